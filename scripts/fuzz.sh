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
# target's CPU time, executions (and their rate per CPU-second) and corpus size, also appended to
# $TRAINER_CACHE/fuzz/runs.log, the record of every run.
# FUZZ_BUILD=0 runs the targets as built before (e.g. a copy, while the sources change).
#   scripts/fuzz.sh --check [TARGET...]
# --check is the test command's short sanitizer pass: each seed corpus replayed, then RUNS
# (default 3000) mutations of it from a fixed seed, into a scratch corpus: the same inputs on
# every machine, so it fails only on a real error. (image_decode's mutations reach PNGs of up to
# kMaxImagePixels, ~45 a second: 20,000 took 7 minutes of the test command.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
check=0 seconds=60
if [ "${1:-}" = --check ]; then
  check=1 seconds=0
  shift
elif [ $# -gt 0 ]; then
  seconds=$1
  shift
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  read -r -a targets < <(sed -n 's/^set(FUZZ_TARGETS \(.*\))$/\1/p' "$root/tests/fuzz/CMakeLists.txt")
fi
# clang and its sanitizers' run-time libraries (a separate package, which clang only recommends).
if ! command -v clang++ >/dev/null ||
  [ ! -f "$(clang++ -print-runtime-dir)/libclang_rt.asan-x86_64.a" ]; then
  echo "fuzz.sh: installing clang and its sanitizer run-time (Debian's)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang libclang-rt-14-dev >&2
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
  if [ $check = 1 ]; then corpus=$(mktemp -d) findings=$(mktemp -d); fi
  mkdir -p "$corpus" "$findings"
  seeds=("$root/tests/fuzz/corpus/$target")
  if [ "$target" = config ]; then seeds+=("$root/configs" "$root/configs/recipes"); fi
  dict=$root/tests/fuzz/dict/$target.dict
  if [ "$target" = config ]; then dict=$build/config.dict; fi
  # No single allocation over 1 GB: the largest an input may cost is an image at kMaxImagePixels
  # (768 MB of RGB); anything larger was sized by an unchecked field.
  options=(-max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -malloc_limit_mb=1024
    -print_final_stats=1 -artifact_prefix="$findings/")
  if [ -f "$dict" ]; then options+=(-dict="$dict"); fi
  if [ $check = 1 ]; then options+=(-runs="${RUNS:-3000}" -seed=1); fi
  if [ "${JOBS:-1}" -gt 1 ]; then options+=(-fork="$JOBS" -ignore_crashes=1); fi
  echo "== fuzz_$target $([ $check = 1 ] && echo "--check" || echo "for ${seconds}s")" >&2
  log=$findings/fuzz.log
  # The CPU time spent (what a fuzzing budget counts), children (-fork) included.
  TIMEFORMAT="cpu: %U s user + %S s system in %R s"
  failed=0
  { time "$build/tests/fuzz/fuzz_$target" "${options[@]}" "$corpus" "${seeds[@]}" \
    >"$log" 2>&1; } 2>"$findings/cpu.txt" || failed=1
  if [ $failed = 1 ]; then status=1; fi
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|ERROR|SUMMARY" "$log" >&2 || true
  inputs=$(find "$corpus" -type f | wc -l)
  # The inputs run: libFuzzer's final statistic, or under -fork (which prints none) the count on
  # the parent's last progress line; per CPU-second, the rate a budget buys.
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  [ -n "$execs" ] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
  rate=$(awk -v n="${execs:-0}" '{c = $2 + $6; printf "%d", (c > 0 ? n / c : 0)}' "$findings/cpu.txt")
  summary="$(date -u +%FT%TZ) $target $(cat "$findings/cpu.txt"), ${execs:-0} executions ($rate per CPU-second), corpus $inputs inputs"
  if [ $check = 1 ]; then
    echo "$summary" >&2
    if [ $failed = 1 ]; then tail -n 40 "$log" >&2; fi
    rm -rf "$corpus" "$findings"
    continue
  fi
  # Every run's line, kept with the working corpus: the CPU time a target has had in all.
  echo "$summary" | tee -a "$cache/runs.log" >&2
  echo "findings: $(find "$findings" -type f ! -name fuzz.log ! -name cpu.txt | wc -l) in $findings" >&2
done
exit $status
