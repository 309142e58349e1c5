"""scripts/device/fused_numerics.py, the GPU check that a run with the fused batch norm trains as one
without it: its verdicts on loss curves and top-1s, and the whole script on the CPU (where both
settings run ATen's ops), down to the fused run's checkpoint in torchvision."""
import importlib.util
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT, binary

SCRIPT = ROOT / "scripts/device/fused_numerics.py"
spec = importlib.util.spec_from_file_location("fused_numerics", SCRIPT)
fused_numerics = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fused_numerics)


def curve(start, end, steps=200, wobble=0.0):
    """A loss falling linearly from start to end, with an alternating wobble."""
    return [start + (end - start) * i / (steps - 1) + (wobble if i % 2 else -wobble)
            for i in range(steps)]


def run(losses, top1, images=1000):
    return {"losses": losses, "top1": top1, "images": images}


def test_curve_distance_is_the_largest_difference_of_20_step_means():
    a = [1.0] * 40
    b = [1.0] * 20 + [1.0] * 19 + [3.0]  # one step 2 higher: its window's mean 0.1 higher
    assert fused_numerics.curve_distance(a, b) == pytest.approx(0.1)
    # A step's wobble averages out within a window.
    assert fused_numerics.curve_distance(curve(4, 1), curve(4, 1, wobble=0.5)) == \
        pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="cannot be compared"):
        fused_numerics.curve_distance(a, a[:20])


def test_a_fused_run_within_the_run_to_run_spread_passes():
    same_seed, other_seed = run(curve(4.6, 2.0), 60.0), run(curve(4.6, 2.3), 55.0)
    fused = run(curve(4.6, 2.1), 58.0)
    assert fused_numerics.compare(fused, same_seed, other_seed) == []


def test_a_fused_run_off_the_unfused_curve_fails():
    same_seed, other_seed = run(curve(4.6, 2.0), 60.0), run(curve(4.6, 2.1), 59.0)
    fused = run(curve(4.6, 2.6), 59.0)  # 0.6 above at the end, where seeds differ by 0.1
    failures = fused_numerics.compare(fused, same_seed, other_seed)
    assert len(failures) == 1 and "loss curve" in failures[0], failures


def test_a_fused_run_that_does_not_learn_fails():
    flat = run(curve(4.6, 4.6), 1.0)
    failures = fused_numerics.compare(flat, flat, flat)
    assert len(failures) == 1 and "did not learn" in failures[0], failures


def test_a_fused_top1_beyond_seeds_and_sampling_fails():
    same_seed, other_seed = run(curve(4.6, 2.0), 60.0), run(curve(4.6, 2.0), 59.0)
    # Two standard errors of a difference of two top-1s near 55% over 1,000 images: 4.4 points.
    assert fused_numerics.top1_tolerance(50.0, 60.0, 1000) == pytest.approx(4.45, abs=0.01)
    assert fused_numerics.compare(run(curve(4.6, 2.0), 56.0), same_seed, other_seed) == []
    failures = fused_numerics.compare(run(curve(4.6, 2.0), 50.0), same_seed, other_seed)
    assert len(failures) == 1 and "top-1" in failures[0], failures


def test_the_script_runs_through_on_the_cpu(tmp_path):
    """ResNet-18 at 32 px for 40 steps: three runs, their comparison, the fused run's checkpoint
    in torchvision against the trainer's model on the same held-out images (on one CPU, the
    same kernels: equal). In fp32: on a CPU without bf16 instructions LibTorch's bf16
    convolutions are emulated, and the same three runs took 540 s instead of 40."""
    binary("train"), binary("generate-dataset"), binary("resnet_parity_tool")
    result = subprocess.run(
        [sys.executable, SCRIPT, "--out", tmp_path, "--bin-dir", BUILD, "--device", "cpu",
         "--arch", "resnet18", "--precisions", "fp32", "--steps", "40", "--batch", "16",
         "--image-size", "32", "--classes", "4", "--conv-fusion",
         "--train-args", "--decode_threads", "2"],
        capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert output.count("--max_steps 40") == 3, output
    assert "--seed 2 --fused_batch_norm false" in output
    # --conv-fusion: the fused run only, both fusions on.
    assert output.count("--fused_batch_norm true --fused_conv_batch_norm true") == 1, output
    assert output.count("--fused_conv_batch_norm false") == 2, output
    assert output.count("--decode_threads 2") == 3, output  # --train-args reach every run
    assert "in torchvision: logits 0.00e+00 from the trainer's" in output, output
    assert "fused batch norm trains as the unfused one" in output
