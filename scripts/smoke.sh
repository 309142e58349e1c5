#!/usr/bin/env bash
# The smoke job: installs what is missing, builds, then trains ResNet-50 for a few hundred steps on
# a small generated labelled dataset (the GPU when there is one, else the CPU) and evaluates it.
# Extra arguments override config keys, e.g. `scripts/smoke.sh --epochs 1`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export BUILD_DIR=${BUILD_DIR:-$root/build}
# Only what the smoke run needs: no test tools installed, only `train` built (scripts/test.sh
# adds the rest to the same build folder later).
BUILD_TESTS=${BUILD_TESTS:-OFF} "$root/scripts/build.sh" train

set -x
"$BUILD_DIR/train" --config "$root/configs/smoke.toml" --output_dir "${OUTPUT_DIR:-/tmp/resnet-smoke}" "$@"
