#!/usr/bin/env bash
# Checks an AWS account and this machine before docs/eks.md's first step, and says what to change:
#   - the tools: aws v2, eksctl, kubectl 1.27 or newer (kustomize built in), helm 3 or 4, docker buildx;
#   - the account: credentials, the "Running On-Demand P instances" vCPU quota (L-417A185B) for
#     the first launch and for the scale-out step;
#   - the zone: AZ must offer the GPU instance types (zone letters map to different zones in each
#     account, and not every zone offers p3dn.24xlarge); names the zones that do;
#   - the EKS version: EKS_VERSION must be in standard support (extended support costs more per
#     cluster-hour); names the versions that are.
# Exit 0 when every check passes, 1 when one fails (each failure on its own line, with a HINT).
# Usage: AWS_REGION=... [AZ=...] [EKS_VERSION=...] scripts/eks/preflight.sh
#   P3_NODES, P3DN_NODES   GPU nodes of the first launch (default 2 and 0: docs/eks.md's cluster)
#   P4D_NODES, P5_NODES    p4d.24xlarge and p5.48xlarge nodes beside them (default 0)
#   SCALE_OUT_NODES        p3.16xlarge nodes after the scale-out step (default 20)
#   INSTANCE_TYPES         the types AZ must offer (default: p3.16xlarge p3dn.24xlarge)
# AWS, EKSCTL, KUBECTL, HELM and DOCKER name the tools (default: their names, on PATH).
set -uo pipefail
: "${AWS_REGION:?set AWS_REGION}"
aws=${AWS:-aws}
p3_nodes=${P3_NODES:-2}
p3dn_nodes=${P3DN_NODES:-0}
p4d_nodes=${P4D_NODES:-0}
p5_nodes=${P5_NODES:-0}
scale_out_nodes=${SCALE_OUT_NODES:-20}
read -r -a instance_types <<<"${INSTANCE_TYPES:-p3.16xlarge p3dn.24xlarge}"
failed=0
ok() { echo "ok: $*"; }
fail() {
  echo "FAIL: $*"
  failed=1
}
# version_at_least VERSION MINIMUM: dotted versions compared field by field.
version_at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }

# --- tools ---
version=$("${AWS:-aws}" --version 2>&1) || version=""
if [[ "$version" =~ aws-cli/2\. ]]; then ok "aws: ${version%% *}"; else
  fail "aws CLI v2 not found (got '${version:-nothing}'). HINT: install AWS CLI v2"
fi
version=$("${EKSCTL:-eksctl}" version 2>/dev/null) || version=""
if [ -n "$version" ]; then ok "eksctl: $version"; else
  fail "eksctl not found. HINT: install eksctl (eksctl.io), a release that knows EKS_VERSION"
fi
version=$("${KUBECTL:-kubectl}" version --client -o json 2>/dev/null |
  sed -n 's/.*"gitVersion": *"v\([0-9.]*\).*/\1/p' | head -n 1) || version=""
if [ -n "$version" ] && version_at_least "$version" 1.27; then ok "kubectl: $version"; else
  fail "kubectl 1.27 or newer not found (got '${version:-nothing}'). HINT: kubectl within one" \
    "minor version of EKS_VERSION"
fi
version=$("${HELM:-helm}" version --short 2>/dev/null) || version=""
# Helm 4 (2025-11) runs the guide's charts and commands as Helm 3 does.
if [[ "$version" == v3.* || "$version" == v4.* ]]; then ok "helm: $version"; else
  fail "helm 3 or 4 not found (got '${version:-nothing}'). HINT: install helm 4 (or 3)"
fi
if "${DOCKER:-docker}" buildx version >/dev/null 2>&1; then ok "docker buildx"; else
  fail "docker with buildx (BuildKit) not found. HINT: scripts/image/build.sh needs it"
fi

# --- account ---
if ! account=$("$aws" sts get-caller-identity --query Account --output text); then
  fail "no AWS credentials. HINT: aws configure, or aws sso login"
  exit 1
fi
ok "account $account, region $AWS_REGION"

