"""Elastic resume on the CPU, the way the EKS guide's scale-out step does it, under mpirun and under
torchrun: a run on 2 ranks, resumed on 3, then on 1 with another per-rank batch, trains every
record of each epoch exactly once (read from each rank's sample trace, not from the step counter),
at the learning rate that the schedule in images gives, and says at resume what changed. A resume
on the same number of ranks still reproduces an uninterrupted run bit for bit."""
import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import binary

MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
TORCHRUN = Path(sys.executable).parent / "torchrun"  # the `torch` wheel's, in the test venv
IMAGES = 100  # training records: 4 classes x 25
BASE_LR = 0.1


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tfrecords")
    result = subprocess.run([str(binary("generate-dataset")), "--tfrecords", folder, "--classes", "4",
                             "--images-per-class", "25", "--val-per-class", "5", "--width", "48",
                             "--height", "40", "--train-shards", "3", "--val-shards", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return folder


def train_args(data, output_dir, batch, *extra):
    return ["--arch", "resnet18", "--num_classes", "4", "--data_source", "tfrecord",
            "--train_data", f"{data}/train-*", "--val_data", f"{data}/validation-*",
            "--image_size", "32", "--val_resize", "36", "--batch_size", batch, "--epochs", "2",
            "--warmup_epochs", "1", "--base_lr", BASE_LR, "--log_every_steps", "1",
            "--device", "cpu", "--decode_threads", "1", "--reader_threads", "1",
            "--output_dir", output_dir, *extra]


@pytest.fixture(params=["mpirun", "torchrun"])
def launch(request):
    """launch(ranks, args, trace): runs `train` on `ranks` processes; returns its output."""
    if request.param == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("OpenMPI not installed")
    if request.param == "torchrun" and not TORCHRUN.exists():
        pytest.skip(f"no torchrun beside {sys.executable}: run scripts/setup.sh")

    def run(ranks, args, trace):
        env = dict(MPI_ENV, TRAINER_SAMPLE_TRACE=str(trace))
        launcher = (["mpirun", "--oversubscribe", "-np", str(ranks), "-x", "TRAINER_SAMPLE_TRACE"]
                    if request.param == "mpirun" else
                    [str(TORCHRUN), "--standalone", "--nproc-per-node", str(ranks), "--no-python"])
        result = subprocess.run([*launcher, str(binary("train")), *map(str, args)],
                                capture_output=True, text=True, env=env, timeout=600)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out
        return out
    return run


def trained_ids(trace):
    """{epoch: Counter of record ids} from every rank's trace file."""
    epochs = {}
    for path in trace.glob("rank-*.txt"):
        for line in path.read_text().splitlines():
            epoch, _step, *ids = map(int, line.split())
            epochs.setdefault(epoch, Counter()).update(ids)
    return epochs


def expected_lr(trained, step_images, global_batch):
    """The cosine schedule with one warmup epoch, counted in images (src/train/lr_schedule.h)."""
    peak = BASE_LR * global_batch / 256
    warmup, total = IMAGES, 2 * IMAGES
    if trained < warmup:
        return peak * min(1.0, (trained + step_images) / warmup)
    return 0.5 * peak * (1 + math.cos(math.pi * min(1.0, (trained - warmup) / (total - warmup))))


def test_growing_then_shrinking_trains_every_record_once_per_epoch(launch, data, tmp_path):
    out_dir, trace = tmp_path / "run", tmp_path / "trace"
    # (ranks, per-rank batch, steps in all at the end of the leg): 2 x 4 for 5 steps, 3 x 4 for
    # 4 more, then 1 x 5 to the end of both epochs.
    legs = [(2, 4, 5), (3, 4, 9), (1, 5, 0)]
    logs = []
    for ranks, batch, max_steps in legs:
        logs.append(launch(ranks, train_args(data, out_dir, batch, "--max_steps", max_steps), trace))
    assert "resized: world size 2 -> 3, global batch 8 -> 12" in logs[1], logs[1]
    assert "resumed from" in logs[1] and "image 40 of 100" in logs[1], logs[1]
    assert "resized: world size 3 -> 1, global batch 12 -> 5" in logs[2], logs[2]
    assert "image 88 of 100" in logs[2], logs[2]
    assert "final: top-1" in logs[2] and "on 20 held-out images" in logs[2]

    epochs = trained_ids(trace)
    assert sorted(epochs) == [0, 1]
    for epoch, counts in epochs.items():
        assert sorted(counts) == list(range(IMAGES)), f"epoch {epoch}: ids missing or extra"
        twice = [i for i, n in counts.items() if n != 1]
        assert not twice, f"epoch {epoch}: trained more than once: {twice}"

    # Every step's LR, from metrics.jsonl, against the schedule in images trained.
    lrs = {}
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "train":
            lrs[event["step"]] = event["lr"]
    trained, step, expected = 0, 0, {}
    for ranks, batch, max_steps in legs:
        global_batch = ranks * batch
        while (step < max_steps or not max_steps) and trained < 2 * IMAGES:
            left = IMAGES - trained % IMAGES  # a single image left joins this step
            images = left if left <= global_batch + 1 else global_batch
            step += 1
            expected[step] = expected_lr(trained, images, global_batch)
            trained += images
    assert sorted(lrs) == sorted(expected)
    for s, lr in expected.items():
        assert lrs[s] == pytest.approx(lr, rel=1e-7), f"step {s}"  # metrics.jsonl: %.9g


def test_resume_on_as_many_ranks_is_bitwise_identical(launch, data, tmp_path):
    straight, resumed, trace = tmp_path / "straight", tmp_path / "resumed", tmp_path / "trace"
    launch(2, train_args(data, straight, 4, "--max_steps", 10, "--val_data", ""), trace)
    launch(2, train_args(data, resumed, 4, "--max_steps", 4, "--val_data", ""), trace)
    launch(2, train_args(data, resumed, 4, "--max_steps", 10, "--val_data", ""), trace)
    a = torch.load(straight / "checkpoints" / "checkpoint-000000010.pt")
    b = torch.load(resumed / "checkpoints" / "checkpoint-000000010.pt")
    assert (a["epoch"], a["samples_in_epoch"]) == (b["epoch"], b["samples_in_epoch"]) == (0, 80)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for name, tensor in a["optimizer"].items():
        assert torch.equal(tensor, b["optimizer"][name]), name


@pytest.mark.parametrize("launch", ["mpirun"], indirect=True)
def test_fixed_global_batch_is_the_same_step_at_any_world_size(launch, data, tmp_path):
    """global_batch = 24 with 4 images per rank: 6, 3 and 2 micro-batches on 1, 2 and 3 ranks;
    the steps, their images and their learning rates do not change with the resizes, and every
    record is still trained once per epoch."""
    out_dir, trace = tmp_path / "run", tmp_path / "trace"
    legs = [(2, 2), (3, 6), (1, 0)]  # (ranks, steps in all at the end of the leg)
    logs = [launch(ranks, train_args(data, out_dir, 4, "--global_batch", 24, "--max_steps",
                                     max_steps), trace) for ranks, max_steps in legs]
    for (ranks, _), log in zip(legs, logs):
        assert f"global batch 24 kept: {6 // ranks} micro-batch(es) of 4 images per rank and " \
               f"step on {ranks} rank(s)" in log, log
        assert "100 images and 5 steps per epoch" in log, log
        assert "peak lr 0.00938 (global batch 24)" in log, log
    assert "resized: world size 2 -> 3, global batch 24 -> 24, peak lr 0.00938 -> 0.00938" in \
        logs[1], logs[1]

    for epoch, counts in trained_ids(trace).items():
        assert sorted(counts) == list(range(IMAGES)), f"epoch {epoch}: ids missing or extra"
        assert set(counts.values()) == {1}, f"epoch {epoch}: an id trained twice"

    lrs = {}
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "train":
            lrs[event["step"]] = event["lr"]
    expected, trained = {}, 0
    for step in range(1, 11):
        images = min(24, IMAGES - trained % IMAGES)  # 24, 24, 24, 24, 4 per epoch
        expected[step] = expected_lr(trained, images, 24)
        trained += images
    assert sorted(lrs) == sorted(expected)
    for s, lr in expected.items():
        assert lrs[s] == pytest.approx(lr, rel=1e-7), f"step {s}"


@pytest.mark.parametrize("launch", ["mpirun"], indirect=True)
@pytest.mark.parametrize("last_batch, epoch0, steps", [(5, 98, 31), (13, 88, 16)])
def test_drop_last_across_resizes_trains_each_record_at_most_once(launch, data, tmp_path,
                                                                 last_batch, epoch0, steps):
    """drop_last with the resizes above, epoch 0 resumed at image 88 on 1 rank: of 5, it trains
    two whole steps and leaves the last 2 images out; of 13, none is whole and the epoch ends
    there. Epoch 1 then trains in whole steps (all 100 images of 5; 91 of 13). No record is
    trained twice, and the run ends where whole steps end."""
    out_dir, trace = tmp_path / "run", tmp_path / "trace"
    legs = [(2, 4, 5), (3, 4, 9), (1, last_batch, 0)]
    logs = [launch(ranks, train_args(data, out_dir, batch, "--drop_last", "true", "--max_steps",
                                     max_steps), trace) for ranks, batch, max_steps in legs]
    assert "image 88 of 100" in logs[2], logs[2]
    per_epoch = IMAGES // last_batch
    assert f"100 images and {per_epoch} steps per epoch" in logs[2], logs[2]
    assert f"{steps} steps in all" in logs[2] and f"after {steps} steps" in logs[2], logs[2]
    # Epoch 0 is evaluated where it ends: after its two steps, or at once where none is whole.
    assert f"eval epoch 1 step {9 if last_batch == 13 else 11} |" in logs[2], logs[2]
    epochs = trained_ids(trace)
    assert sorted(epochs) == [0, 1]
    for epoch, counts in epochs.items():
        assert set(counts.values()) == {1}, f"epoch {epoch}: an id trained twice"
    assert len(epochs[0]) == epoch0 and len(epochs[1]) == per_epoch * last_batch
