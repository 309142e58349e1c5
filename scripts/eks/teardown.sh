#!/usr/bin/env bash
# Tears down what docs/eks.md created, in an order that works, and ends by listing anything left
# that AWS still bills. Every wait has a deadline (TEARDOWN_WAIT_S seconds each, default 1200).
#   0. before anything is deleted: a file system that goes with its claim (k8s/fsx, reclaim policy
#      Delete) takes the runs on it along; unless they are in S3 it stops here, exit 2, naming
#      them and the fix (scripts/eks/export.sh). In S3 means: no pod of the trainer still running,
#      and either a data repository association that exports /runs automatically, or an export
#      task of all of runs/ that succeeded after the last of the trainer's pods ended. A file
#      system whose volume is kept (k8s/fsx-existing, Retain) is never deleted, so not checked;
#   1. every target of k8s/ but fsx and fsx-existing (jobs, MPIJobs, PyTorchJobs, TensorBoard),
#      then waits until no pod uses fsx-claim: a pod that still mounts it holds the claim's
#      finalizer, and deleting the claim would wait forever;
#   2. the claim: with fsx, the FSx file system goes too (the CSI driver deletes it once the
#      volume is released), and it waits until the file system and its network interfaces are
#      gone; with fsx-existing only the claim and the volume object go, the file system stays;
#   3. the FSx security group, before the cluster: eksctl deletes the VPC, which fails with
#      DependencyViolation while a group it did not make is in it (eksctl#616); kept while a
#      kept file system uses it;
#   4. the cluster (eksctl: node groups, add-ons, IAM service accounts, the VPC), then the ECR
#      repository;
#   5. lists what is left and billed in the cluster's VPC and region (FSx file systems, instances,
#      NAT gateways, security groups, eksctl's stacks, node groups); exit 1 when anything is.
# The S3 bucket with the dataset (and the exported runs) is kept, and so is a kept file system:
# both are listed with the command that deletes them.
# Usage: CLUSTER=... AWS_REGION=... [FSX_SECURITY_GROUP_ID=sg-...] [BUCKET=...] \
#          scripts/eks/teardown.sh [--discard-unexported-runs]
#   --discard-unexported-runs   delete the file system even though its runs are not in S3
#   KEEP_ECR=1   keep the ECR repository resnet-trainer (and its images)
# Prints the commands it runs. KUBECTL, AWS and EKSCTL name the tools (default: their names).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
discard=""
for arg in "$@"; do
  case "$arg" in
    --discard-unexported-runs) discard=1 ;;
    *)
      echo "eks-teardown: unknown argument '$arg'. HINT: the one option is" \
        "--discard-unexported-runs; the rest comes from the environment (see the script's head)" >&2
      exit 2 ;;
  esac
done
: "${CLUSTER:?set CLUSTER, the name of the cluster, as in docs/eks.md}"
: "${AWS_REGION:?set AWS_REGION}"
kubectl=${KUBECTL:-kubectl}
aws=${AWS:-aws}
eksctl=${EKSCTL:-eksctl}
wait_s=${TEARDOWN_WAIT_S:-1200}
export AWS_REGION KUBECTL=$kubectl
run() {
  echo "+ $*" >&2
  "$@"
}
# wait_until DESCRIPTION COMMAND...: polls COMMAND (success = done) every 10 s up to wait_s.
wait_until() {
  local what=$1 deadline=$((SECONDS + wait_s))
  shift
  until "$@"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "eks-teardown: still waiting for $what after $wait_s s; stopping here so that nothing" \
        "later fails half-way. HINT: see why, then run this again (it skips what is gone)." >&2
      exit 1
    fi
    sleep "${POLL_S:-10}"
  done
}

# Credentials first: a failed look-up below must mean "no such cluster", not "not signed in".
"$aws" sts get-caller-identity --query Account --output text >/dev/null
vpc=$("$aws" eks describe-cluster --name "$CLUSTER" --query cluster.resourcesVpcConfig.vpcId \
  --output text 2>/dev/null) || vpc=""
[[ "$vpc" == vpc-* ]] || vpc=""

