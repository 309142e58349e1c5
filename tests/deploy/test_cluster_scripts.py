"""scripts/k8s/apply.sh and scripts/k8s/logs.sh against a stand-in kubectl that renders with the
real one and records every other call: what they would do to a cluster, without one; and
scripts/k8s/delete.sh with the real kubectl on a fake API server (tests/deploy/fake_api_server.py)
that serves each operator's kinds or not."""
import os
import subprocess

import pytest
from deploy_support import (IMAGE, ROOT, containers, kubectl,  # noqa: F401 (fixtures)
                            render, rendered)
from fake_api_server import CLUSTER_SCOPED, OPERATORS, FakeApiServer, plural

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")

FAKE_KUBECTL = """#!/usr/bin/env bash
# Renders with the real kubectl; records every other call, answers `get` as if found (a pod's
# name for `-o name`) and `logs` with the file KUBECTL_LOG names, when it names one.
if [ "$1" = kustomize ]; then exec "$REAL_KUBECTL" "$@"; fi
echo "kubectl $*" >> "$KUBECTL_CALLS"
if [ "$1" = get ] && [ "${*: -2}" = "-o name" ]; then echo pod/found; fi
if [ "$1" = logs ] && [ -n "${KUBECTL_LOG:-}" ]; then cat "$KUBECTL_LOG"; fi
"""


@pytest.fixture
def cluster(tmp_path, kubectl):
    """run(script, *args) -> (returncode, stderr, the kubectl calls other than kustomize)."""
    fake = tmp_path / "kubectl"
    fake.write_text(FAKE_KUBECTL)
    fake.chmod(0o755)
    calls = tmp_path / "calls"

    def run(script, *args, log=None):
        calls.write_text("")
        env = {**os.environ, "KUBECTL": str(fake), "REAL_KUBECTL": kubectl,
               "KUBECTL_CALLS": str(calls)}
        env.pop("IMAGE", None)
        if log is not None:
            (tmp_path / "log").write_text(log)
            env["KUBECTL_LOG"] = str(tmp_path / "log")
        proc = subprocess.run([str(ROOT / script), *args], capture_output=True,
                              text=True, env=env, timeout=120)
        return proc.returncode, proc.stderr, calls.read_text().splitlines()

    return run


def test_apply_applies_the_rendered_target(cluster):
    code, err, calls = cluster("scripts/k8s/apply.sh", "p3.16xlarge", "--image", IMAGE, "--workers", "4")
    assert code == 0, err
    manifest = ROOT / "build" / "k8s" / "p3.16xlarge.yaml"
    assert calls == [f"kubectl apply -f {manifest}"]
    assert f"image: {IMAGE}" in manifest.read_text()
    assert "+ " in err  # prints what it runs


def test_apply_refuses_placeholders(cluster):
    code, err, calls = cluster("scripts/k8s/apply.sh", "stage-data")
    assert code == 1 and "still has placeholders" in err and calls == []
    code, err, calls = cluster("scripts/k8s/apply.sh", "fsx")
    assert code == 1 and "FSX_SUBNET_ID" in err and calls == []


@pytest.mark.parametrize("target,job", [("p3.16xlarge", "resnet50-launcher"),
                                        ("p3dn.24xlarge", "resnet50-launcher"),
                                        ("one-node", "resnet50-one-node"),
                                        ("smoke", "resnet50-smoke"),
                                        ("stage-data", "fsx-stage-data")])
def test_logs_follow_the_launcher_or_the_job(cluster, target, job):
    code, err, calls = cluster("scripts/k8s/logs.sh", target)
    assert code == 0, err
    assert calls[-1] == f"kubectl logs -f --pod-running-timeout=30m job/{job}"


