"""TensorFlow Datasets' ImageNet records (`image`, `label` 0-based, `file_name`; files named
`imagenet2012-train.tfrecord-00000-of-00002`), written by TensorFlow itself, train, evaluate and
verify exactly as the same images in TensorFlow's layout (`image/encoded`, `image/class/label`
1-based): the layout and the label base detected from the first record. Records of neither
layout stop with an error naming what they hold."""
import json
import subprocess

import pytest

from conftest import binary, run_train

CLASSES, TRAIN_PER_CLASS, VAL_PER_CLASS = 4, 8, 3


def images(tf, split):
    """(label 0-based, JPEG bytes, file name) of a split: each class its own colour, plus noise,
    so that a few steps learn something."""
    import numpy as np
    rng = np.random.default_rng(0 if split == "train" else 1)
    colours = np.array([[200, 30, 30], [30, 200, 30], [30, 30, 200], [200, 200, 30]])
    out = []
    for i in range((TRAIN_PER_CLASS if split == "train" else VAL_PER_CLASS) * CLASSES):
        label = i % CLASSES
        pixels = np.clip(colours[label] + rng.integers(-40, 40, (40, 48, 3)), 0, 255)
        jpeg = tf.io.encode_jpeg(pixels.astype(np.uint8), quality=90).numpy()
        out.append((label, jpeg, f"n{label:08d}_{i}.JPEG"))
    return out


def write(tf, path, examples):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for features in examples:
            writer.write(tf.train.Example(
                features=tf.train.Features(feature=features)).SerializeToString())


