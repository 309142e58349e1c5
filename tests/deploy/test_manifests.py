"""k8s/: every manifest parses, every kustomization and target renders, and what they render is
valid: built-in kinds against Kubernetes' schemas, MPIJobs against the MPI Operator's CRD
(PyTorchJobs against the Training Operator's: test_pytorchjob.py)."""
import copy
import subprocess

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
# kubectl, render and rendered are fixtures.
from deploy_support import (CRD, MPIJOB_TARGETS, ROOT, TARGETS,  # noqa: E402,F401
                            crd_validator, kubectl, render, rendered)

# The Kubernetes version the built-in kinds are checked against: one in EKS standard support
# (docs/eks.md, step 0).
K8S_VERSION = "1.35"
MANIFESTS = sorted((ROOT / "k8s").rglob("*.yaml"))
# Those that build on an upstream ref (k8s/training-operator) render in their own test, against a
# copy of upstream: the tests cannot reach GitHub. A Component (k8s/components) renders nothing
# alone, only inside the targets that name it, which are rendered.
KUSTOMIZATIONS = sorted(p.parent for p in (ROOT / "k8s").rglob("kustomization.yaml")
                        if "https://github.com/" not in p.read_text()
                        and "\nkind: Component\n" not in p.read_text())


def test_k8s_has_manifests():
    assert MANIFESTS and KUSTOMIZATIONS


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_manifest_parses(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path} is empty"
    for doc in docs:
        if isinstance(doc, list):  # a JSON 6902 patch
            assert all({"op", "path"} <= set(op) for op in doc), f"{path}: malformed patch"
        else:
            assert {"apiVersion", "kind"} <= set(doc) or "nameReference" in doc, (
                f"{path}: a document without apiVersion/kind")


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(ROOT)))
def test_kustomization_renders(directory, kubectl):
    command = ([kubectl, "build"] if kubectl.endswith("kustomize") else [kubectl, "kustomize"])
    proc = subprocess.run(
        command + ["--load-restrictor", "LoadRestrictionsNone", str(directory)],
        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.mark.parametrize("target", TARGETS)
def test_target_renders_with_the_image(target, rendered):
    docs = rendered(target)
    assert docs
    text = yaml.safe_dump_all(docs)
    if target != "fsx":
        assert "image: resnet-trainer" not in text and "REPLACE-ME/resnet-trainer" not in text


def builtin_docs(target, rendered):
    """The objects of Kubernetes' own kinds: not those of the operators' and Kueue's CRDs."""
    return [d for d in rendered(target)
            if d["apiVersion"].split("/")[0] not in ("kubeflow.org", "kueue.x-k8s.io",
                                                     "trainer.kubeflow.org")]


@pytest.mark.parametrize("target", TARGETS)
def test_builtin_kinds_validate(target, rendered):
    kv = pytest.importorskip("kubernetes_validate", reason="run scripts/setup.sh")
    for doc in builtin_docs(target, rendered):
        # strict: unknown fields (a typo the API server would drop silently) are errors.
        kv.validate(doc, K8S_VERSION, strict=True)


def test_builtin_validation_rejects_a_misspelled_field(rendered):
    kv = pytest.importorskip("kubernetes_validate", reason="run scripts/setup.sh")
    job = copy.deepcopy(next(d for d in rendered("smoke") if d["kind"] == "Job"))
    job["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kv.ValidationError):
        kv.validate(job, K8S_VERSION, strict=True)


@pytest.fixture(scope="module")
def mpijob_validator():
    return crd_validator(CRD, "v2beta1", "MPI Operator")


def mpijob(target, rendered):
    return next(d for d in rendered(target) if d["kind"] == "MPIJob")


@pytest.mark.parametrize("target", MPIJOB_TARGETS)
def test_mpijob_validates_against_the_crd(target, rendered, mpijob_validator):
    doc = mpijob(target, rendered)
    assert doc["apiVersion"] == "kubeflow.org/v2beta1"
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}"
              for e in mpijob_validator.iter_errors(doc)]
    assert not errors, "\n".join(errors)


def test_crd_validation_rejects_bad_mpijobs(rendered, mpijob_validator):
    misspelled = copy.deepcopy(mpijob("p3.16xlarge", rendered))
    misspelled["spec"]["launcherCreationPolicyy"] = "WaitForWorkersReady"
    assert not mpijob_validator.is_valid(misspelled)
    wrong_type = copy.deepcopy(mpijob("p3.16xlarge", rendered))
    wrong_type["spec"]["slotsPerWorker"] = "eight"
    assert not mpijob_validator.is_valid(wrong_type)
