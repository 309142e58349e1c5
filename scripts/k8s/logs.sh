#!/usr/bin/env bash
# Follows the training log of a target of k8s/: the MPIJob's launcher (where mpirun collects every
# rank's output), the PyTorchJob's worker 0, or the Job's pod. Waits for it: the MPI Operator
# creates the launcher only once all workers are Ready: up to LOGS_WAIT_S seconds (default 1800),
# then it stops and says where to look. Prints the commands it runs.
# Usage: scripts/k8s/logs.sh TARGET [--once]   (p3.16xlarge, p3dn.24xlarge, pytorchjob-...,
#                                               trainjob-..., one-node, smoke, stage-data)
#   --once   print what is logged so far and return: no waiting, no following
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${1:?usage: $0 TARGET [--once]}
once=""
case "${2:-}" in
  "") ;;
  --once) once=1 ;;
  *) echo "k8s-logs: unknown option $2" >&2; exit 2 ;;
esac
kubectl=${KUBECTL:-kubectl}

# The job's name, from the target as rendered: an MPIJob's launcher is the Job NAME-launcher.
kind="" name=""
read -r kind name < <("$root/scripts/k8s/render.sh" "$target" |
  awk '/^kind: (MPIJob|PyTorchJob|TrainJob|Job)$/ {kind = $2}
       kind && /^  name: / {print kind, $2; exit}') || true
if [ -z "$name" ]; then
  echo "k8s-logs: $target has no Job, MPIJob, PyTorchJob or TrainJob to follow" >&2
  exit 2
fi
# What to follow: an MPIJob's launcher (mpirun gathers every rank's output), a PyTorchJob's
# worker 0 (global rank 0 logs the run; the other workers' logs: kubectl logs <name>-worker-N),
# a TrainJob's first node, whose pod has a generated name: by its JobSet's and index's labels.
pods="training.kubeflow.org/job-name=$name"
case "$kind" in
  MPIJob) follow=(job/"$name"-launcher) ;;
  PyTorchJob) follow=(pod/"$name"-worker-0) ;;
  TrainJob)
    pods="jobset.sigs.k8s.io/jobset-name=$name"
    follow=(-l "$pods,batch.kubernetes.io/job-completion-index=0") ;;
  *) follow=(job/"$name") ;;
esac
# Whether it exists yet: a name is found or not; a selector finds nothing without an error.
exists() {
  if [ "$kind" = TrainJob ]; then
    [ -n "$("$kubectl" get pods "${follow[@]}" -o name 2>/dev/null)" ]
  else
    "$kubectl" get "${follow[@]}" >/dev/null 2>&1
  fi
}

if [ -n "$once" ]; then
  set -x
  exec "$kubectl" logs "${follow[@]}"
fi
set -x
"$kubectl" get "$kind/$name" -o wide
deadline=$((SECONDS + ${LOGS_WAIT_S:-1800}))
until exists; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    set +x
    echo "k8s-logs: no ${follow[*]} after ${LOGS_WAIT_S:-1800} s. HINT: kubectl describe $kind/$name" \
      "and kubectl get pods: Pending pods wait for nodes (is the node group scaled up? see" \
      "docs/eks.md), ImagePullBackOff names the image." >&2
    exit 1
  fi
  "$kubectl" get pods -l "$pods" 2>/dev/null || true
  sleep 15
done
"$kubectl" logs -f --pod-running-timeout=30m "${follow[@]}"
