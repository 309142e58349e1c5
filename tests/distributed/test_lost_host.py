"""A job across hosts that loses one, on hosts made of network namespaces
(tests/distributed/netns_hosts.py), at the trainer's shipped timeouts, on the CPU. Under mpirun:
three worker hosts and the launcher's, with the MPIJob's launcher command as
k8s/base/mpijob.yaml ships it (its entrypoint, its mpirun options and environment). Under
torchrun: three pods' hosts, each running the PyTorchJob's container command with what the
Training Operator sets. A host blackholed or its link cut once checkpoint 10 exists: every
process of the job that can end does so within two minutes, a surviving rank's error names the
lost rank and host, and the newest checkpoint loads. An outage shorter than liveness_timeout_s
ends nothing.
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, binary, descendants, kill_tree
from netns_hosts import hosts_maker  # noqa: F401 (a fixture)

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
sys.path.insert(0, str(Path(__file__).parents[1] / "run"))  # the PyTorchJob, as the chaos test has it
from chaos_jobs import TORCHRUN, operator_env, pytorchjob, worker_container  # noqa: E402

LOST_WITHIN_S = 120  # the bound docs/distributed.md states for every process of the job
START_S = 180  # launch to checkpoint 10 on a busy machine
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMP_NUM_THREADS": "1"}


def launcher(job_yaml, ranks, config):
    """The MPIJob launcher's mpirun options, for `ranks` ranks of this build's train, and its
    environment."""
    (job,) = [d for d in yaml.safe_load_all(job_yaml.read_text()) if d]
    (container,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    args = list(container["args"])
    assert args[:2] == ["-np", args[1]] and args[-3:-1] == ["/opt/resnet-trainer/bin/train",
                                                            "--config"]
    args = ["-np", str(ranks), *args[2:-3], "-x", "OMP_NUM_THREADS",
            str(binary("train").resolve()), "--config", str(config)]
    return args, {e["name"]: e["value"] for e in container.get("env", [])}


def settings(out, images):
    """A small run at the shipped timeouts (collective_timeout_s, liveness_timeout_s unset)."""
    return (f'arch = "resnet18"\nnum_classes = 4\ndevice = "cpu"\ndata_source = "generated"\n'
            f'generated_classes = 4\ngenerated_train_images = {images}\n'
            f'generated_val_images = 12\nimage_size = 32\nbatch_size = 12\nepochs = 1\n'
            f'warmup_epochs = 0\nlog_every_steps = 5\ncheckpoint_every_steps = 5\n'
            f'keep_checkpoints = 2\noutput_dir = "{out}"\nresume = "auto"\n')


def job_processes(marker):
    """Live processes of the job: their command lines name its folder (the config, the hostfile,
    the rsh agent)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(marker).encode() not in cmdline.read_bytes():
                continue
            pid = int(cmdline.parent.name)
            fields = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()
            if pid != os.getpid() and fields[0] != "Z":
                found.append(f"{pid} {(cmdline.parent / 'comm').read_text().strip()}")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return found


class Job:
    """mpirun's launcher on the first host, one rank on each of the others."""

    def __init__(self, hosts, folder, images):
        self.hosts, self.folder = hosts, folder
        self.out = folder / "run"
        self.workers = hosts.names[1:]
        config = folder / "trainer.toml"
        config.write_text(settings(self.out, images))
        hostfile = folder / "hostfile"
        hostfile.write_text("".join(f"{h} slots=1\n" for h in self.workers))
        args, env = launcher(ROOT / "k8s" / "base" / "mpijob.yaml", len(self.workers), config)
        argv = [str(ROOT / "docker" / "entrypoint.sh"), "mpirun", "--hostfile", str(hostfile),
                "--mca", "plm_rsh_agent", str(hosts.rsh_agent(folder)), *args]
        self.log = folder / "launcher.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(hosts.on(hosts.names[0], argv), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         env={"LD_LIBRARY_PATH": "", **os.environ, **ENV, **env},
                                         cwd=folder)

    def text(self):
        return self.log.read_text(errors="replace")

    def checkpoints(self):
        return sorted((self.out / "checkpoints").glob("checkpoint-*.pt"))

    def wait_checkpoint(self, step):
        deadline = time.monotonic() + START_S
        name = f"checkpoint-{step:09d}.pt"
        while not any(p.name >= name for p in self.checkpoints()):
            assert self.proc.poll() is None, (
                f"the job ended (status {self.proc.returncode}) before checkpoint {step}:\n"
                + self.text()[-3000:])
            assert time.monotonic() < deadline, f"no checkpoint {step} after {START_S} s"
            time.sleep(0.2)

    def wait_end(self, within):
        """Seconds until every process of the job has ended; fails past `within`."""
        start = time.monotonic()
        while job_processes(self.folder):
            elapsed = time.monotonic() - start
            assert elapsed < within, (
                f"{elapsed:.0f} s after the fault these processes of the job still run: "
                f"{job_processes(self.folder)}\n" + self.text()[-3000:])
            time.sleep(0.5)
        self.proc.wait(timeout=10)
        return time.monotonic() - start

    def kill(self):
        for pid in job_processes(self.folder):
            try:
                os.kill(int(pid.split()[0]), 9)
            except ProcessLookupError:
                pass
        kill_tree(self.proc)


