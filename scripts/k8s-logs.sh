#!/usr/bin/env bash
# Follows the training log of a target of k8s/: the MPIJob's launcher (where mpirun collects every
# rank's output) or the Job's pod. Waits for the launcher, which the MPI Operator creates only
# once all workers are Ready. Prints the commands it runs.
# Usage: scripts/k8s-logs.sh TARGET   (p3.16xlarge, p3dn.24xlarge, one-node, smoke, stage-data)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:?usage: $0 TARGET}
kubectl=${KUBECTL:-kubectl}

# The job's name, from the target as rendered: an MPIJob's launcher is the Job NAME-launcher.
kind="" name=""
read -r kind name < <("$root/scripts/k8s-render.sh" "$target" |
  awk '/^kind: (MPIJob|Job)$/ {kind = $2} kind && /^  name: / {print kind, $2; exit}') || true
if [ -z "$name" ]; then
  echo "k8s-logs: $target has no Job or MPIJob to follow" >&2
  exit 2
fi
job=$name
[ "$kind" = MPIJob ] && job=$name-launcher

set -x
"$kubectl" get "$kind/$name" -o wide
until "$kubectl" get "job/$job" >/dev/null 2>&1; do
  "$kubectl" get pods -l "training.kubeflow.org/job-name=$name" 2>/dev/null || true
  sleep 15
done
"$kubectl" logs -f --pod-running-timeout=30m "job/$job"
