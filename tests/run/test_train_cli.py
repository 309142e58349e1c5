"""The `train` binary as a user runs it: --help, clear errors with exit status 2 for bad input,
a short CPU run's outputs (checkpoint readable by torch.load and torchvision, metrics, resolved
config), auto-resume, and SIGTERM handling."""
import json
import re
import signal
import subprocess
import time

import pytest
import torch
import torchvision

from conftest import binary, run_train

SMALL = ["--arch", "resnet18", "--num_classes", "4", "--data_source", "generated",
         "--generated_classes", "4", "--generated_train_images", "64",
         "--generated_val_images", "16", "--image_size", "32", "--batch_size", "16",
         "--epochs", "2", "--warmup_epochs", "0", "--log_every_steps", "2", "--device", "cpu"]


def output(result):
    return result.stdout + result.stderr


def test_help_lists_keys_with_defaults():
    result = run_train("--help")
    assert result.returncode == 0
    for key in ["--batch_size INT=256", "--precision TEXT=fp32", "--optimizer TEXT=sgd",
                "--lr_schedule TEXT=cosine", "--resume TEXT=auto", "--benchmark"]:
        assert key in result.stdout


@pytest.mark.parametrize("args,key", [
    (["--batch_size", "0"], "batch_size"),
    (["--precision", "fp8"], "precision"),
    (["--base_lr", "-1"], "base_lr"),
    (["--epochs", "5", "--warmup_epochs", "6"], "warmup_epochs"),
    (["--no_such_key", "1"], "no_such_key"),
    (["--trainable", "backbone"], "trainable"),
    (["--global_batch", "-8"], "global_batch"),
    # One image per rank at 32 px: batch norm cannot train (the micro-batch shrinks to fit).
    (["--global_batch", "1", "--image_size", "32"], "global_batch"),
    (["--evaluate_only", "true"], "evaluate_only"),  # synthetic data has no held-out split
    (["--evaluate_only", "true", "--data_source", "tfrecord"], "val_data"),
    (["--profile_steps", "-1"], "profile_steps"),
    (["--profile_first_step", "0"], "profile_first_step"),
])
def test_bad_values_exit_2_naming_the_key(args, key):
    result = run_train(*args)
    assert result.returncode == 2, output(result)
    assert key in output(result)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_missing_gpu_is_a_clear_error(tmp_path):
    result = run_train(*SMALL, "--device", "cuda", "--output_dir", tmp_path)
    assert result.returncode == 2
    assert "no CUDA device is visible" in output(result)


def test_fp16_on_cpu_is_rejected(tmp_path):
    result = run_train(*SMALL, "--precision", "fp16", "--output_dir", tmp_path)
    assert result.returncode == 2
    assert "fp16 needs a GPU" in output(result)


def test_unwritable_output_dir_is_a_clear_error():
    result = run_train(*SMALL, "--output_dir", "/proc/no/such/dir")
    assert result.returncode == 2
    assert "output_dir" in output(result)


def test_run_writes_checkpoint_metrics_and_config(tmp_path):
    result = run_train(*SMALL, "--output_dir", tmp_path)
    assert result.returncode == 0, output(result)
    assert "final: top-1" in output(result)

    checkpoints = sorted((tmp_path / "checkpoints").glob("checkpoint-*.pt"))
    assert [c.name for c in checkpoints] == ["checkpoint-000000004.pt", "checkpoint-000000008.pt"]
    ckpt = torch.load(checkpoints[-1])  # PyTorch's default: weights_only=True
    assert ckpt["step"] == 8 and ckpt["epoch"] == 2
    assert 'arch = "resnet18"' in ckpt["config"]
    assert set(ckpt["optimizer"]) == {f"momentum_buffer.{n}" for n in ckpt["model"] if
                                      not n.endswith(("running_mean", "running_var",
                                                      "num_batches_tracked"))}
    net = torchvision.models.resnet18(num_classes=4)
    net.load_state_dict(ckpt["model"], strict=True)

    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in events if e["event"] == "train"]
    assert [e["step"] for e in train] == [2, 4, 6, 8]
    assert all(e["loss"] > 0 and e["images_per_s"] > 0 for e in train)
    assert [e["epoch"] for e in events if e["event"] == "eval"] == [1, 2]

    # The resolved configuration is a valid config file that reproduces the run's settings.
    again = run_train("--config", tmp_path / "config.toml", "--output_dir", tmp_path / "again",
                      "--max_steps", "1")
    assert again.returncode == 0, output(again)


def test_profile_steps_write_a_trace_of_those_steps_and_their_phases(tmp_path):
    """profile_steps: a Chrome trace of exactly the steps asked for (8 steps run, 3 and 4 traced),
    each holding its phases, in the file name TensorBoard's profiler plugin reads."""
    result = run_train(*SMALL, "--profile_steps", "2", "--profile_first_step", "3",
                       "--output_dir", tmp_path)
    assert result.returncode == 0, output(result)
    trace = json.loads((tmp_path / "profile" / "rank0.3.pt.trace.json").read_text())
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = {e["name"]: e for e in events if re.fullmatch(r"step \d+", e.get("name", ""))}
    assert sorted(steps) == ["step 3", "step 4"]
    for name in ["input wait", "forward", "backward", "optimizer"]:
        phases = [e for e in events if e.get("name") == name]
        assert len(phases) == 2, name
        for phase, step in zip(sorted(phases, key=lambda e: e["ts"]), ["step 3", "step 4"]):
            assert steps[step]["ts"] <= phase["ts"], (name, step)
            assert phase["ts"] + phase["dur"] <= steps[step]["ts"] + steps[step]["dur"], (name, step)
    # The model's own ops are in it too (a convolution's backward, say).
    assert any("convolution" in e.get("name", "") for e in events)


def test_auto_resume_continues_from_the_newest_checkpoint(tmp_path):
    first = run_train(*SMALL, "--output_dir", tmp_path, "--max_steps", "3",
                      "--checkpoint_every_steps", "3")
    assert first.returncode == 0, output(first)
    second = run_train(*SMALL, "--output_dir", tmp_path)
    assert second.returncode == 0, output(second)
    assert re.search(r"resumed from \S+: epoch 1, image 48 of 64, step 3\n", output(second))
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text()
             .splitlines() if '"train"' in line]
    assert steps == [2, 3, 4, 6, 8]


def test_sigterm_writes_a_checkpoint_and_stops(tmp_path):
    proc = subprocess.Popen([binary("train"), *SMALL, "--epochs", "200", "--output_dir",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.time() + 300
    for line in proc.stdout:  # wait until training is under way
        if "step 2/" in line or time.time() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, rest
    assert "checkpointing" in rest
    assert list((tmp_path / "checkpoints").glob("checkpoint-*.pt"))
