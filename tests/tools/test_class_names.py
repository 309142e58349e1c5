"""Class names from the data to the exported model, from the outside: index-tfrecords writes
synsets.txt from records that name their classes; a run on records with synsets.txt beside them
keeps the names in its checkpoint (torch.load, weights_only=True); evaluate_only logs the worst
classes by name and refuses data whose names are in another order, naming the first difference;
scripts/export.py lists the classes in logit order in preprocessing.json."""
import json
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, binary, run_train

CLASSES = 4
NAMES = [f"class_{i:03d}" for i in range(CLASSES)]  # generate-dataset's image/class/synset


def run(name, *args):
    return subprocess.run([str(binary(name)), *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def output(result):
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """Generated TFRecords, synsets.txt written beside them by index-tfrecords, and a run of a
    few steps on them."""
    root = tmp_path_factory.mktemp("names")
    data = root / "data"
    result = run("generate-dataset", "--tfrecords", data, "--classes", CLASSES,
                 "--images-per-class", 8, "--val-per-class", 4, "--width", 48, "--height", 40,
                 "--train-shards", 1, "--val-shards", 1)
    assert result.returncode == 0, output(result)
    (data / "synsets.txt").unlink(missing_ok=True)  # written by index-tfrecords below
    result = run("index-tfrecords", data / "*-of-*")
    assert result.returncode == 0, output(result)
    assert (data / "synsets.txt").read_text().splitlines() == [f"{n} {n}" for n in NAMES]
    run_dir = root / "run"
    result = run_train(*train_args(data, run_dir), "--max_steps", 2)
    assert result.returncode == 0, output(result)
    assert f"class names: {CLASSES} classes from {data / 'synsets.txt'}" in output(result)
    checkpoint = sorted((run_dir / "checkpoints").glob("checkpoint-*.pt"))[-1]
    return {"root": root, "data": data, "checkpoint": checkpoint}


def train_args(data, output_dir, val_data=None):
    return ["--arch", "resnet18", "--num_classes", CLASSES, "--data_source", "tfrecord",
            "--train_data", data / "train-*", "--val_data", val_data or data / "validation-*",
            "--image_size", 32, "--val_resize", 36, "--batch_size", 8, "--warmup_epochs", 0,
            "--device", "cpu", "--decode_threads", 1, "--reader_threads", 1,
            "--tensorboard", "false", "--output_dir", output_dir]


def evaluate(checkpoint, val_data, output_dir, *extra):
    return run_train(*train_args(val_data.parent, output_dir, val_data), "--evaluate_only",
                     "true", "--init_weights", checkpoint, *extra)


def test_the_checkpoint_carries_the_names(named):
    saved = torch.load(named["checkpoint"], weights_only=True)
    assert saved["class_synsets"] == NAMES
    assert saved["class_texts"] == NAMES  # generate-dataset's image/class/text


def test_evaluate_only_logs_the_worst_classes_by_name(named, tmp_path):
    result = evaluate(named["checkpoint"], named["data"] / "validation-*", tmp_path / "eval")
    assert result.returncode == 0, output(result)
    line = next(l for l in output(result).splitlines() if "lowest top-1 by class" in l)
    # Every class has 4 held-out images; the five worst of four classes are all four, named.
    for index, name in enumerate(NAMES):
        assert f"{index} {name} ({name}) " in line, line
    assert "/4)" in line


def test_a_reordered_synsets_file_stops_evaluate_only_naming_the_first_mismatch(named, tmp_path):
    val = tmp_path / "val"
    val.mkdir()
    for path in named["data"].glob("validation-*"):
        shutil.copy(path, val / path.name)
    reordered = [NAMES[0], NAMES[2], NAMES[1], NAMES[3]]
    (val / "synsets.txt").write_text("".join(f"{n} {n}\n" for n in reordered))
    result = evaluate(named["checkpoint"], val / "validation-*", tmp_path / "eval")
    assert result.returncode == 2, output(result)
    assert (f"class 1 of the weights in {named['checkpoint']} is class_001 (class_001) but "
            f"class 1 of the data is class_002 (class_002) ({val / 'synsets.txt'})"
            in output(result))


def test_a_names_file_of_another_class_count_is_refused(named, tmp_path):
    short = tmp_path / "three.txt"
    short.write_text("".join(f"{n}\n" for n in NAMES[:3]))
    result = evaluate(named["checkpoint"], named["data"] / "validation-*", tmp_path / "eval",
                      "--class_names_file", short)
    assert result.returncode == 2, output(result)
    assert f"{short} (class_names_file) names 3 classes but num_classes = 4" in output(result)


def test_export_lists_the_classes_in_logit_order(named, tmp_path):
    result = subprocess.run([sys.executable, ROOT / "scripts/export.py", named["checkpoint"],
                             tmp_path / "model"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, output(result)
    spec = json.loads((tmp_path / "model" / "preprocessing.json").read_text())
    assert spec["classes"] == [{"index": i, "synset": n, "name": n} for i, n in enumerate(NAMES)]
    assert "logits[:, i] is classes[i]" in spec["output"]


def write_imagenet_records(tf, path, classes):
    """Records as TensorFlow's build_imagenet_data.py writes them: (label, synset, text) each."""
    jpeg = tf.io.encode_jpeg(tf.zeros([8, 8, 3], tf.uint8)).numpy()

    def feature(value):
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))

    with tf.io.TFRecordWriter(str(path)) as writer:
        for label, synset, text in classes:
            example = tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                "image/class/label": feature(label), "image/class/synset": feature(synset),
                "image/class/text": feature(text), "image/height": feature(8),
                "image/width": feature(8)}))
            writer.write(example.SerializeToString())


def test_index_tfrecords_writes_synsets_from_the_records(tf, tmp_path):
    write_imagenet_records(tf, tmp_path / "train-00000-of-00002", [
        (2, "n01443537", "goldfish, Carassius auratus"), (1, "n01440764", "tench, Tinca tinca")])
    write_imagenet_records(tf, tmp_path / "train-00001-of-00002", [
        (3, "n01484850", "great white shark"), (1, "n01440764", "tench, Tinca tinca")])
    result = run("index-tfrecords", tmp_path / "train-*")
    assert result.returncode == 0, output(result)
    assert (tmp_path / "synsets.txt").read_text().splitlines() == [
        "n01440764 tench, Tinca tinca", "n01443537 goldfish, Carassius auratus",
        "n01484850 great white shark"]  # line 1: the lowest label


def test_index_tfrecords_refuses_a_label_naming_two_synsets(tf, tmp_path):
    write_imagenet_records(tf, tmp_path / "train-00000-of-00001", [
        (1, "n01440764", "tench"), (2, "n01443537", "goldfish"), (1, "n01484850", "shark")])
    result = run("index-tfrecords", tmp_path / "train-*")
    assert result.returncode == 2, output(result)
    first = tmp_path / "train-00000-of-00001"
    assert f"label 1 names two classes: n01440764 in {first} at byte 0 and n01484850" in \
        output(result)
    assert not (tmp_path / "synsets.txt").exists()
