"""bench-conv-fusion away from a GPU: it says there is none and where to run it, with exit status 2,
and refuses a precision it does not measure. The benchmark itself runs on a GPU
(scripts/device-checks.sh fusion)."""
import subprocess

import pytest
import torch

from conftest import binary


def run(*args):
    return subprocess.run([str(binary("bench-conv-fusion")), *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_without_a_gpu_it_says_where_to_run_it():
    result = run("--batch", "8")
    assert result.returncode == 2, result.stderr
    assert "no GPU is visible here" in result.stderr
    assert "scripts/device-checks.sh fusion" in result.stderr


def test_a_precision_it_does_not_measure_is_refused():
    result = run("--precision", "fp32")
    assert result.returncode != 0
    assert "fp32 not in {fp16,bf16}" in result.stderr