@pytest.mark.parametrize("target", ["pytorchjob-p3.16xlarge", "pytorchjob-p3dn.24xlarge"])
def test_logs_follow_worker_0_of_a_pytorchjob(cluster, target):
    # Global rank 0, which logs the world, the progress and the accuracy, runs on worker 0.
    code, err, calls = cluster("scripts/k8s/logs.sh", target)
    assert code == 0, err
    assert calls[0] == "kubectl get PyTorchJob/resnet50-elastic -o wide"
    assert calls[-1] == "kubectl logs -f --pod-running-timeout=30m pod/resnet50-elastic-worker-0"


def test_logs_follow_the_first_node_of_a_trainjob(cluster):
    # Global rank 0 runs on the node of index 0, whose pod's name the JobSet generates.
    first = ("-l jobset.sigs.k8s.io/jobset-name=resnet50-torch,"
             "batch.kubernetes.io/job-completion-index=0")
    code, err, calls = cluster("scripts/k8s/logs.sh", "trainjob-p5.48xlarge")
    assert code == 0, err
    assert calls[0] == "kubectl get TrainJob/resnet50-torch -o wide"
    assert calls[1] == f"kubectl get pods {first} -o name"
    assert calls[-1] == f"kubectl logs -f --pod-running-timeout=30m {first}"
    code, err, calls = cluster("scripts/k8s/logs.sh", "trainjob-p5.48xlarge", "--once")
    assert code == 0 and calls == [f"kubectl logs {first}"], err


def test_logs_once_prints_the_log_so_far_without_waiting(cluster):
    code, err, calls = cluster("scripts/k8s/logs.sh", "p3dn.24xlarge", "--once")
    assert code == 0, err
    assert calls == ["kubectl logs job/resnet50-launcher"]


# NCCL_DEBUG=INFO lines as NCCL and aws-ofi-nccl print them: "Provider" in older aws-ofi-nccl
# releases, "provider ..., fabric is" in newer ones; NCCL's sockets when the plugin is missing.
OFI_OLD = "resnet50-worker-0:40:95 [0] NCCL INFO NET/OFI Selected Provider is efa (found 1 nics)\n"
OFI_NEW = ("resnet50-worker-0:40:95 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is "
           "efa (found 1 nics)\n")
OFI_TCP = "resnet50-worker-0:40:95 [0] NCCL INFO NET/OFI Selected provider is tcp, fabric is x\n"
SOCKET = "resnet50-worker-0:40:95 [0] NCCL INFO Using network Socket\n"


@pytest.mark.parametrize("target", ["p3dn.24xlarge", "pytorchjob-p3dn.24xlarge"])
@pytest.mark.parametrize("log,uses_efa,says", [(OFI_OLD, True, "uses EFA"),
                                               (OFI_NEW, True, "uses EFA"),
                                               (OFI_TCP, False, "selected 'tcp'"),
                                               (SOCKET, False, "--efa"),
                                               # efa selected, then given up: NCCL's sockets.
                                               (OFI_NEW + SOCKET, False, "then NCCL logged"),
                                               ("step 20/150\n", False, "no NCCL network line")])
def test_check_efa_exits_0_only_when_nccl_selected_efa(cluster, target, log, uses_efa, says):
    code, out_err, calls = cluster("scripts/k8s/check_efa.sh", target, log="NCCL INFO Bootstrap\n" + log)
    assert (code == 0) == uses_efa, out_err
    assert calls[-1].startswith("kubectl logs ")
    if not uses_efa:
        assert says in out_err


@pytest.mark.parametrize("target,role", [("p3dn.24xlarge", "Launcher"),
                                         ("pytorchjob-p3dn.24xlarge", "Worker")])
def test_the_efa_targets_log_what_the_check_reads(rendered, target, role):
    # The check reads NCCL_DEBUG=INFO lines of the pod whose log scripts/k8s/logs.sh prints (mpirun's
    # launcher gets it as `-x NCCL_DEBUG=INFO`): without them no EFA job could pass the check.
    settings = set()
    for doc in rendered(target):
        if doc["kind"] in ("MPIJob", "PyTorchJob"):
            for r, _, c in containers(doc):
                if r == role:
                    settings |= set(c.get("args", []))
                    settings |= {f"{e['name']}={e.get('value')}" for e in c.get("env", [])}
    assert "NCCL_DEBUG=INFO" in settings, sorted(settings)


