#!/usr/bin/env bash
# The image's entrypoint: runs `train`, one of the project's tools, or any other command, and
# forwards SIGTERM/SIGINT/SIGHUP to it, so `kubectl delete` and node drains reach the trainer.
#   entrypoint --config FILE ...       -> train --config FILE ...
#   entrypoint TOOL ARGS...            -> TOOL from this directory (train, preload-data, ...)
#   entrypoint mpirun ARGS... | sshd   -> that command, as given
set -euo pipefail
shopt -s extglob  # watch_mpirun's patterns
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

# mpirun's end after a lost host.
# When a rank fails, mpirun orders every host's daemon to kill its ranks and waits until each has
# answered. A daemon on a host whose network has gone never answers, and mpirun's order to it
# sits unacknowledged in TCP's retransmissions for a quarter of an hour, so the MPIJob's launcher
# would stay Running with every GPU of the job held. So once mpirun reports that the job is
# failing (one of Open MPI's banners below), it has MPIRUN_EXIT_S seconds (default 40: its
# daemons' SIGTERM-to-SIGKILL odls_base_sigkill_timeout of 20 s, and as much again) to end; then
# it is ended here, naming the job's first error (the trainer's, which names a lost host), and
# the launcher fails, for the run policy to start the job again from the newest checkpoint.
mpirun_failing=""  # a file: the time mpirun first reported the job failing, then the first error
# watch_mpirun: copies mpirun's output through, noting the first failure banner and the job's
# first error line (the trainer logs it "[critical]" or "[error]", its level in colour or not).
watch_mpirun() {
  local line plain
  while IFS= read -r line || [ -n "$line" ]; do
    printf '%s\n' "$line"
    plain=${line//$'\e'\[*([0-9;])m/}
    case "$plain" in
      *"MPI_ABORT was invoked on rank"* | *"ORTE has lost communication with a remote daemon"* | \
        *"Per user-direction, the job has been aborted"* | *"noticed that process rank"* | \
        *"ORTE daemon has unexpectedly failed"*)
        [ -s "$mpirun_failing.at" ] || printf '%(%s)T\n' -1 >"$mpirun_failing.at" ;;
      *"] [critical] "* | *"] [error] "*)
        [ -s "$mpirun_failing.first" ] || printf '%s\n' "$plain" >"$mpirun_failing.first" ;;
    esac
  done
}
# end_mpirun_if_overdue: ends mpirun (SIGTERM, then SIGKILL) once MPIRUN_EXIT_S have passed
# since it reported the job failing, and returns 0 with the launcher's last line in $overdue.
end_mpirun_if_overdue() {
  local at now first
  [ -s "$mpirun_failing.at" ] || return 1
  at=$(<"$mpirun_failing.at")
  printf -v now '%(%s)T' -1
  [ $((now - at)) -ge "${MPIRUN_EXIT_S:-40}" ] || return 1
  first=$(cat "$mpirun_failing.first" 2>/dev/null || true)
  kill -s TERM "$child" 2>/dev/null || true
  sleep 5
  kill -s KILL "$child" 2>/dev/null || true
  overdue="entrypoint: mpirun has not ended ${MPIRUN_EXIT_S:-40} s after it reported the job"
  overdue+=" failing: a host's daemon does not answer (its node or network is gone). Ended it;"
  overdue+=" the job's first error: ${first:-none logged}"
  return 0
}

# Run the program as a child rather than exec'ing it: as PID 1 a program that installs no handler
# would ignore SIGTERM and be killed only at the end of the grace period.
watchers=()
if [ "$(basename "$1")" = mpirun ]; then
  mpirun_failing=$(mktemp)
  trap 'rm -f "$mpirun_failing" "$mpirun_failing.at" "$mpirun_failing.first"' EXIT
  exec {out}> >(watch_mpirun)
  watchers+=($!)
  exec {err}> >(watch_mpirun >&2)
  watchers+=($!)
  "$@" 1>&"$out" 2>&"$err" &
  exec {out}>&- {err}>&-
else
  "$@" &
fi
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
overdue=""
if [ -n "$mpirun_failing" ]; then
  # Polled each second; waiting on the sleep lets a trapped signal through at once.
  while kill -0 "$child" 2>/dev/null; do
    if end_mpirun_if_overdue; then break; fi
    sleep 1 &
    wait $!
  done
else
  wait "$child"
fi
# `wait` returns early when a trapped signal arrives; wait until the child has exited, then once
# more, which gives the child's own exit status (bash keeps it) rather than 128 + the signal.
while kill -0 "$child" 2>/dev/null; do
  wait "$child"
done
wait "$child"
status=$?
if [ -n "$overdue" ]; then status=1; fi
# mpirun's last lines, still passing through the watchers; a process mpirun left behind may
# hold its output open, so they get 5 s.
for _ in 1 2 3 4 5; do
  alive=()
  for watcher in "${watchers[@]}"; do
    if kill -0 "$watcher" 2>/dev/null; then alive+=("$watcher"); fi
  done
  watchers=("${alive[@]}")
  [ ${#watchers[@]} -gt 0 ] || break
  sleep 1
done
if [ ${#watchers[@]} -gt 0 ]; then kill "${watchers[@]}" 2>/dev/null || true; fi
# The launcher's last line names the job's first error (a lost host's name, say), which mpirun's
# own banners, printed last, do not.
if [ -n "$overdue" ]; then
  echo "$overdue" >&2
elif [ -n "$mpirun_failing" ] && [ "$status" != 0 ] && [ -s "$mpirun_failing.first" ]; then
  echo "entrypoint: mpirun exited with status $status; the job's first error:" \
    "$(<"$mpirun_failing.first")" >&2
fi
# The container ends when PID 1 does, killing what still runs. After a signal, give the ranks the
# rest of the grace period to stop cleanly (the trainer writes a checkpoint on SIGTERM).
if [ -n "$whole_container" ] && [ -n "$signalled" ]; then
  while others_running; do sleep 1; done
fi
exit "$status"
