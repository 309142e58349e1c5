"""What the tests of the built image share: building it once per test session with
scripts/image/local.sh (podman, a local Debian 12 base; the base alone for tests that need no
trainer), the rehearsal helpers of scripts/k8s/rehearse.py, a CPU-sized trainer config for the
cluster targets, a small TFRecord dataset made by the image's own tools, and waits that end when
the container they wait on has. Where podman is missing or cannot start containers, the tests
that need the image skip and say why."""
import functools
import importlib.util
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from deploy_support import ROOT, build_dir

IMAGE = "localhost/resnet-trainer:local"
BASE_IMAGE = "localhost/resnet-trainer-base:debian12"
CONTAINERS_CONF = str(ROOT / "docker" / "podman.conf")
# Limits that only a hang reaches, on a busy 2-core machine (the smoke Job takes 2 minutes on an
# idle one, 16 on one running other builds); every wait below has one.
BUILD_TIMEOUT_S = 3600
RUN_TIMEOUT_S = 1800

_spec = importlib.util.spec_from_file_location("k8s_rehearse", ROOT / "scripts" / "k8s" / "rehearse.py")
rehearse = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rehearse)
_prefixes = itertools.count()


def podman_env():
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", CONTAINERS_CONF)}


@functools.cache
def podman_problem():
    """Why podman cannot store images here, or None. `podman info` alone passes where the storage
    driver fails only at the first write (overlay over overlayfs, inside a container), so an empty
    image is imported and removed."""
    if not shutil.which("podman"):
        return "podman is not installed: scripts/setup.sh installs it (apt-get)"
    os.environ.setdefault("CONTAINERS_CONF", CONTAINERS_CONF)
    info = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=120)
    if info.returncode != 0:
        return f"podman does not work here: {info.stderr.strip()[-300:]}"
    probe = subprocess.run("tar -cf - -T /dev/null | podman import - localhost/trainer-probe:empty"
                           " && podman rmi localhost/trainer-probe:empty", shell=True,
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return f"podman cannot store an image here: {probe.stderr.strip()[-300:]}"
    return None


def skip_without_podman():
    problem = podman_problem()
    if problem:
        pytest.skip(problem)


def base_image():
    """The Debian 12 base image (bash, getent; no trainer), made by scripts/image/base.sh: a minute
    or two the first time (debootstrap), seconds once its root file system is cached. Skips
    where podman is missing or cannot start containers."""
    skip_without_podman()
    base = subprocess.run([ROOT / "scripts" / "image" / "base.sh", BASE_IMAGE], capture_output=True,
                          text=True, timeout=1200, env=podman_env())
    assert base.returncode == 0, f"scripts/image/base.sh failed:\n{base.stderr[-3000:]}"
    probe = subprocess.run(["podman", "run", "--rm", BASE_IMAGE, "true"], capture_output=True,
                           text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot start containers here: {probe.stderr.strip()[-300:]}")
    return BASE_IMAGE


def built_from_source():
    """Whether the tests' image compiles the project in its build stage (IMAGE_FROM_SOURCE=1, as
    scripts/image/build.sh does for EKS; 9 minutes from bare on 2 idle cores), rather than
    taking the programs from the build the tests run (scripts/image/local.sh --from-build)."""
    return os.environ.get("IMAGE_FROM_SOURCE") == "1"


@pytest.fixture(scope="session")
def image(tmp_path_factory):
    """The image, built once per session from docker/Dockerfile (cached layers make a rebuild
    of unchanged sources take a minute), or by scripts/test.sh just before, from the same tree
    (TEST_IMAGE_BUILT)."""
    base_image()
    if os.environ.get("TEST_IMAGE_BUILT") == IMAGE:
        return IMAGE
    log = tmp_path_factory.mktemp("image") / "build.log"
    source = [] if built_from_source() else ["--from-build", build_dir()]
    start = time.monotonic()
    with open(log, "w") as out:
        status = run_in_group([ROOT / "scripts" / "image" / "local.sh", *source, IMAGE], out,
                              BUILD_TIMEOUT_S)
    print(f"image built in {time.monotonic() - start:.0f} s (log: {log})")
    assert status == 0, f"scripts/image/local.sh failed:\n{log.read_text()[-5000:]}"
    return IMAGE


def run_in_group(command, out, timeout):
    """Runs command in a process group of its own, so that a timeout (or an interrupted test
    session) stops podman too, not only the script; returns its exit status."""
    proc = subprocess.Popen([str(c) for c in command], stdout=out, stderr=subprocess.STDOUT,
                            env=podman_env(), start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        raise


@functools.cache
def remove_what_killed_sessions_left():
    """The rehearsal containers and networks of earlier test sessions killed before their
    fixtures' teardown ran (prefix rt<pid>-, that process gone): left, they run on for hours and
    keep their images from every prune."""
    networks = rehearse.podman("network", "ls", "--format", "{{.Name}}", check=False, quiet=True)
    for network in networks.split():
        left = re.fullmatch(r"(rt(\d+)-\d+-)net", network)
        if left and not process_exists(int(left.group(2))):
            rehearse.delete_rehearsal(left.group(1), grace=0)


def process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


# One LibTorch thread in each container's process, as every other test process has: the serial
# pass's other lane shares the cores, and a process whose two OpenMP threads wait on each other
# for a core stepped a third slower than with one (10 steps of the smoke config beside two busy
# processes: 41 s with two threads, 30 s with one; 18 and 20 s alone).
NODE_ENV = ("OMP_NUM_THREADS=1",)


@pytest.fixture
def cluster(tmp_path):
    """cluster(docs=(), claims={}) -> a rehearse.Cluster whose containers and network are removed
    after the test, however it ends."""
    remove_what_killed_sessions_left()
    made = []

    def make(docs=(), claims=None):
        prefix = f"rt{os.getpid()}-{next(_prefixes)}-"
        workdir = tmp_path / prefix
        workdir.mkdir()
        made.append(rehearse.Cluster(list(docs), claims or {}, workdir, prefix=prefix,
                                     node_env=NODE_ENV))
        return made[-1]

    yield make
    for c in made:
        c.delete(grace=5)


def restricted_pod(image, args, volumes=None):
    """A pod spec with the settings every rendered pod has (the restricted standard): uid 1000,
    no capabilities, no privilege escalation. volumes: {mountPath: claim name}."""
    volumes = volumes or {}
    return {
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "main", "image": image, "args": list(args),
            "securityContext": {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": claim, "mountPath": path} for path, claim in volumes.items()],
        }],
        "volumes": [{"name": claim, "persistentVolumeClaim": {"claimName": claim}}
                    for claim in volumes.values()],
    }


def writable_dir(path):
    """A folder the image's user (uid 1000) can write, like /fsx/runs after stage-data."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 1000, 1000)
    return path


def cpu_config(source, **overrides):
    """The trainer config `source` with keys replaced (or added): a cluster config made to run
    on a few CPU cores, with everything else (data and output paths, resume) as it is."""
    lines, seen = [], set()
    for line in Path(source).read_text().splitlines():
        key = re.match(r"^\s*([A-Za-z_]\w*)\s*=", line)
        if key and key.group(1) in overrides:
            seen.add(key.group(1))
            line = f"{key.group(1)} = {toml(overrides[key.group(1)])}"
        lines.append(line)
    lines += [f"{k} = {toml(v)}" for k, v in overrides.items() if k not in seen]
    return "\n".join(lines) + "\n"


def toml(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


# configs/p3.16xlarge.toml on 4 CPU ranks: 10 classes of 32x32 crops, 8 images per rank, a
# checkpoint every 5 steps. Data and output stay on /fsx as the cluster has them.
CPU_OVERRIDES = dict(device="cpu", precision="fp32", num_classes=10, image_size=32, val_resize=36,
                     batch_size=8, epochs=3, warmup_epochs=0.5, log_every_steps=5,
                     checkpoint_every_steps=5, keep_checkpoints=3, decode_threads=1,
                     reader_threads=1, prefetch_batches=2, shuffle_buffer=64,
                     collective_timeout_s=120)


def steps_logged(output_dir):
    """The steps of the train events in output_dir/metrics.jsonl, in order."""
    import json
    path = Path(output_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e["step"] for e in events if e.get("event") == "train"]


def newest_checkpoint(output_dir):
    """(step, path) of the newest checkpoint-<step>.pt in output_dir/checkpoints, or (0, None)."""
    found = sorted((int(m.group(1)), p) for p in (Path(output_dir) / "checkpoints").glob("*.pt")
                   if (m := re.match(r"checkpoint-(\d+)\.pt$", p.name)))
    return found[-1] if found else (0, None)


def wait_for(condition, timeout, what, container=None):
    """Waits until condition() holds, at most timeout s. container: the podman container whose
    work should make it hold; once that has exited without, it never will, and the wait fails
    at once with the container's log."""
    deadline = time.monotonic() + timeout
    next_look = time.monotonic()
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        if container and time.monotonic() >= next_look:
            # Every 5 s: each `podman inspect` takes CPU from the run being waited for.
            next_look = time.monotonic() + 5
            status = rehearse.exit_status(container)
            # What it did just before exiting counts (a checkpoint written, then the end).
            if status is not None and not condition():
                pytest.fail(f"{container} exited with status {status} before {what}:\n"
                            + rehearse.container_log(container)[-3000:])
        time.sleep(0.5)