@pytest.fixture
def job_on(hosts_maker, tmp_path):
    """Starts a Job on new hosts (launcher, a, b, c); kills what is left of it at the end."""
    jobs = []

    def start(images):
        job = Job(hosts_maker(["l", "a", "b", "c"]), tmp_path, images)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()


def newest_checkpoint_loads(job):
    torch = pytest.importorskip("torch")
    newest = job.checkpoints()[-1]
    assert int(torch.load(newest)["step"]) >= 10, newest


@pytest.mark.parametrize("fault, lost", [("blackhole", 3), ("link_down", 3), ("blackhole", 1)],
                         ids=["worker-blackholed", "worker-link-down", "rank0-host-blackholed"])
def test_a_lost_host_ends_every_process_within_two_minutes_named(job_on, fault, lost):
    job = job_on(images=3600)  # 100 steps: the job cannot end before the fault does
    job.wait_checkpoint(10)
    host = job.hosts.names[lost]
    rank = lost - 1
    getattr(job.hosts, fault)(host)
    took = job.wait_end(within=LOST_WITHIN_S)
    text = job.text()
    named = f"no word from rank {rank} ({host})"
    survivors = [line for line in text.splitlines() if "[critical]" in line.replace(
        "\x1b[1m\x1b[41m", "").replace("\x1b[m", "") and named in line]
    assert survivors, f"no surviving rank named rank {rank} ({host}):\n{text[-3000:]}"
    last = text.rstrip().splitlines()[-1]
    assert last.startswith("entrypoint: mpirun ") and named in last, last
    assert job.proc.returncode != 0
    newest_checkpoint_loads(job)
    print(f"{fault} of {host}: every process ended {took:.0f} s after the fault")


def test_an_outage_shorter_than_the_liveness_timeout_ends_nothing(job_on):
    job = job_on(images=720)  # 20 steps: it finishes soon after the outage
    job.wait_checkpoint(10)
    worker = job.hosts.names[3]
    job.hosts.blackhole(worker)
    time.sleep(25)
    job.hosts.heal()
    job.wait_end(within=START_S)
    text = job.text()
    assert job.proc.returncode == 0, text[-3000:]
    assert "no word from" not in text and "cut off" not in text, text[-3000:]
    assert job.checkpoints()[-1].name == "checkpoint-000000020.pt"


def test_liveness_blocked_between_hosts_is_said_and_ends_nothing(job_on):
    # A rank never heard from is not judged (src/distributed/liveness.cpp, tell_unheard): a
    # network that passes the job's TCP but drops UDP must not end every job at the timeout.
    job = job_on(images=7200)  # 200 steps: past liveness_timeout_s
    job.hosts.block_udp()
    job.wait_end(within=START_S + 120)
    text = job.text()
    assert job.proc.returncode == 0, text[-3000:]
    assert "UDP between the hosts may be blocked" in text, text[-3000:]
    assert "no word from" not in text and "cut off" not in text, text[-3000:]


