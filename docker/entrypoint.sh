#!/usr/bin/env bash
# The image's entrypoint: runs `train`, one of the project's tools, or any other command, and
# forwards SIGTERM/SIGINT/SIGHUP to it, so `kubectl delete` and node drains reach the trainer.
#   entrypoint --config FILE ...       -> train --config FILE ...
#   entrypoint TOOL ARGS...            -> TOOL from this directory (train, preload-data, ...)
#   entrypoint mpirun ARGS... | sshd   -> that command, as given
set -euo pipefail
bin_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# OpenMPI refuses to start as root unless told twice; the image runs as a non-root user, so this
# only matters when a pod overrides runAsUser to 0.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# The MPI Operator's launcher (it sets K_MPI_JOB_ROLE) may start before the workers can take
# mpirun's SSH connections: before their DNS records exist (mpi-operator#481), and, in a job that
# was created suspended (as Kueue creates every job it queues), before their sshd runs, since the
# operator then starts the launcher with the workers whatever launcherCreationPolicy says
# (mpi-operator#615). mpirun would fail at the first host it cannot reach. Wait until each host
# of the hostfile resolves and its sshd (the port ssh_config gives it) accepts a connection, for
# ENTRYPOINT_WAIT_S seconds in all (default 900: a new node pulls the image first).
wait_for_workers() {
  local hostfile=$1 deadline=$((SECONDS + ${ENTRYPOINT_WAIT_S:-900})) host port why
  # Lines are "host slots=N" (OpenMPI) or "host:N" (Intel MPI, MPICH).
  while read -r host; do
    port=${WORKER_SSH_PORT:-$(ssh -G "$host" 2>/dev/null | awk '$1 == "port" {print $2; exit}' || true)}
    port=${port:-22}
    while :; do
      if ! getent hosts "$host" >/dev/null; then
        why="does not resolve"
      elif ! timeout 5 bash -c ": </dev/tcp/$host/$port" 2>/dev/null; then
        why="resolves, but nothing accepts connections on its port $port (sshd)"
      else
        break
      fi
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "entrypoint: worker $host (from $hostfile) $why after ${ENTRYPOINT_WAIT_S:-900} s." \
          "HINT: kubectl get pods,svc -l training.kubeflow.org/job-name shows whether the" \
          "workers and their service exist, and kubectl describe on a worker pod why it is not" \
          "Ready." >&2
        exit 1
      fi
      sleep 2
    done
  done < <(sed -e 's/[[:space:]:].*//' -e '/^#/d' -e '/^$/d' "$hostfile")
}
if [ "${K_MPI_JOB_ROLE:-}" = launcher ] && [ -f "${MPI_HOSTFILE:-/etc/mpi/hostfile}" ]; then
  wait_for_workers "${MPI_HOSTFILE:-/etc/mpi/hostfile}"
fi

# EFA's libfabric provider pins NCCL's buffers in memory; under a low locked-memory limit it
# fails with "Cannot allocate memory". No pod field sets the limit: the node's container runtime
# gives it, so say so where EFA devices are present (the limit holds for the ranks sshd starts,
# too) and go on. EFA_DEVICES: where the devices are (a glob; the tests point it elsewhere).
memlock=$(ulimit -l)
efa_devices=${EFA_DEVICES:-/dev/infiniband/uverbs*}
if compgen -G "$efa_devices" >/dev/null && [ "$memlock" != unlimited ]; then
  echo "entrypoint: WARNING: EFA devices are present but locked memory is limited to" \
    "$memlock KiB (ulimit -l); libfabric's EFA provider may fail with \"Cannot allocate" \
    "memory\". HINT: raise the container runtime's limit on the node group (docs/eks.md," \
    "\"Locked memory for EFA\")" >&2
fi

if [ $# -eq 0 ]; then set -- train --help; fi
case "$1" in
  -*) set -- train "$@" ;;
esac
# A bare name that is one of ours (train, a tool, preload-data) runs from this directory.
if [[ "$1" != */* ]] && [ -x "$bin_dir/$1" ] && [ ! -d "$bin_dir/$1" ]; then
  program="$bin_dir/$1"
  shift
  set -- "$program" "$@"
fi

# Run the program as a child rather than exec'ing it: as PID 1 a program that installs no handler
# would ignore SIGTERM and be killed only at the end of the grace period.
"$@" &
child=$!
# On an MPI Operator worker (K_MPI_JOB_ROLE=worker), as the container's PID 1, the ranks run in
# sshd's sessions, not under us: a signal goes to every process of the container (kill -1 spares
# PID 1), so that a node drain reaches the trainer too.
whole_container=""
if [ $$ -eq 1 ] && [ "${K_MPI_JOB_ROLE:-}" = worker ]; then whole_container=1; fi
signalled=""
# shellcheck disable=SC2317  # called by the traps below
forward() {
  signalled=1
  kill -s "$1" "$child" 2>/dev/null || true
  if [ -n "$whole_container" ]; then kill -s "$1" -1 2>/dev/null || true; fi
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward HUP' HUP

# Whether a process other than PID 1 is still alive (zombies, exited but not yet reaped, are not).
# Builtins only: a command started here would count itself.
others_running() {
  local status line
  for status in /proc/[0-9]*/status; do
    [ "$status" = /proc/1/status ] && continue
    while IFS= read -r line; do
      case "$line" in
        State:*Z*) break ;;
        State:*) return 0 ;;
      esac
    done 2>/dev/null <"$status"
  done
  return 1
}

set +e
wait "$child"
# `wait` returns early when a trapped signal arrives; wait until the child has exited, then once
# more, which gives the child's own exit status (bash keeps it) rather than 128 + the signal.
while kill -0 "$child" 2>/dev/null; do
  wait "$child"
done
wait "$child"
status=$?
# The container ends when PID 1 does, killing what still runs. After a signal, give the ranks the
# rest of the grace period to stop cleanly (the trainer writes a checkpoint on SIGTERM).
if [ -n "$whole_container" ] && [ -n "$signalled" ]; then
  while others_running; do sleep 1; done
fi
exit "$status"
