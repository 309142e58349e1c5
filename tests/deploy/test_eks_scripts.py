"""scripts/eks-preflight.sh, eks-export.sh and eks-teardown.sh against recorded AWS answers: a
stand-in `aws` that returns the JSON the AWS APIs return (shapes from the services' own
documentation), applies the script's own --query with the aws CLI's query language (JMESPath) and
prints it as `--output text` does; stand-in `eksctl`, `kubectl` (rendering with the real one),
`helm` and `docker`. Every call is recorded in order, so the tests check what the scripts would do
to an account, and in which order, without one."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import ROOT, TARGETS, kubectl  # noqa: F401 (fixtures)

jmespath = pytest.importorskip("jmespath", reason="jmespath is missing: run scripts/setup.sh")

# The stand-in for every tool. ANSWERS is a list of {"tool", "call" (arguments that must all be
# there, each whole or as the part before "="), "after"/"before" (a substring of an earlier
# recorded call that must / must not have been made), "json" | "text", "rc", "stderr"}; the
# first that matches answers. JSON answers go through --query and --output text as the aws CLI
# does.
FAKE = r'''#!PYTHON
import json, os, sys
sys.path[:0] = json.loads(os.environ["FAKE_PATH"])
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
line = " ".join([tool, *args])
if tool == "kubectl" and args[:1] == ["kustomize"]:
    os.execv(os.environ["REAL_KUBECTL"], [os.environ["REAL_KUBECTL"], *args])
with open(os.environ["FAKE_CALLS"]) as f:
    earlier = f.read()
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(line + "\n")


def text(value):
    """--output text: scalars as they are, a list on one line, a list of lists a line each."""
    if value is None:
        return "None"
    if isinstance(value, list):
        if value and all(isinstance(v, list) for v in value):
            return "\n".join("\t".join(text(x) for x in v) for v in value)
        return "\t".join(text(v) for v in value)
    return str(value)


for answer in json.load(open(os.environ["FAKE_ANSWERS"])):
    given = set(args) | {a.split("=", 1)[0] for a in args}
    if answer["tool"] != tool or not set(answer.get("call", [])) <= given:
        continue
    if "after" in answer and answer["after"] not in earlier:
        continue
    if "before" in answer and answer["before"] in earlier:
        continue
    sys.stderr.write(answer.get("stderr", ""))
    out = answer.get("text", "")
    if "json" in answer:
        import jmespath
        value = answer["json"]
        if "--query" in args:
            value = jmespath.search(args[args.index("--query") + 1], value)
        out = text(value) if "text" in args else json.dumps(value, indent=4)
    if out:
        print(out)
    sys.exit(answer.get("rc", 0))
sys.stderr.write(f"fake {tool}: no recorded answer for: {line}\n")
sys.exit(255)
'''

# --- recorded answers: pre-flight -------------------------------------------------------------

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


@pytest.fixture
def tools(tmp_path, kubectl):
    """run(script, answers, *args, **env) -> (returncode, stdout + stderr, the calls in order)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("aws", "eksctl", "kubectl", "helm", "docker"):
        fake = bin_dir / name
        fake.write_text(FAKE.replace("PYTHON", sys.executable, 1))
        fake.chmod(0o755)
    calls, answers_file = tmp_path / "calls", tmp_path / "answers.json"

    def run(script, answers, *args, **env):
        calls.write_text("")
        answers_file.write_text(json.dumps(answers))
        full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                    "FAKE_CALLS": str(calls), "FAKE_ANSWERS": str(answers_file),
                    "FAKE_PATH": json.dumps(sys.path), "REAL_KUBECTL": kubectl,
                    "AWS_REGION": "us-west-2", **env}
        for name in ("KUBECTL", "AWS", "EKSCTL", "AZ", "EKS_VERSION", "FSX_FILE_SYSTEM_ID"):
            if name not in env:
                full_env.pop(name, None)
        proc = subprocess.run([str(ROOT / "scripts" / script), *args], capture_output=True,
                              text=True, env=full_env, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr, calls.read_text().splitlines()

    return run


def test_preflight_passes_a_ready_account(tools):
    code, out, calls = tools("eks-preflight.sh", GOOD_ACCOUNT, AZ="us-west-2b",
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
    code, out, _ = tools("eks-preflight.sh", answers, **env)
    assert code == 1 and says in out, out


@pytest.mark.parametrize("helm", ["v3.17.3+ge4da497", "v4.0.1+g4c6ef9b"])
def test_preflight_takes_helm_3_and_4(tools, helm):
    answers = [{**a, "text": helm} if a["tool"] == "helm" else a for a in GOOD_ACCOUNT]
    code, out, _ = tools("eks-preflight.sh", answers, AZ="us-west-2b", EKS_VERSION="1.36")
    assert code == 0 and f"helm: {helm}" in out, out


def test_preflight_refuses_helm_2(tools):
    answers = [{**a, "text": "Client: v2.17.0+ga690bad"} if a["tool"] == "helm" else a
               for a in GOOD_ACCOUNT]
    code, out, _ = tools("eks-preflight.sh", answers, AZ="us-west-2b", EKS_VERSION="1.36")
    assert code == 1 and "helm 3 or 4 not found (got 'Client: v2.17.0+ga690bad')" in out, out


def test_preflight_warns_of_the_scale_out_quota_but_passes(tools):
    answers = TOOLS_OK + [quota(256)] + GOOD_ACCOUNT[-2:]
    code, out, _ = tools("eks-preflight.sh", answers, AZ="us-west-2c", EKS_VERSION="1.35")
    assert code == 0, out
    assert "needs 1280 vCPUs" in out and "request-service-quota-increase" in out


def test_preflight_stops_without_credentials(tools):
    answers = [a for a in GOOD_ACCOUNT if "sts" not in a.get("call", [])] + [
        {"tool": "aws", "call": ["sts"], "rc": 253,
         "stderr": "Unable to locate credentials. You can configure credentials by running "
                   "\"aws configure\".\n"}]
    code, out, calls = tools("eks-preflight.sh", answers, AZ="us-west-2b", EKS_VERSION="1.36")
    assert code == 1 and "no AWS credentials" in out
    assert not any("service-quotas" in c for c in calls)


# --- recorded answers: teardown -------------------------------------------------------------

VPC, GROUP, FILE_SYSTEM = "vpc-0a1b2c3d4e5f60718", "sg-0fedcba9876543210", "fs-0123456789abcdef0"
FSX_DELETED = "delete --ignore-not-found -f"  # + .../fsx.yaml: matched with "fsx.yaml"
ON_FILE_SYSTEM = f"Name=file-system-id,Values={FILE_SYSTEM}"  # the describe calls' --filters
# The trainer's pods as `kubectl get pods -l app.kubernetes.io/name=resnet-trainer -o
# custom-columns=NAME,PHASE,ENDED` prints them: finished (the last ended 09:58:01 UTC), or a job
# still running.
TRAINER_PODS = {
    "ended": "resnet50-launcher-x8k2p   Succeeded   2026-11-20T09:58:01Z\n"
             "resnet50-smoke-q7w4d      Succeeded   2026-11-19T18:31:09Z\n"
             "fsx-stage-data-4kq9z      Succeeded   2026-11-19T17:02:44Z,2026-11-19T16:40:02Z",
    "running": "resnet50-launcher-x8k2p   Running     <none>\n"
               "resnet50-smoke-q7w4d      Succeeded   2026-11-19T18:31:09Z",
}
# What names the runs: the trainer configs here, and the smoke Job's --output_dir.
CONFIG_MAPS = ('seed = 1\noutput_dir = "/fsx/runs/resnet50-p3"\nresume = "auto"\n'
               'output_dir = "/tmp/resnet-smoke"\n')
POD_ARGS = "train\n--config\n/etc/resnet-trainer/trainer.toml\n--output_dir\n/fsx/runs/smoke"
TASK = "task-0fedcba9876543210"
AFTER_THE_LAST_POD = "2026-11-20T10:04:12.517000+00:00"
BEFORE_THE_LAST_POD = "2026-11-20T09:12:40.101000+00:00"


def data_repository_task(task_id, created, kind="EXPORT_TO_REPOSITORY", lifecycle="SUCCEEDED",
                         paths=("runs",), failed=0):
    """One entry of DescribeDataRepositoryTasks (the FSx API reference's shape), as the aws CLI
    prints it: timestamps in ISO 8601 (in UTC under TZ=UTC)."""
    task = {"TaskId": task_id, "Lifecycle": lifecycle, "Type": kind, "CreationTime": created,
            "StartTime": created, "Tags": [],
            "ResourceARN": f"arn:aws:fsx:us-west-2:123456789012:task/{task_id}",
            "FileSystemId": FILE_SYSTEM, "Paths": list(paths),
            "Status": {"TotalCount": 412, "SucceededCount": 412 - failed, "FailedCount": failed,
                       "LastUpdatedTime": created, "ReleasedCount": 0},
            "Report": {"Enabled": False}}
    if lifecycle in ("SUCCEEDED", "FAILED"):
        task["EndTime"] = created
    if lifecycle == "FAILED":
        task["FailureDetails"] = {"Message": "Access denied writing to s3://my-imagenet-bucket"}
    return task


def export_tasks(created):
    """The file system's tasks: an import, a failed export, an export of one run only, and the
    newest full export of runs/ at `created` (None: no such export)."""
    tasks = [data_repository_task("task-0aaaaaaaaaaaaaaa1", "2026-11-19T16:20:00.000000+00:00",
                                  kind="IMPORT_METADATA_FROM_REPOSITORY", paths=("imagenet",)),
             data_repository_task("task-0aaaaaaaaaaaaaaa2", "2026-11-21T08:00:00.000000+00:00",
                                  lifecycle="FAILED", failed=3),
             data_repository_task("task-0aaaaaaaaaaaaaaa3", "2026-11-21T09:00:00.000000+00:00",
                                  paths=("runs/smoke",))]
    if created:
        tasks.append(data_repository_task(TASK, created))
    return {"DataRepositoryTasks": tasks}


def association(auto_export=("NEW", "CHANGED", "DELETED"), path="/runs"):
    """A data repository association as DescribeDataRepositoryAssociations returns it."""
    s3 = {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}
    if auto_export:
        s3["AutoExportPolicy"] = {"Events": list(auto_export)}
    return {"Associations": [{
        "AssociationId": "dra-0123456789abcdef0",
        "ResourceARN": "arn:aws:fsx:us-west-2:123456789012:association/fs-0123456789abcdef0/"
                       "dra-0123456789abcdef0",
        "FileSystemId": FILE_SYSTEM, "Lifecycle": "AVAILABLE", "FileSystemPath": path,
        "DataRepositoryPath": "s3://my-imagenet-bucket/runs", "BatchImportMetaDataOnCreate": True,
        "ImportedFileChunkSize": 1024, "S3": s3, "Tags": [],
        "CreationTime": "2026-11-18T12:00:00.000000+00:00"}]}


def teardown_answers(file_system_stays=False, nat_gateway_left=False, exported="task",
                     trainer="ended", static=False):
    """exported: how the runs reached S3 ("task": an export after the last pod ended, "stale":
    one before it, "dra": an association that exports automatically, None: never). static: the
    claim is fsx-existing's, bound to the volume fsx-pv that Retains an existing file system."""
    volume = "fsx-pv" if static else "pvc-5e6f7a8b"
    tasks = export_tasks({"task": AFTER_THE_LAST_POD, "stale": BEFORE_THE_LAST_POD}.get(exported))
    answers = [
        {"tool": "aws", "call": ["sts", "get-caller-identity"],
         "json": {"Account": "123456789012", "UserId": "A", "Arn": "arn:aws:iam::1:user/u"}},
        {"tool": "aws", "call": ["eks", "describe-cluster"], "before": "eksctl delete cluster",
         "json": {"cluster": {"name": "resnet", "status": "ACTIVE",
                              "resourcesVpcConfig": {"vpcId": VPC, "subnetIds": []}}}},
        {"tool": "aws", "call": ["eks", "describe-cluster"], "rc": 254,
         "stderr": "An error occurred (ResourceNotFoundException) when calling the "
                   "DescribeCluster operation: No cluster found for name: resnet.\n"},
        {"tool": "kubectl", "call": ["get", "crd"], "json": {}},
        {"tool": "kubectl", "call": ["delete"], "json": {}},
        # The check before anything is deleted: the trainer's pods, the runs they name.
        {"tool": "kubectl", "call": ["get", "pods", "app.kubernetes.io/name=resnet-trainer",
                                     "custom-columns"], "text": TRAINER_PODS[trainer]},
        {"tool": "kubectl", "call": ["get", "pods", "app.kubernetes.io/name=resnet-trainer",
                                     "jsonpath"], "text": POD_ARGS},
        {"tool": "kubectl", "call": ["get", "configmaps"], "text": CONFIG_MAPS},
        {"tool": "aws", "call": ["fsx", "describe-data-repository-associations", ON_FILE_SYSTEM],
         "json": association() if exported == "dra" else {"Associations": []}},
        {"tool": "aws", "call": ["fsx", "describe-data-repository-tasks", ON_FILE_SYSTEM],
         "json": tasks},
        # A TensorBoard pod mounts the claim until the Deployment is deleted.
        {"tool": "kubectl", "call": ["get", "pods", "custom-columns"], "before": "tensorboard.yaml",
         "text": "tensorboard-7d9f8b6c4-x2x9q   fsx-claim\nsome-other-pod   <none>"},
        {"tool": "kubectl", "call": ["get", "pods", "custom-columns"],
         "text": "some-other-pod   <none>"},
        {"tool": "kubectl", "call": ["get", "pvc", "fsx-claim", "jsonpath={.spec.volumeName}"],
         "text": volume},
        {"tool": "kubectl", "call": ["get", "pvc", "fsx-claim"], "text": "fsx-claim Bound"},
        {"tool": "kubectl", "call": ["get", "pv", volume,
                                     "jsonpath={.spec.persistentVolumeReclaimPolicy}"],
         "text": "Retain" if static else "Delete"},
        {"tool": "kubectl", "call": ["get", "pv", volume, "jsonpath={.spec.csi.volumeHandle}"],
         "text": FILE_SYSTEM},
        {"tool": "kubectl", "call": ["wait", "--for=delete"], "text": "deleted"},
        {"tool": "aws", "call": ["fsx", "describe-file-systems", FILE_SYSTEM],
         "before": "fsx.yaml" if not file_system_stays else "never",
         "json": {"FileSystems": [{"FileSystemId": FILE_SYSTEM, "Lifecycle": "AVAILABLE",
                                   "VpcId": VPC}]}},
        {"tool": "aws", "call": ["fsx", "describe-file-systems", FILE_SYSTEM], "rc": 254,
         "stderr": "An error occurred (FileSystemNotFound) when calling the "
                   "DescribeFileSystems operation: File system 'fs-...' does not exist.\n"},
        {"tool": "aws",
         "call": ["ec2", "describe-security-groups", "Name=group-name,Values=resnet-fsx"],
         "json": {"SecurityGroups": [{"GroupId": GROUP, "GroupName": "resnet-fsx",
                                      "VpcId": VPC}]}},
        # The kept file system's network interfaces stay in its security group.
        {"tool": "aws", "call": ["ec2", "describe-network-interfaces"],
         "json": {"NetworkInterfaces": [{"NetworkInterfaceId": "eni-0f1e2d3c4b5a69788",
                                         "InterfaceType": "interface", "VpcId": VPC,
                                         "Groups": [{"GroupId": GROUP}]}] if static else []}},
        {"tool": "aws", "call": ["ec2", "delete-security-group", GROUP], "text": ""},
        {"tool": "eksctl", "call": ["delete", "cluster"], "text": "all cluster resources deleted"},
        {"tool": "aws", "call": ["ecr", "delete-repository"], "json": {"repository": {}}},
        {"tool": "aws", "call": ["fsx", "describe-file-systems"], "json": {"FileSystems": (
            [{"FileSystemId": FILE_SYSTEM, "VpcId": VPC, "Lifecycle": "AVAILABLE"}]
            if file_system_stays or static else [])}},
        {"tool": "aws", "call": ["ec2", "describe-instances"], "json": {"Reservations": []}},
        {"tool": "aws", "call": ["ec2", "describe-nat-gateways"], "json": {"NatGateways": (
            [{"NatGatewayId": "nat-0abc", "State": "available", "VpcId": VPC}]
            if nat_gateway_left else [])}},
        {"tool": "aws", "call": ["ec2", "describe-security-groups"],
         "json": {"SecurityGroups": [{"GroupId": "sg-default", "GroupName": "default"}] + (
             [{"GroupId": GROUP, "GroupName": "resnet-fsx"}] if static else [])}},
        {"tool": "aws", "call": ["cloudformation", "list-stacks"], "json": {"StackSummaries": [
            {"StackName": "eksctl-other-cluster", "StackStatus": "CREATE_COMPLETE"}]}},
        {"tool": "aws", "call": ["eks", "list-nodegroups"], "rc": 254,
         "stderr": "An error occurred (ResourceNotFoundException)\n"},
        {"tool": "aws", "call": ["ecr", "describe-repositories"], "rc": 254,
         "stderr": "An error occurred (RepositoryNotFoundException)\n"},
    ]
    return answers


def guide_targets():
    """The targets docs/eks.md applies (scripts/k8s-apply.sh TARGET ...)."""
    guide = (ROOT / "docs" / "eks.md").read_text()
    return set(re.findall(r"scripts/k8s-apply\.sh ([\w.-]+)", guide))


def teardown(tools, answers, **env):
    return tools("eks-teardown.sh", answers, CLUSTER="resnet", BUCKET="my-imagenet-bucket",
                 TEARDOWN_WAIT_S="5", POLL_S="0", **env)


def test_teardown_deletes_everything_the_guide_made_in_an_order_that_works(tools):
    code, out, calls = teardown(tools, teardown_answers())
    assert code == 0, out
    assert "nothing billed is left of resnet" in out
    assert "kept: s3://my-imagenet-bucket" in out

    def first(pattern):
        found = [i for i, c in enumerate(calls) if re.search(pattern, c)]
        assert found, f"no call matches {pattern!r}:\n" + "\n".join(calls)
        return found[0]

    # Every object the guide applies is deleted, and the file system's claim after all of them:
    # a pod that still mounts it holds its finalizer.
    assert guide_targets() >= {"fsx", "stage-data", "smoke", "tensorboard", "p3.16xlarge",
                               "pytorchjob-p3.16xlarge"}, guide_targets()
    fsx = first(r"delete --ignore-not-found -f \S*/fsx\.yaml$")
    for target in guide_targets() | set(TARGETS):
        if target not in ("fsx", "fsx-existing"):
            assert first(rf"delete --ignore-not-found -f \S*/{re.escape(target)}\.yaml$") < fsx
    # Before anything is deleted, the runs were found in S3: no trainer pod runs, and an export
    # task of runs/ began after the last one ended.
    assert first("describe-data-repository-tasks") < first(" delete ")
    # The claim waits for the pods that mount it; the security group for the file system; the
    # cluster (and its VPC) for the security group; the listing comes last.
    assert first(r"get pods .*custom-columns") < fsx
    assert fsx < first(f"fsx describe-file-systems --file-system-ids {FILE_SYSTEM}")
    assert first(f"describe-file-systems --file-system-ids {FILE_SYSTEM}") < first(
        f"delete-security-group --group-id {GROUP}") < first("eksctl delete cluster")
    assert "--wait" in calls[first("eksctl delete cluster")]
    assert first("eksctl delete cluster") < first("ecr delete-repository") < first(
        "describe-nat-gateways")


def test_teardown_stops_at_a_deadline_when_the_file_system_stays(tools):
    code, out, calls = teardown(tools, teardown_answers(file_system_stays=True))
    assert code == 1
    assert f"still waiting for FSx file system {FILE_SYSTEM} to be deleted after 5 s" in out
    # Nothing after it runs: deleting the cluster now would leave the file system's VPC behind.
    assert not any("eksctl delete cluster" in c or "delete-security-group" in c for c in calls)


def test_teardown_lists_what_is_left_and_billed(tools):
    code, out, _ = teardown(tools, teardown_answers(nat_gateway_left=True))
    assert code == 1
    assert f"LEFT, billed: NAT gateways in {VPC}: nat-0abc" in out
    # The other cluster's stack and the default security group are not this cluster's leftovers.
    assert "eksctl-other-cluster" not in out and "sg-default" not in out


def test_teardown_of_a_deleted_cluster_checks_what_is_left_and_stops(tools):
    answers = [a for a in teardown_answers() if a.get("before") != "eksctl delete cluster"]
    code, out, calls = teardown(tools, answers, FSX_SECURITY_GROUP_ID=GROUP)
    assert code == 0, out
    assert "no cluster resnet in us-west-2" in out
    assert not any(c.startswith("kubectl delete") or "eksctl delete" in c for c in calls)


def deletes(calls):
    """The calls that delete something: kubectl delete, aws ... delete-*, eksctl delete."""
    return [c for c in calls if re.match(r"(kubectl|eksctl) delete |aws \S+ delete-", c)]


@pytest.mark.parametrize("exported,why", [
    # Newer tasks exist, but one failed and one exported runs/smoke alone: neither counts.
    (None, "no export of all of runs/ to S3 has succeeded on it"),
    ("stale", f"its newest export of runs/ ({TASK}, created {BEFORE_THE_LAST_POD}) is older than "
              "the end of resnet50-launcher-x8k2p (2026-11-20T09:58:01Z)"),
])
def test_teardown_refuses_to_delete_runs_that_are_not_in_s3(tools, exported, why):
    code, out, calls = teardown(tools, teardown_answers(exported=exported))
    assert code == 2, out
    assert f"FSx file system {FILE_SYSTEM} goes with the claim fsx-claim" in out
    assert why in out
    # It names the runs (the configs' and the pods' output_dir) and the two ways on.
    assert "Its runs: /fsx/runs/resnet50-p3 /fsx/runs/smoke" in out
    assert "HINT: scripts/eks-export.sh" in out and "--discard-unexported-runs" in out
    # Nothing is deleted: the jobs, the claim, the cluster all stay as they were.
    assert deletes(calls) == [], deletes(calls)


def test_teardown_refuses_while_the_trainer_still_runs(tools):
    # A job still writing: even a fresh export misses what it writes next (its SIGTERM checkpoint
    # too, were teardown to stop it).
    code, out, calls = teardown(tools, teardown_answers(trainer="running"))
    assert code == 2, out
    assert "the trainer's pods resnet50-launcher-x8k2p still run and write to /fsx/runs" in out
    assert "scripts/k8s-delete.sh TARGET" in out and "scripts/eks-export.sh" in out
    assert deletes(calls) == []


def test_teardown_discards_unexported_runs_when_told(tools):
    answers = teardown_answers(exported=None)
    code, out, calls = tools("eks-teardown.sh", answers, "--discard-unexported-runs",
                             CLUSTER="resnet", TEARDOWN_WAIT_S="5", POLL_S="0")
    assert code == 0, out
    assert "--discard-unexported-runs: deleting " + FILE_SYSTEM in out
    assert any(FSX_DELETED in c and c.endswith("/fsx.yaml") for c in calls)
    assert any(f"describe-file-systems --file-system-ids {FILE_SYSTEM}" in c for c in calls)


def test_teardown_refuses_an_unknown_argument(tools):
    code, out, calls = tools("eks-teardown.sh", teardown_answers(), "--discard", CLUSTER="resnet")
    assert code == 2 and "unknown argument '--discard'" in out and calls == []


@pytest.mark.parametrize("exported", ["task", "dra"])
def test_teardown_deletes_the_file_system_once_its_runs_are_in_s3(tools, exported):
    # An export task of runs/ that began after the last pod ended, or an association that
    # exports /runs as files change.
    code, out, calls = teardown(tools, teardown_answers(exported=exported))
    assert code == 0, out
    fsx = [i for i, c in enumerate(calls) if FSX_DELETED in c and c.endswith("/fsx.yaml")]
    assert fsx and any(f"describe-file-systems --file-system-ids {FILE_SYSTEM}" in c
                       for c in calls[fsx[0]:])
    if exported == "dra":
        # The association suffices: the tasks are not consulted.
        assert not any("describe-data-repository-tasks" in c for c in calls)


def test_teardown_never_deletes_a_kept_file_system(tools):
    # k8s/fsx-existing: the claim is bound to fsx-pv, whose reclaim policy is Retain. Its runs
    # are not exported, and it does not matter: the file system stays.
    code, out, calls = teardown(tools, teardown_answers(exported=None, static=True))
    assert code == 0, out
    assert f"{FILE_SYSTEM} stays: its volume fsx-pv is kept (Retain)" in out
    assert not any("describe-data-repository" in c for c in calls)
    # The claim and the volume object go through fsx-existing; then fsx (a StorageClass, if any).
    existing = [i for i, c in enumerate(calls) if FSX_DELETED in c
                and c.endswith("/fsx-existing.yaml")]
    fsx = [i for i, c in enumerate(calls) if FSX_DELETED in c and c.endswith("/fsx.yaml")]
    assert existing and fsx and existing[0] < fsx[0]
    assert any("wait --for=delete pvc/fsx-claim" in c for c in calls)
    # Nothing waits for the file system to go, nor deletes it or its security group, and the
    # listing does not count them as left over.
    assert not any(f"--file-system-ids {FILE_SYSTEM}" in c for c in calls)
    assert not any("delete-file-system" in c or "delete-security-group" in c for c in calls)
    assert f"kept: FSx file system {FILE_SYSTEM}" in out
    assert f"aws fsx delete-file-system --file-system-id {FILE_SYSTEM}" in out
    assert f"kept: security group {GROUP}" in out
    assert "LEFT, billed" not in out and "nothing billed is left of resnet" in out


# --- recorded answers: export -----------------------------------------------------------------

def export_answers(link="path", lifecycles=("EXECUTING", "SUCCEEDED"), trainer="ended"):
    """link: how the file system reaches S3 ("path": the export path of k8s/fsx's import path,
    "dra": an association of /runs with automatic export, "dra-manual": one without it, None:
    no link). lifecycles: what DescribeDataRepositoryTasks says of the new task, poll by poll."""
    answers = [
        {"tool": "kubectl", "call": ["get", "pvc", "fsx-claim"], "text": "pvc-5e6f7a8b"},
        {"tool": "kubectl", "call": ["get", "pv", "pvc-5e6f7a8b"], "text": FILE_SYSTEM},
        {"tool": "kubectl", "call": ["get", "pods", "app.kubernetes.io/name=resnet-trainer"],
         "text": "\n".join(" ".join(line.split()[:2])
                           for line in TRAINER_PODS[trainer].splitlines())},
        {"tool": "aws", "call": ["fsx", "describe-data-repository-associations", ON_FILE_SYSTEM],
         "json": {"dra": association(), "dra-manual": association(auto_export=())}.get(
             link, {"Associations": []})},
        {"tool": "aws", "call": ["fsx", "describe-file-systems", FILE_SYSTEM], "json": {
            "FileSystems": [{
                "FileSystemId": FILE_SYSTEM, "FileSystemType": "LUSTRE", "Lifecycle": "AVAILABLE",
                "StorageCapacity": 2400, "VpcId": VPC,
                "DNSName": f"{FILE_SYSTEM}.fsx.us-west-2.amazonaws.com",
                "LustreConfiguration": {
                    "DeploymentType": "SCRATCH_2", "MountName": "2p3bxbmv",
                    **({"DataRepositoryConfiguration": {
                        "Lifecycle": "AVAILABLE", "ImportPath": "s3://my-imagenet-bucket",
                        "ExportPath": "s3://my-imagenet-bucket", "ImportedFileChunkSize": 1024,
                        "AutoImportPolicy": "NONE"}} if link == "path" else {})}}]}},
        {"tool": "aws", "call": ["fsx", "create-data-repository-task"], "json": {
            "DataRepositoryTask": data_repository_task(TASK, AFTER_THE_LAST_POD,
                                                       lifecycle="PENDING")}},
    ]
    for i, lifecycle in enumerate(lifecycles):
        answer = {"tool": "aws", "call": ["fsx", "describe-data-repository-tasks", TASK],
                  "json": {"DataRepositoryTasks": [data_repository_task(
                      TASK, AFTER_THE_LAST_POD, lifecycle=lifecycle,
                      failed=3 if lifecycle == "FAILED" else 0)]}}
        if i + 1 < len(lifecycles):
            # Until the script has asked this often: each poll sees the next state.
            answer["before"] = f"describe-data-repository-tasks --task-ids {TASK}"
        answers.append(answer)
    return answers


def export(tools, answers, *runs, **env):
    return tools("eks-export.sh", answers, *runs, POLL_S="0", **env)


def created_tasks(calls):
    return [c for c in calls if "create-data-repository-task" in c]


def test_export_exports_the_runs_to_the_export_path_and_waits(tools):
    code, out, calls = export(tools, export_answers())
    assert code == 0, out
    task, = created_tasks(calls)
    assert task == (f"aws fsx create-data-repository-task --type EXPORT_TO_REPOSITORY "
                    f"--file-system-id {FILE_SYSTEM} --paths runs --report Enabled=false "
                    "--query DataRepositoryTask.TaskId --output text")
    # It polls the task until it has ended, then says where the runs are.
    polls = [c for c in calls if f"describe-data-repository-tasks --task-ids {TASK}" in c]
    assert len(polls) == 2, calls
    assert f"exported runs of {FILE_SYSTEM} to s3://my-imagenet-bucket/runs" in out


def test_export_of_named_runs_exports_those_folders(tools):
    code, out, calls = export(tools, export_answers(), "resnet50-p3", "/fsx/runs/smoke/")
    assert code == 0, out
    task, = created_tasks(calls)
    assert " --paths runs/resnet50-p3 runs/smoke --report " in task


@pytest.mark.parametrize("run", ["../imagenet", "/etc", "--all"])
def test_export_refuses_a_path_outside_the_runs(tools, run):
    code, out, calls = export(tools, export_answers(), run)
    assert code == 2 and "is not a folder under /fsx/runs" in out and calls == []


def test_export_warns_of_a_job_still_running(tools):
    code, out, calls = export(tools, export_answers(trainer="running"))
    assert code == 0, out
    assert "WARNING: still running, writing to /fsx/runs after this export: " \
           "resnet50-launcher-x8k2p" in out
    assert created_tasks(calls)


def test_export_leaves_an_automatic_export_to_itself(tools):
    # FSx runs no export task beside automatic export: the association does the work.
    code, out, calls = export(tools, export_answers(link="dra"))
    assert code == 0, out
    assert "exports /runs to s3://my-imagenet-bucket/runs by itself" in out
    assert "dra-0123456789abcdef0" in out and created_tasks(calls) == []


def test_export_through_an_association_without_automatic_export(tools):
    code, out, calls = export(tools, export_answers(link="dra-manual"))
    assert code == 0, out
    assert len(created_tasks(calls)) == 1
    assert "to s3://my-imagenet-bucket/runs" in out


def test_export_without_a_link_to_s3_says_how_to_make_one(tools):
    code, out, calls = export(tools, export_answers(link=None))
    assert code == 2, out
    assert f"{FILE_SYSTEM} has no S3 path to export /runs to" in out
    assert (f"aws fsx create-data-repository-association --file-system-id {FILE_SYSTEM} "
            "--file-system-path /runs --data-repository-path s3://BUCKET/runs") in out
    assert created_tasks(calls) == []


def test_export_that_fails_says_why(tools):
    code, out, _ = export(tools, export_answers(lifecycles=("EXECUTING", "FAILED")))
    assert code == 1, out
    assert f"{TASK} ended FAILED: 3 of 412 files not exported" in out
    assert "Access denied writing to s3://my-imagenet-bucket" in out


def test_export_stops_waiting_at_its_deadline(tools):
    code, out, _ = export(tools, export_answers(lifecycles=("EXECUTING",)), EXPORT_WAIT_S="0")
    assert code == 1, out
    assert f"{TASK} is still EXECUTING after 0 s" in out and "it goes on" in out


def test_export_finds_the_file_system_without_a_cluster(tools):
    answers = [a for a in export_answers() if a["tool"] != "kubectl"]
    code, out, calls = export(tools, answers, FSX_FILE_SYSTEM_ID=FILE_SYSTEM)
    assert code == 0, out
    assert not any(c.startswith("kubectl get pv") for c in calls)


def test_export_without_a_file_system_says_how_to_name_one(tools):
    answers = [{"tool": "kubectl", "call": ["get", "pvc"], "rc": 1,
                "stderr": 'Error from server (NotFound): persistentvolumeclaims "fsx-claim" '
                          "not found\n"}]
    code, out, calls = export(tools, answers)
    assert code == 2 and "HINT: set FSX_FILE_SYSTEM_ID=fs-..." in out
    assert created_tasks(calls) == []


# --- k8s-wait-nodes.sh: the guide's wait after `eksctl scale nodegroup --wait` -------------------

def nodes(*statuses):
    """`kubectl get nodes --no-headers` as it prints them: NAME STATUS ROLES AGE VERSION."""
    return "\n".join(f"ip-10-0-1-{i}.us-west-2.compute.internal   {s}   <none>   {40 + i}s   "
                     "v1.35.2-eks-a1b2c3d" for i, s in enumerate(statuses))


GET_NODES = ["get", "nodes", "node.kubernetes.io/instance-type=p3dn.24xlarge", "--no-headers"]


def test_wait_nodes_waits_for_nodes_not_yet_registered(tools):
    # The first look finds none (kubectl says so on stderr, exit 0); later ones find both Ready.
    answers = [{"tool": "kubectl", "call": GET_NODES, "before": "kubectl get nodes",
                "stderr": "No resources found\n"},
               {"tool": "kubectl", "call": GET_NODES, "text": nodes("Ready", "Ready")}]
    code, out, calls = tools("k8s-wait-nodes.sh", answers, "p3dn.24xlarge", "2", POLL_S="0.1")
    assert code == 0 and "2 p3dn.24xlarge node(s) Ready" in out, out
    assert len(calls) == 2


def test_wait_nodes_counts_neither_not_ready_nor_cordoned_nodes(tools):
    answers = [{"tool": "kubectl", "call": GET_NODES,
                "text": nodes("Ready", "NotReady", "Ready,SchedulingDisabled")}]
    code, out, calls = tools("k8s-wait-nodes.sh", answers, "p3dn.24xlarge", "2", "1",
                             POLL_S="0.2")
    assert code == 1, out
    assert "1 of 2 p3dn.24xlarge node(s) Ready after 1 s" in out and "Fix:" in out
    assert len(calls) >= 2  # it looked again before giving up


def test_wait_nodes_refuses_a_bad_count(tools):
    code, out, calls = tools("k8s-wait-nodes.sh", [], "p3dn.24xlarge", "two")
    assert code == 2 and "COUNT must be a positive whole number" in out and calls == []
