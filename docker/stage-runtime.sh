#!/usr/bin/env bash
# Collects what the runtime image needs from a build into STAGE_DIR:
#   STAGE_DIR/opt/resnet-trainer/      `cmake --install` of the build (cmake/Install.cmake): bin/
#                                      with train and the tools, lib/ with the torch wheel's
#                                      libraries, found by the binaries through a relative RPATH
#   STAGE_DIR/system/<path>            every other shared library those binaries load, at its own
#                                      path: candidates, of which the runtime stage adds the ones
#                                      its packages lack (docker/add-libraries.sh)
#   STAGE_DIR/opt/resnet-trainer/lib/  also the `torch` Python package, for torchrun, beside the
#                                      same libraries (docker/stage-torch-python.py)
# Usage: docker/stage-runtime.sh BUILD_DIR STAGE_DIR
set -euo pipefail
build_dir=${1:?usage: $0 BUILD_DIR STAGE_DIR}
stage=${2:?usage: $0 BUILD_DIR STAGE_DIR}
prefix=/opt/resnet-trainer
here=$(cd "$(dirname "$0")" && pwd)
run() {
  echo "+ $*"
  "$@"
}

if [ ! -f "$build_dir/cmake_install.cmake" ]; then
  echo "stage-runtime: $build_dir is not a configured build." \
    "HINT: build first with BUILD_DIR=$build_dir scripts/build.sh" >&2
  exit 1
fi
run env DESTDIR="$stage" cmake --install "$build_dir" --prefix "$prefix"
binaries=("$stage$prefix"/bin/*)
if [ ! -x "${binaries[0]}" ]; then
  echo "stage-runtime: cmake --install put no program into $stage$prefix/bin." \
    "HINT: the install rules are in cmake/Install.cmake" >&2
  exit 1
fi

# ldd resolves the wheel's libraries inside the stage (relative RPATH); the rest are the system's.
# awk reads to the end: exiting early would SIGPIPE ldd and fail the pipeline (pipefail).
missing=$(ldd "${binaries[@]}" | awk '/not found/ {print $1}' | sort -u)
if [ -n "$missing" ]; then
  echo "stage-runtime: the installed programs do not find: $missing." \
    "HINT: a library outside the torch wheel's folders needs an install rule (cmake/Install.cmake)" >&2
  exit 1
fi
while read -r lib; do
  # The folder's real path (merged /usr: /lib is /usr/lib), the file by the name the loader asks for.
  path=$(realpath "$(dirname "$lib")")/$(basename "$lib")
  mkdir -p "$stage/system$(dirname "$path")"
  cp -L --preserve=timestamps "$lib" "$stage/system$path"
done < <(ldd "${binaries[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | grep -v "^$stage/" | sort -u)
echo "+ $(find "$stage/system" -type f | wc -l) system libraries staged in $stage/system"

# torchrun (Kubeflow's PyTorchJob) imports torch: the wheel's Python files beside the libraries
# installed above, so that it and `train` load one copy of LibTorch, CUDA and NCCL. Only a build
# against the torch wheel has them (another LibTorch installs no lib/torch).
if [ -d "$stage$prefix/lib/torch/lib" ]; then
  python=$(sed -n 's/^PYTHON_EXECUTABLE:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
  run "$python" "$here/stage-torch-python.py" "$stage$prefix/lib"
fi
