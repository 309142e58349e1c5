"""`train` on a file system that stops answering (tests/run/frozen_fs.py), as an FSx or NFS mount
does when its server or network goes: at start-up (the listing of the data) and mid-epoch (a
read of one shard), alone, under mpirun and under torchrun (a pod a host made of a network
namespace, tests/distributed/netns_jobs.py), at the shipped deadlines and at shorter ones. Each
ends within two minutes with a first error line that names the stuck rank, its host and the call
(the file, not the list's first), the other ranks name it too, SIGTERM while frozen is heard,
and the newest checkpoint is left to resume from; under torchrun the frozen pod leaves and the
others start the group again without it."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import binary, kill_tree
from frozen_fs import frozen_fs  # noqa: F401 (a fixture)

sys.path.insert(0, str(Path(__file__).parents[1] / "distributed"))  # the hosts and their jobs
from netns_jobs import hosts_maker, job_processes, torchrun_on  # noqa: E402,F401 (fixtures)

MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
SHARDS = 4
STORAGE_TIMEOUT_S = 60  # the shipped storage_timeout_s (src/config/keys.def)
GRACE_S = 60  # the PyTorchJob's terminationGracePeriodSeconds (k8s/pytorchjob/base)
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


def mpirun(tmp_path, *mounts, more=()):
    """Two ranks, each reading the data through a mount of its own (as each node has), launched
    as the MPIJob does: SIGKILL 20 s after SIGTERM (k8s/base/mpijob.yaml)."""
    argv = ["mpirun", "--oversubscribe", "--mca", "odls_base_sigkill_timeout", 20]
    for i, mount in enumerate(mounts):
        argv += [":"] * bool(i) + ["-np", 1, binary("train"), *train_args(mount, tmp_path, *more)]
    return argv


def pod_configs(tmp_path, mounts, epochs, *more):
    """For netns_jobs' TorchrunJob: each pod's config, reading the data through its own mount."""
    def make(out):
        return [f'arch = "resnet18"\nnum_classes = 4\ndevice = "cpu"\ndata_source = "tfrecord"\n'
                f'train_data = "{mount}/train-*"\nimage_size = 32\nbatch_size = 8\n'
                f'epochs = {epochs}\nwarmup_epochs = 0\nlog_every_steps = 1\n'
                f'checkpoint_every_steps = 4\nkeep_checkpoints = 2\nreader_threads = 1\n'
                f'decode_threads = 1\nindex_cache_dir = "{tmp_path / "index"}"\n'
                f'output_dir = "{out}"\nresume = "auto"\n' + "".join(f"{m}\n" for m in more)
                for mount in mounts]
    return make


def first_critical(text):
    found = CRITICAL.search(COLOURS.sub("", text))
    assert found, f"no critical line:\n{text[-3000:]}"
    return found.group(0)


def frozen_pod_named(job, call):
    """Pod b's first line names its rank, host and `call` (a pattern: "reading MOUNT/train-");
    pod a's names pod b's, and pod a trained on alone. Returns both pods' logs."""
    a, b = job.hosts.names
    pod_a, pod_b = (log.read_text(errors="replace") for log in job.logs)
    first = first_critical(pod_b)
    assert re.search(rf"rank \d \({b}\): the file system does not answer: {call}", first), first
    first = first_critical(pod_a)
    assert re.search(rf"rank \d \({a}\): rank \d \({b}\) ended the job: the file system does "
                     rf"not answer: {call}", first), first
    assert job.procs[0].returncode == 0, pod_a[-4000:]
    assert "world: 1 rank(s)" in pod_a, pod_a[-4000:]
    return pod_a, pod_b


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
    # Rank 0, waiting for rank 1 in a collective, hears its last word and ends at once, naming
    # it, rather than when mpirun passes SIGTERM on (odls_base_sigkill_timeout after the abort).
    host = re.escape(socket.gethostname())
    assert re.search(rf"rank 0 \({host}\): rank 1 \({host}\) ended the job: the file system does "
                     rf"not answer: reading {re.escape(str(fs.mount))}/train-\S+ at byte", out), out
    assert not no_train_left(tmp_path / "run"), "a rank outlived mpirun"
    print(f"mpirun, rank 1 frozen mid-epoch: every rank ended {took:.0f} s after the freeze")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI not installed")
