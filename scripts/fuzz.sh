#!/usr/bin/env bash
# Fuzzes the parsers of outside input with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer (clang): builds tests/fuzz's targets into build-fuzz/ and runs each
# for SECONDS of wall time (default 60) on JOBS processes (default 1):
#   scripts/fuzz.sh [SECONDS] [TARGET...]      targets: tests/fuzz/CMakeLists.txt (default: all)
# Each starts from its seed corpus (tests/fuzz/corpus/<target>; for config also the shipped
# configs) and its dictionary (tests/fuzz/dict/<target>.dict; config's is made from
# docs/configuration.md), and grows a working corpus in $TRAINER_CACHE/fuzz/<target> that later
# runs go on from. An input that fails is written to build-fuzz/findings/<target>/; once fixed it
# joins the seed corpus as regression-<what it broke>, which ctest's runs replay. Prints each
# target's executions per second and corpus size (libFuzzer's final stats).
# FUZZ_BUILD=0 runs the targets as built before (e.g. a copy, while the sources change).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  read -r -a targets < <(sed -n 's/^set(FUZZ_TARGETS \(.*\))$/\1/p' "$root/tests/fuzz/CMakeLists.txt")
fi
if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: installing clang (Debian's)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang >&2
fi
build=${BUILD_DIR:-$root/build-fuzz}
if [ "${FUZZ_BUILD:-1}" != 0 ]; then  # FUZZ_BUILD=0: run the targets as built before
  CC=clang CXX=clang++ BUILD_DIR="$build" TRAINER_SANITIZE=address,undefined TRAINER_FUZZ=ON \
    "$root/scripts/build.sh" "${targets[@]/#/fuzz_}" >&2
fi
cache=${TRAINER_CACHE:-$HOME/.cache/resnet-trainer}/fuzz
export ASAN_OPTIONS="abort_on_error=1:suppressions=$root/tests/sanitizers/asan.supp"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/sanitizers/ubsan.supp"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp"
# The config target's dictionary: every key, and every choice value, of docs/configuration.md.
python3 - "$root/docs/configuration.md" >"$build/config.dict" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    row = re.match(r"^\| `([a-z_0-9]+)` \| `?([^|`]*)`? \| (.*) \|$", line)
    if not row:
        continue
    print(f'"{row[1]} = "')
    for value in re.split(r" \\\| ", row[3]):
        if re.fullmatch(r"[a-z0-9_]+", value.strip()):
            print(f'"\\"{value.strip()}\\""')
PY
status=0
for target in "${targets[@]}"; do
  corpus=$cache/$target findings=$build/findings/$target
  mkdir -p "$corpus" "$findings"
  seeds=("$root/tests/fuzz/corpus/$target")
  if [ "$target" = config ]; then seeds+=("$root/configs" "$root/configs/recipes"); fi
  dict=$root/tests/fuzz/dict/$target.dict
  if [ "$target" = config ]; then dict=$build/config.dict; fi
  # No single allocation over 1 GB: the largest an input may cost is an image at kMaxImagePixels
  # (768 MB of RGB); anything larger was sized by an unchecked field.
  options=(-max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -malloc_limit_mb=1024 -print_final_stats=1
    -artifact_prefix="$findings/")
  if [ -f "$dict" ]; then options+=(-dict="$dict"); fi
  if [ "${JOBS:-1}" -gt 1 ]; then options+=(-fork="$JOBS" -ignore_crashes=1); fi
  echo "== fuzz_$target for ${seconds}s" >&2
  log=$findings/fuzz.log
  # The CPU time spent (what a fuzzing budget counts), children (-fork) included.
  TIMEFORMAT="cpu: %U s user + %S s system in %R s"
  if ! { time "$build/tests/fuzz/fuzz_$target" "${options[@]}" "$corpus" "${seeds[@]}" \
    >"$log" 2>&1; } 2>"$findings/cpu.txt"; then
    status=1
  fi
  cat "$findings/cpu.txt" >&2
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|ERROR|SUMMARY" "$log" >&2 || true
  echo "corpus: $(find "$corpus" -type f | wc -l) inputs, findings: $(find "$findings" -type f ! -name fuzz.log | wc -l)" >&2
done
exit $status
