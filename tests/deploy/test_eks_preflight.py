"""scripts/eks/preflight.sh against recorded AWS answers (tests/deploy/eks_fakes.py): the tools,
the account's quota, the zone's offerings and the EKS versions, each failure with what to change."""
import json

import pytest
from deploy_support import kubectl  # noqa: F401 (a fixture)
from eks_fakes import tools  # noqa: F401 (a fixture)

jmespath = pytest.importorskip("jmespath", reason="jmespath is missing: run scripts/setup.sh")


TOOLS_OK = [
    {"tool": "aws", "call": ["--version"],
     "text": "aws-cli/2.22.35 Python/3.12.6 Linux/6.1.0-28-amd64 exe/x86_64.debian.12"},
    {"tool": "eksctl", "call": ["version"], "text": "0.215.0"},
    {"tool": "kubectl", "call": ["version", "--client"],
     "text": json.dumps({"clientVersion": {"major": "1", "minor": "33",
                                           "gitVersion": "v1.33.4"},
                         "kustomizeVersion": "v5.6.0"}, indent=2)},
    {"tool": "helm", "call": ["version"], "text": "v3.17.3+ge4da497"},
    {"tool": "docker", "call": ["buildx", "version"],
     "text": "github.com/docker/buildx v0.23.0 28c90ea"},
    {"tool": "aws", "call": ["sts", "get-caller-identity"],
     "json": {"UserId": "AIDASAMPLEUSERID", "Account": "123456789012",
              "Arn": "arn:aws:iam::123456789012:user/platform"}},
]


def quota(vcpus):
    return {"tool": "aws", "call": ["service-quotas", "get-service-quota", "L-417A185B"],
            "json": {"Quota": {
                "ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                "QuotaArn": "arn:aws:servicequotas:us-west-2:123456789012:ec2/L-417A185B",
                "QuotaCode": "L-417A185B", "QuotaName": "Running On-Demand P instances",
                "Value": float(vcpus), "Unit": "None", "Adjustable": True, "GlobalQuota": False}}}


def offerings(zones):
    """describe-instance-type-offerings by availability zone: {zone: [types]}."""
    return {"tool": "aws", "call": ["ec2", "describe-instance-type-offerings"],
            "json": {"InstanceTypeOfferings": [
                {"InstanceType": t, "LocationType": "availability-zone", "Location": z}
                for z, types in zones.items() for t in types]}}


def eks_versions(standard):
    return {"tool": "aws", "call": ["eks", "describe-cluster-versions"],
            "json": {"clusterVersions": [
                {"clusterVersion": v, "clusterType": "eks", "defaultPlatformVersion": "eks.5",
                 "defaultVersion": i == 0, "releaseDate": "2025-05-29T00:00:00+00:00",
                 "endOfStandardSupportDate": "2026-12-29T00:00:00+00:00",
                 "endOfExtendedSupportDate": "2027-12-29T00:00:00+00:00",
                 "status": "STANDARD_SUPPORT", "versionStatus": "STANDARD_SUPPORT",
                 "kubernetesPatchVersion": f"{v}.3"} for i, v in enumerate(standard)]}}


BOTH = ["p3.16xlarge", "p3dn.24xlarge"]
GOOD_ACCOUNT = TOOLS_OK + [quota(1280), offerings({"us-west-2a": ["p3.16xlarge"],
                                                   "us-west-2b": BOTH, "us-west-2c": BOTH}),
                           eks_versions(["1.34", "1.35", "1.36"])]


def test_preflight_passes_a_ready_account(tools):
    code, out, calls = tools("scripts/eks/preflight.sh", GOOD_ACCOUNT, AZ="us-west-2b",
                             EKS_VERSION="1.36")
    assert code == 0, out
    assert "FAIL" not in out and "ready for docs/eks.md" in out
    # The quota, the offerings and the versions come from the APIs that answer them.
    assert any("get-service-quota --service-code ec2 --quota-code L-417A185B" in c for c in calls)
    assert any("--location-type availability-zone" in c for c in calls)


