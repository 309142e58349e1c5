"""docker/entrypoint.sh, the image's entrypoint, run here beside a fake train: it passes
arguments on and forwards SIGTERM; as the MPI Operator's launcher it waits for its workers' sshd
(and gives up at a deadline, naming the worker); as a worker's PID 1 it stops the ranks sshd
started; where EFA devices are, it warns of a low locked-memory limit."""
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from deploy_support import ROOT, tool


def run(*command, **kwargs):
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)


FAKE_TRAIN = """#!/usr/bin/env bash
# Stands in for train: prints its arguments and environment; with `wait`, waits for SIGTERM.
echo "train $*"
echo "root-ok=${OMPI_ALLOW_RUN_AS_ROOT:-unset}"
if [ "${1:-}" = wait ]; then
  trap 'echo "got TERM" > "$2"; kill "$sleeper"; exit 3' TERM
  : > "$2.ready"
  sleep 60 & sleeper=$!
  wait
fi
"""


@pytest.fixture
def image_bin(tmp_path):
    """A copy of the image's bin/: the entrypoint beside a fake train."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "entrypoint").write_text((ROOT / "docker" / "entrypoint.sh").read_text())
    (bin_dir / "train").write_text(FAKE_TRAIN)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def test_entrypoint_passes_arguments_to_train_or_a_command(image_bin):
    entrypoint = image_bin / "entrypoint"
    assert run(entrypoint, "--config", "a.toml").stdout.splitlines()[0] == "train --config a.toml"
    assert run(entrypoint, "train", "x", "y z").stdout.splitlines()[0] == "train x y z"
    assert run(entrypoint).stdout.splitlines()[0] == "train --help"
    assert run(entrypoint, "echo", "hello").stdout == "hello\n"
    assert run(entrypoint, "bash", "-c", "exit 7").returncode == 7
    expected = "root-ok=1" if os.getuid() == 0 else "root-ok=unset"
    assert expected in run(entrypoint, "--help").stdout


def test_entrypoint_forwards_sigterm_and_returns_the_childs_status(image_bin, tmp_path):
    marker = tmp_path / "term"
    proc = subprocess.Popen([image_bin / "entrypoint", "train", "wait", marker],
                            stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while not Path(f"{marker}.ready").exists():
        assert time.time() < deadline and proc.poll() is None, "fake train did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 3
    assert marker.read_text() == "got TERM\n"


def with_memlock(limit, *command):
    """command under a locked-memory limit of `limit` (KiB or "unlimited"), or a skip where this
    machine may not set it (raising it needs CAP_SYS_RESOURCE)."""
    if not shutil.which("prlimit"):
        pytest.skip("no prlimit (util-linux) here")
    limit = limit if limit == "unlimited" else limit * 1024
    probe = run("prlimit", f"--memlock={limit}", "true")
    if probe.returncode != 0:
        pytest.skip(f"cannot set the locked-memory limit here: {probe.stderr.strip()}")
    return ["prlimit", f"--memlock={limit}", *command]


@pytest.fixture
def efa_devices(tmp_path):
    (tmp_path / "uverbs0").touch()
    return {**os.environ, "EFA_DEVICES": str(tmp_path / "uverbs*")}


def test_entrypoint_warns_of_a_low_locked_memory_limit_where_efa_is(image_bin, efa_devices):
    low = run(*with_memlock(64, image_bin / "entrypoint", "echo", "ran"), env=efa_devices)
    assert low.returncode == 0 and low.stdout == "ran\n"
    assert "locked memory is limited to 64 KiB (ulimit -l)" in low.stderr
    assert '"Locked memory for EFA"' in low.stderr
    no_efa = {**efa_devices, "EFA_DEVICES": efa_devices["EFA_DEVICES"] + ".absent"}
    quiet = run(*with_memlock(64, image_bin / "entrypoint", "echo", "ran"), env=no_efa)
    assert quiet.stdout == "ran\n" and "WARNING" not in quiet.stderr


def test_entrypoint_is_quiet_under_an_unlimited_locked_memory_limit(image_bin, efa_devices):
    ran = run(*with_memlock("unlimited", image_bin / "entrypoint", "echo", "ran"),
              env=efa_devices)
    assert ran.stdout == "ran\n" and "WARNING" not in ran.stderr


def launcher_env(tmp_path, port, wait_s=60):
    """The MPI Operator's launcher environment, its hostfile naming this machine twice (both
    forms), its workers' sshd at `port`."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=8\n# a comment\n\nlocalhost:8\n")
    return {**os.environ, "K_MPI_JOB_ROLE": "launcher", "MPI_HOSTFILE": str(hostfile),
            "WORKER_SSH_PORT": str(port), "ENTRYPOINT_WAIT_S": str(wait_s)}