# unexported FILE_SYSTEM: prints why the runs on it are not (all) in S3 and succeeds; fails when
# they are. Times compare as text, in UTC: kubectl prints them so, and TZ=UTC makes the aws CLI,
# which prints its own in the local time zone, do the same.
unexported() {
  local file_system=$1 columns pods running last association task created dras tasks whole
  # The trainer's pods (MPIJob launchers included) bound the last write to /fsx/runs: a running one
  # still writes, a finished one wrote until it ended. Kubernetes keeps a finished job's pods for
  # a day (ttlSecondsAfterFinished), so an older job's end is not seen here.
  columns='NAME:.metadata.name,PHASE:.status.phase'
  columns+=',ENDED:.status.containerStatuses[*].state.terminated.finishedAt'
  if ! pods=$("$kubectl" get pods -l app.kubernetes.io/name=resnet-trainer --no-headers \
    -o "custom-columns=$columns"); then
    echo "the trainer's pods could not be listed (above), so nor can the last write be dated"
    return 0
  fi
  running=$(awk '$2 != "Succeeded" && $2 != "Failed" {print $1}' <<<"$pods" | xargs)
  if [ -n "$running" ]; then
    echo "the trainer's pods $running still run and write to /fsx/runs"
    return 0
  fi
  last=$(awk '{n = split($3, t, ",")
               for (i = 1; i <= n; i++) if (t[i] != "<none>" && t[i] > end) {end = t[i]; pod = $1}}
              END {if (end) print end, pod}' <<<"$pods")
  # A data repository association that covers /runs and exports new and changed files itself.
  dras="Lifecycle=='AVAILABLE' && contains(['/', '/runs', '/runs/'], FileSystemPath)"
  dras="$dras && contains(S3.AutoExportPolicy.Events || \`[]\`, 'NEW')"
  dras="$dras && contains(S3.AutoExportPolicy.Events || \`[]\`, 'CHANGED')"
  association=$(TZ=UTC "$aws" fsx describe-data-repository-associations \
    --filters "Name=file-system-id,Values=$file_system" \
    --query "Associations[?$dras] | [0].AssociationId" --output text 2>/dev/null) || association=""
  if [[ "$association" == dra-* ]]; then return 1; fi
  # Else the newest export task of all of runs/ (or of the whole file system) that succeeded
  # without a failed file, and it must have started after the last pod ended.
  tasks="Type=='EXPORT_TO_REPOSITORY' && Lifecycle=='SUCCEEDED' && Status.FailedCount==\`0\`"
  whole="contains(['/', 'runs', '/runs', 'runs/', '/runs/'], @)"  # a path that holds all of runs/
  tasks="$tasks && (!Paths || length(Paths[?$whole]) > \`0\`)"
  if ! task=$(TZ=UTC "$aws" fsx describe-data-repository-tasks \
    --filters "Name=file-system-id,Values=$file_system" --output text \
    --query "sort_by(DataRepositoryTasks[?$tasks], &CreationTime)[-1].[TaskId, CreationTime]"); then
    echo "its export tasks could not be listed (above)"
    return 0
  fi
  read -r task created <<<"$task"
  if [[ "$task" != task-* ]]; then
    echo "no export of all of runs/ to S3 has succeeded on it"
    return 0
  fi
  if [ -n "$last" ] && [[ "${created:0:19}" < "${last:0:19}" ]]; then
    echo "its newest export of runs/ ($task, created $created) is older than the end of" \
      "${last#* } (${last%% *})"
    return 0
  fi
  return 1
}

# The runs a file system holds, as far as the cluster knows them: the output_dir of every
# trainer config here, and of every --output_dir the trainer's pods were given.
runs_here() {
  {
    "$kubectl" get configmaps -o 'jsonpath={range .items[*]}{.data.trainer\.toml}{"\n"}{end}'
    # One argument a line; the one after --output_dir as a config line.
    "$kubectl" get pods -l app.kubernetes.io/name=resnet-trainer \
      -o 'jsonpath={range .items[*].spec.containers[*]}{range .args[*]}{@}{"\n"}{end}{end}' |
      awk 'flag {print "output_dir = \"" $0 "\""} {flag = ($0 == "--output_dir")}'
  } 2>/dev/null | sed -n 's|^output_dir *= *"\(/fsx/runs/[^"]*\)".*|\1|p' | sort -u | xargs
}

