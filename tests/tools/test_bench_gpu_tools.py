"""The GPU benchmarks away from a GPU: bench-conv-fusion and bench-max-pool say there is none and
where to run them, with exit status 2, and refuse a precision they do not measure. The
benchmarks themselves run on a GPU (scripts/device/checks.sh fusion)."""
import subprocess

import pytest
import torch

from conftest import binary

TOOLS = ["bench-conv-fusion", "bench-max-pool"]


def run(tool, *args):
    return subprocess.run([str(binary(tool)), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
@pytest.mark.parametrize("tool", TOOLS)
def test_without_a_gpu_it_says_where_to_run_it(tool):
    result = run(tool, "--batch", "8")
    assert result.returncode == 2, result.stderr
    assert "no GPU is visible here" in result.stderr
    assert "scripts/device/checks.sh fusion" in result.stderr


@pytest.mark.parametrize("tool, refused, allowed", [
    ("bench-conv-fusion", "fp32", "{fp16,bf16}"),
    ("bench-max-pool", "fp8", "{fp16,bf16,fp32}"),
])
def test_a_precision_it_does_not_measure_is_refused(tool, refused, allowed):
    result = run(tool, "--precision", refused)
    assert result.returncode != 0
    assert f"{refused} not in {allowed}" in result.stderr
