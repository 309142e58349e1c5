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
  host-lost             on hosts made of network namespaces, one rank each: a host blackholed or
                        its link cut; every process ends within two minutes naming it and the
                        relaunch resumes, or (a torchrun worker's) the survivors re-form and
                        finish (tests/run/chaos_network.py)
  outage                the same hosts, one blackholed for 5-25 s and healed: nothing ends
  slow-link             the same hosts, one's link slow (5 ms each way, 0.2% lost) for 5-25 s
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
import functools
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict

import pytest

from chaos_jobs import (KUBECTL, LOG_TIME, PYTHON, TORCHRUN, ScenarioFailed, comm,
                        processes_holding)
from chaos_network import network_unavailable
from chaos_run import Run
from chaos_scenarios import KINDS, NETWORK_FAULTS, draw
from conftest import ROOT, binary

BASE_SEED = 1000
DEFAULT_BUDGET_S = 240.0
MIN_SCENARIOS = 5


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
    if fault in NETWORK_FAULTS and network_unavailable(fault):
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


# Rough seconds a scenario takes on a busy 2-core machine, to stop before the budget runs out:
# by launcher, and for a network fault (a host lost is found after liveness_timeout_s; rank 0's
# host lost under mpirun took 100 s with its relaunch, 2026-12-03).
COST_S = {"alone": 15, "mpirun": 25, "torchrun": 45, "network": 100}


def replay_command(seed):
    return f"CHAOS_SEED={seed} {PYTHON} -m pytest -q -rA tests/run/test_chaos.py::test_chaos"


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
                elapsed + COST_S["network" if scenario.on_hosts else scenario.launcher] > budget:
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
