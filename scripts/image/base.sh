#!/usr/bin/env bash
# Makes a Debian 12 base image without a container registry: debootstrap (minbase, the
# distribution's own mirror), then `podman import`, with the environment NVIDIA's CUDA images set
# (PATH to /usr/local/cuda/bin, LD_LIBRARY_PATH to the driver's folders). scripts/image/local.sh
# builds docker/Dockerfile on it in place of the nvidia/cuda images. The root file system is kept
# as a tarball in the cache, so a later run only imports it (seconds). Prints the commands it runs.
# Usage: scripts/image/base.sh [IMAGE]   (default: localhost/resnet-trainer-base:debian12)
set -euo pipefail
image=${1:-localhost/resnet-trainer-base:debian12}
cache=${TRAINER_CACHE:-$HOME/.cache/resnet-trainer}/images
tarball=$cache/debian12-minbase.tar
# The mirror this machine's apt uses, as the official debian:bookworm image does.
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
run() {
  echo "+ $*" >&2
  "$@"
}

if podman image exists "$image"; then
  echo "+ podman image exists $image: nothing to do" >&2
  exit 0
fi

if [ ! -f "$tarball" ]; then
  for tool in debootstrap podman; do
    command -v "$tool" >/dev/null || {
      echo "image-base: $tool is not installed. HINT: scripts/setup.sh installs it (apt-get)." >&2
      exit 2
    }
  done
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  run debootstrap --variant=minbase bookworm "$rootfs" "$mirror"
  # What the official image adds: the updates and security suites, and apt that keeps no .deb
  # files and no translations in its layers.
  cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  run rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  mkdir -p "$cache"
  run tar -C "$rootfs" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
fi

run podman import \
  --change 'ENV PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64' \
  --change 'CMD ["/bin/bash"]' \
  "$tarball" "$image"
