#!/usr/bin/env bash
# Configures and builds the project (Release, Ninja, ccache) into $BUILD_DIR (default: build/).
# LibTorch comes from the cache's `torch` wheel unless CMAKE_PREFIX_PATH names another.
# BUILD_TESTS=OFF builds only train and the tools (the container image's build stage).
# Arguments name targets to build (default: all), e.g. `scripts/build.sh train` for the smoke run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Without the tests only what the build needs is installed (no GoogleTest, no test tools).
setup_args=()
if [ "${BUILD_TESTS:-ON}" = OFF ]; then setup_args=(--build); fi
python=$("$root/scripts/setup.sh" "${setup_args[@]}" | tail -n 1)
build_dir=${BUILD_DIR:-$root/build}
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
export CCACHE_DIR=${CCACHE_DIR:-${TRAINER_CACHE:-$HOME/.cache/resnet-trainer}/ccache}
# Paths relative to the clone, so every clone of the repository shares the compiler cache.
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
# Every target compiles with a precompiled header, which ccache caches only when told that the
# sources' macros and time stamps may be taken as they are (its manual, "Precompiled headers");
# without this nothing of the project was cached ("could not use precompiled header").
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime

set -x
cmake -S "$root" -B "$build_dir" -G Ninja \
  -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
  -DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-$torch_prefix}" \
  -DPYTHON_EXECUTABLE="$python" \
  -DTRAINER_BUILD_TESTS="${BUILD_TESTS:-ON}" \
  ${TRAINER_SANITIZE:+-DTRAINER_SANITIZE="$TRAINER_SANITIZE"} \
  ${TRAINER_FUZZ:+-DTRAINER_FUZZ="$TRAINER_FUZZ"} \
  ${TORCH_CUDA_ARCH_LIST:+-DTORCH_CUDA_ARCH_LIST="$TORCH_CUDA_ARCH_LIST"}
cmake --build "$build_dir" -j "${BUILD_JOBS:-$(nproc)}" ${1:+--target "$@"}