class TorchrunJob:
    """The PyTorchJob's pods, one a host: each the rendered container's command through the
    image's entrypoint, with the operator's PET_* variables pointing at pod 0's host."""

    def __init__(self, hosts, folder, images):
        self.hosts, self.folder = hosts, folder
        self.out = folder / "run"
        config = folder / "trainer.toml"
        config.write_text(settings(self.out, images))
        entrypoint = folder / "bin" / "entrypoint"  # alone: `torchrun` is the test venv's
        entrypoint.parent.mkdir()
        shutil.copy(ROOT / "docker" / "entrypoint.sh", entrypoint)
        job = pytorchjob()
        container = worker_container(job)
        bin_dir = "/opt/resnet-trainer/bin/"
        paths = {bin_dir + "entrypoint": str(entrypoint),
                 bin_dir + "train": str(binary("train").resolve()),
                 "/etc/resnet-trainer/trainer.toml": str(config)}
        argv = [paths.get(w, w) for w in container["command"] + container["args"]]
        rendezvous = hosts.names[0]
        self.procs, self.logs = [], []
        for index, host in enumerate(hosts.names):
            env = {**os.environ, **ENV, **{e["name"]: e["value"] for e in container["env"]},
                   "PATH": f"{TORCHRUN.parent}:{os.environ['PATH']}", "LOGLEVEL": "INFO",
                   **operator_env(job, index, 29400, 1, len(hosts.names)),
                   "PET_RDZV_ENDPOINT": f"{rendezvous}:29400", "MASTER_ADDR": rendezvous}
            log = folder / f"pod{index}.log"
            with open(log, "w") as f:
                self.procs.append(subprocess.Popen(hosts.on(host, argv), stdout=f,
                                                   stderr=subprocess.STDOUT, env=env,
                                                   start_new_session=True, cwd=folder))
            self.logs.append(log)
            if index == 0:
                time.sleep(2)  # pod 0's agent serves the rendezvous

    def text(self):
        return "\n".join(log.read_text(errors="replace") for log in self.logs)

    def checkpoints(self):
        return sorted((self.out / "checkpoints").glob("checkpoint-*.pt"))

    def wait_checkpoint(self, step):
        name = f"checkpoint-{step:09d}.pt"
        deadline = time.monotonic() + START_S
        while not any(p.name >= name for p in self.checkpoints()):
            assert all(p.poll() is None for p in self.procs), self.text()[-3000:]
            assert time.monotonic() < deadline, f"no checkpoint {step} after {START_S} s"
            time.sleep(0.2)

    def wait_pods(self, pods, within):
        start = time.monotonic()
        while any(self.procs[i].poll() is None for i in pods):
            assert time.monotonic() - start < within, (
                f"pods {[i for i in pods if self.procs[i].poll() is None]} still run "
                f"{within} s after the fault:\n" + self.text()[-4000:])
            time.sleep(0.5)
        return time.monotonic() - start

    def kill(self):
        for proc in self.procs:
            kill_tree(proc)
        for pid in job_processes(self.folder):
            try:
                os.kill(int(pid.split()[0]), 9)
            except ProcessLookupError:
                pass


@pytest.fixture
def torchrun_on(hosts_maker, tmp_path):
    jobs = []

    def start(images):
        job = TorchrunJob(hosts_maker(["a", "b", "c"]), tmp_path, images)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()


def test_torchrun_survivors_of_a_lost_worker_regroup_and_finish(torchrun_on):
    job = torchrun_on(images=720)
    job.wait_checkpoint(10)
    lost = job.hosts.names[2]
    job.hosts.blackhole(lost)
    took = job.wait_pods([2], within=LOST_WITHIN_S)  # the cut-off pod's agent ends
    job.wait_pods([0, 1], within=START_S)
    text = job.text()
    assert [p.returncode for p in job.procs[:2]] == [0, 0], text[-4000:]
    assert "no word from rank" in text and f"({lost})" in text, text[-4000:]
    assert "this host is cut off" in job.logs[2].read_text(), job.logs[2].read_text()[-3000:]
    assert "world: 2 rank(s)" in text
    print(f"torchrun, {lost} blackholed: its pod ended {took:.0f} s after the fault")


def test_torchrun_a_lost_rendezvous_host_ends_every_pod(torchrun_on):
    job = torchrun_on(images=3600)
    job.wait_checkpoint(10)
    lost = job.hosts.names[0]
    job.hosts.blackhole(lost)
    took = job.wait_pods([0, 1, 2], within=LOST_WITHIN_S)
    text = job.text()
    assert all(p.returncode != 0 for p in job.procs), text[-4000:]
    assert f"({lost}) for 45 s" in text, text[-4000:]
    newest_checkpoint_loads(job)
    print(f"torchrun, {lost} blackholed: every pod ended {took:.0f} s after the fault")
