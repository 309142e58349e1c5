"""scripts/eks/teardown.sh against recorded AWS answers (tests/deploy/eks_fakes.py) and the real
kubectl deleting on a fake API server (tests/deploy/fake_api_server.py): what it deletes and in
which order, what it refuses while runs are not in S3 or a job still runs, that it completes on
a cluster without one operator or another, and what it says is left and billed."""
import re
import tempfile
from pathlib import Path

import pytest
from deploy_support import ROOT, TARGETS, kubectl  # noqa: F401 (a fixture)
from eks_fakes import tools  # noqa: F401 (a fixture)
from fake_api_server import OPERATORS, FakeApiServer
from fsx_answers import (VPC, GROUP, FILE_SYSTEM, FSX_DELETED, ON_FILE_SYSTEM, TRAINER_PODS,
                         CONFIG_MAPS, POD_ARGS, TASK, AFTER_THE_LAST_POD, BEFORE_THE_LAST_POD,
                         export_tasks, association)

jmespath = pytest.importorskip("jmespath", reason="jmespath is missing: run scripts/setup.sh")


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
    """The targets docs/eks.md applies (scripts/k8s/apply.sh TARGET ...)."""
    guide = (ROOT / "docs" / "eks.md").read_text()
    return set(re.findall(r"scripts/k8s/apply\.sh ([\w.-]+)", guide))


def teardown(tools, answers, *args, operators=tuple(OPERATORS), requests=None, **env):
    """The teardown of the cluster `resnet`, whose API server serves the kinds of `operators`;
    `requests`, a list, receives the requests the server got."""
    env = {"CLUSTER": "resnet", "BUCKET": "my-imagenet-bucket", "TEARDOWN_WAIT_S": "5",
           "POLL_S": "0", **env}
    with tempfile.TemporaryDirectory() as folder, FakeApiServer(operators) as api:
        result = tools("scripts/eks/teardown.sh", answers, *args,
                       FAKE_API_KUBECONFIG=str(api.kubeconfig(Path(folder))), **env)
        if requests is not None:
            requests += api.requests
    return result


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
    assert "HINT: scripts/eks/export.sh" in out and "--discard-unexported-runs" in out
    # Nothing is deleted: the jobs, the claim, the cluster all stay as they were.
    assert deletes(calls) == [], deletes(calls)


def test_teardown_refuses_while_the_trainer_still_runs(tools):
    # A job still writing: even a fresh export misses what it writes next (its SIGTERM checkpoint
    # too, were teardown to stop it).
    code, out, calls = teardown(tools, teardown_answers(trainer="running"))
    assert code == 2, out
    assert "the trainer's pods resnet50-launcher-x8k2p still run and write to /fsx/runs" in out
    assert "scripts/k8s/delete.sh TARGET" in out and "scripts/eks/export.sh" in out
    assert deletes(calls) == []


def test_teardown_discards_unexported_runs_when_told(tools):
    answers = teardown_answers(exported=None)
    code, out, calls = teardown(tools, answers, "--discard-unexported-runs", BUCKET="")
    assert code == 0, out
    assert "--discard-unexported-runs: deleting " + FILE_SYSTEM in out
    assert any(FSX_DELETED in c and c.endswith("/fsx.yaml") for c in calls)
    assert any(f"describe-file-systems --file-system-ids {FILE_SYSTEM}" in c for c in calls)


def test_teardown_refuses_an_unknown_argument(tools):
    code, out, calls = teardown(tools, teardown_answers(), "--discard")
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


@pytest.mark.parametrize("missing", [*OPERATORS, "all"])
def test_teardown_completes_on_a_cluster_without_an_operator(tools, missing):
    # An operator the guide installs but this cluster never got (or lost): kubectl delete fails
    # on its kinds even with --ignore-not-found, so scripts/k8s/delete.sh leaves them out.
    operators = [] if missing == "all" else [o for o in OPERATORS if o != missing]
    requests = []
    code, out, calls = teardown(tools, teardown_answers(), operators=operators,
                                requests=requests)
    assert code == 0, out
    assert "nothing billed is left of resnet" in out
    absent = {kind for name in OPERATORS if name not in operators
              for kinds in OPERATORS[name].values() for kind in kinds}
    named = set(re.findall(r"the cluster serves no (\w+) ", out))
    assert named == absent, out
    # What the cluster does serve is still deleted: the claim, the jobs' configs.
    assert "DELETE /api/v1/namespaces/default/persistentvolumeclaims/fsx-claim" in requests
    assert any(r.startswith("DELETE /api/v1/namespaces/default/configmaps/trainer-config-")
               for r in requests), requests
    assert any("eksctl delete cluster" in c for c in calls)
