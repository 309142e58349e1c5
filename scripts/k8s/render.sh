#!/usr/bin/env bash
# Renders one of the Kubernetes targets in k8s/ to YAML on stdout, with this run's image, trainer
# config and worker count substituted. Prints the commands it runs, and the kustomization it
# writes, on stderr. scripts/k8s/apply.sh and scripts/k8s/delete.sh use it. A training job is
# first planned by the trainer (TRAIN, default build/train) at its world size: one that cannot
# start is refused with exit 2 and the trainer's fix, before anything is applied.
#
# Usage: scripts/k8s/render.sh TARGET [--image IMAGE] [--config NAME|FILE] [--workers N] [--slots N]
#                                      [--min-workers N] [--max-workers N] [--no-plan]
#        scripts/k8s/render.sh --list   (the targets, one a line)
#   TARGET      p3.16xlarge | p3dn.24xlarge | p4d.24xlarge | p5.48xlarge
#                                             multi-node MPIJob (k8s/overlays/TARGET)
#               pytorchjob-p3.16xlarge | pytorchjob-p3dn.24xlarge | pytorchjob-p4d.24xlarge |
#               pytorchjob-p5.48xlarge        elastic PyTorchJob, torchrun (k8s/pytorchjob/...)
#               trainjob-p3.16xlarge | trainjob-p3dn.24xlarge | trainjob-p4d.24xlarge |
#               trainjob-p5.48xlarge          fixed-size TrainJob, Kubeflow Trainer v2, torchrun
#                                             (k8s/trainjob/...)
#               allreduce-p3.16xlarge | ... | allreduce-p5.48xlarge
#                                             the acceptance test of the nodes' network before
#                                             training: the MPIJob of that node type running
#                                             bench-allreduce instead of train, which fails below
#                                             the bus bandwidth the node type must reach
#               one-node | smoke | stage-data batch/v1 Jobs (k8s/jobs/TARGET)
#               tensorboard                   TensorBoard over /fsx/runs (k8s/tensorboard)
#               fsx                           a new file system: StorageClass + PVC (k8s/fsx); reads
#                                             FSX_SUBNET_ID, FSX_SECURITY_GROUP_ID,
#                                             FSX_S3_IMPORT_PATH, FSX_S3_EXPORT_PATH (default: the
#                                             import path's bucket)
#               fsx-existing                  an existing file system: PV (Retain) + PVC
#                                             (k8s/fsx-existing); reads FSX_FILE_SYSTEM_ID,
#                                             FSX_DNS_NAME, FSX_MOUNT_NAME
#               kueue                         Kueue's queue for the MPIJobs: ResourceFlavors, the
#                                             ClusterQueue gpu-nodes, the LocalQueue training (k8s/kueue)
#               trainer-runtime               the TrainJobs' ClusterTrainingRuntime (k8s/trainjob/runtime)
#   --image     the image to run (default: $IMAGE; unset leaves a REPLACE-ME placeholder)
#   --config    configs/NAME.toml, or any FILE (default: the one the target's kustomization names)
#   --workers   MPIJob, PyTorchJob or TrainJob workers (nodes); an MPIJob's -np becomes workers x
#               slots
#   --slots     ranks per node, one per GPU (default 8): an MPIJob's slotsPerWorker, a PyTorchJob's
#               nprocPerNode, a TrainJob's numProcPerNode, one-node's -np, and the GPUs each such
#               pod requests; fewer for smaller nodes or a CPU rehearsal
#   --min-workers, --max-workers
#               the bounds a PyTorchJob's workers may shrink to and grow to (elasticPolicy)
#   --no-plan   no plan of the job (scripts/k8s/delete.sh: deleting a job needs none)
# KUBECTL names the kubectl to use (default: kubectl); KUBECTL=kustomize uses a standalone kustomize.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
usage() { sed -n '8,45p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
# Every target; the tests render and check each one (tests/deploy), so a new one is checked too.
mpijobs=(p3.16xlarge p3dn.24xlarge p4d.24xlarge p5.48xlarge)
targets=("${mpijobs[@]}" "${mpijobs[@]/#/pytorchjob-}" "${mpijobs[@]/#/trainjob-}"
  "${mpijobs[@]/#/allreduce-}" one-node smoke stage-data tensorboard fsx fsx-existing kueue
  trainer-runtime)
# The bus bandwidth (GB/s) bench-allreduce must reach at 2 GiB on 2 or more nodes of each type:
# about half of what NCCL's all_reduce_perf reaches there, and above what NCCL over TCP reaches
# on the same nodes, so that a job that fell back from EFA to TCP fails. Published 2-node figures:
# p3dn 10 GB/s (NVIDIA/nccl#235) against 41 Gbps, 5 GB/s, over TCP (NVIDIA/nccl#209); p4d 57
# (NVIDIA/nccl#527); p5 438 on EKS (aws-samples/awsome-distributed-training,
# micro-benchmarks/nccl-tests). p3.16xlarge has TCP alone: its 25 Gbps link carries 3.1 GB/s.
declare -A min_busbw=([p3.16xlarge]=1.5 [p3dn.24xlarge]=7 [p4d.24xlarge]=25 [p5.48xlarge]=200)

target=${1:-}
if [ -z "$target" ] || [ "$target" = --help ]; then usage; fi
if [ "$target" = --list ]; then printf '%s\n' "${targets[@]}"; exit 0; fi
shift
image=${IMAGE:-}
config=""
workers=""
slots=""
min_workers=""
max_workers=""
plan=1
while [ $# -gt 0 ]; do
  case "$1" in
    --image) image=${2:?--image needs a value}; shift 2 ;;
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --workers) workers=${2:?--workers needs a value}; shift 2 ;;
    --slots) slots=${2:?--slots needs a value}; shift 2 ;;
    --min-workers) min_workers=${2:?--min-workers needs a value}; shift 2 ;;
    --max-workers) max_workers=${2:?--max-workers needs a value}; shift 2 ;;
    --no-plan) plan=; shift ;;
    *) echo "k8s-render: unknown option $1" >&2; usage ;;
  esac
