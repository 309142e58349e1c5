#!/usr/bin/env bash
# The runtime image's one install step: the EFA stack when EFA_INSTALLER_VERSION is set, OpenMPI's
# launcher and libraries, OpenSSH for the MPI Operator, Python for torchrun, and the non-root user
# the image runs as.
# The trainer's other libraries come from the build (docker/add-libraries.sh), not as packages:
# OpenCV's packages would also bring Mesa, LLVM and GDAL's data, which `train` never loads.
# Usage: docker/install-runtime.sh   (DRY_RUN=1 prints the commands only)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
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

run apt-get update
# python3: the interpreter of torchrun (docker/torchrun), for Kubeflow's PyTorchJob; no pip.
run env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  openmpi-bin openssh-server openssh-client python3
run rm -rf /var/lib/apt/lists/*
# openmpi-bin carries the compiler wrappers (mpicc, ...); with no compiler in the image they only
# mislead. mpirun and orted stay.
if update-alternatives --query mpi >/dev/null 2>&1; then run update-alternatives --remove-all mpi; fi
wrappers=(opal_wrapper opalcc opalc++ ortecc mpijavac mpijavac.pl)
for name in mpicc mpiCC mpic++ mpicxx mpif77 mpif90 mpifort; do wrappers+=("$name.openmpi"); done
run rm -f "${wrappers[@]/#//usr/bin/}"

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
# The image build copies these scripts to /tmp/docker for this step alone: none stays in the image.
if [ "$here" = /tmp/docker ]; then run rm -rf "$here"; fi