# 0. The file system behind the claim (its volume's handle is its ID), and whether deleting the
# claim deletes it. Before anything is deleted, so that a refusal leaves everything as it was.
file_system="" keep=""
if [ -n "$vpc" ]; then
  volume=$("$kubectl" get pvc fsx-claim -o 'jsonpath={.spec.volumeName}' 2>/dev/null) || volume=""
  if [ -n "$volume" ]; then
    file_system=$("$kubectl" get pv "$volume" -o 'jsonpath={.spec.csi.volumeHandle}')
    reclaim=$("$kubectl" get pv "$volume" -o 'jsonpath={.spec.persistentVolumeReclaimPolicy}')
    if [ "$reclaim" != Delete ]; then
      keep=$file_system
      echo "eks-teardown: $file_system stays: its volume $volume is kept ($reclaim), so deleting" \
        "the claim leaves the file system and its runs as they are" >&2
    elif why=$(unexported "$file_system"); then
      runs=$(runs_here)
      if [ -n "$discard" ]; then
        echo "eks-teardown: --discard-unexported-runs: deleting $file_system with the runs on it" \
          "(${runs:-all of /fsx/runs}), which are not all in S3: $why" >&2
      else
        echo "eks-teardown: FSx file system $file_system goes with the claim fsx-claim, and the" \
          "runs on it with it, but they are not all in S3: $why. Its runs:" \
          "${runs:-all of /fsx/runs} (everything under /fsx/runs goes). Nothing was deleted." >&2
        if [[ "$why" == *"still run"* ]]; then
          echo "HINT: let the jobs end, or stop them (scripts/k8s/delete.sh TARGET: the trainer" \
            "checkpoints on SIGTERM); then scripts/eks/export.sh, then run this again. Or delete" \
            "the runs: scripts/eks/teardown.sh --discard-unexported-runs" >&2
        else
          echo "HINT: scripts/eks/export.sh (exports /fsx/runs to S3 and waits), then run this" \
            "again. Or delete the runs: scripts/eks/teardown.sh --discard-unexported-runs" >&2
        fi
        exit 2
      fi
    fi
  fi
fi

# 1. Everything that runs pods. A kind whose operator was never installed has nothing to delete:
# scripts/k8s/delete.sh leaves the kinds the cluster does not serve out.
if [ -n "$vpc" ]; then
  for target in $("$root/scripts/k8s/render.sh" --list); do
    case "$target" in
      fsx | fsx-existing) continue ;;
    esac
    "$root/scripts/k8s/delete.sh" "$target"
  done
  pods_on_claim() {
    local columns='NAME:.metadata.name,CLAIMS:.spec.volumes[*].persistentVolumeClaim.claimName'
    "$kubectl" get pods --no-headers -o "custom-columns=$columns" |
      awk '$2 ~ /(^|,)fsx-claim(,|$)/ {print $1}'
  }
  no_pod_on_claim() { [ -z "$(pods_on_claim)" ]; }
  wait_until "the pods that mount fsx-claim to end ($(pods_on_claim | xargs))" no_pod_on_claim

  # 2. The claim, through the target that made it: fsx's takes the file system along,
  # fsx-existing's leaves it. Then the other target: a StorageClass, or a released volume object.
  storage=(fsx fsx-existing)
  if [ -n "$keep" ]; then storage=(fsx-existing fsx); fi
  claim=""
  if "$kubectl" get pvc fsx-claim >/dev/null 2>&1; then claim=1; fi
  "$root/scripts/k8s/delete.sh" "${storage[0]}"
  if [ -n "$claim" ]; then
    run "$kubectl" wait --for=delete pvc/fsx-claim --timeout="${wait_s}s"
  fi
  "$root/scripts/k8s/delete.sh" "${storage[1]}"
  if [ -n "$file_system" ] && [ -z "$keep" ]; then
    file_system_gone() {
      ! "$aws" fsx describe-file-systems --file-system-ids "$file_system" >/dev/null 2>&1
    }
    wait_until "FSx file system $file_system to be deleted" file_system_gone
  fi
else
  echo "eks-teardown: no cluster $CLUSTER in $AWS_REGION: nothing in Kubernetes to delete" >&2
fi

# 3. The FSx security group, once no network interface uses it.
group=${FSX_SECURITY_GROUP_ID:-}
kept_group=""
if [ -z "$group" ] && [ -n "$vpc" ]; then
  group=$("$aws" ec2 describe-security-groups --filters "Name=vpc-id,Values=$vpc" \
    "Name=group-name,Values=$CLUSTER-fsx" --query 'SecurityGroups[0].GroupId' --output text)
