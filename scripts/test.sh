#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, builds, then runs the C++ tests (ctest)
# and the Python interop tests (pytest). Tests that need a GPU or a cluster skip with a reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=$("$root/scripts/setup.sh" | tail -n 1)
export BUILD_DIR=${BUILD_DIR:-$root/build}
"$root/scripts/build.sh"

set -x
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
TRAINER_BUILD_DIR="$BUILD_DIR" "$python" -m pytest -q -rs "$root/tests"
