#!/usr/bin/env bash
# Waits until COUNT nodes of INSTANCE_TYPE have joined the cluster and are Ready, or TIMEOUT
# seconds (default 1200) have passed. Unlike `kubectl wait node -l ...`, which exits at once with
# "no matching resources found" while a scaled node group's instances are still booting, this
# keeps polling until the nodes register.
# Usage: scripts/k8s/wait_nodes.sh INSTANCE_TYPE COUNT [TIMEOUT_S]
#   e.g. scripts/k8s/wait_nodes.sh p3dn.24xlarge 2
# POLL_S: seconds between looks (default 15).
set -euo pipefail
[ $# -ge 2 ] || {
  sed -n '2,8p' "$0" >&2
  exit 2
}
type=$1 count=$2 timeout=${3:-1200} poll=${POLL_S:-15}
[[ $count =~ ^[1-9][0-9]*$ && $timeout =~ ^[0-9]+$ ]] || {
  echo "error: COUNT must be a positive whole number and TIMEOUT_S a number of seconds" >&2
  exit 2
}
deadline=$((SECONDS + timeout))
while :; do
  # `get nodes` prints NAME STATUS ...; STATUS is Ready, NotReady or Ready,SchedulingDisabled (a
  # cordoned node, not counted). No node yet: "No resources found" on stderr, exit status 0.
  ready=$("${KUBECTL:-kubectl}" get nodes -l "node.kubernetes.io/instance-type=$type" \
    --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)
  if [ "$ready" -ge "$count" ]; then
    echo "$ready $type node(s) Ready"
    exit 0
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "error: $ready of $count $type node(s) Ready after ${timeout} s. Fix: check the node" \
      "group's scaling (eksctl get nodegroup --cluster \$CLUSTER) and its instances' capacity" \
      "in the zone (aws autoscaling describe-scaling-activities), then run this again" >&2
    exit 1
  fi
  sleep "$poll"
done
