"""`train` under the faults a job meets, on the CPU: a dataset whose size leaves an awkward last
batch, a stop signal at an epoch's last step, a kill and a resume (TensorBoard shows each step
once), a full output volume (TensorBoard goes on; a checkpoint that cannot be written is a clear
error that leaves no partial file), a fresh start into a folder that holds an earlier run's
checkpoints, and ranks that see different checkpoints (rank 0 decides; a rank that cannot see
its choice says so). Each of these hung, lost work or resumed from the wrong place before."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import binary, run_train

SMALL = ["--arch", "resnet18", "--num_classes", "4", "--data_source", "generated",
         "--generated_classes", "4", "--generated_train_images", "64",
         "--generated_val_images", "16", "--image_size", "32", "--batch_size", "16",
         "--warmup_epochs", "0", "--device", "cpu"]
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")


def events(output_dir, kind):
    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def wait_until(condition, proc, timeout, what):
    """Polls `condition` until it holds; fails when `proc` ends first or after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"train ended before {what}:\n{proc.communicate()[0]}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.1)


def start_train(*args):
    return subprocess.Popen([str(binary("train")), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def checkpoints(output_dir):
    return sorted(p.name for p in (Path(output_dir) / "checkpoints").glob("checkpoint-*.pt"))


@pytest.mark.parametrize("records, batch, prefetch", [(5, 2, 1), (7, 3, 1), (6, 5, 1)])
def test_an_awkward_last_batch_neither_hangs_nor_drops_images(tmp_path, records, batch,
                                                              prefetch):
    # The epoch's last step holds batch + 1 images (a single image left joins it): with a decode
    # window counted in images instead of batches, its last image was never decoded.
    data = tmp_path / "data"
    argv = [binary("generate-dataset"), "--tfrecords", data, "--classes", records,
            "--images-per-class", 1, "--val-per-class", 1, "--width", 40, "--height", 40]
    subprocess.run(list(map(str, argv)), check=True, capture_output=True, timeout=120)
    trace = tmp_path / "trace"
    result = run_train("--arch", "resnet18", "--num_classes", records, "--data_source", "tfrecord",
                       "--train_data", data / "train-*", "--image_size", 32, "--batch_size",
                       batch, "--prefetch_batches", prefetch, "--decode_threads", 1,
                       "--epochs", 2, "--warmup_epochs", 0, "--device", "cpu",
                       "--collective_timeout_s", 60, "--output_dir", tmp_path / "run",
                       timeout=300, env={**os.environ, "TRAINER_SAMPLE_TRACE": str(trace)})
    assert result.returncode == 0, result.stdout + result.stderr
    trained = {}
    for line in (trace / "rank-0.txt").read_text().splitlines():
        epoch, _, *ids = map(int, line.split())
        trained.setdefault(epoch, []).extend(ids)
    assert {e: sorted(ids) for e, ids in trained.items()} == {
        0: list(range(records)), 1: list(range(records))}


def test_a_stop_at_an_epochs_last_step_keeps_its_evaluation(tmp_path):
    # One step per epoch: every stop lands on an epoch's last step, where the checkpoint (which
    # points at the next epoch) is written before the evaluation would have run.
    args = [*SMALL, "--generated_train_images", 16, "--epochs", 40, "--log_every_steps", 1,
            "--output_dir", tmp_path]
    proc = start_train(*args)
    try:
        wait_until(lambda: len(checkpoints(tmp_path)) > 0 and events(tmp_path, "eval"), proc, 300,
                   "a checkpoint and an evaluation")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out
    again = run_train(*args, "--epochs", 12)
    assert again.returncode == 0, again.stdout + again.stderr
    evaluated = [e["epoch"] for e in events(tmp_path, "eval")]
    assert sorted(set(evaluated)) == list(range(1, 13)), f"epochs evaluated: {evaluated}"


def test_a_kill_and_resume_show_each_step_once_in_tensorboard(tmp_path):
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="the tensorboard package is missing: run scripts/setup.sh")
    args = [*SMALL, "--epochs", 40, "--log_every_steps", 1, "--checkpoint_every_steps", 7,
            "--output_dir", tmp_path]
    proc = start_train(*args)
    try:
        wait_until(lambda: (tmp_path / "metrics.jsonl").exists() and
                   len(events(tmp_path, "train")) >= 11, proc, 300, "step 11")
        proc.kill()  # SIGKILL: steps after the last checkpoint are trained again
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    resumed_from = max(int(name[11:20]) for name in checkpoints(tmp_path))
    again = run_train(*args, "--max_steps", resumed_from + 6)
    assert again.returncode == 0, again.stdout + again.stderr
    runs = accumulator.EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    steps = [s.step for s in runs.Scalars("train/loss")]
    assert steps == list(range(1, resumed_from + 7)), steps


def in_small_tmpfs(folder, size, command):
    """argv running `command` (a shell string) with a tmpfs of `size` mounted at `folder`, in a
    mount namespace of its own (the mount ends with it). Skips where mounts are not allowed."""
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    Path(folder).mkdir(parents=True, exist_ok=True)
    return ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs '{folder}' && "
            f"{command}"]


