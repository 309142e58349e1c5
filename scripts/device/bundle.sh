#!/usr/bin/env bash
# Packs what a GPU machine with PyTorch but no package registry lacks to run this project's GPU
# checks without building there: the built binaries, every shared library they load beyond the C
# runtime and PyTorch's own (LibTorch, CUDA and NCCL come from the machine's PyTorch 2.11 cu130,
# the version the build pins), and OpenMPI's launcher with its plugins, relocatable through
# OPAL_PREFIX. Output: .device/bundle.tar.xz (git-ignored, under the 64 MiB a device call
# carries); scripts/device/checks.sh unpacks and uses it there.
# Usage: scripts/device/bundle.sh   (BUILD_DIR overrides the build folder)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/scripts/build.sh" >/dev/null

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
bundle=$stage/bundle
mkdir -p "$bundle/bin" "$bundle/lib"
# What scripts/device/checks.sh and fused_numerics.py run there, and nothing else: the bundle and
# the repository must fit the 64 MiB a device call carries.
for binary in train bench-allreduce bench-conv-fusion bench-max-pool bench-step bench-input \
  generate-dataset tests/trainer_tests tests/distributed_tests tests/resnet_parity_tool; do
  cp "$build/$binary" "$bundle/bin/"
done

# OpenMPI as Debian installs it (prefix /usr), under the same relative paths, so that
# OPAL_PREFIX=<bundle>/usr finds the plugins and help texts. Plugins for fabrics a single GPU
# machine lacks (UCX, libfabric, PSM, InfiniBand verbs) stay behind with their libraries.
triplet=x86_64-linux-gnu
plugins=usr/lib/$triplet/openmpi/lib/openmpi3
mkdir -p "$bundle/usr/bin" "$bundle/$plugins" "$bundle/usr/lib/$triplet/pmix2/lib/pmix" \
  "$bundle/usr/share"
cp /usr/bin/orterun "$bundle/usr/bin/"
ln -s orterun "$bundle/usr/bin/mpirun"
find "/$plugins" -name '*.so' ! -name '*ucx*' ! -name '*ofi*' ! -name '*psm*' \
  ! -name '*openib*' -exec cp {} "$bundle/$plugins/" \;
cp /usr/lib/$triplet/pmix2/lib/pmix/*.so "$bundle/usr/lib/$triplet/pmix2/lib/pmix/"
cp -r /usr/share/openmpi "$bundle/usr/share/"

# Every library those load, except the C runtime (the machine's is newer and compatible) and
# PyTorch's, CUDA's and NCCL's (the machine's PyTorch holds them).
runtime='/(ld-linux[^/]*|lib(c|m|dl|pthread|rt|util|resolv|anl)\.so[^/]*|libstdc\+\+[^/]*|libgcc_s[^/]*)$'
theirs='/torch/lib/|/nvidia/|/usr/local/cuda'
find "$bundle/bin" "$bundle/usr" -type f \( -perm -u+x -o -name '*.so' \) -print0 |
  xargs -0 ldd 2>/dev/null | awk '/=> \// {print $3}' | sort -u |
  grep -Ev "$runtime" | grep -Ev "$theirs" | xargs -r cp -L -t "$bundle/lib/"

mkdir -p "$root/.device"
tar -C "$stage" -cf - bundle | xz -T0 -6 >"$root/.device/bundle.tar.xz"
size=$(stat -c %s "$root/.device/bundle.tar.xz")
echo "$root/.device/bundle.tar.xz: $((size >> 20)) MiB, $(find "$bundle/lib" -type f | wc -l) libraries"
[ "$size" -lt $((60 << 20)) ] || { echo "bundle over 60 MiB: too big to carry" >&2; exit 1; }
