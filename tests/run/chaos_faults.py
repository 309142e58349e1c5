"""The chaos test's faults (tests/run/test_chaos.py), each a function of the run (chaos_run.Run): it
launches the scenario's first job, makes its fault at the drawn step, checks what the docs
promise of the job's end, and relaunches where the run must finish.
"""
import os
import random
import re
import shutil
import signal
import time

from chaos_jobs import (RANK0, REGROUP_MARGIN_S, START_S, STOP_S, ScenarioFailed, check,
                        log_time)
from conftest import kill_tree


def fault_sigterm(run):
    s = run.s
    job = run.launch(s.first, "first")
    if s.launcher == "torchrun":
        procs = job.live()
        if not run.wait_step(job, s.fault_step, "first launch"):
            run.notes.append("finished before the fault")
            return
        for proc in procs:  # the kubelet's SIGTERM to each pod's PID 1, the entrypoint
            proc.send_signal(signal.SIGTERM)
    else:
        if not run.wait_step(job, s.fault_step, "first launch"):
            run.notes.append("finished before the fault")
            return
        run.signal_ranks(job, signal.SIGTERM)
    since, signalled = time.time(), run.progress()
    rcs = job.wait_end(s.timeout_s + STOP_S, "the job after SIGTERM")
    log = job.log()
    if "final: top-1" in log:  # the run was over as the signal came
        check(s.launcher == "torchrun" or rcs[0] in (0, 143),
              f"status {rcs} after the run finished and a SIGTERM came")
        run.finished_after_signal(job, signalled, rcs)
        return
    if s.launcher == "torchrun":
        # Each rank exits 143; the agent reports its workers' failure as its own. The round
        # may be smaller than the job (a pod that joined late had not joined yet).
        world = run.rounds()[-1][1]
        stopped = run.stops_since(job, since)
        check(len(stopped) == world, f"{len(stopped)} of the round's {world} ranks logged "
                                     f"the signal")
        check(all(rc != 0 for rc in rcs), f"a pod ended 0 after SIGTERM: {rcs}")
        run.notes.append(f"pods' status {rcs}")
    else:
        check(rcs == [143], f"exit status {rcs} after SIGTERM, expected 143")
    run.stop_checkpoint(job, signalled, since)
    run.finish(s.relaunch, "relaunch")


def launch_to_fault(run):
    """The first launch, run to the fault's step; None (noted) when it finished before."""
    job = run.launch(run.s.first, "first")
    if not run.wait_step(job, run.s.fault_step, "first launch"):
        run.notes.append("finished before the fault")
        return None
    return job


def fault_sigkill(run):
    s = run.s
    job = launch_to_fault(run)
    if not job:
        return
    run.signal_ranks(job, signal.SIGKILL)
    rcs = job.wait_end(30, "train after SIGKILL")
    check(rcs == [-signal.SIGKILL], f"status {rcs} after SIGKILL")
    run.finish(s.relaunch, "relaunch")


def fault_sigkill_rank(run):
    s = run.s
    job = launch_to_fault(run)
    if not job:
        return
    ranks = job.ranks()
    victim = random.Random(s.seed + 1).choice(ranks)
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    rcs = job.wait_end(s.timeout_s + STOP_S, "the job after one rank's SIGKILL")
    if rcs == [0] and "final: top-1" in job.log():
        run.notes.append("finished as the rank was killed")
    else:
        check(rcs != [0], "the job ended 0 with a rank killed")
    run.notes.append(f"ended {time.monotonic() - killed:.0f} s after the kill")
    run.finish(s.relaunch, "relaunch")


def fault_sigterm_launcher(run):
    s = run.s
    job = launch_to_fault(run)
    if not job:
        return
    job.procs[0][1].send_signal(signal.SIGTERM)
    rcs = job.wait_end(s.timeout_s + STOP_S, "mpirun after SIGTERM")
    if rcs == [0]:
        check("final: top-1" in job.log(), "mpirun ended 0 after SIGTERM, the run unfinished")
        run.notes.append("finished as the signal came")
    run.notes.append(f"mpirun status {rcs[0]}")
    run.finish(s.relaunch, "relaunch")


def pods_to_fault(run):
    """The first launch's two pods, run to the fault's step: the job and its pods; None (noted)
    when it finished before."""
    job = run.launch(run.s.first, "pods")
    if not run.wait_step(job, run.s.fault_step, "two pods"):
        run.notes.append("finished before the fault")
        return None
    return job, job.procs[0][1], job.procs[1][1]


def fault_pod_lost(run):
    s = run.s
    if not (launched := pods_to_fault(run)):
        return
    job, pod0, pod1 = launched
    kill_tree(pod1)
    killed = time.time()
    bound = START_S + 30 * s.epochs + 4 * s.timeout_s
    (rc,) = job.wait_end(bound, "the surviving pod", procs=[pod0])
    check(rc == 0, f"the surviving pod ended with status {rc}, expected 0")
    worlds = [w for _, w in run.rounds()]
    n = s.first.nproc
    if worlds[-1] != n:
        check("final: top-1" in job.log() and len(worlds) == 1,
              f"rounds' worlds {worlds}: the survivor did not go on at world {n}")
        run.notes.append("finished as the pod was killed")
    else:
        check_regroup(run, killed, n)


def check_regroup(run, killed, n, within=None):
    """The survivors restart the group smaller within `within` (s, with what it is) of the
    loss, by default collective_timeout_s (docs/distributed.md's fault table), plus a margin for
    a busy machine's start-up."""
    seconds_allowed, what = within or (run.s.timeout_s, "collective_timeout_s")
    for line in run.merged_log():
        world = re.search(r"world: (\d+) rank\(s\)", line)
        if RANK0.match(line) and world and int(world[1]) == n and log_time(line) > killed:
            seconds = log_time(line) - killed
            run.notes.append(f"smaller group {seconds:.0f} s after the loss")
            check(seconds <= seconds_allowed + REGROUP_MARGIN_S,
                  f"the survivors restarted at world {n} {seconds:.0f} s after the pod was "
                  f"lost, more than {what} {seconds_allowed} + {REGROUP_MARGIN_S} s")
            return
    raise ScenarioFailed(f"no round of world {n} after the pod was lost")


