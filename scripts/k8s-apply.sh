#!/usr/bin/env bash
# Renders a target of k8s/ (scripts/k8s-render.sh, same arguments) and applies it to the current
# kubectl context. Refuses while a REPLACE-ME placeholder is left (no --image, or the FSX_*
# variables unset for the fsx target), and an FSX_* value that is not an AWS ID or S3 path (an
# `aws ... --output text` look-up that found nothing prints "None"). Prints the commands it runs.
# Usage: scripts/k8s-apply.sh TARGET [--image IMAGE] [--config NAME|FILE] [--workers N]
#   e.g. scripts/k8s-apply.sh p3.16xlarge --image 123456789012.dkr.ecr.us-west-2.amazonaws.com/resnet-trainer:cu126 --workers 4
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:?usage: $0 TARGET [--image IMAGE] [--config NAME|FILE] [--workers N]}
manifest=$root/build/k8s/$target.yaml
mkdir -p "$(dirname "$manifest")"

if [ "$target" = fsx ]; then
  bad=""
  check_fsx() { # NAME PATTERN EXPECTED: a set value must match (unset: a placeholder, below)
    local value=${!1:-}
    if [ -n "$value" ] && [[ ! "$value" =~ $2 ]]; then
      echo "k8s-apply: $1='$value' is not a valid value (expected $3)." >&2
      bad=1
    fi
  }
  check_fsx FSX_SUBNET_ID '^subnet-[0-9a-f]+$' "subnet-..."
  check_fsx FSX_SECURITY_GROUP_ID '^sg-[0-9a-f]+$' "sg-..."
  check_fsx FSX_S3_IMPORT_PATH '^s3://[a-z0-9][-a-z0-9.]*[a-z0-9](/.*)?$' "s3://BUCKET[/PREFIX]"
  if [ -n "$bad" ]; then
    echo "HINT: 'None' means the aws look-up found nothing: for the subnet, check that \$AZ is a" \
      "zone of the cluster's VPC with a private subnet (docs/eks.md, step 3)." >&2
    exit 1
  fi
fi

echo "+ scripts/k8s-render.sh $* > $manifest" >&2
"$root/scripts/k8s-render.sh" "$@" >"$manifest"
if grep -n REPLACE-ME "$manifest" >&2; then
  echo "k8s-apply: $manifest still has placeholders (above). HINT: pass --image REPO:TAG, and for" \
    "the fsx target set FSX_SUBNET_ID, FSX_SECURITY_GROUP_ID and FSX_S3_IMPORT_PATH." >&2
  exit 1
fi
set -x
"${KUBECTL:-kubectl}" apply -f "$manifest"
