"""Hosts made of network namespaces, for the tests of a job that loses one: each host a namespace
with one link (a veth) into a bridge that lives in a namespace of its own, never the root
namespace, so that nothing here touches the machine's own network. Each process started on a
host also gets a UTS namespace named after it, so the job's logs name the hosts as a cluster's
would, and `ip netns exec`'s /etc/netns/HOST/hosts makes every host's name resolve on every
other. Faults are made at the bridge, as a node whose network dies looks to the others: frames
to and from a host dropped silently (ebtables: no RST, no ICMP), or its link down; or a host's
link capped (tc's token bucket, both ways), or made slow (iptables in its namespace queues every
packet to delay_line.py, which holds each and drops a share at random).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SUBNET = "10.77.0"  # private to the namespaces; the same in every set, which never meet


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def missing_tools():
    """Why the hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "hosts of network namespaces need root (CI runs as root)"
    for tool in ("ip", "ebtables", "iptables", "tc", "unshare", "hostname"):
        if not shutil.which(tool):
            return f"no {tool} here: run scripts/setup.sh, which installs it"
    return None


class Hosts:
    """`names` hosts (the first often the launcher's) on one bridge; a context manager that
    deletes every namespace and file it made, whatever happens in between."""

    def __init__(self, names, prefix):
        self.prefix = prefix
        self.names = [f"{prefix}{n}" for n in names]
        self.bridge = f"{prefix}br"
        self.address = {h: f"{SUBNET}.{10 + i}" for i, h in enumerate(self.names)}
        self.port = {h: f"v{i}" for i, h in enumerate(self.names)}  # its link, in the bridge's
        self.delay_lines = []

    def __enter__(self):
        try:
            self._make()
        except BaseException:
            self.delete()
            raise
        return self

    def __exit__(self, *exc):
        self.delete()

    def _make(self):
        _ip("netns", "add", self.bridge)
        self._in_bridge("ip", "link", "add", "br0", "type", "bridge")
        self._in_bridge("ip", "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{a} {h}\n" for h, a in self.address.items())
        for host in self.names:
            _ip("netns", "add", host)
            _ip("link", "add", self.port[host], "netns", self.bridge, "type", "veth", "peer",
                "name", "eth0", "netns", host)
            self._in_bridge("ip", "link", "set", self.port[host], "master", "br0", "up")
            _ip("-n", host, "link", "set", "lo", "up")
            _ip("-n", host, "addr", "add", f"{self.address[host]}/24", "dev", "eth0")
            _ip("-n", host, "link", "set", "eth0", "up")
            etc = Path("/etc/netns") / host
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)

    def delete(self):
        self._end_delay_lines()
        for ns in [*self.names, self.bridge]:
            _ip("netns", "delete", ns, check=False)  # its links go with it
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)

    def _in_bridge(self, *argv):
        self._in(self.bridge, *argv)

    def _in(self, host, *argv):
        subprocess.run(["ip", "netns", "exec", host, *argv], capture_output=True, text=True,
                       timeout=30, check=True)

    def on(self, host, argv):
        """`argv` run on `host`: in its network namespace, under its own host name."""
        return ["ip", "netns", "exec", host, "unshare", "--uts", "bash", "-c",
                'hostname "$0" && exec "$@"', host, *argv]

    def rsh_agent(self, folder):
        """A script for Open MPI's plm_rsh_agent: mpirun starts its daemon on HOST as it would
        over ssh, a command line for a shell, in that host's namespaces."""
        agent = Path(folder) / "netns-rsh"
        agent.write_text('#!/bin/bash\nhost=$1; shift\n'
                         'exec ip netns exec "$host" unshare --uts bash -c '
                         '\'hostname "$0" && eval "$1"\' "$host" "$*"\n')
        agent.chmod(0o755)
        return agent

    # Faults.

    def blackhole(self, host):
        """Drops every frame to and from `host` at the bridge: its peers' packets vanish."""
        for direction in ("-i", "-o"):
            self._in_bridge("ebtables", "-A", "FORWARD", direction, self.port[host], "-j", "DROP")

    def block_udp(self):
        """Drops every UDP datagram between hosts at the bridge; TCP still passes (a security
        group or network policy that lets only the job's TCP ports through)."""
        self._in_bridge("ebtables", "-A", "FORWARD", "-p", "IPv4", "--ip-proto", "udp", "-j",
                        "DROP")

    def link_down(self, host):
        self._in_bridge("ip", "link", "set", self.port[host], "down")

    def cap(self, host, rate):
        """Caps `host`'s link both ways at `rate` (tc's units: "200mbit"), with a queue of up to
        100 ms: a slow or shared NIC, where the all-reduce's bursts wait in line."""
        shape = ["root", "tbf", "rate", rate, "burst", "64kb", "latency", "100ms"]
        self._in_bridge("tc", "qdisc", "replace", "dev", self.port[host], *shape)  # toward it
        self._in(host, "tc", "qdisc", "replace", "dev", "eth0", *shape)

    def slow_link(self, host, delay_ms, loss):
        """Every packet to and from `host` held `delay_ms` (so a round trip with a peer takes
        twice that more) and lost with probability `loss` each way: a long or lossy path, a
        flapping NIC that retransmits: iptables' NFQUEUE target in its namespace hands them to
        delay_line.py; packets pass undelayed while no delay line listens (--queue-bypass)."""
        with tempfile.TemporaryDirectory(prefix="delay-line-") as folder:
            ready = Path(folder) / "ready"
            line = subprocess.Popen(["ip", "netns", "exec", host, sys.executable,
                                     str(Path(__file__).with_name("delay_line.py")),
                                     "--delay-ms", str(delay_ms), "--loss", str(loss),
                                     "--ready", str(ready)])
            self.delay_lines.append(line)
            deadline = time.monotonic() + 30
            while not ready.exists():
                assert line.poll() is None, f"delay_line.py on {host} ended ({line.returncode})"
                assert time.monotonic() < deadline, f"delay_line.py on {host} not ready in 30 s"
                time.sleep(0.1)
        for chain, way in (("OUTPUT", "-o"), ("INPUT", "-i")):
            self._in(host, "iptables", "-A", chain, way, "eth0", "-j", "NFQUEUE", "--queue-num",
                     "0", "--queue-bypass")

    def _end_delay_lines(self):
        for line in self.delay_lines:
            line.terminate()
            try:
                line.wait(timeout=10)
            except subprocess.TimeoutExpired:
                line.kill()
                line.wait(timeout=10)
        self.delay_lines = []

    def pids(self, host, name):
        """The processes named `name` (their comm) running on `host`."""
        listed = _ip("netns", "pids", host).stdout.split()
        found = []
        for pid in listed:
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                    found.append(int(pid))
            except FileNotFoundError:
                continue
        return found

    def heal(self):
        self._in_bridge("ebtables", "-F", "FORWARD")
        for host in self.names:
            subprocess.run(["ip", "netns", "exec", host, "iptables", "-F"], capture_output=True,
                           timeout=30)
        self._end_delay_lines()  # the rules gone first: what the lines hold is the last delayed
        for host in self.names:
            self._in_bridge("ip", "link", "set", self.port[host], "up")
            subprocess.run(["ip", "netns", "exec", self.bridge, "tc", "qdisc", "del", "dev",
                            self.port[host], "root"], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "exec", host, "tc", "qdisc", "del", "dev", "eth0",
                            "root"], capture_output=True, timeout=30)


@pytest.fixture
def hosts_maker():
    """Makes Hosts sets for a test and deletes them at its end (also when it fails)."""
    why = missing_tools()
    if why:
        pytest.skip(why)
    made = []

    def make(names):
        hosts = Hosts(names, prefix=f"t{os.getpid() % 100000}{len(made)}")
        made.append(hosts)
        return hosts.__enter__()

    yield make
    for hosts in made:
        hosts.delete()
