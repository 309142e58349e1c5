#!/usr/bin/env bash
# Builds the project with clang under sanitizers into build-KIND/ and runs its CPU tests there:
#   scripts/sanitize.sh asan [CTEST ARGS]
#                                     ctest's tests under AddressSanitizer +
#                                     UndefinedBehaviorSanitizer: the C++ test programs, the
#                                     multi-rank ones under mpirun and torchrun, the fuzz
#                                     corpora's replays
#   scripts/sanitize.sh tsan [CTEST ARGS]   the same under ThreadSanitizer
#   scripts/sanitize.sh KIND pytest [PYTEST ARGS]
#                                     train and the tools built alike, and the pytest tests that
#                                     run them (default: tests/ without tests/deploy/, whose image
#                                     builds its own binaries); every report a sanitized process
#                                     writes fails the run, whatever the test made of its exit
# CTEST ARGS choose tests, e.g. -R 'TFRecord|distributed'. Suppressions, each for third-party
# code and explained: tests/sanitizers/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:-asan}
shift || true
case "$kind" in
  asan) flags=address,undefined ;;
  tsan) flags=thread ;;
  *) echo "sanitize.sh: asan or tsan, got '$kind'" >&2; exit 2 ;;
esac
pytest=0
if [ "${1:-}" = pytest ]; then
  pytest=1
  shift
fi
# clang and its sanitizers' run-time libraries (a separate package, which clang only recommends).
if ! command -v clang++ >/dev/null ||
  [ ! -f "$(clang++ -print-runtime-dir)/libclang_rt.asan-x86_64.a" ]; then
  echo "sanitize.sh: installing clang and its sanitizer run-time (Debian's)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang libclang-rt-14-dev >&2
fi
build=${BUILD_DIR:-$root/build-$kind}
# Everything: the test programs, train, the tools, the parity programs.
CC=clang CXX=clang++ BUILD_DIR="$build" TRAINER_SANITIZE=$flags "$root/scripts/build.sh"
supp=$root/tests/sanitizers
export ASAN_OPTIONS="abort_on_error=1:suppressions=$supp/asan.supp"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp"
# LibTorch, Open MPI, OpenCV and GDAL are not instrumented: what they do is invisible to
# ThreadSanitizer but for the calls it intercepts (malloc and free, mutexes, condition
# variables), and those alone made it report races and lock orders inside them (Gloo's run-loop
# thread freeing a tensor after our thread's last reference; the two mutexes of Open MPI's TCP
# transport, and GDAL's). It ignores intercepted calls from uninstrumented libraries; every
# access our code makes is still checked.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1"
TSAN_OPTIONS+=":suppressions=$supp/tsan.supp"
# LibTorch's kernels run on OpenMP (libgomp) threads, whose barriers ThreadSanitizer cannot see
# (libgomp is not instrumented): every tensor op would look like a race. One OpenMP thread runs
# them inline; the project's own threads (readers, decoders, the watchdog, collectives) stay.
if [ "$kind" = tsan ]; then export OMP_NUM_THREADS=1; fi

if [ $pytest = 1 ]; then
  # Each sanitized process writes its reports to a file of its own here: a test that expects
  # train to fail would otherwise pass on a sanitizer's exit too.
  reports=$(mktemp -d)
  trap 'rm -rf "$reports"' EXIT
  for var in ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS; do
    export "$var=${!var}:log_path=$reports/${var%%_*}"
  done
  # The suppressions LeakSanitizer used would otherwise be written there too, as a report.
  export LSAN_OPTIONS="$LSAN_OPTIONS:print_suppressions=0"
  python=$("$root/scripts/setup.sh" | tail -n 1)
  [ $# -gt 0 ] || set -- "$root/tests" --ignore="$root/tests/deploy"
  status=0
  TRAINER_BUILD_DIR="$build" "$python" -m pytest -q -rs --durations=10 "$@" || status=1
  for report in "$reports"/*; do
    [ -e "$report" ] || continue
    echo "== $(basename "$report")" >&2
    cat "$report" >&2
    status=1
  done
  exit $status
fi

ctest --test-dir "$build" --output-on-failure "$@"
