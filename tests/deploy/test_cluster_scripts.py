"""scripts/k8s-apply.sh, k8s-logs.sh and k8s-delete.sh against a stand-in kubectl that renders
with the real one and records every other call: what they would do to a cluster, without one."""
import os
import subprocess

import pytest
from deploy_support import IMAGE, ROOT, kubectl  # noqa: F401 (a fixture)

FAKE_KUBECTL = """#!/usr/bin/env bash
# Renders with the real kubectl; records every other call, and answers `get` as if found.
if [ "$1" = kustomize ]; then exec "$REAL_KUBECTL" "$@"; fi
echo "kubectl $*" >> "$KUBECTL_CALLS"
"""


@pytest.fixture
def cluster(tmp_path, kubectl):
    """run(script, *args) -> (returncode, stderr, the kubectl calls other than kustomize)."""
    fake = tmp_path / "kubectl"
    fake.write_text(FAKE_KUBECTL)
    fake.chmod(0o755)
    calls = tmp_path / "calls"

    def run(script, *args):
        calls.write_text("")
        env = {**os.environ, "KUBECTL": str(fake), "REAL_KUBECTL": kubectl,
               "KUBECTL_CALLS": str(calls)}
        env.pop("IMAGE", None)
        proc = subprocess.run([str(ROOT / "scripts" / script), *args], capture_output=True,
                              text=True, env=env, timeout=120)
        return proc.returncode, proc.stderr, calls.read_text().splitlines()

    return run


def test_apply_applies_the_rendered_target(cluster):
    code, err, calls = cluster("k8s-apply.sh", "p3.16xlarge", "--image", IMAGE, "--workers", "4")
    assert code == 0, err
    manifest = ROOT / "build" / "k8s" / "p3.16xlarge.yaml"
    assert calls == [f"kubectl apply -f {manifest}"]
    assert f"image: {IMAGE}" in manifest.read_text()
    assert "+ " in err  # prints what it runs


def test_apply_refuses_placeholders(cluster):
    code, err, calls = cluster("k8s-apply.sh", "stage-data")
    assert code == 1 and "still has placeholders" in err and calls == []
    code, err, calls = cluster("k8s-apply.sh", "fsx")
    assert code == 1 and "FSX_SUBNET_ID" in err and calls == []


@pytest.mark.parametrize("target,job", [("p3.16xlarge", "resnet50-launcher"),
                                        ("p3dn.24xlarge", "resnet50-launcher"),
                                        ("one-node", "resnet50-one-node"),
                                        ("smoke", "resnet50-smoke"),
                                        ("stage-data", "fsx-stage-data")])
def test_logs_follow_the_launcher_or_the_job(cluster, target, job):
    code, err, calls = cluster("k8s-logs.sh", target)
    assert code == 0, err
    assert calls[-1] == f"kubectl logs -f --pod-running-timeout=30m job/{job}"


@pytest.mark.parametrize("target", ["pytorchjob-p3.16xlarge", "pytorchjob-p3dn.24xlarge"])
def test_logs_follow_worker_0_of_a_pytorchjob(cluster, target):
    # Global rank 0, which logs the world, the progress and the accuracy, runs on worker 0.
    code, err, calls = cluster("k8s-logs.sh", target)
    assert code == 0, err
    assert calls[0] == "kubectl get PyTorchJob/resnet50-elastic -o wide"
    assert calls[-1] == "kubectl logs -f --pod-running-timeout=30m pod/resnet50-elastic-worker-0"


def test_logs_refuses_a_target_without_a_job(cluster):
    for target in ("fsx", "tensorboard"):
        code, _, calls = cluster("k8s-logs.sh", target)
        assert code == 2 and calls == []


def test_delete_deletes_what_apply_created(cluster):
    code, err, calls = cluster("k8s-delete.sh", "one-node")
    assert code == 0, err
    assert calls == [f"kubectl delete --ignore-not-found -f {ROOT / 'build' / 'k8s' / 'one-node.yaml'}"]