def test_a_full_volume_for_tensorboard_does_not_stop_training(tmp_path):
    events_dir, copy = tmp_path / "run" / "tensorboard", tmp_path / "copy"
    train = " ".join(map(str, [binary("train"), *SMALL, "--epochs", 3, "--log_every_steps", 1,
                               "--output_dir", tmp_path / "run"]))
    # 48 KB: the first picture grid fits, not much more. The copy outlives the mount.
    argv = in_small_tmpfs(events_dir, "48k", f"{train}; status=$?; cp -r '{events_dir}' "
                                             f"'{copy}'; exit $status")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "cannot write TensorBoard events" in out and "Training goes on" in out, out
    # Warned when writes start failing, not at every flush while they go on failing.
    assert out.count("cannot write TensorBoard events") <= 3, out
    assert "final: top-1" in out
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    runs = accumulator.EventAccumulator(str(copy)).Reload()  # readable: no record cut short
    steps = [s.step for s in runs.Scalars("train/loss")] if "train/loss" in runs.Tags()[
        "scalars"] else []
    assert steps == sorted(set(steps)), steps


def test_a_checkpoint_that_does_not_fit_is_a_clear_error_leaving_no_partial_file(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    train = " ".join(map(str, [binary("train"), *SMALL, "--epochs", 3, "--output_dir",
                               tmp_path / "run"]))
    argv = in_small_tmpfs(folder, "1m",
                          f"{train}; status=$?; echo LEFT:; ls -a '{folder}'; exit $status")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "writing checkpoint" in out and "free space on the output volume" in out, out
    left = result.stdout.split("LEFT:")[-1].split()
    assert sorted(left) == [".", ".."], f"a partial checkpoint was left behind: {left}"


def test_a_fresh_start_moves_an_earlier_runs_checkpoints_aside(tmp_path):
    args = [*SMALL, "--epochs", 10, "--checkpoint_every_steps", 2, "--output_dir", tmp_path]
    assert run_train(*args, "--max_steps", 6).returncode == 0
    assert checkpoints(tmp_path)[-1] == "checkpoint-000000006.pt"
    fresh = run_train(*args, "--resume", "none", "--max_steps", 2)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "moved to" in fresh.stdout + fresh.stderr
    assert checkpoints(tmp_path) == ["checkpoint-000000002.pt"]
    aside = list(tmp_path.glob("checkpoints-before-*"))
    assert len(aside) == 1 and "checkpoint-000000006.pt" in os.listdir(aside[0])
    # The next `auto` start continues the fresh run, not the earlier one's step 6.
    resumed = run_train(*args, "--max_steps", 4)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out
    assert re.search(r"resumed from \S+checkpoint-000000002\.pt: .*, step 2\b", out), out


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI not installed")
def test_rank_0_decides_where_every_rank_resumes(tmp_path):
    # Node-local output folders: rank 0's holds a checkpoint, rank 1's none. Each rank deciding
    # alone, rank 0 resumed at step 4 and rank 1 started over, and the replicas silently
    # diverged. Rank 1 must say it cannot see rank 0's checkpoint.
    mine, theirs = tmp_path / "node0", tmp_path / "node1"
    args = [*SMALL, "--epochs", 10, "--checkpoint_every_steps", 2, "--collective_timeout_s", 60]
    assert run_train(*args, "--max_steps", 4, "--output_dir", mine).returncode == 0
    argv = ["mpirun", "--oversubscribe", "-np", "1", str(binary("train")), *map(str, args),
            "--max_steps", "6", "--output_dir", str(mine), ":", "-np", "1", str(binary("train")),
            *map(str, args), "--max_steps", "6", "--output_dir", str(theirs)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=MPI_ENV)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "rank 1" in out and "which this rank does not see" in out, out


@pytest.mark.skipif(not (Path(sys.executable).parent / "torchrun").exists(),
                    reason=f"no torchrun beside {sys.executable}")
def test_an_elastic_start_continues_the_runs_own_checkpoint_whatever_resume_says(tmp_path):
    # A pod that joins a running job starts with a restart count of 0, like a first start: under
    # torchrun the run's own newest checkpoint comes first even with resume = none.
    torchrun = Path(sys.executable).parent / "torchrun"
    args = [*SMALL, "--epochs", 10, "--checkpoint_every_steps", 2, "--resume", "none",
            "--output_dir", tmp_path]

    def launch(steps):
        return subprocess.run([torchrun, "--standalone", "--nproc-per-node", "1", "--no-python",
                               binary("train"), *map(str, args), "--max_steps", str(steps)],
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})

    first = launch(4)
    assert first.returncode == 0, first.stdout + first.stderr
    second = launch(6)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    assert "checkpoint-000000004.pt: epoch" in out and "step 4" in out, out