# The quota counts vCPUs: p3.16xlarge 64, p3dn.24xlarge 96, p4d.24xlarge 96, p5.48xlarge 192.
others=$((p3dn_nodes * 96 + p4d_nodes * 96 + p5_nodes * 192))
first=$((p3_nodes * 64 + others))
scale_out=$((scale_out_nodes * 64 + others))
launch="$p3_nodes p3.16xlarge x 64 + $p3dn_nodes p3dn.24xlarge x 96"
if [ "$p4d_nodes" -gt 0 ]; then launch+=" + $p4d_nodes p4d.24xlarge x 96"; fi
if [ "$p5_nodes" -gt 0 ]; then launch+=" + $p5_nodes p5.48xlarge x 192"; fi
quota=$("$aws" service-quotas get-service-quota --service-code ec2 --quota-code L-417A185B \
  --region "$AWS_REGION" --query Quota.Value --output text) || quota=""
quota=${quota%.*}
increase="aws service-quotas request-service-quota-increase --service-code ec2 --quota-code"
increase+=" L-417A185B --region $AWS_REGION --desired-value"
if ! [[ "$quota" =~ ^[0-9]+$ ]]; then
  fail "could not read the quota 'Running On-Demand P instances' (L-417A185B). HINT: the" \
    "caller needs servicequotas:GetServiceQuota"
elif [ "$quota" -lt "$first" ]; then
  fail "'Running On-Demand P instances' allows $quota vCPUs; the first launch needs $first" \
    "($launch). HINT: $increase $scale_out"
elif [ "$quota" -lt "$scale_out" ]; then
  ok "'Running On-Demand P instances' allows $quota vCPUs: enough for the first launch ($first)"
  echo "note: the scale-out step ($scale_out_nodes p3.16xlarge) needs $scale_out vCPUs." \
    "HINT: $increase $scale_out (approval can take days)"
else
  ok "'Running On-Demand P instances' allows $quota vCPUs" \
    "(first launch $first, scale-out $scale_out)"
fi

# --- zone ---
offered=$("$aws" ec2 describe-instance-type-offerings --region "$AWS_REGION" \
  --location-type availability-zone \
  --filters "Name=instance-type,Values=$(IFS=,; echo "${instance_types[*]}")" \
  --query 'InstanceTypeOfferings[].[Location,InstanceType]' --output text) || offered=""
# The zones that offer every type asked for.
zones=$(awk -v n=${#instance_types[@]} \
  '{count[$1]++} END {for (z in count) if (count[z] == n) print z}' <<<"$offered" | sort | xargs)
if [ -z "$zones" ]; then
  fail "no zone of $AWS_REGION offers all of ${instance_types[*]}. HINT: another region" \
    "(us-east-1 and us-west-2 offer P3dn), or INSTANCE_TYPES=p3.16xlarge for P3 alone"
elif [ -z "${AZ:-}" ]; then
  fail "AZ is not set. HINT: export AZ=${zones%% *} (zones offering ${instance_types[*]}: $zones)"
elif [[ " $zones " != *" $AZ "* ]]; then
  fail "$AZ does not offer all of ${instance_types[*]}. HINT: export AZ=${zones%% *}" \
    "(zones that do: $zones)"
else
  ok "$AZ offers ${instance_types[*]}"
fi

# --- EKS version ---
standard=$("$aws" eks describe-cluster-versions --region "$AWS_REGION" \
  --version-status STANDARD_SUPPORT --query 'clusterVersions[].clusterVersion' --output text |
  tr '\t' '\n' | sort -V | xargs) || standard=""
newest=${standard##* }
if [ -z "$standard" ]; then
  fail "could not list the EKS versions in standard support. HINT: a newer aws CLI v2" \
    "(describe-cluster-versions), or read the EKS Kubernetes version calendar"
elif [ -z "${EKS_VERSION:-}" ]; then
  fail "EKS_VERSION is not set. HINT: export EKS_VERSION=$newest (in standard support: $standard)"
elif [[ " $standard " != *" $EKS_VERSION "* ]]; then
  fail "EKS $EKS_VERSION is not in standard support (extended support costs more per hour)." \
    "HINT: export EKS_VERSION=$newest (in standard support: $standard)"
else
  ok "EKS $EKS_VERSION is in standard support ($standard)"
fi

if [ "$failed" -ne 0 ]; then
  echo "eks-preflight: fix the FAIL lines above, then run this again." >&2
  exit 1
fi
echo "eks-preflight: ready for docs/eks.md, step 1."