def test_logs_refuses_a_target_without_a_job(cluster):
    for target in ("fsx", "tensorboard"):
        code, _, calls = cluster("scripts/k8s/logs.sh", target)
        assert code == 2 and calls == []


def on_cluster(tmp_path, kubectl, operators, *command):
    """COMMAND with the real kubectl on a cluster that serves the kinds of `operators` and holds
    no object: (returncode, stderr, the API server's DELETE requests)."""
    with FakeApiServer(operators) as api:
        env = {**os.environ, "KUBECTL": kubectl, "KUBECONFIG": str(api.kubeconfig(tmp_path)),
               "KUBECACHEDIR": str(tmp_path / "cache")}
        proc = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                              env=env, timeout=120)
    return proc.returncode, proc.stderr, {r for r in api.requests if r.startswith("DELETE ")}


def delete_requests(docs):
    """The DELETE request of each object of `docs`, as kubectl sends it."""
    requests = set()
    for doc in docs:
        version, kind, name = doc["apiVersion"], doc["kind"], doc["metadata"]["name"]
        prefix = "/api/v1" if version == "v1" else f"/apis/{version}"
        scope = "" if kind in CLUSTER_SCOPED else "/namespaces/default"
        requests.add(f"DELETE {prefix}{scope}/{plural(kind)}/{name}")
    return requests


def test_delete_deletes_what_apply_created(tmp_path, kubectl, render):
    code, err, deleted = on_cluster(tmp_path, kubectl, OPERATORS,
                                    ROOT / "scripts/k8s/delete.sh", "one-node")
    assert code == 0, err
    assert deleted == delete_requests(render("one-node")), err


# Each operator's targets, and one target of the four whose kinds it serves.
OPERATOR_TARGETS = {"mpi-operator": "p3.16xlarge", "training-operator": "pytorchjob-p3.16xlarge",
                    "trainer": "trainjob-p5.48xlarge", "kueue": "kueue"}


@pytest.mark.parametrize("missing", OPERATORS)
def test_delete_leaves_out_the_kinds_the_cluster_does_not_serve(tmp_path, kubectl, render,
                                                                 missing):
    target = OPERATOR_TARGETS[missing]
    docs = render(target, "--no-plan")
    absent = {kind for kinds in OPERATORS[missing].values() for kind in kinds}
    served = [d for d in docs if d["kind"] not in absent]
    operators = [o for o in OPERATORS if o != missing]
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    # kubectl itself: a kind the cluster does not serve fails the delete, --ignore-not-found or
    # not, after deleting the rest.
    code, err, deleted = on_cluster(tmp_path, kubectl, operators, kubectl, "delete",
                                    "--ignore-not-found", "-f", manifest)
    assert code == 1 and "no matches for kind" in err, err
    # The script: the same objects deleted, the others named, and success.
    code, err, deleted_by_script = on_cluster(tmp_path, kubectl, operators,
                                              ROOT / "scripts/k8s/delete.sh", target)
    assert code == 0, err
    assert deleted_by_script == deleted == delete_requests(served)
    for doc in docs:
        if doc["kind"] in absent:
            assert f"the cluster serves no {doc['kind']} ({doc['apiVersion']}): no " \
                   f"{doc['kind']} {doc['metadata']['name']} of {target} to delete" in err
    if not served:
        assert f"nothing of {target} on this cluster" in err


@pytest.mark.parametrize("variable,value", [("FSX_SUBNET_ID", "None"),
                                            ("FSX_SECURITY_GROUP_ID", "None"),
                                            ("FSX_SUBNET_ID", "sg-0123abcd"),
                                            ("FSX_S3_IMPORT_PATH", "my-bucket")])
