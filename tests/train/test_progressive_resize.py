"""Progressive resizing and FixRes through the `train` binary on small generated data: each
epoch trains at the size FFCV's schedule gives, the size is logged when it changes and recorded in
metrics.jsonl, and a run stopped and resumed in the middle of the schedule trains every step at
the size a run that never stopped would."""
import json

from conftest import run_train

EPOCHS, STEPS_PER_EPOCH = 3, 2
MIN, MAX, START, END, STEP = 32, 64, 1, 2, 32
ARGS = ["--arch", "resnet18", "--num_classes", "4", "--data_source", "generated",
        "--generated_classes", "4", "--generated_train_images", "16",
        "--generated_val_images", "8", "--image_size", "32", "--val_image_size", "48",
        "--batch_size", "8", "--epochs", EPOCHS, "--warmup_epochs", "0",
        "--log_every_steps", "1", "--eval_every_epochs", "0", "--device", "cpu",
        "--progressive_resize_min_size", MIN, "--progressive_resize_max_size", MAX,
        "--progressive_resize_start_epoch", START, "--progressive_resize_end_epoch", END,
        "--progressive_resize_step", STEP]


def ffcv_size(epoch):
    """FFCV's get_resolution (0-based epochs); Python's round(), like np.round, takes a tie to the
    even integer."""
    if epoch <= START:
        return MIN
    if epoch >= END:
        return MAX
    ramp = MIN + (MAX - MIN) * (epoch - START) / (END - START)
    return round(ramp / STEP) * STEP


def sizes_by_step(output_dir):
    """{step: (1-based epoch, training crop)} from metrics.jsonl's train records."""
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["epoch"], r["image_size"]) for r in records if r["event"] == "train"}


def run(output_dir, *extra):
    """Runs `train` with ARGS into `output_dir`; returns its log."""
    result = run_train(*ARGS, "--output_dir", output_dir, *extra, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    return out


def test_resumed_mid_schedule_trains_each_epoch_at_the_same_size(tmp_path):
    # Steps 1-5 uninterrupted, through the change to 64 px at epoch 3 (0-based 2), then stopped
    # after that epoch's first step and resumed for its second.
    first = run(tmp_path, "--max_steps", 5)
    assert "epoch 1: training crop 32 px (progressive resizing 32 -> 64 px, epochs 2-3)" in first
    assert "epoch 3: training crop 32 -> 64 px" in first, first
    assert max(sizes_by_step(tmp_path)) == 5
    second = run(tmp_path)
    assert "epoch 3, image 8 of 16, step 5" in second, second
    assert "epoch 3: training crop 64 px" in second, second  # the size at once, not image_size's
    assert "final: top-1" in second  # evaluated at val_image_size

    # Every step at its epoch's size by FFCV's formula: what a run that never stopped trains.
    assert [ffcv_size(e) for e in range(EPOCHS)] == [32, 32, 64]
    assert sizes_by_step(tmp_path) == {e * STEPS_PER_EPOCH + s + 1: (e + 1, ffcv_size(e))
                                       for e in range(EPOCHS) for s in range(STEPS_PER_EPOCH)}
