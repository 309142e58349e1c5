#!/usr/bin/env bash
# Says whether NCCL really uses EFA in a running P3dn, P4d or P5 job, from its log so far
# (scripts/k8s/logs.sh TARGET --once): exit 0 when aws-ofi-nccl selected the efa provider, 1
# otherwise, naming what it found instead. Without EFA NCCL falls back to TCP sockets with no
# error, only slower (aws-ofi-nccl's src/platform-aws.cpp); the plugin can also select efa and
# then give it up (v1.21 does with a libfabric older than 1.22), after which NCCL logs "Using
# network Socket". Older releases of the plugin log "Selected Provider is efa", newer ones
# "Selected provider is efa, fabric is ...", so the match ignores case; the line appears once
# NCCL has started (the first collective) with NCCL_DEBUG=INFO, which the EFA targets set.
# Usage: scripts/k8s/check_efa.sh [TARGET]   (default: p3dn.24xlarge; or p4d.24xlarge,
#        p5.48xlarge, pytorchjob-..., trainjob-...)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${1:-p3dn.24xlarge}

log=$("$root/scripts/k8s/logs.sh" "$target" --once) || {
  echo "k8s-check-efa: no log from $target yet (above). HINT: wait for the job to start" >&2
  exit 1
}
selected=$(grep -i -o -m1 'selected provider is [a-z0-9_;+-]*' <<<"$log" || true)
network=$(grep -o -m1 'Using network [A-Za-z0-9 _-]*' <<<"$log" || true)
provider=$(awk '{print tolower($4)}' <<<"$selected")
if [ "$provider" = efa ] && [[ "$network" != *Socket* ]]; then
  echo "k8s-check-efa: $target uses EFA ('$selected')."
  exit 0
fi
if [ "$provider" = efa ]; then
  echo "k8s-check-efa: $target does NOT use EFA: aws-ofi-nccl selected efa, then NCCL logged" \
    "'$network' (TCP). HINT: the plugin's WARN lines above say why; a libfabric older than" \
    "aws-ofi-nccl wants (the EFA installer's) is one cause" >&2
  exit 1
fi
if [ -n "$selected" ]; then
  echo "k8s-check-efa: $target does NOT use EFA: aws-ofi-nccl selected '$provider'." \
    "HINT: FI_PROVIDER=efa, and the EFA device (vpc.amazonaws.com/efa) in the pod's limits" >&2
elif [[ "$network" == *Socket* ]]; then
  echo "k8s-check-efa: $target does NOT use EFA: NCCL logged '$network' (TCP), so it found no" \
    "aws-ofi-nccl plugin. HINT: the image must be the EFA variant (scripts/image/build.sh --efa)" >&2
elif [ -n "$network" ]; then
  echo "k8s-check-efa: $target does NOT show EFA: NCCL logged '$network' but aws-ofi-nccl named" \
    "no provider. HINT: NCCL_DEBUG=INFO in the job's environment shows the plugin's choice" >&2
else
  echo "k8s-check-efa: $target's log has no NCCL network line yet. HINT: NCCL logs it at its" \
    "first collective with NCCL_DEBUG=INFO; run this again once the job has started" >&2
fi
exit 1
