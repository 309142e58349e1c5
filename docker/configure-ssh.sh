#!/usr/bin/env bash
# SSH for the Kubeflow MPI Operator, run as a non-root user: the launcher's mpirun reaches each
# worker's sshd on port 2222. The keys come from the Secret the operator mounts at
# sshAuthMountPath (HOME/.ssh: id_rsa, id_rsa.pub, authorized_keys); none are baked into the
# image, and the host keys that installing openssh-server generated are removed.
# Usage: docker/configure-ssh.sh ROOT HOME   (ROOT is / in the image, a scratch folder in tests)
set -euo pipefail
root=${1:?usage: $0 ROOT HOME}
home=${2:?usage: $0 ROOT HOME}
port=${SSH_PORT:-2222}

echo "+ writing $root/etc/ssh/ssh_config.d/mpi-operator.conf"
mkdir -p "$root/etc/ssh/ssh_config.d"
cat >"$root/etc/ssh/ssh_config.d/mpi-operator.conf" <<EOF
# Workers are new pods on every run, and HOME/.ssh is a read-only Secret mount: no host key
# checking and no known_hosts to write. The workers' sshd runs unprivileged, on port $port.
# A worker whose node or network is gone sends nothing, not even a reset: the keepalives end its
# session within 30 s, and mpirun, which holds that session for its daemon there, then ends the
# job instead of waiting on TCP for a quarter of an hour.
Host *
    Port $port
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    ServerAliveInterval 10
    ServerAliveCountMax 3
EOF

echo "+ writing $root$home/.sshd_config"
mkdir -p "$root$home"
cat >"$root$home/.sshd_config" <<EOF
# The workers' sshd, started by the non-root user: sshd -De -f $home/.sshd_config
# A non-root sshd can bind only ports above 1023, cannot use PAM, and serves only its own user.
Port $port
HostKey $home/.ssh/id_rsa
PidFile $home/sshd.pid
AuthorizedKeysFile $home/.ssh/authorized_keys
# The Secret's files belong to root and are world-readable: skip the ownership checks.
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin no
X11Forwarding no
EOF

echo "+ rm -f $root/etc/ssh/ssh_host_*"
rm -f "$root"/etc/ssh/ssh_host_*
