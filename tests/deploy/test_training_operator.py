"""k8s/training-operator: the Training Operator installs beside the MPI Operator. Rendered against
upstream's tree at the pinned tag (tests/deploy/upstream/, the CRD schemas cut), since the tests
cannot reach GitHub: no MPIJob CRD of its own, and the manager runs the PyTorchJob controller
alone, so it neither replaces the MPI Operator's v2beta1 CRD nor starts launchers for MPIJobs."""
import re
import shutil
import subprocess

import pytest
from deploy_support import ROOT, kubectl  # noqa: F401 (a fixture)

yaml = pytest.importorskip("yaml")
INSTALL = ROOT / "k8s" / "training-operator" / "kustomization.yaml"
UPSTREAM = ROOT / "tests" / "deploy" / "upstream"


@pytest.fixture(scope="module")
def rendered(kubectl, tmp_path_factory):
    text = INSTALL.read_text()
    remote = re.search(r"^- (https://github\.com/kubeflow/trainer\.git/(\S+)\?ref=(v[\d.]+))$",
                       text, re.M)
    assert remote, "the install names no pinned upstream ref"
    _, path, ref = remote.groups()
    copy = UPSTREAM / f"training-operator-{ref}"
    assert copy.is_dir(), f"no copy of upstream at {ref} in {UPSTREAM}: the pin moved without it"
    work = tmp_path_factory.mktemp("training-operator")
    shutil.copytree(copy, work / "upstream")
    (work / "install").mkdir()
    (work / "install" / "kustomization.yaml").write_text(
        text.replace(remote.group(1), f"../upstream/{path}"))
    tool = [kubectl, "build"] if kubectl.endswith("kustomize") else [kubectl, "kustomize"]
    proc = subprocess.run([*tool, str(work / "install")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def named(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_no_mpijob_crd_and_the_pytorchjob_crd_is_there(rendered):
    crds = named(rendered, "CustomResourceDefinition")
    assert "mpijobs.kubeflow.org" not in crds
    assert "pytorchjobs.kubeflow.org" in crds
    # Nothing else of upstream's install is lost on the way.
    assert {"training-operator"} <= set(named(rendered, "Deployment"))
    assert named(rendered, "ValidatingWebhookConfiguration")


def test_the_manager_runs_the_pytorchjob_controller_alone(rendered):
    manager = named(rendered, "Deployment")["training-operator"]
    container = manager["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/manager"]
    assert container["args"] == ["--enable-scheme=pytorchjob"]
    assert manager["metadata"]["namespace"] == "kubeflow"


def test_the_guide_installs_it_after_the_mpi_operator():
    guide = (ROOT / "docs" / "eks.md").read_text()
    mpi = guide.index("mpi-operator/v0.8.2/deploy/v2beta1/mpi-operator.yaml")
    assert guide.index("kubectl apply --server-side -k k8s/training-operator") > mpi
    assert "as its README says" not in guide
