#!/usr/bin/env bash
# The runtime stage's one install step: the EFA stack when EFA_INSTALLER_VERSION is set, the
# distribution packages the build staged (OpenCV, protobuf, spdlog, OpenMPI's libraries, ...),
# OpenMPI's launcher, OpenSSH for the MPI Operator, and the non-root user the image runs as.
# Usage: docker/install-runtime.sh PACKAGE_LIST   (DRY_RUN=1 prints the commands only)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
list=${1:?usage: $0 PACKAGE_LIST (runtime-packages.txt from docker/stage-runtime.sh)}
user=mpiuser
# The uid the MPI Operator's examples and this project's manifests run as (runAsUser: 1000).
uid=1000
run() {
  echo "+ $*"
  if [ -z "${DRY_RUN:-}" ]; then "$@"; fi
}

# EFA first: its rdma-core packages replace the distribution's, which OpenMPI's libraries use.
if [ -n "${EFA_INSTALLER_VERSION:-}" ]; then
  "$here/install-efa.sh" "$EFA_INSTALLER_VERSION"
fi

mapfile -t staged < <(sed -e '/^#/d' -e '/^[[:space:]]*$/d' "$list")
run apt-get update
run env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  openmpi-bin openssh-server openssh-client ca-certificates "${staged[@]}"
run rm -rf /var/lib/apt/lists/*

# Ubuntu 24.04 images come with a user `ubuntu` holding uid 1000: make room for ours.
existing=$(getent passwd "$uid" | cut -d: -f1 || true)
if [ -n "$existing" ] && [ "$existing" != "$user" ]; then
  run userdel --remove "$existing"
fi
# Password '*': no password login, yet not "!" (locked), which sshd without PAM would refuse
# even for key logins wherever it can read /etc/shadow.
if [ "$existing" != "$user" ]; then
  run useradd --create-home --uid "$uid" --user-group --shell /bin/bash --password '*' "$user"
fi
run "$here/configure-ssh.sh" / "/home/$user"
run chown -R "$user:$user" "/home/$user"
