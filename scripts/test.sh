#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, builds, then runs the C++ tests (ctest)
# and the Python interop tests (pytest). Tests that need a GPU or a cluster skip with a reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=$("$root/scripts/setup.sh" | tail -n 1)
export BUILD_DIR=${BUILD_DIR:-$root/build}
"$root/scripts/build.sh"

set -x
# One test at a time: each already uses every core (LibTorch's intra-op threads), and two
# OpenMP pools spinning on 2 cores slow each other down many times over.
ctest --test-dir "$BUILD_DIR" --output-on-failure
# The short sanitizer pass: the parsers that need no LibTorch built with clang under
# AddressSanitizer and UndefinedBehaviorSanitizer, each fuzz target's corpus replayed and 3,000
# mutations of it from a fixed seed. The full runs: scripts/sanitize.sh, scripts/fuzz.sh.
BUILD_DIR="$root/build-fuzz" "$root/scripts/fuzz.sh" --check records example image_decode augment tar
# --durations: the slowest tests, so that each change sees where the suite's time goes.
TRAINER_BUILD_DIR="$BUILD_DIR" "$python" -m pytest -q -rs --durations=25 "$root/tests"
