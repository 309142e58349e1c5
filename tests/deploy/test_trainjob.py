"""The fixed-size TrainJob targets (k8s/trainjob, Kubeflow Trainer v2.3.0): the TrainJob and its
ClusterTrainingRuntime valid against the Trainer's CRDs, shaped as the Trainer's webhook and torch
plugin need (a trainer block, the container `node`, no reserved or patched variables), the same
network settings as the MPIJob of their instance type, resized by scripts/k8s/render.sh; and the
command of each node's pod, run on the CPU as the Trainer runs it (the torch plugin's PET_*
variables, two pods as two torchrun agents meeting at the first, the image's entrypoint): trains
to the end; a pod lost mid-run ends the other with an error, and the JobSet's restart of both
resumes from the newest checkpoint, every image of each epoch trained once."""
import copy
import re
import sys

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
# kubectl, render and rendered are fixtures.
from deploy_support import (EFA_INTERFACES, TRAINER_CRDS, TRAINJOB_TARGETS,  # noqa: E402,F401
                            crd_validator, kubectl, kueue_written_back, node_template,
                            render, rendered, trainjob_pod)
from test_pytorchjob import (BIN, TORCHRUN, LocalPods,  # noqa: E402
                             assert_every_image_once_per_epoch, merged_log, rounds)
from conftest import kill_tree  # noqa: E402

# The torch plugin's variables (pkg/runtime/framework/plugins/torch/torch.go), which a TrainJob
# may not set itself ("must not have reserved envs").
RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
            "PET_MASTER_PORT"}


def trainjob(docs):
    (job,) = [d for d in docs if d["kind"] == "TrainJob"]
    return job


@pytest.mark.parametrize("target", TRAINJOB_TARGETS + ["trainer-runtime"])
def test_objects_validate_against_the_trainer_crds(target, rendered):
    for doc in rendered(target):
        if doc["apiVersion"].split("/")[0] != "trainer.kubeflow.org":
            continue
        plural = {"TrainJob": "trainjobs", "ClusterTrainingRuntime": "clustertrainingruntimes"}
        validator = crd_validator(TRAINER_CRDS / f"trainer.kubeflow.org_{plural[doc['kind']]}.yaml",
                                  "v1alpha1", "Kubeflow Trainer")
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, "\n".join(errors)


def test_crd_validation_rejects_a_misspelled_trainer_field(rendered):
    validator = crd_validator(TRAINER_CRDS / "trainer.kubeflow.org_trainjobs.yaml", "v1alpha1",
                              "Kubeflow Trainer")
    job = copy.deepcopy(trainjob(rendered("trainjob-p3.16xlarge")))
    job["spec"]["trainer"]["numProcsPerNode"] = job["spec"]["trainer"].pop("numProcPerNode")
    assert not validator.is_valid(job)