fi
if [[ "$group" == sg-* ]]; then
  unused() {
    [ -z "$("$aws" ec2 describe-network-interfaces --filters "Name=group-id,Values=$group" \
      --query 'NetworkInterfaces[].NetworkInterfaceId' --output text)" ]
  }
  if [ -n "$keep" ] && ! unused; then
    # The kept file system's network interfaces may be what uses it: they never go.
    kept_group=$group
    echo "eks-teardown: kept: security group $group, in use (the kept file system $keep may" \
      "be what uses it)" >&2
  else
    wait_until "the network interfaces in $group to go" unused
    run "$aws" ec2 delete-security-group --group-id "$group" ||
      echo "eks-teardown: could not delete $group (above); listed at the end" >&2
  fi
fi

# 4. The cluster with its node groups, add-ons, IAM service accounts and VPC; the image repository.
if [ -n "$vpc" ]; then
  run "$eksctl" delete cluster --name "$CLUSTER" --region "$AWS_REGION" --wait
fi
if [ -z "${KEEP_ECR:-}" ]; then
  run "$aws" ecr delete-repository --repository-name resnet-trainer --force >/dev/null 2>&1 ||
    echo "eks-teardown: no ECR repository resnet-trainer to delete" >&2
fi

# 5. What is left and billed.
left=0
report() { # WHAT IDS: a kind of resource and what is left of it (--output text: blank-separated)
  local ids
  ids=$(xargs <<<"$2")
  if [ -n "$ids" ] && [ "$ids" != None ]; then
    echo "LEFT, billed: $1: $ids"
    left=1
  fi
}
if [ -n "$vpc" ]; then
  report "FSx file systems in $vpc" "$("$aws" fsx describe-file-systems \
    --query "FileSystems[?VpcId=='$vpc' && FileSystemId!='$keep'].FileSystemId" --output text)"
  report "instances in $vpc" "$("$aws" ec2 describe-instances --filters "Name=vpc-id,Values=$vpc" \
    Name=instance-state-name,Values=pending,running,stopping,stopped \
    --query 'Reservations[].Instances[].InstanceId' --output text)"
  report "NAT gateways in $vpc" "$("$aws" ec2 describe-nat-gateways \
    --filter "Name=vpc-id,Values=$vpc" Name=state,Values=pending,available \
    --query 'NatGateways[].NatGatewayId' --output text)"
  report "security groups in $vpc" "$("$aws" ec2 describe-security-groups \
    --filters "Name=vpc-id,Values=$vpc" --output text \
    --query "SecurityGroups[?GroupName!='default' && GroupId!='$kept_group'].GroupId")"
fi
report "eksctl stacks of $CLUSTER" "$("$aws" cloudformation list-stacks --stack-status-filter \
  CREATE_COMPLETE UPDATE_COMPLETE DELETE_FAILED ROLLBACK_COMPLETE \
  --query "StackSummaries[?starts_with(StackName, 'eksctl-$CLUSTER-')].StackName" --output text)"
# Both fail once the cluster or the repository is gone, which is what is wanted.
report "node groups of $CLUSTER" "$("$aws" eks list-nodegroups --cluster-name "$CLUSTER" \
  --query 'nodegroups[]' --output text 2>/dev/null || true)"
if [ -z "${KEEP_ECR:-}" ]; then
  report "ECR repository" "$("$aws" ecr describe-repositories --repository-names resnet-trainer \
    --query 'repositories[].repositoryName' --output text 2>/dev/null || true)"
fi
if [ -n "${BUCKET:-}" ]; then
  echo "kept: s3://$BUCKET (the dataset and the exported runs; billed for storage)." \
    "To delete it: aws s3 rb s3://$BUCKET --force"
fi
if [ -n "$keep" ]; then
  echo "kept: FSx file system $keep with its runs (its volume was kept; billed until deleted)." \
    "To delete it: aws fsx delete-file-system --file-system-id $keep"
fi
if [ "$left" -ne 0 ]; then
  echo "eks-teardown: resources above are left and billed. HINT: delete them in the console or" \
    "with the aws CLI; a DELETE_FAILED stack names what blocked it in its events" >&2
  exit 1
fi
echo "eks-teardown: nothing billed is left of $CLUSTER in $AWS_REGION."
