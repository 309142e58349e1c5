#!/usr/bin/env bash
# Follows the training log of a target of k8s/: the MPIJob's launcher (where mpirun collects every
# rank's output), the PyTorchJob's worker 0, or the Job's pod. Waits for it: the MPI Operator
# creates the launcher only once all workers are Ready. Prints the commands it runs.
# Usage: scripts/k8s-logs.sh TARGET   (p3.16xlarge, p3dn.24xlarge, pytorchjob-..., one-node, smoke,
#                                      stage-data)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:?usage: $0 TARGET}
kubectl=${KUBECTL:-kubectl}

# The job's name, from the target as rendered: an MPIJob's launcher is the Job NAME-launcher.
kind="" name=""
read -r kind name < <("$root/scripts/k8s-render.sh" "$target" |
  awk '/^kind: (MPIJob|PyTorchJob|Job)$/ {kind = $2} kind && /^  name: / {print kind, $2; exit}') || true
if [ -z "$name" ]; then
  echo "k8s-logs: $target has no Job, MPIJob or PyTorchJob to follow" >&2
  exit 2
fi
# What to follow: an MPIJob's launcher (mpirun gathers every rank's output), a PyTorchJob's
# worker 0 (global rank 0 logs the run; the other workers' logs: kubectl logs <name>-worker-N).
case "$kind" in
  MPIJob) follow=job/$name-launcher ;;
  PyTorchJob) follow=pod/$name-worker-0 ;;
  *) follow=job/$name ;;
esac

set -x
"$kubectl" get "$kind/$name" -o wide
until "$kubectl" get "$follow" >/dev/null 2>&1; do
  "$kubectl" get pods -l "training.kubeflow.org/job-name=$name" 2>/dev/null || true
  sleep 15
done
"$kubectl" logs -f --pod-running-timeout=30m "$follow"
