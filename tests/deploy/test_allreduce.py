"""The network acceptance jobs (scripts/k8s/render.sh allreduce-NODE-TYPE, docs/eks.md step 6):
each the MPIJob of its node type, same nodes, ranks and network settings, whose launcher runs
bench-allreduce instead of train, to 2 GiB, gated at the bus bandwidth the guide states for the
node type; a job of its own name, so it can run beside training. Its run on the CPU in the image
is in test_image_run.py."""
import re

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
# render and rendered are fixtures.
from deploy_support import (ALLREDUCE_TARGETS, ROOT, kubectl, render,  # noqa: E402,F401
                            rendered)

BIN = "/opt/resnet-trainer/bin/"
GUIDE = ROOT / "docs" / "eks.md"


def mpijob(docs):
    (job,) = [d for d in docs if d["kind"] == "MPIJob"]
    return job


def launcher_args(job):
    return job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]


def gates_in_the_guide():
    """{node type: GB/s} from the guide's table of what each node type must reach."""
    rows = re.findall(r"^\| `allreduce-([\w.]+)` \| ([\d.]+) GB/s \|", GUIDE.read_text(), re.M)
    return {node: float(gbps) for node, gbps in rows}


@pytest.mark.parametrize("target", ALLREDUCE_TARGETS)
def test_the_training_job_with_bench_allreduce_in_place_of_train(target, rendered):
    node_type = target.split("-", 1)[1]
    check, training = mpijob(rendered(target)), mpijob(rendered(node_type))
    assert check["metadata"]["name"] == "resnet50-allreduce" != training["metadata"]["name"]
    args, train_args = launcher_args(check), launcher_args(training)
    at = train_args.index(BIN + "train")
    # mpirun's own arguments, -np and the network settings (-x) included, are the training job's.
    assert args[:at] == train_args[:at]
    assert train_args[at:] == [BIN + "train", "--config", "/etc/resnet-trainer/trainer.toml"]
    assert args[at:] == [BIN + "bench-allreduce", "--min-bytes", "1M", "--max-bytes", "2G",
                         "--min-busbw", args[-1]]
    assert float(args[-1]) == gates_in_the_guide()[node_type]
    # The same nodes: worker pods alike but for the config's generated name.
    workers = [j["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"] for j in (check, training)]
    assert workers[0]["nodeSelector"] == workers[1]["nodeSelector"]
    assert workers[0]["containers"][0]["resources"] == workers[1]["containers"][0]["resources"]


def test_the_guide_states_a_gate_for_every_node_type():
    assert set(gates_in_the_guide()) == {t.split("-", 1)[1] for t in ALLREDUCE_TARGETS}


def test_workers_and_slots_resize_the_acceptance_job_too(render):
    job = mpijob(render("allreduce-p4d.24xlarge", "--workers", "5", "--slots", "4"))
    args = launcher_args(job)
    assert args[:2] == ["-np", "20"] and job["spec"]["slotsPerWorker"] == 4
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 5
    assert args[args.index(BIN + "bench-allreduce"):] == [
        BIN + "bench-allreduce", "--min-bytes", "1M", "--max-bytes", "2G", "--min-busbw", "25"]
