#!/usr/bin/env bash
# Renders a target of k8s/ (scripts/k8s/render.sh, same arguments) and applies it to the current
# kubectl context. Refuses while a REPLACE-ME placeholder is left (no --image, or the FSX_*
# variables unset for the fsx and fsx-existing targets), and an FSX_* value that is not an AWS ID,
# DNS name or S3 path (an `aws ... --output text` look-up that found nothing prints "None").
# Prints the commands it runs.
# Usage: scripts/k8s/apply.sh TARGET [--image IMAGE] [--config NAME|FILE] [--workers N]
#   e.g. scripts/k8s/apply.sh p3.16xlarge --image 123456789012.dkr.ecr.us-west-2.amazonaws.com/resnet-trainer:cu126 --workers 4
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${1:?usage: $0 TARGET [--image IMAGE] [--config NAME|FILE] [--workers N]}
manifest=$root/build/k8s/$target.yaml
mkdir -p "$(dirname "$manifest")"

if [ "$target" = fsx ] || [ "$target" = fsx-existing ]; then
  bad=""
  check_fsx() { # NAME PATTERN EXPECTED: a set value must match (unset: a placeholder, below)
    local value=${!1:-}
    if [ -n "$value" ] && [[ ! "$value" =~ $2 ]]; then
      echo "k8s-apply: $1='$value' is not a valid value (expected $3)." >&2
      bad=1
    fi
  }
  s3_path='^s3://[a-z0-9][-a-z0-9.]*[a-z0-9](/.*)?$'
  if [ "$target" = fsx ]; then
    check_fsx FSX_SUBNET_ID '^subnet-[0-9a-f]+$' "subnet-..."
    check_fsx FSX_SECURITY_GROUP_ID '^sg-[0-9a-f]+$' "sg-..."
    check_fsx FSX_S3_IMPORT_PATH "$s3_path" "s3://BUCKET[/PREFIX]"
    check_fsx FSX_S3_EXPORT_PATH "$s3_path" "s3://BUCKET[/PREFIX]"
    # FSx exports only to the bucket it imports from; another leaves the claim Pending, with the
    # error in the CSI controller's log alone.
    import_bucket=${FSX_S3_IMPORT_PATH:-}
    import_bucket=${import_bucket#s3://}
    export_bucket=${FSX_S3_EXPORT_PATH:-s3://${import_bucket}}
    export_bucket=${export_bucket#s3://}
    if [ "${import_bucket%%/*}" != "${export_bucket%%/*}" ]; then
      echo "k8s-apply: FSX_S3_EXPORT_PATH='${FSX_S3_EXPORT_PATH:-}' is not in the bucket of" \
        "FSX_S3_IMPORT_PATH='${FSX_S3_IMPORT_PATH:-}': FSx exports to the import bucket only." >&2
      bad=1
    fi
    hint="for the subnet, check that \$AZ is a zone of the cluster's VPC with a private subnet"
  else
    check_fsx FSX_FILE_SYSTEM_ID '^fs-[0-9a-f]+$' "fs-..."
    check_fsx FSX_DNS_NAME '^fs-[0-9a-f]+\.fsx\.[a-z0-9.-]+$' "fs-....fsx.REGION.amazonaws.com"
    check_fsx FSX_MOUNT_NAME '^[a-z0-9]+$' "the file system's LustreConfiguration.MountName"
    hint="check the file system's ID and AWS_REGION"
  fi
  if [ -n "$bad" ]; then
    echo "HINT: 'None' means the aws look-up found nothing: $hint (docs/eks.md, steps 3 and 5)." >&2
    exit 1
  fi
fi

echo "+ scripts/k8s/render.sh $* > $manifest" >&2
"$root/scripts/k8s/render.sh" "$@" >"$manifest"
if grep -n REPLACE-ME "$manifest" >&2; then
  echo "k8s-apply: $manifest still has placeholders (above). HINT: pass --image REPO:TAG; for" \
    "the fsx target set FSX_SUBNET_ID, FSX_SECURITY_GROUP_ID and FSX_S3_IMPORT_PATH, for" \
    "fsx-existing FSX_FILE_SYSTEM_ID, FSX_DNS_NAME and FSX_MOUNT_NAME." >&2
  exit 1
fi
set -x
"${KUBECTL:-kubectl}" apply -f "$manifest"
