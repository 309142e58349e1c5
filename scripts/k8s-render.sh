#!/usr/bin/env bash
# Renders one of the Kubernetes targets in k8s/ to YAML on stdout, with this run's image, trainer
# config and worker count substituted. Prints the commands it runs, and the kustomization it
# writes, on stderr. scripts/k8s-apply.sh and scripts/k8s-delete.sh use it.
#
# Usage: scripts/k8s-render.sh TARGET [--image IMAGE] [--config NAME|FILE] [--workers N]
#   TARGET      p3.16xlarge | p3dn.24xlarge   multi-node MPIJob (k8s/overlays/TARGET)
#               one-node | smoke | stage-data batch/v1 Jobs (k8s/jobs/TARGET)
#               fsx                           StorageClass + PVC (k8s/fsx); reads FSX_SUBNET_ID,
#                                             FSX_SECURITY_GROUP_ID, FSX_S3_IMPORT_PATH
#   --image     the image to run (default: $IMAGE; unset leaves a REPLACE-ME placeholder)
#   --config    configs/NAME.toml, or any FILE (default: the one the target's kustomization names)
#   --workers   MPIJob workers (nodes); -np becomes workers x slotsPerWorker
# KUBECTL names the kubectl to use (default: kubectl); KUBECTL=kustomize uses a standalone kustomize.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage() { sed -n '6,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

target=${1:-}
if [ -z "$target" ] || [ "$target" = --help ]; then usage; fi
shift
image=${IMAGE:-}
config=""
workers=""
while [ $# -gt 0 ]; do
  case "$1" in
    --image) image=${2:?--image needs a value}; shift 2 ;;
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --workers) workers=${2:?--workers needs a value}; shift 2 ;;
    *) echo "k8s-render: unknown option $1" >&2; usage ;;
  esac
done

case "$target" in
  p3.16xlarge | p3dn.24xlarge) dir=k8s/overlays/$target ;;
  one-node | smoke | stage-data) dir=k8s/jobs/$target ;;
  fsx) dir=k8s/fsx ;;
  *) echo "k8s-render: unknown target '$target'" >&2; usage ;;
esac
if [ -n "$workers" ] && [[ ! "$workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "k8s-render: --workers must be a positive integer, got '$workers'" >&2
  exit 2
fi

# The kustomization for this run lives in build/k8s/TARGET, three levels below the root, and
# builds on k8s/... by a relative path (kustomize accepts no absolute ones).
out=$root/build/k8s/$target
mkdir -p "$out"
kubectl=${KUBECTL:-kubectl}
kustomize_build() {
  # LoadRestrictionsNone: the kustomizations read the trainer configs from configs/, outside k8s/.
  if [ "$(basename "$kubectl")" = kustomize ]; then
    echo "+ $kubectl build --load-restrictor LoadRestrictionsNone $1" >&2
    "$kubectl" build --load-restrictor LoadRestrictionsNone "$1"
  else
    echo "+ $kubectl kustomize --load-restrictor LoadRestrictionsNone $1" >&2
    "$kubectl" kustomize --load-restrictor LoadRestrictionsNone "$1"
  fi
}

{
  echo "# Written by scripts/k8s-render.sh $target: $dir with this run's settings."
  echo "apiVersion: kustomize.config.k8s.io/v1beta1"
  echo "kind: Kustomization"
  echo "resources:"
  echo "- ../../../$dir"
  echo "images:"
  echo "- name: resnet-trainer"
  echo "  newName: ${image:-REPLACE-ME/resnet-trainer}"
} >"$out/kustomization.yaml"

if [ -n "$config" ]; then
  [ -f "$config" ] || config=$root/configs/${config%.toml}.toml
  if [ ! -f "$config" ]; then
    echo "k8s-render: no config $config. HINT: the configs are:" "$root"/configs/*.toml >&2
    exit 1
  fi
  cp "$config" "$out/trainer.toml"
  cat >>"$out/kustomization.yaml" <<EOF
configMapGenerator:
- name: trainer-config
  behavior: replace
  files:
  - trainer.toml
EOF
fi

if [ "$target" = fsx ]; then
  cat >>"$out/kustomization.yaml" <<EOF
patches:
- target:
    kind: StorageClass
    name: fsx-sc
  patch: |-
    - op: replace
      path: /parameters/subnetId
      value: ${FSX_SUBNET_ID:-subnet-REPLACE-ME}
    - op: replace
      path: /parameters/securityGroupIds
      value: ${FSX_SECURITY_GROUP_ID:-sg-REPLACE-ME}
    - op: replace
      path: /parameters/s3ImportPath
      value: ${FSX_S3_IMPORT_PATH:-s3://REPLACE-ME}
EOF
fi

if [ -n "$workers" ]; then
  if [[ "$target" != p3* ]]; then
    echo "k8s-render: --workers applies to the MPIJob targets (p3.16xlarge, p3dn.24xlarge) only" >&2
    exit 2
  fi
  # -np must equal workers x slotsPerWorker: read the slots from the target as rendered so far.
  slots=$(kustomize_build "$out" | awk '/^  slotsPerWorker:/ {print $2; exit}')
  cat >>"$out/kustomization.yaml" <<EOF
patches:
- target:
    kind: MPIJob
    name: resnet50
  patch: |-
    - op: replace
      path: /spec/mpiReplicaSpecs/Worker/replicas
      value: $workers
    - op: test
      path: /spec/mpiReplicaSpecs/Launcher/template/spec/containers/0/args/0
      value: -np
    - op: replace
      path: /spec/mpiReplicaSpecs/Launcher/template/spec/containers/0/args/1
      value: "$((workers * slots))"
EOF
fi

sed 's/^/  | /' "$out/kustomization.yaml" >&2
kustomize_build "$out"
