"""The elastic PyTorchJob targets (k8s/pytorchjob): valid against the Training Operator v1.9.0 CRD,
shaped the way the operator needs (a `pytorch` container with its port, workers only, c10d
rendezvous, one rank per GPU), the same network settings as the MPIJob of their instance type,
resized by scripts/k8s/render.sh within their elastic bounds; and their worker command, run on
the CPU the way the operator runs it (its PET_* variables, two pods as two torchrun agents, the
image's entrypoint), trains, loses a pod mid-run and finishes on the one left, every image of
each epoch trained once."""
import copy
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
# kubectl, render and rendered are fixtures.
from deploy_support import (EFA_INTERFACES, MPIJOB_TARGETS, PYTORCHJOB_CRD,  # noqa: E402,F401
                            PYTORCHJOB_TARGETS,
                            ROOT, build_dir, crd_validator, kubectl, render,
                            rendered)
from conftest import kill_tree  # noqa: E402

BIN = "/opt/resnet-trainer/bin/"
TORCHRUN = Path(sys.executable).parent / "torchrun"  # the `torch` wheel's, in the test venv


def pytorchjob(docs):
    found = [d for d in docs if d["kind"] == "PyTorchJob"]
    assert len(found) == 1, f"expected one PyTorchJob, found {len(found)}"
    return found[0]


def worker(job):
    """The Worker replica spec, its pod spec and its one container."""
    spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    return spec, pod, container


@pytest.fixture(scope="module")
def validator():
    return crd_validator(PYTORCHJOB_CRD, "v1", "Training Operator")


@pytest.mark.parametrize("target", PYTORCHJOB_TARGETS)
def test_pytorchjob_validates_against_the_crd(target, rendered, validator):
    job = pytorchjob(rendered(target))
    assert job["apiVersion"] == "kubeflow.org/v1"
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(job)]
    assert not errors, "\n".join(errors)


def test_crd_validation_rejects_bad_pytorchjobs(rendered, validator):
    job = pytorchjob(rendered(PYTORCHJOB_TARGETS[0]))
    misspelled = copy.deepcopy(job)
    misspelled["spec"]["elasticPolicy"]["maxRestart"] = 3
    assert not validator.is_valid(misspelled)
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["elasticPolicy"]["minReplicas"] = "one"
    assert not validator.is_valid(wrong_type)


@pytest.mark.parametrize("target", PYTORCHJOB_TARGETS)
def test_the_operator_finds_what_it_needs(target, rendered):
    job = pytorchjob(rendered(target))
    spec = job["spec"]
    # Elastic jobs are workers only: the rendezvous, not a Master replica, makes rank 0.
    assert set(spec["pytorchReplicaSpecs"]) == {"Worker"}
    replicas, pod, container = worker(job)
    policy = spec["elasticPolicy"]
    assert policy["rdzvBackend"] == "c10d" and policy["maxRestarts"] >= 1
    assert 1 <= policy["minReplicas"] <= replicas["replicas"] <= policy["maxReplicas"]
    # The operator takes the rendezvous port from the port of this name in the container of
    # this name; without them it cannot point PET_RDZV_ENDPOINT anywhere.
    assert container["name"] == "pytorch"
    assert [p["name"] for p in container["ports"]] == ["pytorchjob-port"]
    # One rank per GPU, torchrun running train itself with the config alone: a flag would
    # override the config's keys (resume among them).
    assert int(spec["nprocPerNode"]) == int(container["resources"]["limits"]["nvidia.com/gpu"]) == 8
    words = container["command"] + container["args"]
    assert words[:3] == [BIN + "entrypoint", "torchrun", "--no-python"]
    assert words[3:] == [BIN + "train", "--config", "/etc/resnet-trainer/trainer.toml"]
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == target.split("-", 1)[1]


