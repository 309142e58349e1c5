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

# The MPI Operator's launcher (it sets K_MPI_JOB_ROLE) may start before the workers' DNS records
# exist (mpi-operator#481); mpirun then fails on the first unknown host. Wait for each host in
# the hostfile to resolve, a bounded number of times.
wait_for_hosts() {
  local hostfile=$1 tries=${ENTRYPOINT_RESOLVE_TRIES:-60} host i
  # Lines are "host slots=N" (OpenMPI) or "host:N" (Intel MPI, MPICH).
  while read -r host; do
    for ((i = 1; ; i++)); do
      getent hosts "$host" >/dev/null && break
      if [ "$i" -ge "$tries" ]; then
        echo "entrypoint: $host from $hostfile does not resolve after $tries tries." \
          "HINT: kubectl get pods,svc -l training.kubeflow.org/job-name shows whether the" \
          "workers and their service exist." >&2
        exit 1
      fi
      sleep 5
    done
  done < <(sed -e 's/[[:space:]:].*//' -e '/^#/d' -e '/^$/d' "$hostfile")
}
if [ "${K_MPI_JOB_ROLE:-}" = launcher ] && [ -f "${MPI_HOSTFILE:-/etc/mpi/hostfile}" ]; then
  wait_for_hosts "${MPI_HOSTFILE:-/etc/mpi/hostfile}"
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
