#!/usr/bin/env bash
# Collects what the runtime image needs from a build into STAGE_DIR, a tree the Dockerfile copies
# onto / of the runtime stage:
#   STAGE_DIR/opt/resnet-trainer/bin/       the executables the build produced (add_executable)
#   STAGE_DIR/<venv site-packages>/         LibTorch and the NVIDIA libraries of the `torch` wheel,
#                                           at the same path, so the binaries' RPATH still resolves
#   STAGE_DIR/<other paths>                 any other shared library a binary loads that no
#                                           Debian/Ubuntu package owns (e.g. a runfile CUDA)
#   STAGE_DIR/opt/resnet-trainer/runtime-packages.txt
#                                           the packages owning the rest (OpenCV, protobuf, OpenMPI,
#                                           ...), for docker/install-runtime.sh to apt-get install
# Usage: docker/stage-runtime.sh BUILD_DIR STAGE_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:?usage: $0 BUILD_DIR STAGE_DIR}
stage=${2:?usage: $0 BUILD_DIR STAGE_DIR}
bin_out=$stage/opt/resnet-trainer/bin

# Executable names: the first argument of every add_executable() in the project's CMakeLists.
mapfile -t names < <(grep -rhoE --include=CMakeLists.txt --exclude-dir='build*' --exclude-dir=.git \
  'add_executable\([[:space:]]*[A-Za-z0-9_.+-]+' "$root" |
  sed -E 's/add_executable\([[:space:]]*//' | sort -u)
mkdir -p "$bin_out"
binaries=()
for name in "${names[@]}"; do
  # Test executables live in tests/ and are not shipped.
  [ -x "$build_dir/$name" ] || [ -x "$build_dir/src/$name" ] || continue
  binary=$build_dir/$name
  [ -x "$binary" ] || binary=$build_dir/src/$name
  echo "+ cp $binary $bin_out/$name"
  cp "$binary" "$bin_out/$name"
  binaries+=("$binary")
done
if [ ${#binaries[@]} -eq 0 ]; then
  echo "stage-runtime: no executable of ${names[*]:-(none)} found in $build_dir." \
    "HINT: build first with BUILD_DIR=$build_dir scripts/build.sh" >&2
  exit 1
fi

# The `torch` wheel's libraries: every library directory of torch/ and nvidia/ in the venv's
# site-packages, kept at the same absolute path. Copied whole (not only what ldd lists) because
# LibTorch and cuDNN dlopen() some of their own libraries. Hard links where the file system allows.
copy_tree() {
  mkdir -p "$stage$(dirname "$1")"
  echo "+ cp -a $1 $stage$1"
  cp -al "$1" "$stage$1" 2>/dev/null || cp -a "$1" "$stage$1"
}
site=""
# awk reads to the end: exiting early would SIGPIPE ldd and fail the pipeline (pipefail).
torch_lib=$(ldd "${binaries[@]}" | awk '/libtorch_cpu\.so/ && !found {print $3; found = 1}')
if [ -n "$torch_lib" ]; then
  site=$(cd "$(dirname "$torch_lib")/../.." && pwd)
  copy_tree "$site/torch/lib"
  for lib in "$site"/nvidia/*/lib; do
    [ -d "$lib" ] && copy_tree "$lib"
  done
fi

# Every other library: apt-get install its package in the runtime stage, or copy the file.
packages=()
while read -r lib; do
  if [ -n "$site" ] && [[ "$lib" == "$site"/* ]]; then continue; fi
  real=$(readlink -f "$lib")
  package=""
  # dpkg knows a file by one of its paths (merged /usr makes /lib and /usr/lib the same).
  for path in "$lib" "$real" "/usr$lib" "${lib#/usr}" "/usr$real" "${real#/usr}"; do
    # "pkg:amd64: /usr/lib/..." or "pkg1, pkg2: /path": the first package name.
    package=$(dpkg-query -S "$path" 2>/dev/null | head -n 1 | sed 's/[:,].*//') && [ -n "$package" ] && break
  done
  if [ -n "$package" ]; then
    packages+=("$package")
  else
    mkdir -p "$stage$(dirname "$lib")"
    echo "+ cp -L $lib $stage$lib"
    cp -L "$lib" "$stage$lib"
  fi
done < <(ldd "${binaries[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
list=$stage/opt/resnet-trainer/runtime-packages.txt
printf '%s\n' "${packages[@]}" | sort -u >"$list"
echo "+ runtime packages: $(tr '\n' ' ' <"$list")"
