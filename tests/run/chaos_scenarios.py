"""The chaos test's scenarios (tests/run/test_chaos.py): what a seed draws, a pure function of it, and
the values the shipped configs give the intervals it draws among.
"""
import dataclasses
import random
import re

from conftest import ROOT


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

# (launcher, fault): relative weight of the draw.
KINDS = {
    ("alone", "sigterm"): 2, ("alone", "sigkill"): 2, ("alone", "disk-full-checkpoint"): 1,
    ("alone", "disk-full-tensorboard"): 1,
    ("mpirun", "sigterm"): 2, ("mpirun", "sigkill-rank"): 2, ("mpirun", "sigterm-launcher"): 1,
    ("mpirun", "disk-full-checkpoint"): 1, ("mpirun", "disk-full-tensorboard"): 1,
    ("torchrun", "pod-lost"): 2, ("torchrun", "pod-replaced"): 2, ("torchrun", "pod-added"): 2,
    ("torchrun", "sigterm"): 1,
    ("mpirun", "host-lost"): 1, ("torchrun", "host-lost"): 1, ("mpirun", "outage"): 1,
    ("torchrun", "outage"): 1, ("mpirun", "slow-link"): 1, ("torchrun", "slow-link"): 1,
}
# Faults of the network, played on hosts made of network namespaces, one rank a host.
NETWORK_FAULTS = {"host-lost", "outage", "slow-link"}
# What ends a job that loses a host is the liveness signal (liveness_timeout_s, 45 s), not the
# collective's deadline: theirs is the default, which no shipped config changes.
DEFAULT_COLLECTIVE_TIMEOUT_S = 300



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
    lost: int = 0  # network faults: the rank (mpirun) or pod (torchrun) whose host it strikes
    how: str = ""  # host-lost: "blackhole" (its frames dropped) or "link_down"
    lasts_s: int = 0  # outage, slow-link: how long the fault lasts before it heals

    @property
    def on_hosts(self):
        return self.fault in NETWORK_FAULTS

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

    @property
    def lost_name(self):
        return f"{'pod' if self.launcher == 'torchrun' else 'rank'} {self.lost}"

    def describe(self):
        g = self.first.ranks * self.first.batch
        data = (f"{self.records} {self.source} records" +
                (f" in {self.shards} shards" if self.source == "tfrecord" else "") +
                f" ({self.records % g} mod global batch {g}), {self.image_size} px, "
                f"prefetch {self.prefetch}, {self.epochs} epochs, log every {self.log_every}, "
                f"checkpoint every {self.checkpoint_every}")
        fault = f"{self.fault} at step {self.fault_step}"
        if self.fault == "host-lost":
            fault = f"{self.how} of {self.lost_name}'s host at step {self.fault_step}"
        elif self.fault == "outage":
            fault = f"{self.lasts_s} s outage of {self.lost_name}'s host at step {self.fault_step}"
        elif self.fault == "slow-link":
            fault = (f"{self.lasts_s} s of a slow link at {self.lost_name}'s host at step "
                     f"{self.fault_step}")
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
    network = fault in NETWORK_FAULTS
    pods = {"pod-lost": 2, "pod-replaced": 2, "pod-added": 1}.get(fault)
    first = draw_phase(rng, launcher, batches, pods=pods,
                       max_ranks=2 if fault == "pod-added" else 4)
    if network:  # two or three hosts, one rank each: a host lost is a rank lost
        first.ranks, first.mpmd = rng.randint(2, 3), False
        if launcher == "torchrun":
            first.pods = first.max_pods = first.ranks
            first.nproc = 1
    if launcher == "torchrun" and fault in ("pod-lost", "pod-replaced", "pod-added"):
        first.nproc = rng.choice([1, 1, 2])
        first.ranks = first.pods * first.nproc
        first.max_pods = 2
    g = first.ranks * first.batch
    pod_fault = fault in ("pod-lost", "pod-replaced", "pod-added") or network
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
    # The network fault's draws, apart, so that the draws below stay as they were.
    net = random.Random(seed * 7841 + 3)
    lost, how, lasts_s = net.randrange(first.ranks), net.choice(["blackhole", "link_down"]), \
        net.randint(5, 25)
    # A job that must restart: a host lost under mpirun, or torchrun's rendezvous host.
    restarts = fault == "host-lost" and (launcher == "mpirun" or lost == 0)
    relaunch = None
    if not pod_fault or restarts:
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
    if network:
        scenario.timeout_s = DEFAULT_COLLECTIVE_TIMEOUT_S
        scenario.lost, scenario.how, scenario.lasts_s = lost, how, lasts_s
        scenario.epochs = 2
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