@pytest.mark.parametrize("target", TRAINJOB_TARGETS)
def test_the_trainer_finds_what_it_needs(target, rendered):
    job = trainjob(rendered(target))
    (runtime,) = rendered("trainer-runtime")
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert "torch" in runtime["spec"]["mlPolicy"]
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] \
        == "trainer"
    # The webhook: a manager that is a domain-prefixed path; patches name only what the runtime
    # has, and set no variables (spec.trainer.env does).
    (patch,) = job["spec"]["runtimePatches"]
    assert re.fullmatch(r"[a-z0-9.-]+\.[a-z]+/[a-z0-9./-]+", patch["manager"])
    (patched,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert patched["name"] == "node"
    for container in patched["template"]["spec"]["template"]["spec"]["containers"]:
        assert container["name"] == "node" and "env" not in container
    trainer = job["spec"]["trainer"]
    assert not RESERVED & {e["name"] for e in trainer["env"]}
    # One rank per GPU, torchrun running train itself with the config alone.
    assert trainer["numProcPerNode"] == trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert trainer["command"] + trainer["args"] == [
        BIN + "entrypoint", "torchrun", "--no-python", BIN + "train", "--config",
        "/etc/resnet-trainer/trainer.toml"]
    _, pod = trainjob_pod(job, runtime)
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == target.split("-", 1)[1]
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert {"/dev/shm", "/fsx/imagenet", "/fsx/runs", "/fsx/weights",
            "/etc/resnet-trainer"} == set(mounts)
    assert mounts["/fsx/imagenet"]["readOnly"] and mounts["/fsx/weights"]["readOnly"]


@pytest.mark.parametrize("target", TRAINJOB_TARGETS)
def test_network_settings_match_the_mpijob_of_the_instance_type(target, rendered):
    trainer = trainjob(rendered(target))["spec"]["trainer"]
    env = {f"{e['name']}={e['value']}" for e in trainer["env"]
           if e["name"].startswith(("NCCL_", "FI_"))}
    mpijob = next(d for d in rendered(target.split("-", 1)[1]) if d["kind"] == "MPIJob")
    launcher = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    args = launcher["containers"][0]["args"]
    exported = {args[i + 1] for i, a in enumerate(args) if a == "-x" and "=" in args[i + 1]}
    assert exported and env == exported
    efa = int(trainer["resourcesPerNode"]["limits"].get("vpc.amazonaws.com/efa", 0))
    assert efa == EFA_INTERFACES[target.split("-", 1)[1]]


def test_the_renderer_sets_nodes_and_ranks_per_node(render):
    trainer = trainjob(render("trainjob-p5.48xlarge", "--workers", "6", "--slots", "4"))["spec"][
        "trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (6, 4)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 4
    # The instance type's own settings survive the patch.
    assert trainer["resourcesPerNode"]["limits"]["vpc.amazonaws.com/efa"] == 32


# The rehearsal: each node's command on the CPU, two pods as two torchrun agents.

def plugin_env(job, index, port):
    """What the Trainer's torch plugin sets in the container `node` of pod `index`, with the
    first pod's name (<job>-node-0-0.<job>) as 127.0.0.1."""
    trainer = job["spec"]["trainer"]
    return {"PET_NNODES": str(trainer["numNodes"]),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_NODE_RANK": str(index), "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1"}


class Nodes(LocalPods):
    """The pods of the rendered TrainJob as the Trainer's JobSet starts them, with the torch
    plugin's variables."""

    def __init__(self, render, tmp_path, epochs):
        self.job = trainjob(render("trainjob-p3.16xlarge", "--workers", "2", "--slots", "1"))
        (container,) = trainjob_pod(self.job)[1]["containers"]
        super().__init__(container, tmp_path, epochs)

    def start_pods(self):
        """Starts both pods at once, as the JobSet does (again, on a restart)."""
        self.pods = [self.start(plugin_env(self.job, i, self.port)) for i in (0, 1)]


@pytest.mark.skipif(not TORCHRUN.exists(), reason=f"no torchrun beside {sys.executable}")
def test_node_command_trains_and_a_restart_after_a_lost_pod_resumes(render, tmp_path):
    nodes = Nodes(render, tmp_path, epochs=3)
    try:
        nodes.start_pods()
        nodes.wait_for_checkpoint(4)
        # A node goes away: every process of its pod dies at once. With a fixed number of nodes
        # the other pod's ranks cannot go on: its torchrun ends with an error, its Job fails.
        kill_tree(nodes.pods[1])
        first, _ = nodes.pods[0].communicate(timeout=300)
        assert nodes.pods[0].returncode != 0, first
        # The JobSet's restart (failurePolicy.maxRestarts): both pods anew.
        nodes.start_pods()
        outs = [pod.communicate(timeout=600)[0] for pod in nodes.pods]
    finally:
        nodes.stop()
    assert [pod.returncode for pod in nodes.pods] == [0, 0], outs
    log = merged_log([first, *outs])
    (_, first_world), (resumed_at, world) = rounds(log)
    assert first_world == world == 2 and resumed_at >= 4, log
    assert_every_image_once_per_epoch(nodes.trace, log, epochs=3)


# torchrun's agent stops its ranks with SIGTERM, then SIGKILL this many seconds later
# (torch.distributed.elastic's shutdown timeout).
TORCHRUN_KILL_S = 30


@pytest.mark.parametrize("target", TRAINJOB_TARGETS)
def test_the_grace_period_outlasts_torchruns_kill_once_kueue_admits_the_job(target, rendered):
    # Every field the job's patches set survives Kueue's write-back on admission, and the pods
    # then get the time to checkpoint: torchrun's SIGTERM, its SIGKILL 30 s later, all inside
    # the grace period.
    job = trainjob(rendered(target))
    for patch in job["spec"]["runtimePatches"]:
        assert kueue_written_back(patch) == node_template(patch["trainingRuntimeSpec"])
    _, pod = trainjob_pod(job)
    assert pod["terminationGracePeriodSeconds"] >= 2 * TORCHRUN_KILL_S