done

case "$target" in
  p3.16xlarge | p3dn.24xlarge | p4d.24xlarge | p5.48xlarge) dir=k8s/overlays/$target ;;
  allreduce-p3.16xlarge | allreduce-p3dn.24xlarge | allreduce-p4d.24xlarge | \
    allreduce-p5.48xlarge) dir=k8s/overlays/${target#allreduce-} ;;
  pytorchjob-p3.16xlarge | pytorchjob-p3dn.24xlarge | pytorchjob-p4d.24xlarge | \
    pytorchjob-p5.48xlarge) dir=k8s/pytorchjob/${target#pytorchjob-} ;;
  trainjob-p3.16xlarge | trainjob-p3dn.24xlarge | trainjob-p4d.24xlarge | trainjob-p5.48xlarge)
    dir=k8s/trainjob/${target#trainjob-} ;;
  trainer-runtime) dir=k8s/trainjob/runtime ;;
  one-node | smoke | stage-data) dir=k8s/jobs/$target ;;
  tensorboard | fsx | fsx-existing | kueue) dir=k8s/$target ;;
  *) echo "k8s-render: unknown target '$target'" >&2; usage ;;
esac
for option in workers slots min_workers max_workers; do
  value=${!option}
  if [ -n "$value" ] && [[ ! "$value" =~ ^[1-9][0-9]*$ ]]; then
    echo "k8s-render: --${option/_/-} must be a positive integer, got '$value'" >&2
    exit 2
  fi
