"""TensorBoard output of a short CPU run, read by TensorBoard's own loader: every scalar of every
metrics.jsonl event at its step and value; the training and evaluation input pictures, decoded,
at the configured size and in the right colours; the resolved config as text; a resumed run's
curves continuing where the first stopped; everything written before a SIGTERM stop kept; and
the log line's progress and time left. The `tensorboard` key turns it off."""
import io
import json
import re
import signal
import subprocess
import time

import pytest

from conftest import binary, run_train

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard package is missing: run scripts/setup.sh")
Image = pytest.importorskip("PIL.Image")

SMALL = ["--arch", "resnet18", "--num_classes", "4", "--data_source", "generated",
         "--generated_classes", "4", "--generated_train_images", "64",
         "--generated_val_images", "16", "--image_size", "32", "--batch_size", "16",
         "--epochs", "2", "--warmup_epochs", "0", "--log_every_steps", "2", "--device", "cpu"]


def load(folder):
    accumulator = event_accumulator.EventAccumulator(
        str(folder), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0,
                                    event_accumulator.TENSORS: 0})
    return accumulator.Reload()


def metrics(output_dir):
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def test_every_metric_is_a_scalar_at_its_step(tmp_path):
    result = run_train(*SMALL, "--output_dir", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    runs = load(tmp_path / "tensorboard")
    tags = runs.Tags()["scalars"]
    expected = {}
    for event in metrics(tmp_path):
        for key, value in event.items():
            if key in ("event", "time", "step") or not isinstance(value, (int, float)):
                continue
            expected.setdefault(f"{event['event']}/{key}", []).append((event.get("step", 0), value))
    for tag in ["train/loss", "train/lr", "train/images_per_s", "train/image_size",
                "train/loss_scale", "train/input_wait_ms", "train/compute_spread_ms",
                "train/skipped_steps", "train/bad_records", "train/epoch_progress",
                "train/seconds_left", "eval/top1", "eval/top5", "startup/seconds_to_first_step",
                "startup/bytes_read"]:
        assert tag in tags, f"{tag} missing from {sorted(tags)}"
    assert sorted(tags) == sorted(expected)
    for tag, points in expected.items():
        got = [(s.step, s.value) for s in runs.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], tag
        for (_, value), (_, want) in zip(got, points):
            assert value == pytest.approx(want, rel=1e-6, abs=1e-6), tag  # stored as float32
    assert [s.step for s in runs.Scalars("train/loss")] == [2, 4, 6, 8]


def test_input_pictures_and_config(tmp_path):
    result = run_train(*SMALL, "--output_dir", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    runs = load(tmp_path / "tensorboard")
    train = runs.Images("input/train")
    assert [i.step for i in train] == [0, 4]  # the start of each epoch
    assert [i.step for i in runs.Images("input/eval")] == [4]  # once, at the first evaluation
    for image in [*train, *runs.Images("input/eval")]:
        picture = Image.open(io.BytesIO(image.encoded_image_string))
        assert picture.mode == "RGB"
        assert picture.size == (image.width, image.height) == (8 * 32, 2 * 32)  # 16 crops
    text = runs.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert "arch = \"resnet18\"" in text and "batch_size = 16" in text


def test_preview_colours_are_the_images_colours(tmp_path):
    # Synthetic data is one fixed batch of random pixels: the preview must show those pixels
    # again (denormalised, RGB, not BGR), whatever normalisation the model saw.
    result = run_train(*SMALL, "--data_source", "synthetic", "--synthetic_batches_per_epoch", "2",
                       "--output_dir", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    first = load(tmp_path / "tensorboard").Images("input/train")[0]
    picture = Image.open(io.BytesIO(first.encoded_image_string))
    import numpy as np
    import torch
    generator = torch.Generator().manual_seed(42)  # SyntheticSource's draw, with the config seed
    # batch_size + 1 rows: room for the largest share of a step (data/sources/synthetic_source.cpp)
    pixels = torch.randint(0, 256, (17, 32, 32, 3), generator=generator, dtype=torch.uint8)
    tile = np.asarray(picture)[16:32, 0:32]  # the first image, below its label's corner box
    assert np.abs(tile.astype(int) - pixels[0, 16:32].numpy().astype(int)).max() <= 1


def test_a_resumed_run_continues_the_curves(tmp_path):
    first = run_train(*SMALL, "--max_steps", "3", "--checkpoint_every_steps", "3",
                      "--output_dir", tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    second = run_train(*SMALL, "--output_dir", tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    runs = load(tmp_path / "tensorboard")
    assert [s.step for s in runs.Scalars("train/loss")] == [2, 3, 4, 6, 8]
    losses = [e["loss"] for e in metrics(tmp_path) if e["event"] == "train"]
    assert [s.value for s in runs.Scalars("train/loss")] == pytest.approx(losses, rel=1e-6)


def test_progress_and_time_left_in_the_log(tmp_path):
    result = run_train(*SMALL, "--output_dir", tmp_path)
    out = result.stdout + result.stderr
    assert re.search(r"epoch 1/2 \(50%\) step 2/8 \|.* \| \d+(m\d\ds|s) left", out), out
    assert "epoch 2/2 (100%) step 8/8" in out
    last = [e for e in metrics(tmp_path) if e["event"] == "train"][-1]
    assert last["epoch_progress"] == 1.0 and last["seconds_left"] == 0


def test_the_key_turns_it_off(tmp_path):
    result = run_train(*SMALL, "--tensorboard", "false", "--output_dir", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "tensorboard").exists()


def test_a_sigterm_stop_keeps_what_was_written(tmp_path):
    # No log interval comes before the stop: what reaches the file is what the stop flushed.
    args = [*SMALL, "--epochs", "50", "--log_every_steps", "1000", "--checkpoint_every_steps", "2",
            "--output_dir", tmp_path]
    proc = subprocess.Popen([str(binary("train")), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while not (tmp_path / "checkpoints" / "checkpoint-000000002.pt").exists():
            assert proc.poll() is None and time.time() < deadline, "no checkpoint at step 2"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out
    # The signal lands a step or more after checkpoint 2 appears (on a loaded machine past step 4,
    # where epoch 2's preview is made): every epoch's preview made before the stop is kept.
    stopped_at = int(re.search(r"checkpointing at step (\d+) and stopping", out).group(1))
    steps_per_epoch = 64 // 16
    runs = load(tmp_path / "tensorboard")
    assert [i.step for i in runs.Images("input/train")] == list(range(0, stopped_at,
                                                                        steps_per_epoch))
    assert "startup/seconds_to_first_step" in runs.Tags()["scalars"]
    assert "config" in runs.Tags()["tensors"]