def fault_pod_replaced(run):
    s = run.s
    if not (launched := pods_to_fault(run)):
        return
    job, pod0, pod1 = launched
    kill_tree(pod1)
    killed, killed_at = time.time(), run.progress()
    # The survivor goes on alone: a round of world nproc that trains a step past the kill.
    n = s.first.nproc
    deadline = time.monotonic() + START_S + 2 * s.timeout_s
    while not (run.rounds() and run.rounds()[-1][1] == n and run.progress() > killed_at):
        check(pod0.poll() is None or pod0.returncode == 0,
              f"the surviving pod ended with status {pod0.returncode}")
        if pod0.poll() is not None:
            break
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"hang: the survivor did not train alone within "
                                 f"{START_S + 2 * s.timeout_s} s; rounds {run.rounds()}")
        time.sleep(0.2)
    if pod0.poll() is not None or "final: top-1" in job.log():
        run.notes.append("finished before the replacement")
    else:
        check_regroup(run, killed, n)
        job.start_pod(1)
    bound = START_S + 30 * s.epochs + 6 * s.timeout_s
    procs = [pod0] + [p for label, p, _ in job.procs[2:]]
    rcs = job.wait_end(bound, "the survivor and the replacement", procs=procs)
    check(all(rc == 0 for rc in rcs), f"pods ended with status {rcs}, expected 0 (the "
                                      f"survivor, then the replacement)")
    worlds = [w for _, w in run.rounds()]
    if len(procs) == 2:
        check(worlds[-1] == 2 * n and n in worlds,
              f"rounds' worlds {worlds}: expected {2 * n}, {n}, ..., {2 * n}")


def fault_pod_added(run):
    s = run.s
    job = run.launch(s.first, "pods")
    if not run.wait_step(job, s.fault_step, "one pod"):
        run.notes.append("finished before the fault")
        return
    job.start_pod(1)
    bound = START_S + 30 * s.epochs + 6 * s.timeout_s
    rcs = job.wait_end(bound, "the two pods")
    worlds = [w for _, w in run.rounds()]
    n = s.first.nproc
    if worlds[-1] != 2 * n:
        check("final: top-1" in job.log(), f"rounds' worlds {worlds}: no round of "
                                           f"{2 * n} ranks and no end before the join")
        # The job was over before the new pod met it: the first pod ends 0, and the new one
        # may find no rendezvous store left to join (pod 0 served it), as a pod added to a
        # finished PyTorchJob would.
        check(rcs[0] == 0, f"the first pod ended with status {rcs[0]}, expected 0")
        run.notes.append(f"finished before the new pod joined (pods' status {rcs})")
        return
    check(all(rc == 0 for rc in rcs), f"pods ended with status {rcs}, expected 0")


def fault_disk_full_checkpoint(run):
    s = run.s
    volume = run.out / "checkpoints"
    job = run.launch(s.first, "first", volume=volume, size=s.tmpfs)
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
    for kept in (run.dir / "first-volume-kept").glob("checkpoint-*.pt"):
        shutil.copy(kept, volume / kept.name)
    run.notes.append(f"{len(left) - 2} checkpoint(s) fitted")
    run.finish(s.relaunch, "relaunch")


def fault_disk_full_tensorboard(run):
    s = run.s
    volume = run.out / "tensorboard"
    job = run.launch(s.first, "first", volume=volume, size=s.tmpfs)
    stopped = False
    if s.also_sigterm:
        if run.wait_step(job, s.fault_step, "first launch"):
            run.signal_ranks(job, signal.SIGTERM)
            stopped, since, signalled = True, time.time(), run.progress()
        else:
            run.notes.append("finished before the fault")
    bound = START_S + 30 * s.epochs + 2 * s.timeout_s
    rcs = job.wait_end(bound, "the job with a full TensorBoard volume")
    log = job.log()
    if stopped and not (rcs == [0] and "final: top-1" in log):
        check(rcs == [143], f"status {rcs} after SIGTERM, expected 143")
        run.stop_checkpoint(job, signalled, since)
    elif stopped:
        run.finished_after_signal(job, signalled, rcs)
    else:
        check(rcs == [0], f"status {rcs} with a full TensorBoard volume, expected 0")
    if s.tmpfs == "16k" and "final: top-1" in log:
        check("cannot write TensorBoard events" in log and "Training goes on" in log,
              "no warning that TensorBoard events cannot be written")
    check(log.count("cannot write TensorBoard events") <= 3,
          "the full-volume warning repeats at every flush")
    for kept in (run.dir / "first-volume-kept").glob("events.out.tfevents.*"):
        shutil.copy(kept, volume / kept.name)
    run.tensorboard_full = True
    if stopped:
        run.finish(s.relaunch, "relaunch")


# Each fault kind's function, by the name the draw gives it (chaos_scenarios.KINDS).
FAULTS = {
    "sigterm": fault_sigterm,
    "sigkill": fault_sigkill,
    "sigkill-rank": fault_sigkill_rank,
    "sigterm-launcher": fault_sigterm_launcher,
    "pod-lost": fault_pod_lost,
    "pod-replaced": fault_pod_replaced,
    "pod-added": fault_pod_added,
    "disk-full-checkpoint": fault_disk_full_checkpoint,
    "disk-full-tensorboard": fault_disk_full_tensorboard,
}
