"""Chaos on the CPU: many short, seeded, randomly drawn jobs, each with one fault, checked against
what the docs promise.

A scenario is a pure function of its seed (`draw(seed)`): the launcher (`train` alone, `mpirun`
-np N or MPMD, or torchrun agents started as Kubeflow's PyTorchJob operator starts them: its PET_*
variables, the rendered worker command through the image's entrypoint), the world size (1-4
processes in all), a dataset of an awkward size for its global batch (records mod global batch in
{0, 1, b-1}, or one step of b+1 images; TFRecord shards of unequal size or the generated source;
batch_size 1 at 64 px), prefetch_batches, the log and checkpoint intervals (now and then the
shipped configs' own, which a short run never reaches), and one fault at a random step:

  sigterm               SIGTERM to every rank (a node drain): exit 143 and a checkpoint at the
                        step the log names, within two steps of the signal whatever the log
                        interval; a relaunch finishes
  sigkill               `train` alone killed: the relaunch resumes
  sigkill-rank          one rank of an mpirun job killed: the job ends non-zero within a bound;
                        the relaunch resumes
  sigterm-launcher      SIGTERM to mpirun itself: the job ends within a bound; the relaunch resumes
  pod-lost              a torchrun pod killed whole: the survivor goes on at the smaller world
  pod-replaced          pod 1 killed, and once the survivor trains alone, a new pod with worker 1's
                        environment: both finish
  pod-added             a second pod joins a running one: both finish
  disk-full-checkpoint  checkpoints on a small tmpfs: exit 2 with "free space on the output
                        volume" and no partial file; a relaunch with space resumes
  disk-full-tensorboard TensorBoard on a small tmpfs: training goes on
A relaunch may change the launcher, the world size or the batch size (a resize by relaunch).

After each scenario: every wait had a deadline and stopped when its process died; the exit
statuses are as documented; across all restarts every training image was trained exactly once per
epoch (the sample trace, each step counted as the last round that trained it did); every epoch
was evaluated, on each held-out image once; the newest checkpoint loads with a plain `torch.load`,
has the documented keys and the run's last step; TensorBoard's EventAccumulator reads the event
files and `train/loss` has no step twice (every step, when each is logged); a lost pod's
survivors regroup within collective_timeout_s (plus a margin); no process is left.

Replay: CHAOS_SEED=<seed> runs exactly that scenario (the failure message starts with it).
CHAOS_BUDGET_S=<seconds> runs scenarios for that long (default 240, from the fixed BASE_SEED; any
other budget draws new seeds from CHAOS_BASE_SEED or, unset, a random base that it prints).
CHAOS_KINDS=mpirun/sigkill-rank,torchrun/pod-added limits the draw to those kinds.

The pods differ from the operator's in two ways only: torchrun's wait for more pods once the
fewest have joined is 3 s instead of 30 (the elasticPolicy's rdzvConf, passed on as
PET_RDZV_CONF), and its agent logs at INFO. A passed scenario's checkpoints are deleted; its logs
stay under the pytest tmp folder, next to chaos-summary.txt.
"""
import dataclasses
import datetime
import functools
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from chaos_history import trained_per_epoch
from conftest import ROOT, binary, descendants, kill_tree

PYTHON = Path(sys.executable)
TORCHRUN = PYTHON.parent / "torchrun"  # the `torch` wheel's, in the test venv
KUBECTL = os.environ.get("KUBECTL") or (str(PYTHON.parent / "kubectl") if (
    PYTHON.parent / "kubectl").exists() else shutil.which("kubectl"))
BIN = "/opt/resnet-trainer/bin/"  # where the image puts the binaries (the rendered command's)

BASE_SEED = 1000
DEFAULT_BUDGET_S = 240.0
MIN_SCENARIOS = 5
SAVED_KEYS = {"model", "optimizer", "loss_scale", "loss_scale_growth_tracker", "step", "epoch",
               "samples_in_epoch", "eval_pending", "target_reached", "world_size", "global_batch",
               "samples_per_epoch", "config"}
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMP_NUM_THREADS": "1"}
START_S = 180  # launch to the fault step, at most (start-up, rendezvous, a few steps)
LAST_CALL_S = 3  # torchrun's wait for more pods once the fewest have joined (30 s by default)
STOP_S = 60  # a signalled or broken job to its end, on top of collective_timeout_s
REGROUP_MARGIN_S = 15  # a lost pod's survivors at a smaller world: start-up on a busy machine
# The ranks agree on a stop at most this many steps after the one the signal came in (Note [A
# stop at any step] in src/fit.cpp): the log interval plays no part.
STOP_WITHIN_STEPS = 2


def shipped_values(key):
    """The values the configs in configs/ and configs/recipes/ give `key`."""
    found = set()
    for path in sorted((ROOT / "configs").rglob("*.toml")):
        for line in path.read_text().splitlines():
            m = re.match(rf"\s*{key}\s*=\s*(\d+)", line)
            if m:
                found.add(int(m[1]))
    return sorted(found)


SHIPPED_LOG_EVERY = shipped_values("log_every_steps")
SHIPPED_CHECKPOINT_EVERY = shipped_values("checkpoint_every_steps")
# A line of `train`'s log starts with its time: [YYYY-MM-DD HH:MM:SS.mmm] [host rank/world].
LOG_TIME = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\]")
RANK0 = re.compile(r"^\[[^]]+\] \[\S+ 0/\d+\]")