def test_under_mpirun_a_rank_frozen_at_start_up_ends_the_job_naming_it(tmp_path, data, frozen_fs,
                                                                      jobs):
    healthy, fs = frozen_fs(data), frozen_fs(data)
    fs.freeze("all")
    # A deadline of its own, to be quick: the shipped one is the mid-epoch test's above.
    job = jobs(mpirun(tmp_path, healthy.mount, fs.mount, more=("--storage_timeout_s", 20)),
               tmp_path / "mpirun.log")
    code, took = job.wait_end(timeout=120)
    out = job.text()
    assert code != 0, out
    # Start-up, the deadline, and mpirun's end: its daemons' kill sequence takes
    # odls_base_sigkill_timeout twice (40 s) whenever a rank is still alive as it starts.
    assert took < 20 + 40 + 20, (took, out)
    host = re.escape(socket.gethostname())
    first = first_critical(out)
    assert re.search(rf"rank 1 \({host}\): the file system does not answer: listing "
                     rf"{re.escape(str(fs.mount))}/train-\* has not returned for 2\d s", first), first
    assert re.search(rf"rank 0 \({host}\): rank 1 \({host}\) ended the job: the file system does "
                     rf"not answer: listing {re.escape(str(fs.mount))}/train-\*", out), out
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



def test_under_torchrun_a_pod_frozen_mid_epoch_leaves_and_the_others_finish(tmp_path, data,
                                                                           frozen_fs, torchrun_on):
    # Two pods, on hosts a and b, each reading through its own mount, at the shipped deadlines.
    healthy, fs = frozen_fs(data), frozen_fs(data)
    job = torchrun_on(hosts=("a", "b"), configs=pod_configs(tmp_path, [healthy.mount, fs.mount],
                                                            epochs=8))
    job.wait_checkpoint(4)
    fs.freeze("read")
    frozen = time.monotonic()
    fs.wait_held(job.procs[1], timeout=60)
    job.wait_pods([1], within=STORAGE_TIMEOUT_S + 60)
    left = time.monotonic() - frozen
    job.wait_pods([0], within=120)
    pod_a, pod_b = frozen_pod_named(job, rf"reading {re.escape(str(fs.mount))}/train-")
    # The frozen pod names the byte it reads; it ends its agent, which would start the rank again
    # on the same mount, and so its pod. The other starts the group again without it, from the
    # newest checkpoint.
    first = first_critical(pod_b)
    assert re.search(rf"{re.escape(str(fs.mount))}/train-\S+ at byte", first), first
    assert "torchrun's agent" in first, first
    assert job.procs[1].returncode != 0
    assert left < STORAGE_TIMEOUT_S + 60, (left, pod_b[-3000:])
    assert not job_processes(job.folder / "trainer1.toml"), "a process of the frozen pod is left"
    resumed = re.search(r"resumed from \S+checkpoint-0*(\d+)\.pt", pod_a)
    assert resumed and int(resumed[1]) >= 4, pod_a[-4000:]
    print(f"torchrun, pod b frozen mid-epoch: it ended {left:.0f} s after the freeze")