def test_apply_refuses_an_fsx_value_that_a_failed_lookup_left(cluster, monkeypatch, variable,
                                                              value):
    # `aws ec2 describe-subnets ... --output text` prints "None" when no subnet matches; applied,
    # the claim would stay Pending with an error only the CSI controller's log shows.
    good = {"FSX_SUBNET_ID": "subnet-0a1b2c3d", "FSX_SECURITY_GROUP_ID": "sg-0a1b2c3d",
            "FSX_S3_IMPORT_PATH": "s3://my-bucket"}
    for name, v in {**good, variable: value}.items():
        monkeypatch.setenv(name, v)
    code, err, calls = cluster("scripts/k8s/apply.sh", "fsx")
    assert code == 1 and f"{variable}='{value}'" in err and calls == []


def test_apply_applies_fsx_with_real_looking_values(cluster, monkeypatch):
    for name, v in {"FSX_SUBNET_ID": "subnet-0a1b2c3d", "FSX_SECURITY_GROUP_ID": "sg-0a1b2c3d",
                    "FSX_S3_IMPORT_PATH": "s3://my-bucket"}.items():
        monkeypatch.setenv(name, v)
    code, err, calls = cluster("scripts/k8s/apply.sh", "fsx")
    assert code == 0, err
    assert calls == [f"kubectl apply -f {ROOT / 'build' / 'k8s' / 'fsx.yaml'}"]
    assert "subnetId: subnet-0a1b2c3d" in (ROOT / "build" / "k8s" / "fsx.yaml").read_text()


EXISTING = {"FSX_FILE_SYSTEM_ID": "fs-0a1b2c3d4e5f60718",
            "FSX_DNS_NAME": "fs-0a1b2c3d4e5f60718.fsx.us-west-2.amazonaws.com",
            "FSX_MOUNT_NAME": "2p3bxbmv"}


def test_apply_refuses_an_existing_file_system_left_unnamed(cluster):
    code, err, calls = cluster("scripts/k8s/apply.sh", "fsx-existing")
    assert code == 1 and "still has placeholders" in err and "FSX_FILE_SYSTEM_ID" in err
    assert calls == []


@pytest.mark.parametrize("variable,value", [("FSX_FILE_SYSTEM_ID", "None"),
                                            ("FSX_DNS_NAME", "None"),
                                            ("FSX_MOUNT_NAME", "None"),
                                            ("FSX_FILE_SYSTEM_ID", "subnet-0a1b2c3d")])
def test_apply_refuses_an_existing_file_system_value_that_a_failed_lookup_left(
        cluster, monkeypatch, variable, value):
    for name, v in {**EXISTING, variable: value}.items():
        monkeypatch.setenv(name, v)
    code, err, calls = cluster("scripts/k8s/apply.sh", "fsx-existing")
    assert code == 1 and f"{variable}='{value}'" in err and calls == []


def test_apply_applies_an_existing_file_system(cluster, monkeypatch):
    for name, v in EXISTING.items():
        monkeypatch.setenv(name, v)
    code, err, calls = cluster("scripts/k8s/apply.sh", "fsx-existing")
    assert code == 0, err
    manifest = ROOT / "build" / "k8s" / "fsx-existing.yaml"
    assert calls == [f"kubectl apply -f {manifest}"]
    assert f"volumeHandle: {EXISTING['FSX_FILE_SYSTEM_ID']}" in manifest.read_text()


def test_apply_refuses_an_export_path_outside_the_import_bucket(cluster, monkeypatch):
    # FSx exports only to the bucket it imports from; applied, the claim would stay Pending with
    # the error in the CSI controller's log alone.
    for name, v in {"FSX_SUBNET_ID": "subnet-0a1b2c3d", "FSX_SECURITY_GROUP_ID": "sg-0a1b2c3d",
                    "FSX_S3_IMPORT_PATH": "s3://my-bucket",
                    "FSX_S3_EXPORT_PATH": "s3://other-bucket/runs"}.items():
        monkeypatch.setenv(name, v)
    code, err, calls = cluster("scripts/k8s/apply.sh", "fsx")
    assert code == 1 and "is not in the bucket of FSX_S3_IMPORT_PATH" in err and calls == []