@pytest.mark.parametrize("answers,env,says", [
    # New accounts: no P-instance quota at all.
    (TOOLS_OK + [quota(0)] + GOOD_ACCOUNT[-2:], {"AZ": "us-west-2b", "EKS_VERSION": "1.36"},
     "allows 0 vCPUs; the first launch needs 128"),
    # Zone letters map to other zones per account: this one offers no p3dn.24xlarge.
    (GOOD_ACCOUNT, {"AZ": "us-west-2a", "EKS_VERSION": "1.36"},
     "us-west-2a does not offer all of p3.16xlarge p3dn.24xlarge. HINT: export AZ=us-west-2b"),
    (GOOD_ACCOUNT, {"EKS_VERSION": "1.36"}, "AZ is not set. HINT: export AZ=us-west-2b"),
    (TOOLS_OK + [quota(1280), offerings({"eu-north-1a": ["p3.16xlarge"]}),
                 eks_versions(["1.36"])], {"AZ": "eu-north-1a", "EKS_VERSION": "1.36"},
     "no zone of us-west-2 offers all of p3.16xlarge p3dn.24xlarge"),
    # A version out of standard support costs more per cluster-hour.
    (GOOD_ACCOUNT, {"AZ": "us-west-2b", "EKS_VERSION": "1.32"},
     "EKS 1.32 is not in standard support (extended support costs more per hour). "
     "HINT: export EKS_VERSION=1.36"),
    # An aws CLI v1 cannot run the guide's commands.
    ([{"tool": "aws", "call": ["--version"], "text": "aws-cli/1.33.0 Python/3.11 Linux"}]
     + GOOD_ACCOUNT[1:], {"AZ": "us-west-2b", "EKS_VERSION": "1.36"}, "aws CLI v2 not found"),
    ([a for a in GOOD_ACCOUNT if a["tool"] != "kubectl"]
     + [{"tool": "kubectl", "call": ["version"], "text": '{"clientVersion": '
         '{"gitVersion": "v1.25.16"}}'}], {"AZ": "us-west-2b", "EKS_VERSION": "1.36"},
     "kubectl 1.27 or newer not found (got '1.25.16')"),
])
def test_preflight_fails_and_says_what_to_change(tools, answers, env, says):
    code, out, _ = tools("scripts/eks/preflight.sh", answers, **env)
    assert code == 1 and says in out, out


@pytest.mark.parametrize("helm", ["v3.17.3+ge4da497", "v4.0.1+g4c6ef9b"])
def test_preflight_takes_helm_3_and_4(tools, helm):
    answers = [{**a, "text": helm} if a["tool"] == "helm" else a for a in GOOD_ACCOUNT]
    code, out, _ = tools("scripts/eks/preflight.sh", answers, AZ="us-west-2b", EKS_VERSION="1.36")
    assert code == 0 and f"helm: {helm}" in out, out


def test_preflight_refuses_helm_2(tools):
    answers = [{**a, "text": "Client: v2.17.0+ga690bad"} if a["tool"] == "helm" else a
               for a in GOOD_ACCOUNT]
    code, out, _ = tools("scripts/eks/preflight.sh", answers, AZ="us-west-2b", EKS_VERSION="1.36")
    assert code == 1 and "helm 3 or 4 not found (got 'Client: v2.17.0+ga690bad')" in out, out


def test_preflight_warns_of_the_scale_out_quota_but_passes(tools):
    answers = TOOLS_OK + [quota(256)] + GOOD_ACCOUNT[-2:]
    code, out, _ = tools("scripts/eks/preflight.sh", answers, AZ="us-west-2c", EKS_VERSION="1.35")
    assert code == 0, out
    assert "needs 1280 vCPUs" in out and "request-service-quota-increase" in out


def test_preflight_stops_without_credentials(tools):
    answers = [a for a in GOOD_ACCOUNT if "sts" not in a.get("call", [])] + [
        {"tool": "aws", "call": ["sts"], "rc": 253,
         "stderr": "Unable to locate credentials. You can configure credentials by running "
                   "\"aws configure\".\n"}]
    code, out, calls = tools("scripts/eks/preflight.sh", answers, AZ="us-west-2b", EKS_VERSION="1.36")
    assert code == 1 and "no AWS credentials" in out
    assert not any("service-quotas" in c for c in calls)


def test_preflight_counts_p4d_and_p5_nodes_in_the_quota_at_their_vcpus(tools):
    # 2 p3.16xlarge (128) + 1 p4d.24xlarge (96) + 2 p5.48xlarge (384) = 608 vCPUs of P instances.
    answers = TOOLS_OK + [quota(600)] + GOOD_ACCOUNT[-2:]
    code, out, _ = tools("scripts/eks/preflight.sh", answers, AZ="us-west-2b", EKS_VERSION="1.36",
                         P4D_NODES="1", P5_NODES="2")
    assert code == 1, out
    assert "allows 600 vCPUs; the first launch needs 608" in out
    assert "1 p4d.24xlarge x 96 + 2 p5.48xlarge x 192" in out
    code, out, _ = tools("scripts/eks/preflight.sh", TOOLS_OK + [quota(608)] + GOOD_ACCOUNT[-2:],
                         AZ="us-west-2b", EKS_VERSION="1.36", P4D_NODES="1", P5_NODES="2")
    assert "enough for the first launch (608)" in out, out
