#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, builds, then runs the C++ tests (ctest)
# and the Python interop tests (pytest). Tests that need a GPU or a cluster skip with a reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=$("$root/scripts/setup.sh" | tail -n 1)
export BUILD_DIR=${BUILD_DIR:-$root/build}
"$root/scripts/build.sh"

# The image the deploy tests run (tests/deploy/image_support.py), built while the C++ tests run:
# from bare its build is mostly downloads and package installs (minutes), from a warm cache
# seconds. The tests' own build then finds every layer cached, or fails and says why.
image_log=$(mktemp)
image_build=
# shellcheck disable=SC2064  # the log's name now; the build's when it runs
trap "rm -f '$image_log'; "'[ -z "$image_build" ] || kill "$image_build" 2>/dev/null || true' EXIT
if command -v podman >/dev/null; then
  echo "+ scripts/image-local.sh >$image_log (in the background)" >&2
  timeout 3600 "$root/scripts/image-local.sh" >"$image_log" 2>&1 &
  image_build=$!
fi

set -x
# One test at a time: each already uses every core (LibTorch's intra-op threads), and two
# OpenMP pools spinning on 2 cores slow each other down many times over.
ctest --test-dir "$BUILD_DIR" --output-on-failure
# The short sanitizer pass: the parsers that need no LibTorch built with clang under
# AddressSanitizer and UndefinedBehaviorSanitizer, each fuzz target's corpus replayed and 3,000
# mutations of it from a fixed seed. The full runs: scripts/sanitize.sh, scripts/fuzz.sh.
BUILD_DIR="$root/build-fuzz" "$root/scripts/fuzz.sh" --check records example image_decode augment tar
if [ -n "$image_build" ]; then
  wait "$image_build" || echo "test.sh: the early image build failed ($(tail -n 1 "$image_log")); the image tests build it again"
fi
# --durations: the slowest tests, so that each change sees where the suite's time goes.
TRAINER_BUILD_DIR="$BUILD_DIR" "$python" -m pytest -q -rs --durations=25 "$root/tests"
