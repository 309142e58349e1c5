"""The chaos test's network faults (tests/run/test_chaos.py), played on hosts made of network
namespaces (tests/distributed/netns_hosts.py), one rank a host, at the default collective timeout
so that the liveness signal is what finds a lost host (docs/distributed.md, "When a host is
lost"):

  host-lost  a host blackholed (its frames dropped at the bridge) or its link cut at the drawn
             step: under mpirun every process ends within two minutes, non-zero, a surviving rank
             naming the lost host, and the relaunch resumes; under torchrun a worker's agent ends
             within two minutes saying its host is cut off and the survivors re-form smaller and
             finish, or, the rendezvous host lost, every pod ends and the relaunch resumes
  outage     a host blackholed for 5-25 s, then healed: nothing ends, nobody is named, the job
             finishes at the world it started with
  slow-link  a host's link slow for 5-25 s (every packet held 5 ms each way, 0.2% lost: the
             NFQUEUE delay line, tests/distributed/delay_line.py), then healed: the same
"""
import importlib.util
import os
import sys
import time
from pathlib import Path

from chaos_jobs import check
from chaos_faults import check_regroup, launch_to_fault

sys.path.insert(0, str(Path(__file__).parents[1] / "distributed"))  # the hosts
from netns_hosts import Hosts, missing_tools  # noqa: E402

LOST_WITHIN_S = 120  # the bound docs/distributed.md states for every process of the job
LIVENESS_TIMEOUT_S = 45  # its default: the survivors' agents re-form within it of the loss
MPIRUN_HOSTS = ["l", "a", "b", "c"]  # the launcher's, then one a rank
POD_HOSTS = ["a", "b", "c"]


def hosts_for(scenario):
    """The scenario's hosts, not yet made (a context manager)."""
    names = (POD_HOSTS if scenario.launcher == "torchrun" else MPIRUN_HOSTS)
    return Hosts(names[:scenario.first.ranks + (scenario.launcher == "mpirun")],
                 prefix=f"c{os.getpid() % 100000}")


def network_unavailable(fault):
    """Why `fault`'s hosts cannot be made here, or None."""
    if fault == "slow-link" and importlib.util.find_spec("netfilterqueue") is None:
        return "NetfilterQueue is missing: run scripts/setup.sh"
    return missing_tools()


def struck_host(run):
    """The name of the host the fault strikes: the drawn rank's or pod's."""
    return run.hosts.names[run.s.lost + (run.s.launcher == "mpirun")]


def named(log, host):
    """Whether a line of `log` names `host` as the one no word came from."""
    return any("no word from rank" in line and f"({host})" in line for line in log.splitlines())


def fault_host_lost(run):
    s = run.s
    job = launch_to_fault(run)
    if not job:
        return
    host = struck_host(run)
    getattr(run.hosts, s.how)(host)
    lost_at, lost = time.time(), time.monotonic()
    if s.launcher == "torchrun" and s.lost > 0:
        cut_off = job.procs[s.lost]
        job.wait_end(LOST_WITHIN_S, f"the agent of pod {s.lost}, cut off", procs=[cut_off[1]])
        run.notes.append(f"the cut-off pod ended {time.monotonic() - lost:.0f} s after the fault")
        survivors = [p for i, (_, p, _) in enumerate(job.procs) if i != s.lost]
        rcs = job.wait_end(run.bound(), "the surviving pods", procs=survivors)
        check(all(rc == 0 for rc in rcs), f"the surviving pods ended with status {rcs}")
        if "final: top-1" in cut_off[2].read_text(errors="replace"):
            run.notes.append("finished as the host was lost")
            return
        # Of two hosts neither can tell which lost its network; of three, the one that hears
        # nobody knows it is itself.
        said = "this host is cut off" if s.first.ranks > 2 else "that host or this one"
        check(said in cut_off[2].read_text(errors="replace"),
              f"pod {s.lost}'s log does not say {said!r}")
        check(named(job.log(), host), f"no surviving rank named {host}, the host lost")
        check_regroup(run, lost_at, s.first.ranks - 1,
                      within=(LIVENESS_TIMEOUT_S, "liveness_timeout_s"))
        return
    rcs = job.wait_end(LOST_WITHIN_S, f"the job after {host} was lost")
    run.notes.append(f"every process ended {time.monotonic() - lost:.0f} s after the fault")
    if all(rc == 0 for rc in rcs) and "final: top-1" in job.log():
        run.notes.append("finished as the host was lost")
    else:
        check(all(rc != 0 for rc in rcs), f"status {rcs} after a host was lost")
        check(named(job.log(), host), f"no surviving rank named {host}, the host lost")
    run.hosts.heal()
    run.finish(s.relaunch, "relaunch")


def fault_outage(run):
    survive_a_while(run, run.hosts.blackhole, f"a {run.s.lasts_s} s outage")


def fault_slow_link(run):
    survive_a_while(run, lambda host: run.hosts.slow_link(host, delay_ms=5, loss=0.002),
                    f"{run.s.lasts_s} s of a slow link")


def survive_a_while(run, fault, what):
    """`fault` made at the drawn step on the drawn host, healed `lasts_s` later: nothing ends,
    nobody is named lost, no group re-forms, and the job finishes."""
    s = run.s
    job = launch_to_fault(run)
    if not job:
        return
    fault(struck_host(run))
    time.sleep(s.lasts_s)
    run.hosts.heal()
    rcs = job.wait_end(run.bound(), f"the job after {what}")
    log = job.log()
    check(all(rc == 0 for rc in rcs), f"status {rcs} after {what}")
    check("no word from" not in log and "cut off" not in log, f"{what} was taken for a lost host")
    worlds = sorted({w for _, w in run.rounds()})
    check(worlds == [s.first.ranks], f"rounds' worlds {worlds} after {what}")


# Each network fault's function, by the name the draw gives it (chaos_scenarios.NETWORK_FAULTS).
FAULTS_ON_HOSTS = {"host-lost": fault_host_lost, "outage": fault_outage,
                   "slow-link": fault_slow_link}
