#!/usr/bin/env bash
# Builds docker/Dockerfile on this machine with podman, without a container registry: the same
# Dockerfile, install and build scripts as the EKS image (scripts/image/build.sh); only the base
# images differ. A Debian 12 base made here (scripts/image/base.sh) stands in for NVIDIA's CUDA
# images, and this machine's CUDA toolkit is mounted into the build (NVIDIA's devel image has its
# own). Also tags the stages the final image does not hold (IMAGE-build, unless --from-build,
# and IMAGE-libraries) so that the next build finds them cached, removes what earlier builds left
# untagged, and prints the commands, the time and the sizes.
# Usage: scripts/image/local.sh [--base-only | --from-build BUILD_DIR] [IMAGE]
#                                          (default IMAGE: localhost/resnet-trainer:local)
#   --base-only  the base image and the runtime stage's packages, which need nothing built: the
#               test command builds them beside its compile, and the image after it.
#   --from-build BUILD_DIR   the programs and their libraries from a build made on this machine
#               (the test command's; the base image's distribution), staged in
#               BUILD_DIR/image-programs by docker/stage-runtime.sh, instead of compiled in the
#               build stage: the tests' image, without a second compile of the project.
#   CA_BUNDLE   CAs for pip and curl in the build, as a build secret that no layer keeps
#               (default: /etc/ssl/certs/ca-certificates.crt, with a proxy's CA if the host trusts one)
#   CUDA_HOME   the CUDA toolkit to mount (default: /usr/local/cuda)
#   TRAINER_CACHE, CCACHE_DIR   the host's cache and compiler cache, as for scripts/build.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
from_build=''
base_only=''
case "${1:-}" in
  --from-build)
    from_build=${2:?usage: $0 [--base-only | --from-build BUILD_DIR] [IMAGE]}
    shift 2
    ;;
  --base-only)
    base_only=1
    shift
    ;;
esac
image=${1:-localhost/resnet-trainer:local}
base=localhost/resnet-trainer-base:debian12
ca_bundle=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
cuda=$(realpath "${CUDA_HOME:-/usr/local/cuda}")
export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/docker/podman.conf}
run() {
  echo "+ $*" >&2
  "$@"
}

if [ -z "$from_build$base_only" ] && [ ! -x "$cuda/bin/nvcc" ]; then
  echo "image-local: no nvcc in $cuda. HINT: set CUDA_HOME to a CUDA toolkit" >&2
  exit 2
fi
"$root/scripts/image/base.sh" "$base"

args=(--ignorefile "$root/docker/Dockerfile.dockerignore"
  --build-arg "BUILD_IMAGE=$base" --build-arg "RUNTIME_IMAGE=$base")
[ ! -f "$ca_bundle" ] || args+=(--secret "id=ca-bundle,src=$ca_bundle")
stages=(build libraries)
if [ -n "$base_only" ]; then
  # Untagged, and not pruned here: the next build of the image starts from it.
  run podman build --layers --force-rm -f "$root/docker/Dockerfile" "${args[@]}" \
    --build-arg PROGRAMS_FROM=build --target runtime-base "$root"
  exit
fi
if [ -n "$from_build" ]; then
  # /stage as the build stage would leave it, made from this machine's build and given to the
  # build as the context named `programs`, which takes the place of the stage of that name
  # (buildah looks a COPY --from or RUN --mount from= up among the build contexts first). No
  # image of it is made: importing the 4 GB as one cost a minute of CPU beside the tests and
  # 4 GB of disk. stage-runtime.sh brings the wheel's libraries (lib/, gigabytes) up to date file
  # by file and keeps timestamps; the programs and system libraries are staged afresh.
  programs_dir=$(realpath "$from_build")/image-programs
  run rm -rf "$programs_dir/stage/system" "$programs_dir/stage/opt/resnet-trainer/bin"
  run "$root/docker/stage-runtime.sh" "$from_build" "$programs_dir/stage" >&2
  args+=(--build-arg PROGRAMS_FROM=scratch --build-context "programs=$programs_dir")
  stages=(libraries)
  # The imported tree earlier versions of this script kept (4 GB), which nothing uses now.
  ! podman image exists "$image-programs" || run podman rmi "$image-programs" >/dev/null
else
  args+=(--build-arg PROGRAMS_FROM=build --volume "$cuda:/usr/local/cuda:ro")
fi
# The host's compiler cache, mounted into the build stage, whose venv lies at the host's path:
# the compiler sees what the host's build (scripts/build.sh's defaults) saw, and what that build
# compiled is not compiled again (15-20 minutes on 2 cores).
host_cache=${TRAINER_CACHE:-$HOME/.cache/resnet-trainer}
host_ccache=${CCACHE_DIR:-$host_cache/ccache}
if [ -z "$from_build" ] && [ -d "$host_ccache" ]; then
  args+=(--build-arg "TRAINER_CACHE=$host_cache" --build-arg "CCACHE_DIR=/host-ccache"
    --volume "$host_ccache:/host-ccache")
  # The host's venv too, at its own path: the build stage's set-up finds the torch wheel there
  # (setup.sh --build installs into it only what it lacks) instead of downloading and unpacking
  # its 3.5 GB again, and the stage copies the wheel's libraries from it. With it the Python it
  # was made from, where that lies outside /usr (pyenv's, say), read-only.
  venv=$host_cache/venv
  if [ -x "$venv/bin/python" ]; then
    args+=(--build-arg HOST_VENV=1 --volume "$venv:$venv")
    python_home=$(sed -n 's/^home = //p' "$venv/pyvenv.cfg")
    case $python_home in
      /usr/bin | /bin) ;;
      *) args+=(--volume "$(dirname "$python_home"):$(dirname "$python_home"):ro") ;;
    esac
  fi
fi
echo "+ export CONTAINERS_CONF=$CONTAINERS_CONF" >&2
# What killed builds left: a build's working containers outlive it when it is killed (a test run
# stopped midway), each keeping its layers, gigabytes, from every prune. Those over 2 hours old
# belong to no live build here (the test command gives a build an hour).
mapfile -t stale < <(podman ps -a --external --filter until=2h --format '{{.ID}} {{.Status}}' |
  awk '$2 == "Storage" {print $1}')
[ "${#stale[@]}" = 0 ] || run podman rm -f "${stale[@]}" >/dev/null
start=$SECONDS
run podman build --layers --force-rm -f "$root/docker/Dockerfile" "${args[@]}" -t "$image" "$root"
# Every step is cached by now: this only names the other stages, to measure the build stage
# and to keep them from the prune below.
for target in "${stages[@]}"; do
  run podman build --layers --force-rm -f "$root/docker/Dockerfile" "${args[@]}" --target "$target" \
    -t "$image-$target" "$root" >/dev/null
done
echo "+ built $image in $((SECONDS - start)) s" >&2
# Each rebuild leaves the previous build's images behind, untagged (over 10 GB): remove them. The
# image is built by now: a prune refused because a container (another test's) still uses one of
# them leaves them for the next build, and is no failure.
run podman image prune -f >/dev/null ||
  echo "image-local: WARNING: untagged images left for the next build's prune (above)" >&2
run podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' --filter "reference=$image*" >&2
