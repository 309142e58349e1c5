#!/usr/bin/env bash
# The EFA user-space stack for p3dn.24xlarge, from AWS's EFA installer: rdma-core, libfabric with
# the `efa` provider (/opt/amazon/efa) and the aws-ofi-nccl plugin through which NCCL uses EFA
# (/opt/amazon/ofi-nccl). No kernel module: the node's AMI has it, and the EFA device plugin
# hands the device to the pod.
# Usage: docker/install-efa.sh VERSION   (e.g. 1.47.0; DRY_RUN=1 prints the commands only)
#   CA_BUNDLE=FILE   extra CAs (PEM) for the download
set -euo pipefail
version=${1:?usage: $0 EFA_INSTALLER_VERSION}
plugin_dir=/opt/resnet-trainer/efa/lib
run() {
  echo "+ $*"
  if [ -z "${DRY_RUN:-}" ]; then "$@"; fi
}

run apt-get update
run env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl ca-certificates
tmp=$(mktemp -d)
# CA_BUNDLE (a build secret): extra CAs to trust besides the system's, behind a TLS-intercepting proxy.
cacert=()
if [ -n "${CA_BUNDLE:-}" ] && [ -f "$CA_BUNDLE" ]; then
  cat /etc/ssl/certs/ca-certificates.crt "$CA_BUNDLE" >"$tmp/ca.pem"
  cacert=(--cacert "$tmp/ca.pem")
fi
run curl -fsSL "${cacert[@]}" -o "$tmp/efa.tar.gz" "https://efa-installer.amazonaws.com/aws-efa-installer-$version.tar.gz"
run tar -xzf "$tmp/efa.tar.gz" -C "$tmp"
# --skip-kmod: no kernel module in a container; --skip-limit-conf: the container runtime sets the
# memlock limit; --no-verify: the build machine has no EFA device to test with.
run env -C "$tmp/aws-efa-installer" ./efa_installer.sh --yes --skip-kmod --skip-limit-conf --no-verify
run rm -rf "$tmp"
[ -n "${DRY_RUN:-}" ] && exit 0

# NCCL loads `libnccl-net.so` from LD_LIBRARY_PATH. Newer installers name the plugin
# libnccl-net-ofi.so, older ones libnccl-net.so: give it the name NCCL looks for, in a folder the
# image puts on LD_LIBRARY_PATH, so a missing plugin cannot silently fall back to TCP unnoticed.
plugin=$(find /opt/amazon/ofi-nccl -name 'libnccl-net-ofi.so' | head -n 1)
[ -n "$plugin" ] || plugin=$(find /opt/amazon/ofi-nccl -name 'libnccl-net.so' | head -n 1)
if [ -z "$plugin" ]; then
  echo "install-efa: no aws-ofi-nccl plugin under /opt/amazon/ofi-nccl after installing EFA $version." \
    "HINT: pick an EFA installer version that bundles aws-ofi-nccl (EFA_INSTALLER_VERSION)." >&2
  exit 1
fi
run mkdir -p "$plugin_dir"
run ln -sf "$plugin" "$plugin_dir/libnccl-net.so"