def feature(tf, value):
    if isinstance(value, int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


@pytest.fixture(scope="module")
def datasets(tf, tmp_path_factory):
    """The same images in both layouts, each with its own file names: {"tensorflow": folder,
    "tfds": folder}, two training shards and one validation shard each."""
    root = tmp_path_factory.mktemp("layouts")
    for layout in ("tensorflow", "tfds"):
        (root / layout).mkdir()
    for split, shards in (("train", 2), ("validation", 1)):
        rows = images(tf, "train" if split == "train" else "val")
        for shard in range(shards):
            part = rows[shard::shards]
            write(tf, root / "tensorflow" / f"{split}-{shard:05d}-of-{shards:05d}",
                  [{"image/encoded": feature(tf, jpeg), "image/class/label": feature(tf, label + 1),
                    "image/filename": feature(tf, name.encode()),
                    "image/format": feature(tf, b"JPEG")} for label, jpeg, name in part])
            tfds_name = f"imagenet2012-{split}.tfrecord-{shard:05d}-of-{shards:05d}"
            write(tf, root / "tfds" / tfds_name,
                  [{"image": feature(tf, jpeg), "label": feature(tf, label),
                    "file_name": feature(tf, name.encode())} for label, jpeg, name in part])
    return {"tensorflow": root / "tensorflow", "tfds": root / "tfds"}


def globs(folder):
    if (folder / "train-00000-of-00002").exists():
        return folder / "train-*", folder / "validation-*"
    return folder / "imagenet2012-train.tfrecord-*", folder / "imagenet2012-validation.tfrecord-*"


COMMON = ["--arch", "resnet18", "--num_classes", CLASSES, "--data_source", "tfrecord",
          "--image_size", 32, "--val_resize", 36, "--batch_size", 8, "--device", "cpu",
          "--decode_threads", 2, "--seed", 3]


def events(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def test_tfds_records_train_and_evaluate_as_tensorflows_layout(datasets, tmp_path):
    runs = {}
    for layout, folder in datasets.items():
        train, val = globs(folder)
        out = tmp_path / layout
        result = run_train(*COMMON, "--train_data", train, "--val_data", val, "--epochs", 2,
                           "--warmup_epochs", 0, "--log_every_steps", 1, "--output_dir", out,
                           "--resume", "none")
        log = result.stdout + result.stderr
        assert result.returncode == 0, log
        # Each split's layout from its own first record, and the label base with it.
        assert f"training records: {layout} layout (from the first record), label_offset " \
               f"{1 if layout == 'tensorflow' else 0}" in log, log
        assert f"evaluation records: {layout} layout (from the first record)" in log, log
        runs[layout] = out
    # The same images and labels, batch for batch: the same losses step by step, and the same
    # held-out accuracy. A label base off by one would train other targets (and drop class 0's
    # or the last class's records as out of range).
    losses = {layout: [e["loss"] for e in events(out, "train")] for layout, out in runs.items()}
    assert len(losses["tfds"]) == 8
    assert losses["tfds"] == pytest.approx(losses["tensorflow"], rel=1e-5)
    evals = {layout: events(out, "eval")[-1] for layout, out in runs.items()}
    assert evals["tfds"]["images"] == evals["tensorflow"]["images"] == CLASSES * VAL_PER_CLASS
    assert evals["tfds"]["top1"] == evals["tensorflow"]["top1"]
    assert evals["tfds"]["top5"] == evals["tensorflow"]["top5"]

    # The same weights evaluated alone on either layout: the same accuracy.
    checkpoint = sorted((runs["tensorflow"] / "checkpoints").glob("checkpoint-*.pt"))[-1]
    alone = {}
    for layout, folder in datasets.items():
        out = tmp_path / f"eval-{layout}"
        result = run_train(*COMMON, "--evaluate_only", "true", "--init_weights", checkpoint,
                           "--val_data", globs(folder)[1], "--output_dir", out)
        assert result.returncode == 0, result.stdout + result.stderr
        alone[layout] = events(out, "eval")[-1]
    assert alone["tfds"]["images"] == CLASSES * VAL_PER_CLASS
    assert (alone["tfds"]["top1"], alone["tfds"]["top5"]) == \
        (alone["tensorflow"]["top1"], alone["tensorflow"]["top5"])
    assert alone["tfds"]["top1"] == evals["tensorflow"]["top1"]  # as at the end of training


def test_a_layout_named_wrongly_makes_every_record_bad(datasets, tmp_path):
    train, val = globs(datasets["tfds"])
    result = run_train(*COMMON, "--train_data", train, "--val_data", val, "--max_steps", 1,
                       "--record_layout", "tensorflow", "--bad_record_policy", "fail",
                       "--output_dir", tmp_path / "run", "--resume", "none")
    assert result.returncode != 0
    assert "missing feature image/encoded (record_layout = tensorflow)" in \
        result.stdout + result.stderr


def tool(name, *args):
    return subprocess.run([str(binary(name)), *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_the_data_tools_read_tfds_records(datasets):
    files, _ = globs(datasets["tfds"])  # a glob, which the tools expand (index files aside)
    result = tool("verify-tfrecords", files, "--num-classes", CLASSES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "record layout tfds, stored labels from 0" in result.stdout
    assert f"{CLASSES * TRAIN_PER_CLASS} intact records, {CLASSES} classes" in result.stdout
    # Given TensorFlow's label base, the stored 0 is out of range: the default follows the layout.
    result = tool("verify-tfrecords", files, "--num-classes", CLASSES, "--label-offset", 1)
    assert result.returncode == 1 and "label 0 outside [1, 5)" in result.stdout, result.stdout
    # bench-input: a label out of range would be a bad record, and every bad record is an error.
    result = tool("bench-input", files, "--num-classes", CLASSES, "--threads", 1,
                  "--transforms", "val", "--images", 16, "--warmup-images", 8, "--batch-size", 8,
                  "--image-size", 32, "--val-resize", 36)
    assert result.returncode == 0, result.stdout + result.stderr


def test_records_of_neither_layout_are_a_clear_error(tf, tmp_path):
    data = tmp_path / "other"
    data.mkdir()
    write(tf, data / "train-00000-of-00001",
          [{"jpeg": feature(tf, b"\xff\xd8"), "class_id": feature(tf, 3)}] * 16)
    result = run_train(*COMMON, "--train_data", data / "train-*", "--max_steps", 1,
                       "--output_dir", tmp_path / "run", "--resume", "none")
    log = result.stdout + result.stderr
    assert result.returncode == 2, log
    for part in (str(data / "train-00000-of-00001"), "class_id (int64), jpeg (bytes)",
                 "image/encoded + image/class/label", "image + label",
                 "set record_layout = tensorflow or tfds"):
        assert part in log, log
    result = tool("verify-tfrecords", data / "train-00000-of-00001")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "set --record-layout = tensorflow or tfds" in result.stderr, result.stderr


def test_label_offset_below_the_layouts_default_is_refused(datasets, tmp_path):
    train, _ = globs(datasets["tfds"])
    result = run_train(*COMMON, "--train_data", train, "--label_offset", -2, "--output_dir",
                       tmp_path / "run", "--resume", "none")
    log = result.stdout + result.stderr
    assert result.returncode == 2, log
    assert "'label_offset' = -2" in log and "-1: the record layout's" in log, log
    result = run_train(*COMMON, "--train_data", train, "--record_layout", "tfds2", "--output_dir",
                       tmp_path / "run", "--resume", "none")
    assert result.returncode == 2
    assert "use one of: auto, tensorflow, tfds" in result.stdout + result.stderr
