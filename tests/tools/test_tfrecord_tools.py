"""The TFRecord tools and pipeline from the outside: records written by TensorFlow itself read
back identically; the converter's output verifies, round-trips labels and bytes (and reads in
TensorFlow); damage makes verify-tfrecords exit 1; `train` runs on generated TFRecords."""
import pathlib
import subprocess

import pytest

from conftest import binary, run_train


def run(name, *args, check=True):
    result = subprocess.run([str(binary(name)), *map(str, args)], capture_output=True, text=True,
                            timeout=300)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return format(h, "x")


def read_dump(path):
    rows = []
    for line in pathlib.Path(path).read_text().splitlines():
        file, index, label, height, width, filename, size, digest = line.split("\t")
        rows.append(dict(file=file, index=int(index), label=int(label), height=int(height),
                         width=int(width), filename=filename, size=int(size), digest=digest))
    return rows


def test_records_written_by_tensorflow_read_back_identically(tf, tmp_path):
    import numpy as np
    rng = np.random.default_rng(0)
    expected, offsets = [], {}
    for shard in range(2):
        path = tmp_path / f"train-{shard:05d}-of-00002"
        offsets[str(path)] = []
        offset = 0
        with tf.io.TFRecordWriter(str(path)) as writer:
            for i in range(7):
                h, w = int(rng.integers(20, 60)), int(rng.integers(20, 60))
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                jpeg = tf.io.encode_jpeg(pixels, quality=90).numpy()
                label = int(rng.integers(1, 1001))
                feature = {
                    "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                    "image/class/label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[label])),
                    "image/height": tf.train.Feature(int64_list=tf.train.Int64List(value=[h])),
                    "image/width": tf.train.Feature(int64_list=tf.train.Int64List(value=[w])),
                    "image/filename": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[f"img{shard}_{i}.JPEG".encode()])),
                    "image/object/bbox/xmin": tf.train.Feature(
                        float_list=tf.train.FloatList(value=[0.1, 0.2])),
                }
                payload = tf.train.Example(
                    features=tf.train.Features(feature=feature)).SerializeToString()
                writer.write(payload)
                offsets[str(path)].append((offset, len(payload) + 16))
                offset += len(payload) + 16
                expected.append(dict(file=str(path), index=i, label=label, height=h, width=w,
                                     filename=f"img{shard}_{i}.JPEG", size=len(jpeg),
                                     digest=fnv1a64(jpeg)))
    dump = tmp_path / "dump.tsv"
    result = run("verify-tfrecords", tmp_path / "train-*", "--dump", dump, "--threads", 1)
    assert "14 intact records" in result.stdout and "OK" in result.stdout
    assert read_dump(dump) == expected
    run("index-tfrecords", tmp_path / "train-*")
    for path, entries in offsets.items():
        lines = pathlib.Path(path + ".idx").read_text().split("\n")[:-1]
        assert lines == [f"{o} {s}" for o, s in entries]  # DALI's tfrecord2idx format


def test_converter_round_trips_labels_and_bytes(tmp_path):
    folder, out = tmp_path / "folder", tmp_path / "records"
    run("generate-dataset", "--image-folder", folder, "--classes", 3, "--images-per-class", 4,
        "--width", 64, "--height", 48)
    run("make-tfrecords", folder, out, "--shards", 3, "--threads", 2, "--prefix", "validation")
    shards = sorted(out.glob("validation-*-of-00003"))
    assert [s.name for s in shards] == [f"validation-{i:05d}-of-00003" for i in range(3)]
    assert all(pathlib.Path(str(s) + ".idx").exists() for s in shards)
    dump = tmp_path / "dump.tsv"
    result = run("verify-tfrecords", out, "--num-classes", 3, "--dump", dump)
    assert "12 intact records, 3 classes, 0 problems" in result.stdout
    rows = read_dump(dump)
    classes = sorted(p.name for p in folder.iterdir())
    originals = {}
    for label, name in enumerate(classes, start=1):
        for image in (folder / name).iterdir():
            originals[image.name, label] = image.read_bytes()
    assert len(rows) == len(originals) == 12
    for row in rows:
        data = originals.pop((row["filename"], row["label"]))  # right label for the file
        assert row["size"] == len(data) and row["digest"] == fnv1a64(data)
    assert not originals


def test_converter_output_reads_in_tensorflow(tf, tmp_path):
    folder, out = tmp_path / "folder", tmp_path / "records"
    run("generate-dataset", "--image-folder", folder, "--classes", 2, "--images-per-class", 3,
        "--width", 40, "--height", 30)
    run("make-tfrecords", folder, out, "--shards", 1)
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64),
            "image/class/synset": tf.io.FixedLenFeature([], tf.string),
            "image/height": tf.io.FixedLenFeature([], tf.int64),
            "image/width": tf.io.FixedLenFeature([], tf.int64),
            "image/filename": tf.io.FixedLenFeature([], tf.string),
            "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32)}
    seen = 0
    for record in tf.data.TFRecordDataset(str(out / "train-00000-of-00001")):
        example = tf.io.parse_single_example(record, spec)
        synset = example["image/class/synset"].numpy().decode()
        name = example["image/filename"].numpy().decode()
        original = (folder / synset / name).read_bytes()
        assert example["image/encoded"].numpy() == original
        assert example["image/class/label"].numpy() == sorted(["class_000", "class_001"]).index(
            synset) + 1
        image = tf.io.decode_jpeg(example["image/encoded"])
        assert image.shape[0] == example["image/height"] and image.shape[1] == example["image/width"]
        seen += 1
    assert seen == 6


def test_verify_reports_damage_with_exit_1(tmp_path):
    run("generate-dataset", "--tfrecords", tmp_path, "--classes", 2, "--images-per-class", 3,
        "--width", 40, "--height", 30, "--train-shards", 1)
    shard = tmp_path / "train-00000-of-00001"
    data = bytearray(shard.read_bytes())
    data[300] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = run("verify-tfrecords", shard, "--num-classes", 2, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "PROBLEM" in result.stdout and "CRC" in result.stdout and "DAMAGED" in result.stdout
    result = run("verify-tfrecords", tmp_path / "nothing-*", check=False)
    assert result.returncode == 2 and "matches no TFRecord file" in result.stderr


def test_train_runs_on_generated_tfrecords(tmp_path):
    data = tmp_path / "data"
    run("generate-dataset", "--tfrecords", data, "--classes", 4, "--images-per-class", 8,
        "--val-per-class", 3, "--width", 64, "--height", 48, "--train-shards", 3,
        "--val-shards", 2)
    result = run_train("--arch", "resnet18", "--num_classes", 4, "--data_source", "tfrecord",
                       "--train_data", data / "train-*", "--val_data", data / "validation-*",
                       "--image_size", 32, "--val_resize", 36, "--batch_size", 8, "--epochs", 2,
                       "--warmup_epochs", 0, "--log_every_steps", 1, "--device", "cpu",
                       "--decode_threads", 2, "--output_dir", tmp_path / "run", "--resume", "none")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "run" / "metrics.jsonl").exists()


def test_train_with_missing_data_is_a_clear_error(tmp_path):
    result = run_train("--arch", "resnet18", "--data_source", "tfrecord", "--train_data",
                       tmp_path / "nothing-*", "--device", "cpu", "--output_dir", tmp_path / "run")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "train_data" in result.stdout + result.stderr
