#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, builds, then runs the C++ tests (ctest)
# and the Python interop tests (pytest). Tests that need a GPU or a cluster skip with a reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Each traced command with the time it started, so that a log shows where the run's time went.
PS4='+ $(date +%T) '
echo "test.sh: started at $(date +%T)" >&2
# Debian's packages first (podman among them), so that the image's base builds beside the rest.
"$root/scripts/setup.sh" --system
export BUILD_DIR=${BUILD_DIR:-$root/build}

# The image the deploy tests run (tests/deploy/image_support.py), built in the background: its
# base and runtime packages (from bare, debootstrap and apt: a minute of one core and downloads)
# beside the venv's downloads, which leave half the CPU idle, and the compile; then the image
# from the programs just built (IMAGE_FROM_SOURCE=1: compiled in its build stage, as for EKS)
# beside the C++ tests and pytest's first pass; the serial pass's tests are the ones that run
# it. From a warm cache both take seconds. The tests' own build then finds every layer cached, or
# fails and says why.
image_log=$(mktemp)
image_build=
image=localhost/resnet-trainer:local  # the name tests/deploy/image_support.py runs
image_source=(--from-build "$BUILD_DIR")
[ "${IMAGE_FROM_SOURCE:-0}" != 1 ] || image_source=()
# shellcheck disable=SC2064  # the log's name now; the build's when it runs
trap "rm -f '$image_log'; "'[ -z "$image_build" ] || kill "$image_build" 2>/dev/null || true' EXIT
# image_in_background ARGS...: scripts/image/local.sh ARGS... IMAGE, its output to $image_log.
image_in_background() {
  echo "+ scripts/image/local.sh $* $image >$image_log (in the background)" >&2
  timeout 3600 "$root/scripts/image/local.sh" "$@" "$image" >"$image_log" 2>&1 &
  image_build=$!
}
if command -v podman >/dev/null; then image_in_background --base-only; fi
python=$("$root/scripts/setup.sh" | tail -n 1)
"$root/scripts/build.sh"
if [ -n "$image_build" ]; then
  wait "$image_build" || echo "test.sh: the image's base failed ($(tail -n 1 "$image_log"))" >&2
  image_in_background "${image_source[@]}"
fi

set -x
# As many tests at a time as there are cores, each process with one LibTorch thread: two OpenMP
# pools of every core's threads spin against each other and slow both many times over. Most
# cases spend their second loading LibTorch on one core; the multi-rank tests run alone
# (RUN_SERIAL, tests/CMakeLists.txt).
OMP_NUM_THREADS=1 ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
# The short sanitizer pass: the parsers that need no LibTorch built with clang under
# AddressSanitizer and UndefinedBehaviorSanitizer, each fuzz target's corpus replayed and 3,000
# mutations of it from a fixed seed. The full runs: scripts/sanitize.sh, scripts/fuzz.sh.
BUILD_DIR="$root/build-fuzz" "$root/scripts/fuzz.sh" --check records example image_decode augment tar
# pytest in two passes, both run whatever the first's result. First the tests but those marked
# serial, as many at a time as there are cores (pytest-xdist), a whole file to a worker so that a
# file's fixtures are made once, each process with one LibTorch thread (as ctest's above); many
# of them wait on processes, sleeps and start-ups and leave a core idle. Then the serial ones
# (tests/conftest.py says which and why), in its two lanes side by side, one test of each at a
# time, again with one LibTorch thread a process (the containers too: image_support.NODE_ENV).
# --durations: the slowest tests, so that each change sees where the suite's time goes.
export TRAINER_BUILD_DIR=$BUILD_DIR
status=0
OMP_NUM_THREADS=1 "$python" -m pytest -q -rs --durations=15 -m "not serial" \
  -n "$(nproc)" --dist loadfile "$root/tests" || status=1
# The image is for the serial pass's tests alone: its build went on beside the first pass. Built,
# it is what their fixture would build again from the same tree (a minute of cache checks).
if [ -n "$image_build" ]; then
  if wait "$image_build"; then
    export TEST_IMAGE_BUILT=$image
  else
    echo "test.sh: the early image build failed ($(tail -n 1 "$image_log")); the image tests build it again"
  fi
fi
OMP_NUM_THREADS=1 "$python" -m pytest -q -rs --durations=15 -m serial -n 2 --dist loadgroup \
  "$root/tests" || status=1
set +x
if [ "$status" != 0 ]; then
  echo "test.sh: pytest failed (above); ended at $(date +%T), $((SECONDS / 60)) min in all" >&2
  exit 1
fi
echo "test.sh: passed at $(date +%T), $((SECONDS / 60)) min $((SECONDS % 60)) s in all" >&2