def test_entrypoint_starts_the_launcher_once_its_workers_take_connections(image_bin, tmp_path):
    with socket.socket() as sshd:
        sshd.bind(("127.0.0.1", 0))
        sshd.listen(8)
        env = launcher_env(tmp_path, sshd.getsockname()[1])
        proc = run(image_bin / "entrypoint", "echo", "started", env=env, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "started\n", proc.stderr


def test_entrypoint_waits_for_a_workers_sshd_that_starts_late(image_bin, tmp_path):
    """A job Kueue resumes gets its launcher with its workers (mpi-operator#615): the launcher
    waits for their sshd, here one that starts 3 s after it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([image_bin / "entrypoint", "echo", "started"], text=True,
                            env=launcher_env(tmp_path, port), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        time.sleep(3)
        assert proc.poll() is None, "the launcher started before its workers' sshd"
        with socket.socket() as sshd:
            sshd.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sshd.bind(("127.0.0.1", port))
            sshd.listen(8)
            out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out == "started\n", err


def test_entrypoint_gives_up_on_workers_that_never_listen_and_says_which(image_bin, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = run(image_bin / "entrypoint", "echo", "started", timeout=60,
               env=launcher_env(tmp_path, port, wait_s=2))
    assert proc.returncode == 1 and proc.stdout == ""
    assert (f"worker localhost (from {tmp_path / 'hostfile'}) resolves, but nothing accepts "
            f"connections on its port {port} (sshd) after 2 s") in proc.stderr


RANK = """#!/usr/bin/env bash
# A rank started by sshd, outside the entrypoint's process tree: 1 s to checkpoint on SIGTERM.
trap 'sleep 1; echo checkpointed > "$1"; exit 0' TERM
: > "$1.ready"
while :; do sleep 0.1; done
"""
SSHD = """#!/usr/bin/env bash
# Stands in for a worker's sshd: starts a rank in a session of its own, stops on SIGTERM.
setsid "$(dirname "$0")/rank" "$1" &
trap 'exit 0' TERM
while :; do sleep 0.1; done
"""


@pytest.mark.parametrize("role,checkpointed", [("worker", True), ("launcher", False)])
def test_entrypoint_as_a_workers_pid_1_stops_the_ranks_cleanly(image_bin, tmp_path, role,
                                                               checkpointed):
    """In a container of its own (a PID namespace), on an MPIJob worker, SIGTERM reaches the
    ranks under sshd and the entrypoint waits for them; elsewhere only its own child gets it."""
    for name, text in [("rank", RANK), ("sshd", SSHD)]:
        (image_bin / name).write_text(text)
        (image_bin / name).chmod(0o755)
    unshare = tool("unshare")
    if not unshare or run(unshare, "--pid", "--fork", "--mount-proc", "true").returncode != 0:
        pytest.skip("cannot make a PID namespace here (unshare needs root)")
    marker = tmp_path / "checkpoint"
    env = {**os.environ, "K_MPI_JOB_ROLE": role, "MPI_HOSTFILE": str(tmp_path / "none")}
    proc = subprocess.Popen([unshare, "--pid", "--fork", "--mount-proc", image_bin / "entrypoint",
                             image_bin / "sshd", marker], env=env)
    try:
        deadline = time.time() + 20
        while not Path(f"{marker}.ready").exists():
            assert time.time() < deadline and proc.poll() is None, "the fake rank did not start"
            time.sleep(0.05)
        # The entrypoint is unshare's child: PID 1 inside the namespace.
        pid1 = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        os.kill(pid1, signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        time.sleep(1.5)  # a rank that was not waited for would have written by now, if alive
        assert marker.exists() == checkpointed
    finally:
        if proc.poll() is None:
            proc.kill()


FAKE_MPIRUN = """#!/usr/bin/env bash
# Stands in for mpirun: `ok` prints a line to each stream and exits 0; `abort` prints a rank's
# error and Open MPI's abort banner and exits 3; `hang` does the same, then waits as mpirun does
# for a lost host's daemon, SIGTERM or not.
echo "a rank's line"
echo "mpirun's own" >&2
[ "$1" = ok ] && exit 0
printf '[2026-12-01 10:00:00.000] [hostb 1/3] [\\e[1m\\e[41mcritical\\e[m] rank 1 (hostb): no word from rank 2 (hostc)\\n'
printf 'MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\\nwith errorcode 3.\\n' >&2
[ "$1" = abort ] && exit 3
trap '' TERM
exec sleep 600
"""


@pytest.mark.parametrize("mode", ["ok", "abort", "hang"])
def test_the_launcher_ends_mpirun_that_outlives_the_jobs_failure(image_bin, tmp_path, mode):
    # docker/entrypoint.sh, "mpirun's end after a lost host". MPIRUN_EXIT_S ships as 40.
    (image_bin / "mpirun").write_text(FAKE_MPIRUN)
    (image_bin / "mpirun").chmod(0o755)
    start = time.monotonic()
    result = run(image_bin / "entrypoint", image_bin / "mpirun", mode, timeout=60,
                 env={**os.environ, "MPIRUN_EXIT_S": "2"})
    took = time.monotonic() - start
    assert result.stdout.splitlines()[0] == "a rank's line"  # each stream stays itself
    assert result.stderr.splitlines()[0] == "mpirun's own"
    last = result.stderr.rstrip().splitlines()[-1]
    if mode == "ok":
        assert (result.returncode, last) == (0, "mpirun's own")
        return
    named = "the job's first error: [2026-12-01 10:00:00.000] [hostb 1/3] [critical] rank 1"
    assert named in last and last.endswith("no word from rank 2 (hostc)"), last
    if mode == "abort":
        assert result.returncode == 3 and took < 10, (result.returncode, took)
        assert last.startswith("entrypoint: mpirun exited with status 3;"), last
    else:  # 2 s after the banner, then SIGTERM, 5 s, SIGKILL
        assert result.returncode == 1 and 6 < took < 20, (result.returncode, took)
        assert last.startswith("entrypoint: mpirun has not ended 2 s after"), last