@pytest.mark.parametrize("target", PYTORCHJOB_TARGETS)
def test_network_settings_match_the_mpijob_of_the_instance_type(target, rendered):
    _, _, container = worker(pytorchjob(rendered(target)))
    # NCCL's and libfabric's settings (the rest is torchrun's).
    env = {f"{e['name']}={e['value']}" for e in container["env"]
           if e["name"].startswith(("NCCL_", "FI_"))}
    mpijob = next(d for d in rendered(target.split("-", 1)[1]) if d["kind"] == "MPIJob")
    args = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    exported = {args[i + 1] for i, a in enumerate(args) if a == "-x" and "=" in args[i + 1]}
    assert exported and env == exported
    efa = int(container["resources"]["limits"].get("vpc.amazonaws.com/efa", 0))
    assert efa == EFA_INTERFACES[target.split("-", 1)[1]]


def test_the_renderer_resizes_within_the_elastic_bounds(render):
    job = pytorchjob(render("pytorchjob-p3dn.24xlarge", "--workers", "12", "--max-workers", "20",
                            "--min-workers", "2", "--slots", "4"))
    replicas, _, container = worker(job)
    assert replicas["replicas"] == 12
    assert (job["spec"]["elasticPolicy"]["minReplicas"], job["spec"]["elasticPolicy"]["maxReplicas"]) == (2, 20)
    assert job["spec"]["nprocPerNode"] == "4" and container["resources"]["limits"]["nvidia.com/gpu"] == 4
    # The instance type's own settings survive the patch.
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == 1


def test_the_renderer_refuses_workers_outside_the_bounds(kubectl):
    result = subprocess.run([str(ROOT / "scripts" / "k8s" / "render.sh"), "pytorchjob-p3.16xlarge",
                             "--workers", "6"], capture_output=True, text=True,
                            env={**os.environ, "KUBECTL": kubectl})
    assert result.returncode == 2
    assert "6 workers lie outside the elastic bounds [1, 4]" in result.stderr
    assert "--max-workers" in result.stderr


# The rehearsal: the rendered worker command on the CPU, two pods as two torchrun agents.

CPU_CONFIG = """arch = "resnet18"
num_classes = 4
data_source = "generated"
generated_classes = 4
generated_train_images = 96
generated_val_images = 20
image_size = 32
batch_size = 8
epochs = {epochs}
warmup_epochs = 0
log_every_steps = 2
checkpoint_every_steps = 2
device = "cpu"
collective_timeout_s = 20
output_dir = "{output_dir}"
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def operator_env(job, index, port):
    """What the Training Operator v1.9 sets in worker `index` of an elastic PyTorchJob (its
    elastic and PET_* generators), with the worker-0 service's name as 127.0.0.1."""
    policy = job["spec"]["elasticPolicy"]
    return {
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
        "PET_RDZV_BACKEND": policy["rdzvBackend"],
        "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}",
        "PET_MAX_RESTARTS": str(policy["maxRestarts"]),
        "PET_NPROC_PER_NODE": job["spec"]["nprocPerNode"],
        "PET_NODE_RANK": str(index),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONUNBUFFERED": "1",
    }


def pod_command(container, entrypoint, train, config):
    """The container's command and args with the image's paths replaced by this machine's."""
    paths = {BIN + "entrypoint": str(entrypoint), BIN + "train": str(train),
             "/etc/resnet-trainer/trainer.toml": str(config)}
    return [paths.get(w, w) for w in container["command"] + container["args"]]


def wait_for_listener(port, pod, timeout=60):
    deadline = time.time() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert pod.poll() is None, f"the pod ended:\n{pod.communicate()[0]}"
        assert time.time() < deadline, f"nothing listens on port {port} after {timeout} s"
        time.sleep(0.1)


# A line of `train`'s log starts with its time: [YYYY-MM-DD HH:MM:SS.mmm].
LOG_TIME = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\]")


def merged_log(outs):
    """The pods' logs as one, in time order: rank 0, which logs for the job, may run in any pod."""
    lines = [line for out in outs for line in out.splitlines() if LOG_TIME.match(line)]
    return "\n".join(sorted(lines, key=lambda line: LOG_TIME.match(line)[0]))