# (launcher, fault): relative weight of the draw.
KINDS = {
    ("alone", "sigterm"): 2, ("alone", "sigkill"): 2, ("alone", "disk-full-checkpoint"): 1,
    ("alone", "disk-full-tensorboard"): 1,
    ("mpirun", "sigterm"): 2, ("mpirun", "sigkill-rank"): 2, ("mpirun", "sigterm-launcher"): 1,
    ("mpirun", "disk-full-checkpoint"): 1, ("mpirun", "disk-full-tensorboard"): 1,
    ("torchrun", "pod-lost"): 2, ("torchrun", "pod-replaced"): 2, ("torchrun", "pod-added"): 2,
    ("torchrun", "sigterm"): 1,
}


class ScenarioFailed(AssertionError):
    pass


def check(condition, message):
    if not condition:
        raise ScenarioFailed(message)


# The draw.

@dataclasses.dataclass
class Phase:
    """One launch: `launcher` with `ranks` processes in all (torchrun: `pods` pods of `nproc`)."""
    launcher: str
    ranks: int
    batch: int
    pods: int = 0
    nproc: int = 0
    mpmd: bool = False
    max_pods: int = 0  # torchrun: the elasticPolicy's maxReplicas (every pod's PET_NNODES 1:max)

    def describe(self):
        if self.launcher == "torchrun":
            return f"torchrun {self.pods} pod(s) x {self.nproc}, batch {self.batch}"
        how = " MPMD" if self.mpmd else ""
        return f"{self.launcher}{how} -np {self.ranks}, batch {self.batch}" if (
            self.launcher == "mpirun") else f"alone, batch {self.batch}"


