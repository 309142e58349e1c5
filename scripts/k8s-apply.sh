#!/usr/bin/env bash
# Renders a target of k8s/ (scripts/k8s-render.sh, same arguments) and applies it to the current
# kubectl context. Refuses while a REPLACE-ME placeholder is left (no --image, or the FSX_*
# variables unset for the fsx target). Prints the commands it runs.
# Usage: scripts/k8s-apply.sh TARGET [--image IMAGE] [--config NAME|FILE] [--workers N]
#   e.g. scripts/k8s-apply.sh p3.16xlarge --image 123456789012.dkr.ecr.us-west-2.amazonaws.com/resnet-trainer:cu126 --workers 4
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:?usage: $0 TARGET [--image IMAGE] [--config NAME|FILE] [--workers N]}
manifest=$root/build/k8s/$target.yaml
mkdir -p "$(dirname "$manifest")"

echo "+ scripts/k8s-render.sh $* > $manifest" >&2
"$root/scripts/k8s-render.sh" "$@" >"$manifest"
if grep -n REPLACE-ME "$manifest" >&2; then
  echo "k8s-apply: $manifest still has placeholders (above). HINT: pass --image REPO:TAG, and for" \
    "the fsx target set FSX_SUBNET_ID, FSX_SECURITY_GROUP_ID and FSX_S3_IMPORT_PATH." >&2
  exit 1
fi
set -x
"${KUBECTL:-kubectl}" apply -f "$manifest"
