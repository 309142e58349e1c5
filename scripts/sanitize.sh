#!/usr/bin/env bash
# Builds the C++ test programs with clang under sanitizers into build-KIND/ and runs them (CPU):
#   scripts/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/sanitize.sh tsan   ThreadSanitizer
# Extra arguments go to each program (e.g. --gtest_filter='TFRecord*'). Suppressions, each for
# third-party code and explained: tests/sanitizers/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:-asan}
shift || true
case "$kind" in
  asan) flags=address,undefined ;;
  tsan) flags=thread ;;
  *) echo "sanitize.sh: asan or tsan, got '$kind'" >&2; exit 2 ;;
esac
if ! command -v clang++ >/dev/null; then
  echo "sanitize.sh: installing clang (Debian's)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang >&2
fi
build=${BUILD_DIR:-$root/build-$kind}
CC=clang CXX=clang++ BUILD_DIR="$build" TRAINER_SANITIZE=$flags \
  "$root/scripts/build.sh" trainer_tests data_tests class_names_tests
supp=$root/tests/sanitizers
export ASAN_OPTIONS="abort_on_error=1:suppressions=$supp/asan.supp"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
# LibTorch's kernels run on OpenMP (libgomp) threads, whose barriers ThreadSanitizer cannot see
# (libgomp is not instrumented): every tensor op would look like a race. One OpenMP thread runs
# them inline; the project's own threads (readers, decoders, the watchdog, collectives) stay.
if [ "$kind" = tsan ]; then export OMP_NUM_THREADS=1; fi
status=0
for program in data_tests class_names_tests trainer_tests; do
  echo "== $program under $kind" >&2
  "$build/tests/$program" "$@" || status=1
done
exit $status
