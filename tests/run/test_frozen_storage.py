"""`train` on a file system that stops answering (tests/run/frozen_fs.py), as an FSx or NFS mount
does when its server or network goes: at start-up (the listing of the data) and mid-epoch (a
read of one shard), alone and under mpirun, at the shipped deadlines. Each ends within two minutes
with a first error line that names the stuck rank, its host and the call (the file, not the
list's first), hears SIGTERM while frozen, and leaves the newest checkpoint to resume from."""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import binary, kill_tree
from frozen_fs import frozen_fs  # noqa: F401 (a fixture)

MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
SHARDS = 4
STORAGE_TIMEOUT_S = 60  # the shipped storage_timeout_s (src/config/keys.def)
CRITICAL = re.compile(r"\[critical\].*")
COLOURS = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def data(tmp_path):
    """Four training shards of 4 classes x 24 images, 32 px."""
    folder = tmp_path / "data"
    argv = [binary("generate-dataset"), "--tfrecords", folder, "--classes", 4,
            "--images-per-class", 24, "--val-per-class", 1, "--width", 40, "--height", 40,
            "--train-shards", SHARDS]
    subprocess.run(list(map(str, argv)), check=True, capture_output=True, timeout=120)
    return folder


def train_args(mount, tmp_path, *more):
    return ["--arch", "resnet18", "--num_classes", 4, "--data_source", "tfrecord",
            "--train_data", f"{mount}/train-*", "--image_size", 32, "--batch_size", 8,
            "--epochs", 100, "--warmup_epochs", 0, "--log_every_steps", 1, "--device", "cpu",
            "--checkpoint_every_steps", 4, "--reader_threads", 1, "--decode_threads", 1,
            "--index_cache_dir", tmp_path / "index", "--output_dir", tmp_path / "run", *more]


