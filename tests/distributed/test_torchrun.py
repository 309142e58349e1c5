"""`train` under torchrun and the launchers that set its variables (TorchElastic, Kubeflow's
PyTorchJob), on the CPU, where Gloo over the c10d store carries the collectives: two processes
train and evaluate; a process killed mid-run makes the elastic agent restart the group, which
resumes from the newest checkpoint without being told and finishes; ranks that meet at a store
served by rank 0 (no agent) train too; a stuck rank ends the job; half-set variables and an
unreachable store are clear errors. Resizes under torchrun are in test_elastic.py."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import binary

TORCHRUN = Path(sys.executable).parent / "torchrun"  # the `torch` wheel's, in the test venv
pytestmark = pytest.mark.skipif(not TORCHRUN.exists(),
                                reason=f"no torchrun beside {sys.executable}: run scripts/setup.sh")

SMALL = ["--arch", "resnet18", "--num_classes", "4", "--data_source", "generated",
         "--generated_classes", "4", "--generated_train_images", "96",
         "--generated_val_images", "20", "--image_size", "32", "--batch_size", "8",
         "--epochs", "2", "--warmup_epochs", "0", "--log_every_steps", "2", "--device", "cpu",
         "--collective_timeout_s", "20"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def torchrun(*args, ranks=2):
    return [str(TORCHRUN), "--standalone", "--nproc-per-node", str(ranks), "--no-python",
            str(binary("train")), *map(str, args)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_pids(marker):
    """PIDs of `train` processes whose command line contains `marker`."""
    out = subprocess.run(["pgrep", "-x", "train"], capture_output=True, text=True)
    pids = []
    for pid in out.stdout.split():
        try:
            if str(marker).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(int(pid))
        except FileNotFoundError:
            pass
    return pids


def kill_all(proc, marker):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in train_pids(marker):
        os.kill(pid, signal.SIGKILL)


def test_two_processes_train_and_evaluate(tmp_path):
    result = subprocess.run(torchrun(*SMALL, "--output_dir", tmp_path), capture_output=True,
                            text=True, env=ENV, timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "world: 2 rank(s) on 1 host(s)" in out
    assert "final: top-1" in out and "on 20 held-out images" in out
    assert len(list((tmp_path / "checkpoints").glob("checkpoint-*.pt"))) == 2


def test_a_killed_process_is_restarted_and_training_resumes(tmp_path):
    trace = tmp_path / "trace"
    args = [*SMALL, "--epochs", "3", "--checkpoint_every_steps", "2", "--output_dir", tmp_path]
    argv = torchrun(*args)
    argv[1:1] = ["--max-restarts", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(ENV, TRAINER_SAMPLE_TRACE=str(trace)),
                            start_new_session=True)
    try:
        deadline = time.time() + 300
        while not list((tmp_path / "checkpoints").glob("checkpoint-000000004.pt")):
            assert time.time() < deadline and proc.poll() is None, "no checkpoint at step 4"
            time.sleep(0.2)
        victims = train_pids(tmp_path)
        assert len(victims) == 2
        os.kill(victims[-1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        kill_all(proc, tmp_path)
    assert proc.returncode == 0, out
    assert "restart 1 by the elastic agent" in out, out
    assert "final: top-1" in out
    # Steps after the checkpoint were trained twice (before the kill, and again after the
    # restart), on the same records; the run as finally kept trains each record once per epoch.
    steps = {}
    for path in trace.glob("rank-*.txt"):
        for line in path.read_text().splitlines():
            epoch, step, *ids = map(int, line.split())
            rank = path.stem
            if (rank, step) in steps:
                assert steps[rank, step] == (epoch, sorted(ids)), f"step {step} differs on retry"
            steps[rank, step] = (epoch, sorted(ids))
    per_epoch = {}
    for epoch, ids in steps.values():
        per_epoch.setdefault(epoch, []).extend(ids)
    assert sorted(per_epoch) == [0, 1, 2]
    for epoch, ids in per_epoch.items():
        assert sorted(ids) == list(range(96)), f"epoch {epoch}"


def test_ranks_meeting_at_a_store_rank0_serves(tmp_path):
    # A PyTorchJob without torchrun: the operator sets RANK, WORLD_SIZE and MASTER_ADDR/PORT
    # for each process, and no agent serves the store.
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(ENV, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([str(binary("train")), *SMALL, "--epochs", "1",
                                       "--output_dir", tmp_path], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env))
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        kill_all(procs[0], tmp_path)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    assert "world: 2 rank(s) on 1 host(s)" in outs[0]
    assert "final: top-1" in outs[0]


def test_a_stuck_rank_ends_the_job(tmp_path):
    args = [*SMALL, "--epochs", "500", "--collective_timeout_s", "5", "--output_dir", tmp_path]
    proc = subprocess.Popen(torchrun(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=ENV, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not (tmp_path / "metrics.jsonl").exists() or "train" not in (
                tmp_path / "metrics.jsonl").read_text():
            assert time.time() < deadline and proc.poll() is None, "never trained"
            time.sleep(0.2)
        os.kill(train_pids(tmp_path)[-1], signal.SIGSTOP)
        start = time.time()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode != 0, out
        assert time.time() - start < 60, out
        assert "has not finished after 5 s" in out, out
    finally:
        for pid in train_pids(tmp_path):
            os.kill(pid, signal.SIGCONT)
        kill_all(proc, tmp_path)


@pytest.mark.parametrize("env,message", [
    ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR"),
    ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, "RANK=2"),
    ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE='two'"),
])
def test_half_set_launcher_variables_are_clear_errors(tmp_path, env, message):
    result = subprocess.run([str(binary("train")), *SMALL, "--output_dir", tmp_path],
                            capture_output=True, text=True, env=dict(ENV, **env), timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stdout + result.stderr


def test_an_unreachable_store_is_a_clear_error(tmp_path):
    env = dict(ENV, RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    start = time.time()
    result = subprocess.run([str(binary("train")), *SMALL, "--collective_timeout_s", "3",
                             "--output_dir", tmp_path], capture_output=True, text=True, env=env,
                            timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "cannot reach the rendezvous store at MASTER_ADDR:MASTER_PORT" in out, out
    assert time.time() - start < 60