def test_under_torchrun_a_pod_frozen_at_start_up_leaves_and_the_others_finish(tmp_path, data,
                                                                             frozen_fs,
                                                                             torchrun_on):
    healthy, fs = frozen_fs(data), frozen_fs(data)
    fs.freeze("all")
    # A deadline of its own, to be quick: the shipped one is the mid-epoch test's above.
    job = torchrun_on(hosts=("a", "b"), configs=pod_configs(
        tmp_path, [healthy.mount, fs.mount], 2, "storage_timeout_s = 20"))
    start = time.monotonic()
    job.wait_pods([1], within=120)
    left = time.monotonic() - start
    job.wait_pods([0], within=120)
    pod_a, pod_b = frozen_pod_named(job, rf"listing {re.escape(str(fs.mount))}/train-\*")
    first = first_critical(pod_b)
    assert re.search(rf"listing {re.escape(str(fs.mount))}/train-\* has not returned for", first), (
        first)
    assert left < 20 + 40, (left, pod_b[-3000:])


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI not installed")
def test_a_slow_first_step_and_a_slow_checkpoint_end_nothing(tmp_path, data, frozen_fs, jobs):
    # A rank busy longer than liveness_timeout_s (45 s) while the other waits for it in a
    # collective is alive, and its liveness messages say so: rank 1's first step waits 50 s for
    # its first records (as on a cold file system), then rank 0's checkpoint 8 takes 50 s to
    # write (as on a busy FSx). Both are under storage_timeout_s a call, and the job goes on.
    subprocess.run([str(binary("index-tfrecords")), str(data)], check=True, capture_output=True,
                   timeout=60)  # beside the data: only the records' reads are held below
    slow_data = frozen_fs(data)
    slow_data.freeze("read", "train-0000?-of-0000?")
    (tmp_path / "disk").mkdir()
    slow_disk = frozen_fs(tmp_path / "disk", writable=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(slow_disk.mount)
    slow_disk.freeze("write", "checkpoint-000000008.pt*")
    argv = mpirun(tmp_path, data, slow_data.mount, more=("--max_steps", 12))
    job = jobs(argv, tmp_path / "mpirun.log")
    for slow in (slow_data, slow_disk):
        slow.wait_held(job.proc, timeout=120)
        time.sleep(50)
        slow.thaw()
    code, _ = job.wait_end(timeout=120)
    out = job.text()
    assert code == 0, out
    assert "[critical]" not in out and "no word from" not in out, out
    assert "checkpoint-000000008.pt" in "".join(slow_disk.held()), slow_disk.held()
    newest = sorted(slow_disk.mount.glob("checkpoint-*.pt"))[-1]
    assert newest.name == "checkpoint-000000012.pt", newest
    # The interval after checkpoint 8 names its writer and what held the step: the 50 s are
    # rank 0's time outside its steps, which rank 1 spent in the next all-reduce.
    held = re.search(r"step 9 ranks: .*; rank 0 \(\S+\) holds the step back: its time outside "
                     r"the steps, (\d+)\.\d ms a step", out)
    assert held and 45000 < float(held[1]) < 60000, re.findall(r"step \d+ ranks: .*", out)


def test_under_torchrun_sigterm_while_a_pod_is_frozen_ends_every_pod_within_the_grace(
        tmp_path, data, frozen_fs, torchrun_on):
    healthy, fs = frozen_fs(data), frozen_fs(data)
    job = torchrun_on(hosts=("a", "b"), configs=pod_configs(tmp_path, [healthy.mount, fs.mount],
                                                            epochs=8))
    job.wait_checkpoint(4)
    fs.freeze("read")
    fs.wait_held(job.procs[1], timeout=60)
    time.sleep(3)  # the other rank now waits for it in a collective
    for proc in job.procs:  # the kubelet's SIGTERM to each pod's PID 1, the entrypoint
        proc.send_signal(signal.SIGTERM)
    took = job.wait_pods([0, 1], within=GRACE_S)
    pod_a, pod_b = (log.read_text(errors="replace") for log in job.logs)
    assert all(p.returncode != 0 for p in job.procs), pod_a[-3000:] + pod_b[-3000:]
    assert re.search(r"signal 15 arrived while waiting for batch", pod_b), pod_b[-3000:]
    # The other rank stops on the signal too, naming the frozen one, as a stop, not a fault.
    plain = COLOURS.sub("", pod_a)
    assert "[critical]" not in plain and "[error]" not in plain, pod_a[-3000:]
    assert re.search(rf"signal 15 arrived.*rank \d \({job.hosts.names[1]}\) waits on storage: "
                     rf"reading {re.escape(str(fs.mount))}/", plain), pod_a[-3000:]
    print(f"torchrun, SIGTERM with pod b frozen: every pod ended {took:.0f} s after it")
