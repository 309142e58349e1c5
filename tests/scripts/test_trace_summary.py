"""scripts/dev/trace_summary.py: a profile_steps trace summarised per traced step, GPU kernels by kind
and by name, or a CPU run's operators by self time."""
import json
import re
import subprocess
import sys

from conftest import ROOT, run_train

SCRIPT = ROOT / "scripts" / "dev" / "trace_summary.py"


def summarise(path, *args):
    result = subprocess.run([sys.executable, SCRIPT, path, *args], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def kernel(name, us):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": 0, "dur": us}


def step(n):
    return {"ph": "X", "cat": "user_annotation", "name": f"step {n}", "ts": 0, "dur": 1500}


def test_gpu_kernels_are_summed_by_kind_per_step(tmp_path):
    """Two steps of 1 ms of kernels each: cuDNN's batch norm 30%, a convolution 50%, an add and the
    max pooling 10% each (names as H100 traces show them)."""
    per_step = [kernel("void cudnn::bn_fw_tr_1C11_kernel_NCHW<__half, float, 512, true, 1>", 300),
                kernel("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc", 500),
                kernel("void at::native::vectorized_elementwise_kernel<4, "
                       "at::native::CUDAFunctor_add<c10::Half>>", 100),
                kernel("void at::native::(anonymous namespace)::max_pool_forward_nhwc<c10::Half>",
                       100)]
    trace = tmp_path / "rank0.22.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": [step(22), step(23)] + per_step * 2}))
    out = summarise(trace)
    assert "2 traced step(s); GPU kernels, copies and sets: 8 (4 a step), 2.0 ms (1.00 ms a step)" \
        in out
    rows = {m[1].strip(): (float(m[2]), m[3]) for m in
            re.finditer(r"^(\S[^\d\n]*?)\s+([\d.]+)\s+([\d.]+%)\s+\d+$", out, re.M)}
    assert rows["batch norm"] == (0.3, "30.0%")
    assert rows["convolution"] == (0.5, "50.0%")
    assert rows["element-wise and copies"] == (0.1, "10.0%")
    assert rows["pooling"] == (0.1, "10.0%")
    assert "0.500 ms  50.0% x1     sm90_xmma_fprop" in out


def test_a_cpu_run_is_summarised_by_operator_self_time(tmp_path):
    """A CPU run's trace: its operators' self times, which nest (aten::conv2d holds
    aten::convolution), add up to no more than the traced steps took."""
    result = run_train("--arch", "resnet18", "--num_classes", "4", "--data_source", "generated",
                       "--generated_classes", "4", "--generated_train_images", "64",
                       "--generated_val_images", "16", "--image_size", "32", "--batch_size", "16",
                       "--epochs", "1", "--warmup_epochs", "0", "--device", "cpu",
                       "--profile_steps", "2", "--profile_first_step", "2",
                       "--output_dir", tmp_path)
    assert result.returncode == 0, result.stderr
    trace = tmp_path / "profile" / "rank0.2.pt.trace.json"
    steps_us = sum(e["dur"] for e in json.loads(trace.read_text())["traceEvents"]
                   if re.fullmatch(r"step \d+", str(e.get("name"))))
    out = summarise(trace, "--top", "5")
    header = re.search(r"2 traced step\(s\); host operators \(self time\): \d+ \(\d+ a step\), "
                       r"([\d.]+) ms", out)
    assert header, out
    assert 0 < float(header[1]) * 1000 <= steps_us
    assert "convolution" in out and "aten::convolution_backward" in out
    assert len(re.findall(r"^\s+[\d.]+ ms ", out, re.M)) == 5


def test_a_file_that_is_not_a_trace_is_named():
    result = subprocess.run([sys.executable, SCRIPT, SCRIPT], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert f"cannot read {SCRIPT} as a trace" in result.stderr
