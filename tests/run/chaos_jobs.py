"""The chaos test's jobs (tests/run/test_chaos.py): `train` launched alone, under mpirun or as the
PyTorchJob's torchrun pods, each process logging to a file of its own; the deadlines they are
held to, and what a scenario reads of them (their processes, their logs' times, the steps
traced).
"""
import datetime
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos_history import RANK0  # noqa: F401 (the faults' and the run's)
from conftest import ROOT, descendants, kill_tree


PYTHON = Path(sys.executable)
TORCHRUN = PYTHON.parent / "torchrun"  # the `torch` wheel's, in the test venv
KUBECTL = os.environ.get("KUBECTL") or (str(PYTHON.parent / "kubectl") if (
    PYTHON.parent / "kubectl").exists() else shutil.which("kubectl"))
BIN = "/opt/resnet-trainer/bin/"  # where the image puts the binaries (the rendered command's)

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMP_NUM_THREADS": "1"}
START_S = 180  # launch to the fault step, at most (start-up, rendezvous, a few steps)
LAST_CALL_S = 3  # torchrun's wait for more pods once the fewest have joined (30 s by default)
STOP_S = 60  # a signalled or broken job to its end, on top of collective_timeout_s
REGROUP_MARGIN_S = 15  # a lost pod's survivors at a smaller world: start-up on a busy machine
# The ranks agree on a stop at most this many steps after the one the signal came in (Note [A
# stop at any step] in src/run/fit.cpp): the log interval plays no part.
STOP_WITHIN_STEPS = 2


# A line of `train`'s log starts with its time: [YYYY-MM-DD HH:MM:SS.mmm] [host rank/world].
LOG_TIME = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\]")


class ScenarioFailed(AssertionError):
    pass


def check(condition, message):
    if not condition:
        raise ScenarioFailed(message)



# Processes.

def comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def processes_holding(marker):
    """PIDs of live processes whose command line holds `marker` (this scenario's folder)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(marker).encode() in cmdline.read_bytes():
                pid = int(cmdline.parent.name)
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if pid != os.getpid() and state != "Z":
                    found.append(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
    return found


def log_time(line):
    """The time a log line was written, in epoch seconds (the log's time is local)."""
    return datetime.datetime.strptime(LOG_TIME.match(line)[0], "[%Y-%m-%d %H:%M:%S.%f]").timestamp()


def traced_step(trace):
    """The highest step index any rank has traced in the folder `trace` (-1 before the first)."""
    best = -1
    for path in trace.glob("rank-*.txt"):
        for line in path.read_text().splitlines()[-3:]:
            fields = line.split()
            if len(fields) >= 2 and line.endswith(tuple("0123456789")):
                best = max(best, int(fields[1]))
    return best


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml(settings):
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v) if isinstance(v, str) else str(v)
    return "".join(f"{k} = {value(v)}\n" for k, v in settings.items())


# The PyTorchJob, rendered once from k8s/pytorchjob as scripts/k8s/render.sh renders it (with
# kubectl kustomize; nothing written to the build tree), shaped for one or two CPU pods.

_JOB = {}


