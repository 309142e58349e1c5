"""The chaos test's run of one scenario (tests/run/test_chaos.py): its jobs' settings and launches,
the waits for their steps, and the checks every scenario ends with (each image trained once per
epoch across restarts, every epoch evaluated, the checkpoint and the TensorBoard events).
"""
import json
import os
import random
import re
import time
from collections import Counter

import pytest

from chaos_faults import FAULTS
from chaos_network import FAULTS_ON_HOSTS, LOST_WITHIN_S, hosts_for
from chaos_history import rounds_of, trained_per_epoch
from chaos_jobs import (LOG_TIME, START_S, STOP_WITHIN_STEPS, Job, ScenarioFailed, check,
                        log_time, traced_step)

# What a checkpoint holds (docs/training.md), read back with a plain torch.load.
SAVED_KEYS = {"model", "optimizer", "loss_scale", "loss_scale_growth_tracker", "step", "epoch",
               "samples_in_epoch", "eval_pending", "target_reached", "world_size", "global_batch",
               "samples_per_epoch", "config"}


class Run:
    """One scenario played in `folder`: its launches share the output folder and the sample
    trace, as a job's relaunches share the file system."""

    def __init__(self, scenario, folder, bins, datasets):
        self.s, self.dir, self.bins = scenario, folder, bins
        self.out, self.trace = folder / "run", folder / "trace"
        self.log_files, self.notes, self.jobs = [], [], []
        self.data = datasets(scenario) if scenario.source == "tfrecord" else None
        self.hosts = None  # the first launch's, for a network fault (chaos_network.py)

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
        job = Job(self, phase, name, hosts=self.hosts if phase is self.s.first else None)
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
        rcs = job.wait_end(self.bound(), f"{name} ({phase.describe()})")
        check(all(rc == 0 for rc in rcs), f"{name} ended with status {rcs}, expected 0")
        return job

    def bound(self):
        """The longest a launch that must finish may take."""
        faults = 2 * LOST_WITHIN_S if self.s.on_hosts else 4 * self.s.timeout_s
        return START_S + 30 * self.s.epochs + faults

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

    # The scenario: its fault (chaos_faults.py), then the checks.

    def play(self):
        if self.s.on_hosts:
            with hosts_for(self.s) as self.hosts:
                FAULTS_ON_HOSTS[self.s.fault](self)
        else:
            FAULTS[self.s.fault](self)
        self.check_all()

    # The checks every scenario ends with.

    def merged_log(self):
        lines = [line for path in self.log_files
                 for line in path.read_text(errors="replace").splitlines() if LOG_TIME.match(line)]
        return sorted(lines, key=lambda line: LOG_TIME.match(line)[0])

    def rounds(self):
        return rounds_of(self.merged_log())

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


