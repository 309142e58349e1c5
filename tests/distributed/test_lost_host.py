"""A job across hosts that loses one, on hosts made of network namespaces (netns_jobs.py), at the
trainer's shipped timeouts, on the CPU: under mpirun, three worker hosts and the launcher's;
under torchrun, three pods' hosts. A host blackholed or its link cut once checkpoint 10 exists:
every process of the job that can end does so within two minutes, a surviving rank's error names
the lost rank and host, and the newest checkpoint loads; under torchrun the survivors of a lost
worker train every image once per epoch. An outage shorter than liveness_timeout_s ends
nothing, under either launcher.
"""
import re
import time

import pytest

from netns_jobs import START_S, hosts_maker, job_on, torchrun_on  # noqa: F401 (fixtures)

LOST_WITHIN_S = 120  # the bound docs/distributed.md states for every process of the job


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


def test_torchrun_an_outage_shorter_than_the_liveness_timeout_ends_nothing(torchrun_on):
    job = torchrun_on(images=720)  # 20 steps
    job.wait_checkpoint(10)
    # The groups formed so far: on a busy machine pod 0's agent may start alone and re-form when
    # the others arrive (min 1 node, as the PyTorchJob allows), before the fault.
    formed = job.logs[0].read_text(errors="replace").count("world: ")
    job.hosts.blackhole(job.hosts.names[2])
    time.sleep(25)
    job.hosts.heal()
    job.wait_pods([0, 1, 2], within=START_S)
    text = job.text()
    assert [p.returncode for p in job.procs] == [0, 0, 0], text[-4000:]
    assert "no word from" not in text and "cut off" not in text, text[-4000:]
    assert "world: 3 rank(s)" in text and "world: 2 rank(s)" not in text, text[-4000:]
    # No group formed after the fault, and the run's last checkpoint is the epoch's end.
    assert job.logs[0].read_text(errors="replace").count("world: ") == formed, text[-4000:]
    steps = re.findall(r"(\d+) steps in all", job.logs[0].read_text(errors="replace"))
    assert job.checkpoints()[-1].name == f"checkpoint-{int(steps[-1]):09d}.pt", steps


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


@pytest.mark.parametrize("fault", ["blackhole", "link_down"])
def test_torchrun_survivors_of_a_lost_worker_regroup_and_finish(torchrun_on, fault):
    job = torchrun_on(images=720)
    job.wait_checkpoint(10)
    lost = job.hosts.names[2]
    getattr(job.hosts, fault)(lost)
    took = job.wait_pods([2], within=LOST_WITHIN_S)  # the cut-off pod's agent ends
    job.wait_pods([0, 1], within=START_S)
    text = job.text()
    assert [p.returncode for p in job.procs[:2]] == [0, 0], text[-4000:]
    assert "no word from rank" in text and f"({lost})" in text, text[-4000:]
    assert "this host is cut off" in job.logs[2].read_text(), job.logs[2].read_text()[-3000:]
    assert "world: 2 rank(s)" in text
    # Across the rounds, the run as kept trained every image once in its one epoch.
    trained = job.trained_per_epoch()
    assert list(trained) == [0] and sorted(trained[0].elements()) == list(range(720)), (
        sorted(trained), sorted(set(range(720)) - set(trained[0])),
        [i for i, n in trained[0].items() if n > 1])
    print(f"torchrun, {fault} of {lost}: its pod ended {took:.0f} s after the fault")


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