class Job:
    """A process (train, or mpirun with its ranks) whose output goes to a file read as it grows."""

    def __init__(self, argv, log):
        self.log = Path(log)
        self.out = open(self.log, "w")
        self.proc = subprocess.Popen(list(map(str, argv)), stdout=self.out,
                                     stderr=subprocess.STDOUT, env=MPI_ENV,
                                     start_new_session=True)

    def text(self):
        return COLOURS.sub("", self.log.read_text(errors="replace"))

    def wait_for(self, pattern, timeout):
        """Waits until the output matches `pattern`; fails when the job ends first or at the
        timeout."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text()):
            assert self.proc.poll() is None, f"ended before {pattern!r}:\n{self.text()}"
            assert time.monotonic() < deadline, f"no {pattern!r} in {timeout} s:\n{self.text()}"
            time.sleep(0.1)

    def wait_end(self, timeout):
        """The exit status and the seconds it took from now; kills the job at the timeout."""
        start = time.monotonic()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc)
            pytest.fail(f"still running {timeout} s on:\n{self.text()}")
        return code, time.monotonic() - start

    def close(self):
        if self.proc.poll() is None:
            kill_tree(self.proc)
        self.out.close()


@pytest.fixture
def jobs():
    made = []

    def start(argv, log):
        made.append(Job(argv, log))
        return made[-1]

    yield start
    for job in made:
        job.close()


def mpirun(tmp_path, *mounts):
    """Two ranks, each reading the data through a mount of its own (as each node has), launched
    as the MPIJob does: SIGKILL 20 s after SIGTERM (k8s/base/mpijob.yaml)."""
    argv = ["mpirun", "--oversubscribe", "--mca", "odls_base_sigkill_timeout", 20]
    for i, mount in enumerate(mounts):
        argv += [":"] * bool(i) + ["-np", 1, binary("train"), *train_args(mount, tmp_path)]
    return argv


def no_train_left(marker):
    out = subprocess.run(["pgrep", "-f", str(marker)], capture_output=True, text=True)
    return [pid for pid in out.stdout.split() if int(pid) != os.getpid()]


def test_a_listing_that_never_returns_at_start_up_ends_the_run_naming_it(tmp_path, data,
                                                                          frozen_fs, jobs):
    fs = frozen_fs(data)
    fs.freeze("all")
    # A deadline of its own, to be quick: the shipped one is the mpirun test's below.
    args = train_args(fs.mount, tmp_path, "--storage_timeout_s", 10)
    job = jobs([binary("train"), *args], tmp_path / "train.log")
    code, took = job.wait_end(timeout=60)
    out = job.text()
    assert code == 3, out
    assert 10 <= took < 10 + 10, (took, out)
    first = CRITICAL.search(out).group(0)
    assert f"rank 0 ({socket.gethostname()})" in first, first
    assert f"the file system does not answer: listing {fs.mount}/train-*" in first, first


def test_sigterm_while_start_up_waits_on_the_file_system_ends_the_run(tmp_path, data, frozen_fs,
                                                                      jobs):
    fs = frozen_fs(data)
    fs.freeze("all")
    job = jobs([binary("train"), *train_args(fs.mount, tmp_path)], tmp_path / "train.log")
    fs.wait_held(job.proc, timeout=60)
    job.proc.send_signal(signal.SIGTERM)
    code, took = job.wait_end(timeout=30)
    out = job.text()
    assert code == 128 + signal.SIGTERM, out
    assert took < 10, (took, out)  # the stop grace (5 s) and the watch's poll
    assert f"signal 15 arrived while listing {fs.mount}/train-*" in out, out


def test_a_read_that_never_returns_mid_epoch_names_its_file_and_the_run_resumes(tmp_path, data,
                                                                               frozen_fs, jobs):
    fs = frozen_fs(data)
    args = train_args(fs.mount, tmp_path, "--storage_timeout_s", 20)
    job = jobs([binary("train"), *args], tmp_path / "train.log")
    job.wait_for(r"checkpoint-0+8\.pt", timeout=240)
    stuck = "train-00002-of-00004"
    fs.freeze("read", stuck)
    fs.wait_held(job.proc, timeout=120)
    code, took = job.wait_end(timeout=60)
    out = job.text()
    assert code == 3, out
    assert took < 20 + 5, (took, out)  # at the deadline, not after a wait for the readers
    first = CRITICAL.search(out).group(0)
    assert f"the file system does not answer: reading {fs.mount}/{stuck} at byte" in first, first

    fs.thaw()
    newest = sorted((tmp_path / "run" / "checkpoints").glob("checkpoint-*.pt"))[-1]
    again = jobs([binary("train"), *args, "--max_steps", int(newest.stem.split("-")[1]) + 1],
                 tmp_path / "again.log")
    code, _ = again.wait_end(timeout=240)
    assert code == 0, again.text()
    assert f"resumed from {newest}" in again.text(), again.text()


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI not installed")
def test_under_mpirun_a_rank_frozen_mid_epoch_ends_the_job_naming_it(tmp_path, data, frozen_fs,
                                                                    jobs):
    healthy, fs = frozen_fs(data), frozen_fs(data)
    job = jobs(mpirun(tmp_path, healthy.mount, fs.mount), tmp_path / "mpirun.log")
    job.wait_for(r"checkpoint-0+4\.pt", timeout=240)
    fs.freeze("read")
    frozen = time.monotonic()
    fs.wait_held(job.proc, timeout=120)
    code, _ = job.wait_end(timeout=150)
    took = time.monotonic() - frozen
    out = job.text()
    assert code != 0, out
    assert took < 120, (took, out)
    first = CRITICAL.search(out).group(0)
    assert f"rank 1 ({socket.gethostname()})" in first, first
    assert f"the file system does not answer: reading {fs.mount}/train-" in first, first
    # mpirun passes SIGTERM on to rank 0, waiting for rank 1 in a collective, 20 s after the
    # abort; rank 0 then ends, naming rank 1's read from its liveness messages.
    assert re.search(r"rank 0 \(.*signal 15 arrived while waiting in .*: rank 1 \(.*\) waits on "
                     rf"storage: reading {re.escape(str(fs.mount))}/train-\S+ at byte", out), out
    assert not no_train_left(tmp_path / "run"), "a rank outlived mpirun"


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI not installed")
def test_under_mpirun_sigterm_while_a_rank_is_frozen_ends_every_rank_within_the_grace(
        tmp_path, data, frozen_fs, jobs):
    healthy, fs = frozen_fs(data), frozen_fs(data)
    job = jobs(mpirun(tmp_path, healthy.mount, fs.mount), tmp_path / "mpirun.log")
    job.wait_for(r"checkpoint-0+4\.pt", timeout=240)
    fs.freeze("read")
    fs.wait_held(job.proc, timeout=120)
    time.sleep(3)  # rank 0 now waits for rank 1 in a collective
    job.proc.send_signal(signal.SIGTERM)
    code, took = job.wait_end(timeout=90)
    out = job.text()
    assert code != 0, out
    # mpirun's daemons pass SIGTERM on odls_base_sigkill_timeout (20 s) after mpirun has it, and
    # SIGKILL as long after that: each rank ends by itself, saying why, before the SIGKILL, and
    # the whole job inside the launcher pod's grace (60 s, k8s/base/mpijob.yaml).
    assert took < 60, (took, out)
    assert re.search(r"rank 1 \(.*signal 15 arrived while waiting for batch", out), out
    assert not no_train_left(tmp_path / "run"), "a rank outlived mpirun"

