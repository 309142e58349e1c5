#!/usr/bin/env bash
# Tears down what docs/eks.md created, in an order that works, and ends by listing anything left
# that AWS still bills. Every wait has a deadline (TEARDOWN_WAIT_S seconds each, default 1200).
#   1. every target of k8s/ but fsx (jobs, MPIJobs, PyTorchJobs, TensorBoard), then waits until no
#      pod uses fsx-claim: a pod that still mounts it holds the claim's finalizer, and deleting the
#      claim would wait forever;
#   2. fsx: the claim, and with it the FSx file system (the CSI driver deletes it once the
#      volume is released); waits until the file system and its network interfaces are gone;
#   3. the FSx security group, before the cluster: eksctl deletes the VPC, which fails with
#      DependencyViolation while a group it did not make is in it (eksctl#616);
#   4. the cluster (eksctl: node groups, add-ons, IAM service accounts, the VPC), then the ECR
#      repository;
#   5. lists what is left and billed in the cluster's VPC and region (FSx file systems, instances,
#      NAT gateways, security groups, eksctl's stacks, node groups); exit 1 when anything is.
# The S3 bucket with the dataset is kept (listed with the command that deletes it).
# Usage: CLUSTER=... AWS_REGION=... [FSX_SECURITY_GROUP_ID=sg-...] [BUCKET=...] \
#          scripts/eks-teardown.sh
#   KEEP_ECR=1   keep the ECR repository resnet-trainer (and its images)
# Prints the commands it runs. KUBECTL, AWS and EKSCTL name the tools (default: their names).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
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

# 1. Everything that runs pods. A kind whose operator was never installed has nothing to delete.
if [ -n "$vpc" ]; then
  for target in $("$root/scripts/k8s-render.sh" --list); do
    case "$target" in
      fsx) continue ;;
      p3*) crd=mpijobs.kubeflow.org ;;
      pytorchjob-*) crd=pytorchjobs.kubeflow.org ;;
      *) crd="" ;;
    esac
    if [ -n "$crd" ] && ! "$kubectl" get crd "$crd" >/dev/null 2>&1; then continue; fi
    "$root/scripts/k8s-delete.sh" "$target"
  done
  pods_on_claim() {
    local columns='NAME:.metadata.name,CLAIMS:.spec.volumes[*].persistentVolumeClaim.claimName'
    "$kubectl" get pods --no-headers -o "custom-columns=$columns" |
      awk '$2 ~ /(^|,)fsx-claim(,|$)/ {print $1}'
  }
  no_pod_on_claim() { [ -z "$(pods_on_claim)" ]; }
  wait_until "the pods that mount fsx-claim to end ($(pods_on_claim | xargs))" no_pod_on_claim

  # 2. The claim, and the file system behind it (the volume's handle is the file system's ID).
  volume=$("$kubectl" get pvc fsx-claim -o 'jsonpath={.spec.volumeName}' 2>/dev/null) || volume=""
  file_system=""
  if [ -n "$volume" ]; then
    file_system=$("$kubectl" get pv "$volume" -o 'jsonpath={.spec.csi.volumeHandle}')
  fi
  if "$kubectl" get pvc fsx-claim >/dev/null 2>&1; then
    "$root/scripts/k8s-delete.sh" fsx
    run "$kubectl" wait --for=delete pvc/fsx-claim --timeout="${wait_s}s"
  else
    "$root/scripts/k8s-delete.sh" fsx # the StorageClass
  fi
  if [ -n "$file_system" ]; then
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
if [ -z "$group" ] && [ -n "$vpc" ]; then
  group=$("$aws" ec2 describe-security-groups --filters "Name=vpc-id,Values=$vpc" \
    "Name=group-name,Values=$CLUSTER-fsx" --query 'SecurityGroups[0].GroupId' --output text)
fi
if [[ "$group" == sg-* ]]; then
  unused() {
    [ -z "$("$aws" ec2 describe-network-interfaces --filters "Name=group-id,Values=$group" \
      --query 'NetworkInterfaces[].NetworkInterfaceId' --output text)" ]
  }
  wait_until "the network interfaces in $group to go" unused
  run "$aws" ec2 delete-security-group --group-id "$group" ||
    echo "eks-teardown: could not delete $group (above); listed at the end" >&2
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
    --query "FileSystems[?VpcId=='$vpc'].FileSystemId" --output text)"
  report "instances in $vpc" "$("$aws" ec2 describe-instances --filters "Name=vpc-id,Values=$vpc" \
    Name=instance-state-name,Values=pending,running,stopping,stopped \
    --query 'Reservations[].Instances[].InstanceId' --output text)"
  report "NAT gateways in $vpc" "$("$aws" ec2 describe-nat-gateways \
    --filter "Name=vpc-id,Values=$vpc" Name=state,Values=pending,available \
    --query 'NatGateways[].NatGatewayId' --output text)"
  report "security groups in $vpc" "$("$aws" ec2 describe-security-groups \
    --filters "Name=vpc-id,Values=$vpc" --query "SecurityGroups[?GroupName!='default'].GroupId" \
    --output text)"
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
  echo "kept: s3://$BUCKET (the dataset; billed for storage)." \
    "To delete it: aws s3 rb s3://$BUCKET --force"
fi
if [ "$left" -ne 0 ]; then
  echo "eks-teardown: resources above are left and billed. HINT: delete them in the console or" \
    "with the aws CLI; a DELETE_FAILED stack names what blocked it in its events" >&2
  exit 1
fi
echo "eks-teardown: nothing billed is left of $CLUSTER in $AWS_REGION."