def rounds(log):
    """[(first step, world size)] of each round of the run, in the order they ran: a round starts
    with rank 0's "world:" line and, when it resumed, its "resumed from ... step S" line."""
    found = []
    for line in log.splitlines():
        if world := re.search(r"world: (\d+) rank\(s\)", line):
            found.append([0, int(world[1])])
        elif resumed := re.search(r"resumed from \S+: epoch \d+, image \d+ of \d+, step (\d+)",
                                  line):
            found[-1][0] = int(resumed[1])
    return found


def kept_steps(trace, run_rounds):
    """{epoch: Counter of ids} that the run as finally kept trained. Each step counts as the last
    round that trained it did (the last to start at or before it): that round's ranks, each by its
    last line for the step (a retried step rewrites it); a rank the round did not have wrote its
    line in an earlier round, whose work on that step was dropped."""
    last = {}
    for path in trace.glob("rank-*.txt"):
        rank = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            epoch, step, *ids = map(int, line.split())
            last[rank, step] = (epoch, ids)
    epochs = {}
    for (rank, step), (epoch, ids) in last.items():
        world = [w for first, w in run_rounds if first <= step][-1]
        if rank < world:
            epochs.setdefault(epoch, Counter()).update(ids)
    return epochs


class LocalPods:
    """Pods of a torchrun job on this machine, whichever operator starts them: each a process
    group running `container`'s command through the image's entrypoint, with `train` and a CPU
    config from here and every rank's sample trace; the subclass adds the operator's variables."""

    def __init__(self, container, tmp_path, epochs):
        self.container = container
        self.config = tmp_path / "trainer.toml"
        # The image's entrypoint, alone in a bin/ folder: `torchrun` is then the test venv's.
        self.entrypoint = tmp_path / "bin" / "entrypoint"
        self.entrypoint.parent.mkdir()
        shutil.copy(ROOT / "docker" / "entrypoint.sh", self.entrypoint)
        self.config.write_text(CPU_CONFIG.format(output_dir=tmp_path / "runs", epochs=epochs))
        self.checkpoints = tmp_path / "runs" / "checkpoints"
        self.trace, self.port = tmp_path / "trace", free_port()
        self.env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]},
                    "PATH": f"{TORCHRUN.parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
                    "TRAINER_SAMPLE_TRACE": str(self.trace)}
        self.pods = []

    def start(self, extra_env):
        """Starts one pod with `extra_env` (the operator's variables) over the common ones."""
        return subprocess.Popen(
            pod_command(self.container, self.entrypoint, build_dir() / "train", self.config),
            env={**self.env, **extra_env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True)

    def wait_for_checkpoint(self, step, timeout=300):
        deadline = time.time() + timeout
        while not (self.checkpoints / f"checkpoint-{step:09d}.pt").exists():
            ended = [p for p in self.pods if p.poll() is not None]
            assert not ended, f"a pod ended before step {step}:\n{ended[0].communicate()[0]}"
            assert time.time() < deadline, f"no checkpoint at step {step} after {timeout} s"
            time.sleep(0.2)

    def stop(self):
        for pod in self.pods:
            kill_tree(pod)


class Cluster(LocalPods):
    """Worker pods of the rendered PyTorchJob as the operator starts them, with its variables."""

    def __init__(self, render, tmp_path, epochs):
        self.job = pytorchjob(render("pytorchjob-p3.16xlarge", "--workers", "2", "--slots", "1",
                                     "--min-workers", "1", "--max-workers", "2"))
        super().__init__(worker(self.job)[2], tmp_path, epochs)

    def start_pod(self, index=None):
        """Starts the pod of worker `index` (default: the next one)."""
        index = len(self.pods) if index is None else index
        self.pods.append(self.start(operator_env(self.job, index, self.port)))
        # On the cluster only worker 0's name is the rendezvous endpoint's, so its agent hosts
        # the store; here every agent's is, and the first to listen hosts it.
        if index == 0:
            wait_for_listener(self.port, self.pods[0])



def assert_every_image_once_per_epoch(trace, log, epochs):
    trained = kept_steps(trace, rounds(log))
    assert sorted(trained) == list(range(epochs))
    for epoch, counts in trained.items():
        assert sorted(counts) == list(range(96)), f"epoch {epoch}: ids missing or extra"
        assert set(counts.values()) == {1}, f"epoch {epoch}: an image trained twice"


@pytest.mark.skipif(not TORCHRUN.exists(), reason=f"no torchrun beside {sys.executable}")
def test_worker_command_trains_loses_a_pod_and_finishes_on_the_other(render, tmp_path):
    cluster = Cluster(render, tmp_path, epochs=3)
    try:
        cluster.start_pod()
        cluster.start_pod()
        cluster.wait_for_checkpoint(4)
        # The second pod's node goes away: every process of the pod dies at once (torchrun
        # starts each rank in a session of its own, so the pod's process group is not enough).
        kill_tree(cluster.pods[1])
        out, _ = cluster.pods[0].communicate(timeout=600)
    finally:
        cluster.stop()
    assert cluster.pods[0].returncode == 0, out
    assert "world: 2 rank(s)" in out and "world: 1 rank(s)" in out, out
    assert "resized: world size 2 -> 1, global batch 16 -> 8" in out, out
    assert "final: top-1" in out and "on 20 held-out images" in out
    assert_every_image_once_per_epoch(cluster.trace, out, epochs=3)


@pytest.mark.skipif(not TORCHRUN.exists(), reason=f"no torchrun beside {sys.executable}")
def test_a_pod_added_mid_run_joins_and_the_two_finish(render, tmp_path):
    # As `kubectl patch` of the replicas does: a second pod's agent asks to join; torchrun stops
    # the running rank (SIGTERM: it writes a checkpoint) and starts both ranks on 2 workers.
    cluster = Cluster(render, tmp_path, epochs=8)
    try:
        cluster.start_pod()
        cluster.wait_for_checkpoint(2)
        cluster.start_pod()
        outs = [pod.communicate(timeout=600)[0] for pod in cluster.pods]
    finally:
        cluster.stop()
    assert [pod.returncode for pod in cluster.pods] == [0, 0], "\n".join(outs)
    out = outs[0]
    assert out.index("world: 1 rank(s)") < out.index("world: 2 rank(s)"), out
    assert "resized: world size 1 -> 2, global batch 8 -> 16" in out, out
    # A change of members is not a failure: torchrun's restart count stays 0, and the run goes
    # on from the checkpoint the stopped rank wrote (the newest), not an older one.
    stopped = re.search(r"signal 15 received: checkpointing at step (\d+)", out)
    resumed = re.search(r"resumed from \S+: epoch \d+, image \d+ of 96, step (\d+)", out)
    assert stopped and resumed and stopped[1] == resumed[1], out
    assert "final: top-1" in out and "on 20 held-out images" in out
    assert_every_image_once_per_epoch(cluster.trace, out, epochs=8)


@pytest.mark.skipif(not TORCHRUN.exists(), reason=f"no torchrun beside {sys.executable}")
def test_a_pod_replaced_mid_run_rejoins_and_the_two_finish(render, tmp_path):
    # A spot node reclaimed and replaced: pod 1 dies with all its processes, pod 0 goes on alone,
    # then a new pod with worker 1's environment starts and the two train together again. The
    # survivor's agent has counted a restart, the newcomer's has not: ranks that used their own
    # restart count to name the store's keys waited for each other until both pods failed.
    cluster = Cluster(render, tmp_path, epochs=8)
    try:
        cluster.start_pod()
        cluster.start_pod()
        cluster.wait_for_checkpoint(4)
        kill_tree(cluster.pods[1])
        cluster.pods.pop()
        cluster.wait_for_checkpoint(10)  # at world 1 (2 steps a checkpoint)
        cluster.start_pod(index=1)
        outs = [pod.communicate(timeout=600)[0] for pod in cluster.pods]
    finally:
        cluster.stop()
    assert [pod.returncode for pod in cluster.pods] == [0, 0], "\n".join(outs)
    log = merged_log(outs)
    assert [world for _, world in rounds(log)] == [2, 1, 2], log
    assert "resized: world size 1 -> 2, global batch 8 -> 16" in log, log
    assert "final: top-1" in log and "on 20 held-out images" in log, log
    assert_every_image_once_per_epoch(cluster.trace, log, epochs=8)