def pytorchjob():
    if "job" not in _JOB:
        yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
        if not KUBECTL:
            pytest.skip("no kubectl to render the PyTorchJob: run scripts/setup.sh")
        out = subprocess.run([KUBECTL, "kustomize", "--load-restrictor", "LoadRestrictionsNone",
                              str(ROOT / "k8s" / "pytorchjob" / "p3.16xlarge")],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        (job,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PyTorchJob"]
        # Once the fewest pods have joined, torchrun waits 30 s for more before it starts them
        # (a lost pod's survivor, a job of one pod that may grow). The rehearsal shortens that
        # wait the way a PyTorchJob can: its elasticPolicy's rdzvConf, which the operator passes
        # on as PET_RDZV_CONF.
        job["spec"]["elasticPolicy"].setdefault("rdzvConf", []).append(
            {"key": "last_call_timeout", "value": str(LAST_CALL_S)})
        _JOB["job"] = job
    return _JOB["job"]


def mpijob_launcher(ranks, train, config):
    """The MPIJob launcher's mpirun options (k8s/base/mpijob.yaml as shipped), for `ranks` ranks
    of `train`, and its environment."""
    yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
    manifest = ROOT / "k8s" / "base" / "mpijob.yaml"
    (job,) = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    (container,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    args = list(container["args"])
    assert args[:2] == ["-np", args[1]] and args[-3:-1] == [BIN + "train", "--config"]
    args = ["-np", str(ranks), *args[2:-3], "-x", "OMP_NUM_THREADS", str(train), "--config",
            str(config)]
    return args, {e["name"]: e["value"] for e in container.get("env", [])}


def mpirun_on_hosts(hosts, hostfile, entrypoint, train, config, options=()):
    """mpirun as the MPIJob's launcher runs it, across netns_hosts.Hosts `hosts`: through the
    image's entrypoint on the first host, with the manifest's options and environment, one rank
    of `train` on each other host (`hostfile` written, an rsh agent beside it): argv and the
    launcher's environment."""
    hostfile.write_text("".join(f"{h} slots=1\n" for h in hosts.names[1:]))
    args, env = mpijob_launcher(len(hosts.names) - 1, train, config)
    argv = [str(entrypoint), "mpirun", "--hostfile", str(hostfile), *options, "--mca",
            "plm_rsh_agent", str(hosts.rsh_agent(hostfile.parent)), *args]
    return hosts.on(hosts.names[0], argv), env


def worker_container(job):
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    return container


def operator_env(job, index, port, nproc, max_pods):
    """What the Training Operator v1.9 sets in worker `index` of an elastic PyTorchJob (its
    elastic and PET_* generators), with the worker-0 service's name as 127.0.0.1 and the job
    resized to `max_pods` pods of `nproc` ranks (scripts/k8s/render.sh --slots/--max-workers)."""
    policy = job["spec"]["elasticPolicy"]
    return {
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
        "PET_RDZV_BACKEND": policy["rdzvBackend"],
        "PET_NNODES": f"1:{max_pods}",
        "PET_RDZV_CONF": ",".join(f"{kv['key']}={kv['value']}"
                                  for kv in policy.get("rdzvConf", [])),
        "PET_MAX_RESTARTS": str(policy["maxRestarts"]),
        "PET_NPROC_PER_NODE": str(nproc),
        "PET_NODE_RANK": str(index),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONUNBUFFERED": "1",
    }


# One launch of a job.

class Job:
    """One launch: its processes (one for `train` alone or mpirun, one per pod under torchrun),
    each logging to a file of its own."""

    def __init__(self, run, phase, name, hosts=None):
        self.run, self.phase, self.name = run, phase, name
        # netns_hosts.Hosts: under mpirun its first host the launcher's, a rank on each other;
        # under torchrun a pod on each
        self.hosts = hosts
        self.config = run.dir / f"{name}.toml"
        self.config.write_text(toml(run.settings(phase)))
        self.procs = []  # [(label, Popen, log path)]
        self.port = free_port()
        self.tmpfs_listing = None

    def _popen(self, label, argv, env):
        log = self.run.dir / f"{self.name}-{label}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, text=True,
                                    env=env, start_new_session=True, cwd=self.run.dir)
        self.procs.append((label, proc, log))
        self.run.log_files.append(log)
        return proc

    def argv(self):
        train = [str(self.run.bins["train"]), "--config", str(self.config)]
        if self.phase.launcher == "alone":
            return train
        argv = ["mpirun", "--oversubscribe", "-x", "OMP_NUM_THREADS", "-x", "TRAINER_SAMPLE_TRACE"]
        if self.phase.mpmd:
            for i in range(self.phase.ranks):
                argv += ([":"] if i else []) + ["-np", "1", *train]
            return argv
        return [*argv, "-np", str(self.phase.ranks), *train]

    def start(self, volume=None, size=""):
        """Starts the job; `volume`: a folder given a tmpfs of `size` in a mount namespace."""
        env = {**os.environ, **MPI_ENV, "TRAINER_SAMPLE_TRACE": str(self.run.trace)}
        argv = self.argv()
        if self.hosts:
            argv, launcher_env = mpirun_on_hosts(
                self.hosts, self.run.dir / f"{self.name}-hostfile", self.run.bins["entrypoint"],
                self.run.bins["train"], self.config, options=["-x", "TRAINER_SAMPLE_TRACE"])
            env.update(launcher_env)
            env.setdefault("LD_LIBRARY_PATH", "")  # which the launcher's options -x
        if volume is not None:
            volume.mkdir(parents=True, exist_ok=True)
            self.tmpfs_listing = self.run.dir / f"{self.name}-volume.txt"
            keep = self.run.dir / f"{self.name}-volume-kept"
            keep.mkdir()
            q = shlex.quote
            argv = ["unshare", "-rm", "sh", "-c",
                    f"mount -t tmpfs -o size={size} tmpfs {q(str(volume))} && "
                    f"{' '.join(map(q, argv))}; status=$?; ls -a {q(str(volume))} > "
                    f"{q(str(self.tmpfs_listing))}; cp -a {q(str(volume))}/. {q(str(keep))}/; "
                    f"exit $status"]
        self._popen("job", argv, env)

    def start_pod(self, index):
        """A pod of worker `index` as the operator starts it: the rendered container's command
        through the image's entrypoint, with the PET_* variables."""
        job = pytorchjob()
        container = worker_container(job)
        paths = {BIN + "entrypoint": str(self.run.bins["entrypoint"]),
                 BIN + "train": str(self.run.bins["train"]),
                 "/etc/resnet-trainer/trainer.toml": str(self.config)}
        argv = [paths.get(w, w) for w in container["command"] + container["args"]]
        env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]},
               "PATH": f"{TORCHRUN.parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
               "TRAINER_SAMPLE_TRACE": str(self.run.trace),
               "LOGLEVEL": "INFO",  # the elastic agent's rendezvous and restarts, in the log
               **operator_env(job, index, self.port, self.phase.nproc, self.phase.max_pods)}
        if self.hosts:  # worker 0's service name is its host's
            argv = self.hosts.on(self.hosts.names[index], argv)
            env.update(PET_RDZV_ENDPOINT=f"{self.hosts.names[0]}:{self.port}",
                       MASTER_ADDR=self.hosts.names[0])
        label = f"pod{index}" + ("-new" if any(l == f"pod{index}" for l, _, _ in self.procs)
                                 else "")
        proc = self._popen(label, argv, env)
        if index == 0:  # the first agent to listen hosts the store (worker 0's on a cluster)
            deadline = time.monotonic() + 60
            while not self.serves_store():
                check(proc.poll() is None, f"pod 0 ended before it served the store "
                                           f"(status {proc.returncode})")
                check(time.monotonic() < deadline, "nothing listens on the rendezvous port "
                                                   "60 s after pod 0 started")
                time.sleep(0.1)
        return proc

    def serves_store(self):
        """Whether pod 0's agent listens on the rendezvous port (on its host, if on hosts)."""
        if self.hosts:
            listening = subprocess.run(["ip", "netns", "exec", self.hosts.names[0], "ss", "-Hltn",
                                        f"sport = :{self.port}"],
                                       capture_output=True, text=True, timeout=30).stdout
            return bool(listening.strip())
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def live(self):
        return [p for _, p, _ in self.procs if p.poll() is None]

    def ranks(self):
        """PIDs of the job's `train` processes."""
        return [pid for _, p, _ in self.procs if p.poll() is None
                for pid in [p.pid, *descendants(p.pid)] if comm(pid) == "train"]

    def log(self):
        return "\n".join(log.read_text(errors="replace") for _, _, log in self.procs)

    def wait_end(self, timeout, what, procs=None):
        """Waits for `procs` (default: all) to end, at most `timeout` s; fails naming `what`."""
        procs = procs or [p for _, p, _ in self.procs]
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"hang: {what} not ended {timeout:.0f} s later")
            time.sleep(0.2)
        return [p.returncode for p in procs]

    def kill(self):
        for _, proc, _ in self.procs:
            kill_tree(proc)


# One scenario's run.

