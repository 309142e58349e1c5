"""Shared fixtures and helpers for the Python tests: where the build put the binaries; which tests
run alone; ending a process with everything it started."""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("TRAINER_BUILD_DIR", ROOT / "build"))

# Tests marked `serial`, which scripts/test.sh runs after the others (those one per core): those
# that assert a deadline a busy machine could make them miss (a checkpoint before mpirun's
# SIGKILL, a stuck or killed rank ending the job, the chaos scenarios' bounds, a teardown's wait)
# and those that run the container image (whole jobs, one image build). They run in two lanes
# side by side, one test of each at a time (pytest-xdist's loadgroup): about a third of the
# cores stood idle while they ran one at a time, waiting on container starts, rendezvous, kills
# and grace periods. The lanes hold about equal time (on 2 cores, about 15 minutes each): the
# image's jobs in one, with torchrun's tests on the host and the frozen file system's, and the
# other processes in the other. The slow host's test stays with the lost host's: each runs three
# ranks that need the CPU, and side by side they missed their deadlines.
SERIAL_LANES = {
    "image": {
        "deploy/test_image.py", "deploy/test_image_run.py", "deploy/test_trainjob.py",
        "deploy/test_entrypoint.py", "deploy/test_rehearsal_names.py",
        "deploy/test_k8s_wait_nodes.py", "distributed/test_torchrun.py",
        "run/test_frozen_storage.py",
    },
    "processes": {
        "run/test_chaos.py", "deploy/test_pytorchjob.py", "run/test_stop_deadline.py",
        "distributed/test_distributed_cli.py", "distributed/test_elastic.py", "run/test_faults.py",
        "tools/test_imagenet_convert.py", "deploy/test_eks_export.py",
        "deploy/test_eks_teardown.py", "distributed/test_lost_host.py",
        "distributed/test_slow_host.py",
    },
}
SERIAL_MODULES = {module: lane for lane, modules in SERIAL_LANES.items() for module in modules}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the lane to group by
def pytest_collection_modifyitems(items):
    tests = pathlib.Path(__file__).parent
    missing = sorted(m for m in SERIAL_MODULES if not (tests / m).is_file())
    if missing:  # renamed: its tests would run beside the others, unnoticed
        raise pytest.UsageError(f"conftest.py's SERIAL_LANES names no such file: {missing}")
    for item in items:
        if not item.path.is_relative_to(tests):
            continue
        lane = SERIAL_MODULES.get(item.path.relative_to(tests).as_posix())
        if lane:
            item.add_marker(pytest.mark.serial)
            item.add_marker(pytest.mark.xdist_group(lane))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, run where it schedules
def pytest_xdist_node_collection_finished(node, ids):
    """pytest-xdist keeps a lane on one worker by ending each of its tests' ids with the lane's
    name (--dist loadgroup). With pytest 9.2 (xdist 3.8) that no longer takes, and the lanes would
    mix unnoticed: container jobs beside each other, deadlines beside both (pytest-xdist issue
    #1386). So an id without its lane stops the run before any test starts."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    for nodeid in ids:
        lane = SERIAL_MODULES.get(nodeid.split("::")[0].removeprefix("tests/"))
        if lane and not nodeid.endswith("@" + lane):
            pytest.exit(f"pytest-xdist did not put {nodeid} in its lane {lane!r} (pytest "
                        f"{pytest.__version__}): the serial lanes would mix. Fix: "
                        "scripts/setup.sh installs a pytest that xdist groups with (below 9.2)",
                        returncode=pytest.ExitCode.USAGE_ERROR)


_torchrun_logs = None  # the folder pytest_configure made, which pytest_unconfigure removes


def pytest_configure(config):
    """torchrun's agent writes its logs into one folder of this run's, removed at its end, instead
    of a new /tmp/torchelastic_* folder each run (PET_LOG_DIR is torchrun's --log-dir; one the
    caller set stays). Set before the test modules are imported, so that the environments they
    copy at import have it, and before pytest-xdist starts its workers, which inherit it."""
    global _torchrun_logs
    if "PET_LOG_DIR" not in os.environ:
        _torchrun_logs = tempfile.mkdtemp(prefix="pytest-torchelastic-")
        os.environ["PET_LOG_DIR"] = _torchrun_logs


def pytest_unconfigure(config):
    if _torchrun_logs:
        shutil.rmtree(_torchrun_logs, ignore_errors=True)


def binary(name):
    """Path of a built binary; skips the test when the build has not produced it."""
    for candidate in (BUILD / name, BUILD / "tests" / name):
        if candidate.exists():
            return candidate
    pytest.skip(f"{name} not built in {BUILD}; run scripts/build.sh first")


def descendants(pid):
    """PIDs of the processes below `pid`, from /proc."""
    children = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, pending = [], [pid]
    while pending:
        below = children.get(pending.pop(), [])
        found += below
        pending += below
    return found


def kill_tree(proc):
    """SIGKILL to `proc` and every process below it (all started by this test)."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def run_train(*args, timeout=600, **kwargs):
    """Runs `train` with the given arguments; returns the CompletedProcess (stdout+stderr)."""
    return subprocess.run([str(binary("train")), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="session")
def tf():
    """TensorFlow itself, which writes and reads records in the tests; skips without it."""
    try:
        import tensorflow
    except Exception as error:  # absent, or a broken install: skip with the reason
        pytest.skip(f"tensorflow is not importable ({error}); scripts/setup.sh installs it")
    return tensorflow


PHOTOS = pathlib.Path("/usr/share/backgrounds/mate/nature")
PHOTO_VAL_SIZE = 72  # held-out crops' side: the evaluation's val_resize leaves them as they are


@pytest.fixture(scope="session")
def photo_dataset(tmp_path_factory):
    """10 classes of crops of real photographs (scripts/dev/make_photo_dataset.py) as an ImageFolder
    tree (`folder`/train, `folder`/val) and as TFRecords (`tfrecords`/train-*, validation-*)."""
    if not PHOTOS.is_dir():
        pytest.skip(f"{PHOTOS} is missing; scripts/setup.sh installs mate-backgrounds")
    root = tmp_path_factory.mktemp("photos")
    folder, records = root / "folder", root / "tfrecords"
    subprocess.run([sys.executable, ROOT / "scripts/dev/make_photo_dataset.py",
                    folder, "--photos", PHOTOS, "--val-size", str(PHOTO_VAL_SIZE),
                    "--val-per-class", "30"], check=True,
                   timeout=300)
    for split, prefix in (("train", "train"), ("val", "validation")):
        subprocess.run([binary("make-tfrecords"), folder / split, records, "--prefix", prefix,
                        "--shards", "2"], check=True, capture_output=True, timeout=300)
    return {"folder": folder, "tfrecords": records}