@dataclasses.dataclass
class Scenario:
    seed: int
    launcher: str
    fault: str
    first: Phase
    relaunch: Phase | None
    fault_step: int  # 0-based step index (as in the sample trace) the fault waits for
    records: int
    classes: int
    source: str  # tfrecord | generated
    shards: int
    image_size: int
    prefetch: int
    epochs: int
    log_every: int
    checkpoint_every: int
    keep: int
    timeout_s: int
    tmpfs: str = ""  # size of the small volume (disk-full faults)
    also_sigterm: bool = False  # disk-full-tensorboard: a SIGTERM stop too

    @property
    def val_images(self):
        """Held-out images: one class's worth or more, and at least one per rank."""
        return self.classes * -(-4 // self.classes)

    @property
    def kind(self):
        return f"{self.launcher}/{self.fault}"

    def steps_per_epoch(self, phase):
        g = phase.ranks * phase.batch
        whole, left = divmod(self.records, g)
        return whole if left <= 1 and whole else whole + 1  # a single image left joins a step

    def describe(self):
        g = self.first.ranks * self.first.batch
        data = (f"{self.records} {self.source} records" +
                (f" in {self.shards} shards" if self.source == "tfrecord" else "") +
                f" ({self.records % g} mod global batch {g}), {self.image_size} px, "
                f"prefetch {self.prefetch}, {self.epochs} epochs, log every {self.log_every}, "
                f"checkpoint every {self.checkpoint_every}")
        fault = f"{self.fault} at step {self.fault_step}"
        if self.fault == "disk-full-checkpoint" or (self.tmpfs and not self.also_sigterm):
            fault = self.fault  # the volume fills when it fills
        if self.tmpfs:
            fault += f" ({self.tmpfs} volume{', then SIGTERM' if self.also_sigterm else ''})"
        again = f"; relaunch {self.relaunch.describe()}" if self.relaunch else ""
        return f"{self.kind}: {self.first.describe()}, {data}; {fault}{again}"


def draw_phase(rng, launcher, batch_choices, max_ranks=4, pods=None):
    batch = rng.choice(batch_choices)
    if launcher == "alone":
        return Phase("alone", 1, batch)
    if launcher == "mpirun":
        ranks = rng.randint(1, max_ranks)
        return Phase("mpirun", ranks, batch, mpmd=ranks > 1 and rng.random() < 0.4)
    pods = pods or rng.choice([1, 2])
    nproc = rng.choice([1, 1, 2]) if pods * 2 <= max_ranks else 1
    return Phase("torchrun", pods * nproc, batch, pods=pods, nproc=nproc, max_pods=pods)


def draw(seed):
    """The scenario of `seed`: a pure function of it."""
    rng = random.Random(seed)
    kinds = sorted(KINDS)
    launcher, fault = rng.choices(kinds, weights=[KINDS[k] for k in kinds])[0]
    tiny = rng.random() < 0.15  # batch_size 1, which needs 64 px
    image_size = 64 if tiny else 32
    batches = [1, 2] if tiny else [2, 3, 4]
    pods = {"pod-lost": 2, "pod-replaced": 2, "pod-added": 1}.get(fault)
    first = draw_phase(rng, launcher, batches, pods=pods,
                       max_ranks=2 if fault == "pod-added" else 4)
    if launcher == "torchrun" and fault in ("pod-lost", "pod-replaced", "pod-added"):
        first.nproc = rng.choice([1, 1, 2])
        first.ranks = first.pods * first.nproc
        first.max_pods = 2
    g = first.ranks * first.batch
    pod_fault = fault in ("pod-lost", "pod-replaced", "pod-added")
    # Pods come and go while the job runs: enough steps that it is still running when they do.
    steps = (rng.randint(6, 8) if fault == "pod-added" else rng.randint(4, 6) if pod_fault
             else rng.randint(2, 4))
    remainder = rng.choice(["0", "1", "b-1"] + ([] if pod_fault else ["one step of b+1"]))
    records = {"0": steps * g, "1": steps * g + 1, "b-1": steps * g + g - 1,
               "one step of b+1": g + 1}[remainder]
    if remainder == "b-1" and g == 1:
        records = steps * g  # b-1 = 0
    records = max(records, 2)
    divisors = [c for c in (5, 4, 3, 2) if records % c == 0]
    classes = divisors[0] if divisors else records
    source = "generated" if rng.random() < 0.25 else "tfrecord"
    relaunch = None
    if not pod_fault:
        if rng.random() < 0.5:
            relaunch = dataclasses.replace(first)  # the same job started again
        else:  # a resize by relaunch: another launcher, world size or batch size
            while True:  # as many images as one global batch at least (else exit 2, rightly)
                relaunch = draw_phase(rng, rng.choice(["alone", "mpirun", "torchrun"]), batches)
                if relaunch.ranks * relaunch.batch <= records:
                    break
    scenario = Scenario(
        seed=seed, launcher=launcher, fault=fault, first=first, relaunch=relaunch, fault_step=0,
        records=records, classes=classes, source=source,
        shards=rng.randint(1, min(4, records)), image_size=image_size,
        prefetch=rng.randint(1, 3), epochs=3 if pod_fault else rng.choice([2, 3]),
        log_every=rng.choice([1, 1, 2]), checkpoint_every=2, keep=rng.choice([2, 3]),
        timeout_s=rng.choice([20, 25, 30]))
    # Now and then the shipped intervals, drawn apart so that the draws above stay as they were.
    shipped = random.Random(seed * 7919 + 17)
    if shipped.random() < 0.3:
        scenario.log_every = shipped.choice(SHIPPED_LOG_EVERY)
    if shipped.random() < 0.3:
        scenario.checkpoint_every = shipped.choice(SHIPPED_CHECKPOINT_EVERY)
    total = scenario.epochs * scenario.steps_per_epoch(first)
    if fault == "pod-replaced":
        # Early enough that the survivor, alone at half the world, has steps left when the new pod
        # comes: the kill within the first third of the run.
        scenario.fault_step = rng.randint(1, max(1, total // 3))
    elif fault == "pod-added":
        scenario.fault_step = rng.randint(0, 2)  # the new pod takes seconds to start
    else:  # a step with one after it, so that the fault comes while the job still runs
        scenario.fault_step = rng.randint(min(1, total - 2), max(0, total - 2))
    if fault == "disk-full-checkpoint":
        # Nothing fits, or one checkpoint (ResNet-18 with momentum: 87 MB) but not a second.
        scenario.tmpfs = rng.choice(["1m", "130m"])
    elif fault == "disk-full-tensorboard":
        scenario.tmpfs = rng.choice(["16k", "48k"])
        scenario.also_sigterm = rng.random() < 0.5
        if not scenario.also_sigterm:
            scenario.relaunch = None
    return scenario


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


# The PyTorchJob, rendered once from k8s/pytorchjob as scripts/k8s-render.sh renders it (with
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


def worker_container(job):
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    return container


def operator_env(job, index, port, nproc, max_pods):
    """What the Training Operator v1.9 sets in worker `index` of an elastic PyTorchJob (its
    elastic and PET_* generators), with the worker-0 service's name as 127.0.0.1 and the job
    resized to `max_pods` pods of `nproc` ranks (scripts/k8s-render.sh --slots/--max-workers)."""
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

    def __init__(self, run, phase, name):
        self.run, self.phase, self.name = run, phase, name
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
        label = f"pod{index}" + ("-new" if any(l == f"pod{index}" for l, _, _ in self.procs)
                                 else "")
        proc = self._popen(label, argv, env)
        if index == 0:  # the first agent to listen hosts the store (worker 0's on a cluster)
            deadline = time.monotonic() + 60
            while True:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", self.port)) == 0:
                        break
                check(proc.poll() is None, f"pod 0 ended before it served the store "
                                           f"(status {proc.returncode})")
                check(time.monotonic() < deadline, "nothing listens on the rendezvous port "
                                                   "60 s after pod 0 started")
                time.sleep(0.1)
        return proc

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

class Run:
    def __init__(self, scenario, folder, bins, datasets):
        self.s, self.dir, self.bins = scenario, folder, bins
        self.out, self.trace = folder / "run", folder / "trace"
        self.log_files, self.notes, self.jobs = [], [], []
        self.data = datasets(scenario) if scenario.source == "tfrecord" else None

    def settings(self, phase):
        s = self.s
        settings = {
            "arch": "resnet18", "num_classes": s.classes, "device": "cpu",
            "image_size": s.image_size, "batch_size": phase.batch, "epochs": s.epochs,
            "warmup_epochs": 0, "log_every_steps": s.log_every,
            "checkpoint_every_steps": s.checkpoint_every,
            "keep_checkpoints": s.keep, "collective_timeout_s": s.timeout_s,
            "output_dir": str(self.out), "resume": "auto", "seed": s.seed % 1000,
        }
        if s.source == "tfrecord":
            settings.update(data_source="tfrecord", train_data=f"{self.data}/train-*",
                            val_data=f"{self.data}/validation-*", val_resize=s.image_size + 4,
                            decode_threads=1, reader_threads=1, prefetch_batches=s.prefetch,
                            shuffle_buffer=random.Random(s.seed).choice([4, 64, 1024]),
                            epoch_order=random.Random(s.seed + 1).choice(["global", "by_node"]))
        else:
            settings.update(data_source="generated", generated_classes=s.classes,
                            generated_train_images=s.records, generated_val_images=s.val_images)
        return settings

    def progress(self):
        return traced_step(self.trace)

    def wait_step(self, job, step, what, timeout=START_S, procs=None):
        """Waits until some rank has traced `step`; returns False if the job ended first
        (successfully), fails on a deadline or a failed end."""
        procs = procs or [p for _, p, _ in job.procs]
        deadline = time.monotonic() + timeout
        while self.progress() < step:
            ended = [p for p in procs if p.poll() is not None]
            if ended:
                if all(p.returncode == 0 for p in ended) and len(ended) == len(procs):
                    return False
                raise ScenarioFailed(f"{what}: the job ended (status "
                                     f"{[p.returncode for p in ended]}) before step {step}")
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"hang: {what}: no step {step} after {timeout} s "
                                     f"(traced up to {self.progress()})")
            time.sleep(0.1)
        return True

    def launch(self, phase, name, **kwargs):
        job = Job(self, phase, name)
        self.jobs.append(job)
        if phase.launcher == "torchrun":
            for i in range(phase.pods):
                job.start_pod(i)
        else:
            job.start(**kwargs)
        return job

    def finish(self, phase, name):
        """A launch that must finish: status 0 for every process."""
        job = self.launch(phase, name)
        bound = START_S + 30 * self.s.epochs + 4 * self.s.timeout_s
        rcs = job.wait_end(bound, f"{name} ({phase.describe()})")
        check(all(rc == 0 for rc in rcs), f"{name} ended with status {rcs}, expected 0")
        return job

    def stops_since(self, job, since):
        """Steps of the ranks' "signal 15 received: checkpointing at step S" lines logged at or
        after `since` (epoch seconds): an earlier stop may be torchrun's own, for a new pod."""
        found = []
        for line in job.log().splitlines():
            stop = re.search(r"signal 15 received: checkpointing at step (\d+)", line)
            if stop and LOG_TIME.match(line) and log_time(line) >= since - 0.01:
                found.append(stop[1])
        return found

    def stop_checkpoint(self, job, signalled, since):
        """The step of the stop's checkpoint the log announces; it must exist, and come within
        STOP_WITHIN_STEPS of the signal's step (`signalled`: the step index traced once the signal
        was sent at `since`, so the signal came during step signalled + 1 or before)."""
        found = self.stops_since(job, since)
        check(found, "no rank logged 'signal 15 received: checkpointing at step'")
        check(len(set(found)) == 1, f"ranks stopped at different steps: {found}")
        step = int(found[0])
        path = self.out / "checkpoints" / f"checkpoint-{step:09d}.pt"
        check(path.exists(), f"no checkpoint {path.name} after the SIGTERM stop")
        latest = signalled + 1 + STOP_WITHIN_STEPS
        check(step <= latest, f"the SIGTERM came by step {signalled + 1}, the stop at step "
                              f"{step}: more than {STOP_WITHIN_STEPS} steps later (log every "
                              f"{self.s.log_every})")
        return step

    def finished_after_signal(self, job, signalled, rcs):
        """A run that finished although SIGTERM came: only if it ended within the steps the
        ranks take to agree on a stop (docs/training.md)."""
        ended = [int(n) for n in re.findall(r"final: top-1 .* after (\d+) steps", job.log())]
        latest = signalled + 1 + STOP_WITHIN_STEPS
        check(ended and ended[-1] <= latest,
              f"SIGTERM came by step {signalled + 1} but the run went on to its end at step "
              f"{ended[-1] if ended else '?'} (status {rcs}), more than {STOP_WITHIN_STEPS} "
              f"steps later")
        self.notes.append(f"finished as the signal came (status {rcs})")

    def signal_ranks(self, job, sig):
        ranks = job.ranks()
        check(ranks, "no train process to signal")
        for pid in ranks:
            os.kill(pid, sig)
        return ranks

    # The scenarios.

    def play(self):
        s = self.s
        getattr(self, "fault_" + s.fault.replace("-", "_"))()
        self.check_all()

    def fault_sigterm(self):
        s = self.s
        job = self.launch(s.first, "first")
        if s.launcher == "torchrun":
            procs = job.live()
            if not self.wait_step(job, s.fault_step, "first launch"):
                self.notes.append("finished before the fault")
                return
            for proc in procs:  # the kubelet's SIGTERM to each pod's PID 1, the entrypoint
                proc.send_signal(signal.SIGTERM)
        else:
            if not self.wait_step(job, s.fault_step, "first launch"):
                self.notes.append("finished before the fault")
                return
            self.signal_ranks(job, signal.SIGTERM)
        since, signalled = time.time(), self.progress()
        rcs = job.wait_end(s.timeout_s + STOP_S, "the job after SIGTERM")
        log = job.log()
        if "final: top-1" in log:  # the run was over as the signal came
            check(s.launcher == "torchrun" or rcs[0] in (0, 143),
                  f"status {rcs} after the run finished and a SIGTERM came")
            self.finished_after_signal(job, signalled, rcs)
            return
        if s.launcher == "torchrun":
            # Each rank exits 143; the agent reports its workers' failure as its own. The round
            # may be smaller than the job (a pod that joined late had not joined yet).
            world = self.rounds()[-1][1]
            stopped = self.stops_since(job, since)
            check(len(stopped) == world, f"{len(stopped)} of the round's {world} ranks logged "
                                         f"the signal")
            check(all(rc != 0 for rc in rcs), f"a pod ended 0 after SIGTERM: {rcs}")
            self.notes.append(f"pods' status {rcs}")
        else:
            check(rcs == [143], f"exit status {rcs} after SIGTERM, expected 143")
        self.stop_checkpoint(job, signalled, since)
        self.finish(s.relaunch, "relaunch")

    def launch_to_fault(self):
        """The first launch, run to the fault's step; None (noted) when it finished before."""
        job = self.launch(self.s.first, "first")
        if not self.wait_step(job, self.s.fault_step, "first launch"):
            self.notes.append("finished before the fault")
            return None
        return job

    def fault_sigkill(self):
        s = self.s
        job = self.launch_to_fault()
        if not job:
            return
        self.signal_ranks(job, signal.SIGKILL)
        rcs = job.wait_end(30, "train after SIGKILL")
        check(rcs == [-signal.SIGKILL], f"status {rcs} after SIGKILL")
        self.finish(s.relaunch, "relaunch")

    def fault_sigkill_rank(self):
        s = self.s
        job = self.launch_to_fault()
        if not job:
            return
        ranks = job.ranks()
        victim = random.Random(s.seed + 1).choice(ranks)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        rcs = job.wait_end(s.timeout_s + STOP_S, "the job after one rank's SIGKILL")
        if rcs == [0] and "final: top-1" in job.log():
            self.notes.append("finished as the rank was killed")
        else:
            check(rcs != [0], "the job ended 0 with a rank killed")
        self.notes.append(f"ended {time.monotonic() - killed:.0f} s after the kill")
        self.finish(s.relaunch, "relaunch")

    def fault_sigterm_launcher(self):
        s = self.s
        job = self.launch_to_fault()
        if not job:
            return
        job.procs[0][1].send_signal(signal.SIGTERM)
        rcs = job.wait_end(s.timeout_s + STOP_S, "mpirun after SIGTERM")
        if rcs == [0]:
            check("final: top-1" in job.log(), "mpirun ended 0 after SIGTERM, the run unfinished")
            self.notes.append("finished as the signal came")
        self.notes.append(f"mpirun status {rcs[0]}")
        self.finish(s.relaunch, "relaunch")

    def fault_pod_lost(self):
        s = self.s
        job = self.launch(s.first, "pods")
        pod0, pod1 = job.procs[0][1], job.procs[1][1]
        if not self.wait_step(job, s.fault_step, "two pods"):
            self.notes.append("finished before the fault")
            return
        kill_tree(pod1)
        killed = time.time()
        bound = START_S + 30 * s.epochs + 4 * s.timeout_s
        (rc,) = job.wait_end(bound, "the surviving pod", procs=[pod0])
        check(rc == 0, f"the surviving pod ended with status {rc}, expected 0")
        worlds = [w for _, w in self.rounds()]
        n = s.first.nproc
        if worlds[-1] != n:
            check("final: top-1" in job.log() and len(worlds) == 1,
                  f"rounds' worlds {worlds}: the survivor did not go on at world {n}")
            self.notes.append("finished as the pod was killed")
        else:
            self.check_regroup(killed, n)

    def check_regroup(self, killed, n):
        """The survivors restart the group smaller within collective_timeout_s of the loss
        (docs/distributed.md's fault table), plus a margin for a busy machine's start-up."""
        for line in self.merged_log():
            world = re.search(r"world: (\d+) rank\(s\)", line)
            if RANK0.match(line) and world and int(world[1]) == n and log_time(line) > killed:
                seconds = log_time(line) - killed
                self.notes.append(f"smaller group {seconds:.0f} s after the loss")
                check(seconds <= self.s.timeout_s + REGROUP_MARGIN_S,
                      f"the survivors restarted at world {n} {seconds:.0f} s after the pod was "
                      f"lost, more than collective_timeout_s {self.s.timeout_s} + "
                      f"{REGROUP_MARGIN_S} s")
                return
        raise ScenarioFailed(f"no round of world {n} after the pod was lost")

    def fault_pod_replaced(self):
        s = self.s
        job = self.launch(s.first, "pods")
        pod0, pod1 = job.procs[0][1], job.procs[1][1]
        if not self.wait_step(job, s.fault_step, "two pods"):
            self.notes.append("finished before the fault")
            return
        kill_tree(pod1)
        killed, killed_at = time.time(), self.progress()
        # The survivor goes on alone: a round of world nproc that trains a step past the kill.
        n = s.first.nproc
        deadline = time.monotonic() + START_S + 2 * s.timeout_s
        while not (self.rounds() and self.rounds()[-1][1] == n and self.progress() > killed_at):
            check(pod0.poll() is None or pod0.returncode == 0,
                  f"the surviving pod ended with status {pod0.returncode}")
            if pod0.poll() is not None:
                break
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"hang: the survivor did not train alone within "
                                     f"{START_S + 2 * s.timeout_s} s; rounds {self.rounds()}")
            time.sleep(0.2)
        if pod0.poll() is not None or "final: top-1" in job.log():
            self.notes.append("finished before the replacement")
        else:
            self.check_regroup(killed, n)
            job.start_pod(1)
        bound = START_S + 30 * s.epochs + 6 * s.timeout_s
        procs = [pod0] + [p for label, p, _ in job.procs[2:]]
        rcs = job.wait_end(bound, "the survivor and the replacement", procs=procs)
        check(all(rc == 0 for rc in rcs), f"pods ended with status {rcs}, expected 0 (the "
                                          f"survivor, then the replacement)")
        worlds = [w for _, w in self.rounds()]
        if len(procs) == 2:
            check(worlds[-1] == 2 * n and n in worlds,
                  f"rounds' worlds {worlds}: expected {2 * n}, {n}, ..., {2 * n}")

    def fault_pod_added(self):
        s = self.s
        job = self.launch(s.first, "pods")
        if not self.wait_step(job, s.fault_step, "one pod"):
            self.notes.append("finished before the fault")
            return
        job.start_pod(1)
        bound = START_S + 30 * s.epochs + 6 * s.timeout_s
        rcs = job.wait_end(bound, "the two pods")
        worlds = [w for _, w in self.rounds()]
        n = s.first.nproc
        if worlds[-1] != 2 * n:
            check("final: top-1" in job.log(), f"rounds' worlds {worlds}: no round of "
                                               f"{2 * n} ranks and no end before the join")
            # The job was over before the new pod met it: the first pod ends 0, and the new one
            # may find no rendezvous store left to join (pod 0 served it), as a pod added to a
            # finished PyTorchJob would.
            check(rcs[0] == 0, f"the first pod ended with status {rcs[0]}, expected 0")
            self.notes.append(f"finished before the new pod joined (pods' status {rcs})")
            return
        check(all(rc == 0 for rc in rcs), f"pods ended with status {rcs}, expected 0")

    def fault_disk_full_checkpoint(self):
        s = self.s
        volume = self.out / "checkpoints"
        job = self.launch(s.first, "first", volume=volume, size=s.tmpfs)
        bound = START_S + 30 * s.epochs + 2 * s.timeout_s
        rcs = job.wait_end(bound, "the job with a full checkpoint volume")
        log = job.log()
        check(rcs == [2], f"status {rcs} with a full checkpoint volume, expected 2")
        check("free space on the output volume" in log,
              "no 'free space on the output volume' in the log")
        left = job.tmpfs_listing.read_text().split()
        partial = [n for n in left if n not in (".", "..") and
                   not re.fullmatch(r"checkpoint-\d{9}\.pt", n)]
        check(not partial, f"a partial checkpoint was left behind: {partial}")
        # Space freed: the checkpoints that fitted are back in place; the relaunch resumes.
        for kept in (self.dir / "first-volume-kept").glob("checkpoint-*.pt"):
            shutil.copy(kept, volume / kept.name)
        self.notes.append(f"{len(left) - 2} checkpoint(s) fitted")
        self.finish(s.relaunch, "relaunch")

    def fault_disk_full_tensorboard(self):
        s = self.s
        volume = self.out / "tensorboard"
        job = self.launch(s.first, "first", volume=volume, size=s.tmpfs)
        stopped = False
        if s.also_sigterm:
            if self.wait_step(job, s.fault_step, "first launch"):
                self.signal_ranks(job, signal.SIGTERM)
                stopped, since, signalled = True, time.time(), self.progress()
            else:
                self.notes.append("finished before the fault")
        bound = START_S + 30 * s.epochs + 2 * s.timeout_s
        rcs = job.wait_end(bound, "the job with a full TensorBoard volume")
        log = job.log()
        if stopped and not (rcs == [0] and "final: top-1" in log):
            check(rcs == [143], f"status {rcs} after SIGTERM, expected 143")
            self.stop_checkpoint(job, signalled, since)
        elif stopped:
            self.finished_after_signal(job, signalled, rcs)
        else:
            check(rcs == [0], f"status {rcs} with a full TensorBoard volume, expected 0")
        if s.tmpfs == "16k" and "final: top-1" in log:
            check("cannot write TensorBoard events" in log and "Training goes on" in log,
                  "no warning that TensorBoard events cannot be written")
        check(log.count("cannot write TensorBoard events") <= 3,
              "the full-volume warning repeats at every flush")
        for kept in (self.dir / "first-volume-kept").glob("events.out.tfevents.*"):
            shutil.copy(kept, volume / kept.name)
        self.tensorboard_full = True
        if stopped:
            self.finish(s.relaunch, "relaunch")

    # The checks every scenario ends with.

    def merged_log(self):
        lines = [line for path in self.log_files
                 for line in path.read_text(errors="replace").splitlines() if LOG_TIME.match(line)]
        return sorted(lines, key=lambda line: LOG_TIME.match(line)[0])

    def rounds(self):
        """[first step, world size] of each round, in order: a round starts with rank 0's
        "world:" line and, when it resumed, its "resumed from ... step S" line."""
        found = []
        for line in self.merged_log():
            if not RANK0.match(line):
                continue
            if world := re.search(r"world: (\d+) rank\(s\)", line):
                found.append([0, int(world[1])])
            elif resumed := re.search(r"resumed from \S+: epoch \d+, image \d+ of \d+, step (\d+)",
                                      line):
                if found:
                    found[-1][0] = int(resumed[1])
        return found

    def check_all(self):
        s = self.s
        log = "\n".join(self.merged_log())
        if "final: top-1" not in log:
            raise ScenarioFailed("no launch finished the run ('final: top-1' nowhere)")
        final_steps = int(re.findall(r"final: top-1 .* after (\d+) steps", log)[-1])
        # Every image trained exactly once per epoch, across all restarts.
        rounds = self.rounds()
        check(rounds, "no round logged its world")
        epochs = trained_per_epoch(
            {int(path.stem.split("-")[1]): path.read_text().splitlines()
             for path in self.trace.glob("rank-*.txt")}, rounds)
        check(sorted(epochs) == list(range(s.epochs)),
              f"epochs traced: {sorted(epochs)}, expected 0..{s.epochs - 1}")
        for epoch, counts in sorted(epochs.items()):
            missing = sorted(set(range(s.records)) - set(counts))
            extra = sorted(set(counts) - set(range(s.records)))
            twice = sorted(i for i, n in counts.items() if n > 1)
            check(not (missing or extra or twice),
                  f"epoch {epoch}: images missing {missing}, unknown {extra}, trained more than "
                  f"once {twice} (rounds [first step, world]: {rounds})")
        # Every epoch evaluated (a stop at an epoch's last step leaves its evaluation to the
        # resumed run), each held-out image counted once.
        events, torn = [], 0
        for line in (self.out / "metrics.jsonl").read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                torn += 1  # a line cut short by a SIGKILL: noted, not promised otherwise
        if torn:
            self.notes.append(f"{torn} torn line(s) in metrics.jsonl")
        evals = [e for e in events if e.get("event") == "eval"]
        evaluated = sorted({e["epoch"] for e in evals})
        check(evaluated == list(range(1, s.epochs + 1)),
              f"epochs evaluated: {evaluated}, expected 1..{s.epochs}")
        counted = sorted({e["images"] for e in evals})
        check(counted == [s.val_images], f"evaluations counted {counted} held-out images, "
                                         f"not {s.val_images}")
        # The newest checkpoint loads with PyTorch's safe defaults and has the documented keys.
        torch = pytest.importorskip("torch")
        newest = max((self.out / "checkpoints").glob("checkpoint-*.pt"))
        ckpt = torch.load(newest)
        check(SAVED_KEYS <= set(ckpt), f"{newest.name} lacks {sorted(SAVED_KEYS - set(ckpt))}")
        check(int(ckpt["step"]) == final_steps,
              f"{newest.name}: step {ckpt['step']}, the run ended after {final_steps}")
        check(int(ckpt["samples_per_epoch"]) == s.records,
              f"{newest.name}: samples_per_epoch {ckpt['samples_per_epoch']}, not {s.records}")
        # TensorBoard reads the events; train/loss has each step once.
        accumulator = pytest.importorskip(
            "tensorboard.backend.event_processing.event_accumulator",
            reason="the tensorboard package is missing: run scripts/setup.sh")
        runs = accumulator.EventAccumulator(str(self.out / "tensorboard"),
                                            size_guidance={accumulator.SCALARS: 0}).Reload()
        tags = runs.Tags()["scalars"]
        steps = [e.step for e in runs.Scalars("train/loss")] if "train/loss" in tags else []
        twice = sorted(k for k, n in Counter(steps).items() if n > 1)
        check(not twice, f"TensorBoard shows train/loss at steps {twice} more than once")
        check(steps == sorted(steps), f"train/loss steps out of order: {steps}")
        if not getattr(self, "tensorboard_full", False) and s.log_every == 1:
            check(steps == list(range(1, final_steps + 1)),
                  f"train/loss at steps {steps}, expected 1..{final_steps}")


# Datasets, binaries, the loop.

@pytest.fixture(scope="module")
def bins(tmp_path_factory):
    """`train`, `generate-dataset` and the image's entrypoint, copied once: the build may be
    relinked while the scenarios run, and a launch must not find half a binary."""
    folder = tmp_path_factory.mktemp("bin")
    found = {}
    for name in ("train", "generate-dataset"):
        source = binary(name)
        for _ in range(60):  # a file the linker is still writing changes size or time
            before = source.stat()
            time.sleep(0.5)
            after = source.stat()
            if (before.st_size, before.st_mtime) == (after.st_size, after.st_mtime) and \
                    time.time() - after.st_mtime > 2:
                break
        shutil.copy2(source, folder / name)
        found[name] = folder / name
    probe = subprocess.run([str(found["train"]), "--help"], capture_output=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    found["entrypoint"] = folder / "entrypoint"  # alone in its folder: `torchrun` is the venv's
    shutil.copy(ROOT / "docker" / "entrypoint.sh", found["entrypoint"])
    return found


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, bins):
    """datasets(scenario) -> a TFRecord folder for its records, classes and shards (cached)."""
    cache = {}

    def get(s):
        key = (s.classes, s.records // s.classes, s.shards)
        if key not in cache:
            folder = tmp_path_factory.mktemp("data")
            argv = [bins["generate-dataset"], "--tfrecords", folder, "--classes", s.classes,
                    "--images-per-class", s.records // s.classes,
                    "--val-per-class", s.val_images // s.classes,
                    "--train-shards", s.shards, "--val-shards", 1, "--width", 40, "--height", 40]
            result = subprocess.run(list(map(str, argv)), capture_output=True, text=True,
                                    timeout=120)
            assert result.returncode == 0, result.stdout + result.stderr
            cache[key] = folder
        return cache[key]
    return get


@functools.lru_cache(maxsize=None)
def available(kind):
    launcher, fault = kind
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        return False
    if launcher == "torchrun" and not (TORCHRUN.exists() and KUBECTL):
        return False
    if fault.startswith("disk-full") and subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode != 0:
        return False
    return True


def usable(scenario, wanted):
    phases = [scenario.first] + ([scenario.relaunch] if scenario.relaunch else [])
    return (available((scenario.launcher, scenario.fault)) and
            all(available((p.launcher, "")) for p in phases) and
            (not wanted or scenario.kind in wanted))


def seeds(base, wanted):
    """Seeds to play, in order: a torchrun pod-replaced scenario and an mpirun one first, then
    the kinds in turn (in an order drawn from `base`), each time the next seed from `base` on that
    draws the kind. Every seed plays the scenario draw(seed), whatever came before it."""
    kinds = sorted(KINDS)
    random.Random(base).shuffle(kinds)
    kinds.remove(("torchrun", "pod-replaced"))
    kinds.insert(0, ("torchrun", "pod-replaced"))
    mpi = next(k for k in kinds if k[0] == "mpirun")
    kinds.remove(mpi)
    kinds.insert(1, mpi)
    kinds = [k for k in kinds if not wanted or f"{k[0]}/{k[1]}" in wanted]
    used, cursor = set(), {}
    while kinds:
        for kind in list(kinds):
            seed = cursor.get(kind, base)
            while seed < cursor.get(kind, base) + 10_000:
                scenario = draw(seed)
                if (scenario.launcher, scenario.fault) == kind and seed not in used:
                    break
                seed += 1
            cursor[kind] = seed + 1
            if seed in used or (scenario.launcher, scenario.fault) != kind:
                kinds.remove(kind)  # not drawn in 10,000 seeds
            elif usable(scenario, wanted):
                used.add(seed)
                yield seed


# Rough seconds a scenario takes on a busy 2-core machine, to stop before the budget runs out.
COST_S = {"alone": 15, "mpirun": 25, "torchrun": 45}


def replay_command(seed):
    return f"CHAOS_SEED={seed} {PYTHON} -m pytest -q -rA tests/test_chaos.py::test_chaos"


def play(scenario, folder, bins, datasets):
    """Plays one scenario; returns (outcome, notes, seconds, failure message or None)."""
    run = Run(scenario, folder, bins, datasets)
    started = time.monotonic()
    failure = None
    try:
        run.play()
    except Exception as error:  # noqa: BLE001 - every error is this scenario's failure
        failure = f"{type(error).__name__}: {error}" if not isinstance(
            error, ScenarioFailed) else str(error)
    if failure is None:
        # Every launch has ended: nothing of this scenario may outlive it (an orphaned rank
        # holds the scenario's folder in its command line).
        deadline = time.monotonic() + 10
        while (left := processes_holding(folder)) and time.monotonic() < deadline:
            time.sleep(0.5)
        if left:
            failure = "processes left behind after the job ended: " + "; ".join(
                f"{pid} {comm(pid)}" for pid in left)
    for job in run.jobs:
        job.kill()
    for pid in processes_holding(folder):  # started by this scenario, escaped its jobs
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    seconds = time.monotonic() - started
    if failure is None:
        # Passed: its checkpoints (87 MB each) go; the logs, trace and events stay.
        for folder_ in [run.out / "checkpoints", folder / "first-volume-kept"]:
            shutil.rmtree(folder_, ignore_errors=True)
        late = any(note.startswith("finished") for note in run.notes)
        return "late" if late else "ok", run.notes, seconds, None
    tail = "\n".join(run.merged_log()[-25:])
    others = [line for path in run.log_files for line in
              path.read_text(errors="replace").splitlines()[-15:] if not LOG_TIME.match(line)]
    message = (f"seed {scenario.seed}: {scenario.describe()}\n"
               f"  FAILED: {failure}\n"
               f"  replay: {replay_command(scenario.seed)}\n"
               f"  logs: {folder}\n"
               f"  merged log tail:\n    " + "\n    ".join(tail.splitlines()) +
               ("\n  launcher output tail:\n    " + "\n    ".join(others[-15:]) if others else ""))
    return "FAIL", run.notes, seconds, message


def test_chaos(tmp_path, bins, datasets, record_property, capsys):
    replay = os.environ.get("CHAOS_SEED")
    budget = float(os.environ.get("CHAOS_BUDGET_S", DEFAULT_BUDGET_S))
    wanted = {k.strip() for k in os.environ.get("CHAOS_KINDS", "").split(",") if k.strip()}
    if replay:
        order, base = iter([int(replay)]), int(replay)
        if not usable(draw(base), set()):
            pytest.skip(f"seed {base} ({draw(base).kind}) needs a launcher or mounts not here")
    else:
        if "CHAOS_BASE_SEED" in os.environ:
            base = int(os.environ["CHAOS_BASE_SEED"])
        elif "CHAOS_BUDGET_S" in os.environ and budget != DEFAULT_BUDGET_S:
            base = random.SystemRandom().randrange(10_000, 10_000_000)  # new seeds
        else:
            base = BASE_SEED
        order = seeds(base, wanted)
    print(f"chaos: base seed {base}, budget {budget:.0f} s")
    started = time.monotonic()
    results, failures = [], []
    for seed in order:
        elapsed = time.monotonic() - started
        scenario = draw(seed)
        if not replay and len(results) >= MIN_SCENARIOS and \
                elapsed + COST_S[scenario.launcher] > budget:
            break
        folder = tmp_path / f"seed-{seed}"
        folder.mkdir()
        outcome, notes, seconds, message = play(scenario, folder, bins, datasets)
        line = (f"[{elapsed:5.0f} s] seed {seed} {outcome} in {seconds:.0f} s: "
                f"{scenario.describe()}" + (f" [{'; '.join(notes)}]" if notes else ""))
        print(line)
        with capsys.disabled():
            sys.stdout.write("\n" + line)
            sys.stdout.flush()
        results.append((scenario, outcome))  # late: passed, but the run ended before the fault
        if message:
            failures.append(message)
            print(message)
        if replay:
            break
    by_kind = defaultdict(Counter)
    for scenario, outcome in results:
        by_kind[scenario.kind][outcome] += 1
    summary = (f"chaos summary: {len(results)} scenario(s) in {time.monotonic() - started:.0f} s "
               f"(base seed {base}), {sum(o == 'ok' for _, o in results)} ok, "
               f"{sum(o == 'late' for _, o in results)} late (passed; the fault came after the "
               f"run's end), {len(failures)} failed; by kind: " + ", ".join(
                   f"{kind} " + "/".join(f"{n} {o}" for o, n in sorted(c.items()))
                   for kind, c in sorted(by_kind.items())) +
               ("; failed seeds: " + " ".join(str(s.seed) for s, o in results if o == "FAIL")
                if failures else ""))
    print(summary)
    (tmp_path / "chaos-summary.txt").write_text(summary + "\n" + "\n\n".join(failures))
    record_property("chaos_summary", summary)
    with capsys.disabled():
        sys.stdout.write("\n" + summary + f" ({tmp_path / 'chaos-summary.txt'})\n")
        sys.stdout.flush()
    assert not failures, "\n\n".join(failures)


def test_batch_size_one_needs_64_pixels(tmp_path, bins):
    # Batch norm needs more than one value per channel, and ResNet's last feature map is 1x1
    # below 64 px: batch_size 1 is refused there (the chaos draws batch 1 only at 64 px).
    args = ["--arch", "resnet18", "--num_classes", "4", "--data_source", "generated",
            "--image_size", "32", "--batch_size", "1", "--device", "cpu",
            "--output_dir", tmp_path / "run"]
    result = subprocess.run([str(bins["train"]), *map(str, args)], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "'batch_size' = 1 is invalid" in out and "64" in out, out
    assert not (tmp_path / "run").exists()