done
multi_node=""
if [[ "$dir" == k8s/overlays/* || "$target" == pytorchjob-* || "$target" == trainjob-* ]]; then
  multi_node=1
fi
if [ -n "$workers" ] && [ -z "$multi_node" ]; then
  echo "k8s-render: --workers applies to the MPIJob, PyTorchJob and TrainJob targets only" >&2
  exit 2
fi
if [ -n "$slots" ] && [ -z "$multi_node" ] && [ "$target" != one-node ]; then
  echo "k8s-render: --slots applies to the MPIJob, PyTorchJob and TrainJob targets and one-node" \
    "only" >&2
  exit 2
fi
if [ -n "$min_workers$max_workers" ] && [[ "$target" != pytorchjob-* ]]; then
  echo "k8s-render: --min-workers and --max-workers apply to the PyTorchJob targets only" >&2
  exit 2
fi

# The kustomization for this run lives in a folder of its own, build/k8s/TARGET.XXXXXX, three
# levels below the root, and builds on k8s/... by a relative path (kustomize accepts no absolute
# ones). Its own: two renders of a target at once (the tests, two users) would otherwise write
# each other's settings.
mkdir -p "$root/build/k8s"
out=$(mktemp -d "$root/build/k8s/$target.XXXXXX")
trap 'rm -rf "$out"' EXIT
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
# Values of the target as rendered (in $rendered): an MPIJob's workers and slots per worker, and
# the first value of a key anywhere (a PyTorchJob's replicas, nprocPerNode, minReplicas, ...).
mpijob_workers() { awk '/^    Worker:/ {w = 1} w && /^      replicas:/ {print $2; exit}' <<<"$rendered"; }
mpijob_slots() { awk '/^  slotsPerWorker:/ {print $2; exit}' <<<"$rendered"; }
rendered_value() { awk -v key="$1:" '$1 == key {gsub(/"/, "", $2); print $2; exit}' <<<"$rendered"; }
# patches_list: the kustomization's one `patches:` list, begun by the first patch.
patches_list() {
  grep -q '^patches:' "$out/kustomization.yaml" || echo "patches:" >>"$out/kustomization.yaml"
}
# patch KIND NAME OP PATH VALUE [OP PATH VALUE]...: a JSON patch of the target's KIND (of that
# NAME; '' for any) into the kustomization, one operation per OP PATH VALUE. VALUE is written as
# given, so a string that YAML would read as a number comes quoted ("\"8\"").
patch() {
  local kind=$1 name=$2
  shift 2
  patches_list
  {
    printf -- '- target:\n    kind: %s\n' "$kind"
    [ -z "$name" ] || printf '    name: %s\n' "$name"
    printf '  patch: |-\n'
    while [ "$#" -ge 3 ]; do
      printf '    - op: %s\n      path: %s\n      value: %s\n' "$1" "$2" "$3"
      shift 3
    done
  } >>"$out/kustomization.yaml"
}

{
  echo "# Written by scripts/k8s/render.sh $target: $dir with this run's settings."
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
  # Exports go to the import bucket (FSx allows no other), by default to its root: /fsx/runs/RUN
  # becomes s3://BUCKET/runs/RUN.
  import_bucket=${FSX_S3_IMPORT_PATH:-s3://REPLACE-ME}
  import_bucket=${import_bucket#s3://}
  import_bucket=s3://${import_bucket%%/*}
  patch StorageClass fsx-sc \
    replace "/parameters/subnetId" "${FSX_SUBNET_ID:-subnet-REPLACE-ME}" \
    replace "/parameters/securityGroupIds" "${FSX_SECURITY_GROUP_ID:-sg-REPLACE-ME}" \
    replace "/parameters/s3ImportPath" "${FSX_S3_IMPORT_PATH:-s3://REPLACE-ME}" \
    replace "/parameters/s3ExportPath" "${FSX_S3_EXPORT_PATH:-$import_bucket}"
fi

if [ "$target" = fsx-existing ]; then
  # The existing file system the volume names (aws fsx describe-file-systems: FileSystemId,
  # DNSName, LustreConfiguration.MountName). Quoted: a mount name may be all digits.
  patch PersistentVolume fsx-pv \
    replace "/spec/csi/volumeHandle" "\"${FSX_FILE_SYSTEM_ID:-fs-REPLACE-ME}\"" \
    replace "/spec/csi/volumeAttributes/dnsname" "\"${FSX_DNS_NAME:-REPLACE-ME}\"" \
    replace "/spec/csi/volumeAttributes/mountname" "\"${FSX_MOUNT_NAME:-REPLACE-ME}\""
fi

gpus=/resources/limits/nvidia.com~1gpu
if [[ "$dir" == k8s/overlays/* ]] && [ -n "$workers$slots" ]; then
  # -np must equal workers x slotsPerWorker: what is not given comes from the target as rendered.
  rendered=$(kustomize_build "$out")
  [ -n "$workers" ] || workers=$(mpijob_workers)
  [ -n "$slots" ] || slots=$(mpijob_slots)
  patch MPIJob resnet50 \
    replace "/spec/mpiReplicaSpecs/Worker/replicas" "$workers" \
    replace "/spec/slotsPerWorker" "$slots" \
    replace "/spec/mpiReplicaSpecs/Worker/template/spec/containers/0$gpus" "$slots" \
    test "/spec/mpiReplicaSpecs/Launcher/template/spec/containers/0/args/0" -np \
    replace "/spec/mpiReplicaSpecs/Launcher/template/spec/containers/0/args/1" "\"$((workers * slots))\""
elif [[ "$target" == pytorchjob-* ]] && [ -n "$workers$slots$min_workers$max_workers" ]; then
  # What is not given comes from the target as rendered; the workers must lie within the bounds.
  rendered=$(kustomize_build "$out")
  [ -n "$workers" ] || workers=$(rendered_value replicas)
  [ -n "$slots" ] || slots=$(rendered_value nprocPerNode)
  [ -n "$min_workers" ] || min_workers=$(rendered_value minReplicas)
  [ -n "$max_workers" ] || max_workers=$(rendered_value maxReplicas)
  if [ "$min_workers" -gt "$workers" ] || [ "$workers" -gt "$max_workers" ]; then
    echo "k8s-render: $workers workers lie outside the elastic bounds [$min_workers, $max_workers]." \
      "HINT: give --min-workers and --max-workers too" >&2
    exit 2
  fi
  patch PyTorchJob resnet50-elastic \
    replace "/spec/pytorchReplicaSpecs/Worker/replicas" "$workers" \
    replace "/spec/elasticPolicy/minReplicas" "$min_workers" \
    replace "/spec/elasticPolicy/maxReplicas" "$max_workers" \
    replace "/spec/nprocPerNode" "\"$slots\"" \
    replace "/spec/pytorchReplicaSpecs/Worker/template/spec/containers/0$gpus" "$slots"
elif [[ "$target" == trainjob-* ]] && [ -n "$workers$slots" ]; then
  # What is not given comes from the target as rendered.
  rendered=$(kustomize_build "$out")
  [ -n "$workers" ] || workers=$(rendered_value numNodes)
  [ -n "$slots" ] || slots=$(rendered_value numProcPerNode)
  patch TrainJob resnet50-torch \
    replace "/spec/trainer/numNodes" "$workers" \
    replace "/spec/trainer/numProcPerNode" "$slots" \
    replace "/spec/trainer/resourcesPerNode/limits/nvidia.com~1gpu" "$slots"
elif [ "$target" = one-node ] && [ -n "$slots" ]; then
  patch Job '' \
    replace "/spec/template/spec/containers/0$gpus" "$slots" \
    test "/spec/template/spec/containers/0/args/0" -np \
    replace "/spec/template/spec/containers/0/args/1" "\"$slots\""
fi

if [[ "$target" == allreduce-* ]]; then
  # The launcher's `train --config FILE`, the last of mpirun's arguments, becomes the all-reduce
  # sweep to 2 GiB with the node type's gate; the job is resnet50-allreduce, so that it can run
  # beside a training job. Everything else (nodes, -np, slots, network settings) is the target's.
  rendered=$(kustomize_build "$out")
  at=$(awk '/^    Launcher:/ {l = 1} /^    Worker:/ {l = 0}
            l && /^ *- args:$/ {a = 1; i = 0; next}
            l && a && /^ *- / {if ($2 == "/opt/resnet-trainer/bin/train") {print i; exit}; i++; next}
            l && a {a = 0}' <<<"$rendered")
  [ -n "$at" ] || { echo "k8s-render: no train among the launcher's arguments" >&2; exit 1; }
  patches_list
  args=/spec/mpiReplicaSpecs/Launcher/template/spec/containers/0/args
  cat >>"$out/kustomization.yaml" <<EOF
- target:
    kind: MPIJob
    name: resnet50
  patch: |-
    - {op: test, path: $args/$at, value: /opt/resnet-trainer/bin/train}
    - {op: test, path: $args/$((at + 1)), value: --config}
    - {op: replace, path: $args/$at, value: /opt/resnet-trainer/bin/bench-allreduce}
    - {op: replace, path: $args/$((at + 1)), value: --min-bytes}
    - {op: replace, path: $args/$((at + 2)), value: 1M}
    - {op: add, path: $args/-, value: --max-bytes}
    - {op: add, path: $args/-, value: 2G}
    - {op: add, path: $args/-, value: --min-busbw}
    - {op: add, path: $args/-, value: "${min_busbw[${target#allreduce-}]}"}
nameSuffix: -allreduce
EOF
fi

sed 's/^/  | /' "$out/kustomization.yaml" >&2
rendered=$(kustomize_build "$out")

# The run's plan at the world size the job starts with (an elastic job: at each of its bounds),
# by the trainer itself: a job that cannot start is refused here, before anything is applied and
# before any node is billed. TRAIN names the binary (default: build/train); without one the plan
# is skipped, with a warning.
plan_world_sizes() {
  local per_pod
  case "$target" in
    p[0-9]*) echo $(($(mpijob_workers) * $(mpijob_slots))) ;;
    pytorchjob-*)
      per_pod=$(rendered_value nprocPerNode)
      printf '%s\n' $(($(rendered_value minReplicas) * per_pod)) \
        $(($(rendered_value replicas) * per_pod)) $(($(rendered_value maxReplicas) * per_pod)) |
        sort -nu ;;
    trainjob-*) echo $(($(rendered_value numNodes) * $(rendered_value numProcPerNode))) ;;
    one-node) awk '$1 == "-" && $2 == "-np" {getline; gsub(/"/, "", $2); print $2; exit}' <<<"$rendered" ;;
  esac
}
train=${TRAIN:-$root/build/train}
sizes=""
if [ -n "$plan" ]; then sizes=$(plan_world_sizes); fi
if [ -n "$sizes" ] && [ ! -x "$train" ]; then
  echo "k8s-render: WARNING: no $train to check the run's plan; build it (scripts/build.sh) or" \
    "set TRAIN, so that a job that cannot start is refused before it is applied" >&2
elif [ -n "$sizes" ]; then
  # The trainer config as the job's ConfigMap holds it.
  awk '/^  trainer.toml: \|/ {grab = 1; next}
       grab && /^    / {sub(/^    /, ""); print; next}
       grab && !/^ *$/ {exit}
       grab {print}' <<<"$rendered" >"$out/planned.toml"
  for n in $sizes; do
    echo "+ $train --config $out/planned.toml --plan_world_size $n" >&2
    if ! "$train" --config "$out/planned.toml" --plan_world_size "$n" >&2; then
      echo "k8s-render: the job cannot start at $n ranks (above); nothing rendered" >&2
      exit 2
    fi
  done
fi
printf '%s\n' "$rendered"
