#!/usr/bin/env bash
# Builds the trainer's image from docker/Dockerfile and optionally pushes it. Prints the commands
# it runs; DRY_RUN=1 prints them only.
# Usage: scripts/image/build.sh IMAGE [--cuda 13.0|12.6] [--efa [VERSION]] [--ca-bundle FILE] [--push]
#   --cuda 13.0   default: CUDA 13.0 images and the default torch wheel (Turing and newer GPUs)
#   --cuda 12.6   CUDA 12.6 images, PyTorch's cu126 wheel and sm_70: V100 nodes (P3, P3dn), which
#                 CUDA 13 no longer supports
#   --efa         add libfabric and the aws-ofi-nccl plugin (AWS EFA installer) for P3dn's EFA
#   --ca-bundle   CAs (PEM) for pip and curl to trust in the build, e.g. a TLS-intercepting
#                 proxy's: a build secret, kept in no layer
#   --push        docker push IMAGE afterwards (for ECR, docker login first: see docs/eks.md)
# e.g. scripts/image/build.sh 123456789012.dkr.ecr.us-west-2.amazonaws.com/resnet-trainer:cu126-efa --cuda 12.6 --efa --push
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
usage() { sed -n '4,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
# The EFA installer release the --efa variant uses unless one is given.
efa_default=1.47.0

image=${1:-}
if [ -z "$image" ] || [[ "$image" == -* ]]; then usage; fi
shift
cuda=13.0
efa=""
ca_bundle=""
push=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda=${2:?--cuda needs 13.0 or 12.6}; shift 2 ;;
    --efa)
      efa=$efa_default
      if [[ "${2:-}" =~ ^[0-9] ]]; then efa=$2; shift; fi
      shift ;;
    --ca-bundle) ca_bundle=${2:?--ca-bundle needs a file}; shift 2 ;;
    --push) push=1; shift ;;
    *) echo "image-build: unknown option $1" >&2; usage ;;
  esac
done

# The programs compiled in the build stage: the Dockerfile's default, named for builders (podman
# 4.3) that do not take a stage's name from an argument's default.
args=(--build-arg PROGRAMS_FROM=build)
case "$cuda" in
  13.0) ;; # the Dockerfile's defaults
  12.6)
    args+=(--build-arg BUILD_IMAGE=nvidia/cuda:12.6.3-cudnn-devel-ubuntu24.04
      --build-arg RUNTIME_IMAGE=nvidia/cuda:12.6.3-base-ubuntu24.04
      --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126
      --build-arg "CUDAFLAGS=-gencode arch=compute_70,code=sm_70") ;;
  *) echo "image-build: --cuda must be 13.0 or 12.6, got '$cuda'" >&2; exit 2 ;;
esac
[ -z "$efa" ] || args+=(--build-arg "EFA_INSTALLER_VERSION=$efa")
if [ -n "$ca_bundle" ]; then
  [ -f "$ca_bundle" ] || { echo "image-build: no file $ca_bundle (--ca-bundle)" >&2; exit 2; }
  args+=(--secret "id=ca-bundle,src=$ca_bundle")
fi

run() {
  echo "+ $*" >&2
  if [ -z "${DRY_RUN:-}" ]; then "$@"; fi
}
# P3 and P3dn are x86-64: an image built on an ARM laptop or a Graviton builder would otherwise be
# arm64 and fail there with "exec format error". (On such a builder BuildKit emulates x86-64, which
# is slow for the C++ build: an x86-64 builder is the quick way.)
run docker build --platform linux/amd64 -f "$root/docker/Dockerfile" -t "$image" "${args[@]}" "$root"
[ -z "$push" ] || run docker push "$image"
