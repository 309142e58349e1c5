"""The jobs that tests/distributed/test_lost_host.py and test_slow_host.py run on hosts made of
network namespaces (netns_hosts.py), at the trainer's shipped timeouts, on the CPU. Under mpirun:
worker hosts and the launcher's, with the MPIJob's launcher command as k8s/base/mpijob.yaml ships
it (its entrypoint, its mpirun options and environment). Under torchrun: a pod a host, each
running the PyTorchJob's container command with what the Training Operator sets. The fixtures
kill whatever is left of a job at the end.
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, binary, kill_tree
from netns_hosts import hosts_maker  # noqa: F401 (a fixture)

sys.path.insert(0, str(Path(__file__).parents[1] / "run"))  # the PyTorchJob the chaos test has
from chaos_history import rounds_of, trained_per_epoch  # noqa: E402
from chaos_jobs import (LOG_TIME, TORCHRUN, mpirun_on_hosts, operator_env, pytorchjob,  # noqa: E402
                        worker_container)

START_S = 180  # launch to checkpoint 10 on a busy machine
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMP_NUM_THREADS": "1"}


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
        config = folder / "trainer.toml"
        config.write_text(settings(self.out, images))
        argv, env = mpirun_on_hosts(hosts, folder / "hostfile", ROOT / "docker" / "entrypoint.sh",
                                    binary("train").resolve(), config)
        self.log = folder / "launcher.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=folder,
                                         env={"LD_LIBRARY_PATH": "", **os.environ, **ENV, **env})

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

    def wait_line(self, text, within, since=0):
        """The first line of the job's log past offset `since` that holds `text`; fails past
        `within` seconds or when the job ends first."""
        deadline = time.monotonic() + within
        while True:
            found = [line for line in self.text()[since:].splitlines() if text in line]
            if found:
                return found[0]
            assert self.proc.poll() is None, (
                f"the job ended (status {self.proc.returncode}) with no line saying {text!r}:\n"
                + self.text()[-3000:])
            assert time.monotonic() < deadline, (
                f"no line saying {text!r} after {within} s:\n" + self.text()[-3000:])
            time.sleep(0.5)

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


class TorchrunJob:
    """The PyTorchJob's pods, one a host: each the rendered container's command through the
    image's entrypoint, with the operator's PET_* variables pointing at pod 0's host. Each pod's
    config is `settings(out, images)`, or `configs(out)[pod]` when given (a pod's own data)."""

    def __init__(self, hosts, folder, images, configs=None):
        self.hosts, self.folder = hosts, folder
        self.out = folder / "run"
        self.trace = folder / "trace"  # the samples each rank trains (src/report/sample_trace.h)
        texts = configs(self.out) if configs else [settings(self.out, images)] * len(hosts.names)
        entrypoint = folder / "bin" / "entrypoint"  # alone: `torchrun` is the test venv's
        entrypoint.parent.mkdir()
        shutil.copy(ROOT / "docker" / "entrypoint.sh", entrypoint)
        job = pytorchjob()
        container = worker_container(job)
        bin_dir = "/opt/resnet-trainer/bin/"
        rendezvous = hosts.names[0]
        self.procs, self.logs = [], []
        for index, host in enumerate(hosts.names):
            config = folder / f"trainer{index}.toml"
            config.write_text(texts[index])
            paths = {bin_dir + "entrypoint": str(entrypoint),
                     bin_dir + "train": str(binary("train").resolve()),
                     "/etc/resnet-trainer/trainer.toml": str(config)}
            argv = [paths.get(w, w) for w in container["command"] + container["args"]]
            env = {**os.environ, **ENV, **{e["name"]: e["value"] for e in container["env"]},
                   "PATH": f"{TORCHRUN.parent}:{os.environ['PATH']}", "LOGLEVEL": "INFO",
                   **operator_env(job, index, 29400, 1, len(hosts.names)),
                   "PET_RDZV_ENDPOINT": f"{rendezvous}:29400", "MASTER_ADDR": rendezvous,
                   "TRAINER_SAMPLE_TRACE": str(self.trace)}
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

    def trained_per_epoch(self):
        """{epoch: Counter of sample ids} the run as finally kept trained, across its rounds."""
        lines = sorted(line for line in self.text().splitlines() if LOG_TIME.match(line))
        return trained_per_epoch({int(p.stem.split("-")[1]): p.read_text().splitlines()
                                  for p in self.trace.glob("rank-*.txt")}, rounds_of(lines))

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
    """Starts a TorchrunJob on new hosts (a, b, c, or `hosts`); kills what is left at the end."""
    jobs = []

    def start(images=None, hosts=("a", "b", "c"), configs=None):
        job = TorchrunJob(hosts_maker(list(hosts)), tmp_path, images, configs)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()
