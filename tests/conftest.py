"""Shared fixtures for the Python tests: where the build put the binaries."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("TRAINER_BUILD_DIR", ROOT / "build"))


def binary(name):
    """Path of a built binary; skips the test when the build has not produced it."""
    for candidate in (BUILD / name, BUILD / "tests" / name):
        if candidate.exists():
            return candidate
    pytest.skip(f"{name} not built in {BUILD}; run scripts/build.sh first")


def run_train(*args, timeout=600, **kwargs):
    """Runs `train` with the given arguments; returns the CompletedProcess (stdout+stderr)."""
    return subprocess.run([str(binary("train")), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, **kwargs)
