"""The data staging Job (k8s/jobs/stage-data, docker/preload-data.sh --index) writes each shard's
index beside it, so that training reads the indexes and never scans the shards; a damaged shard
fails the staging with its name."""
import os
import subprocess

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
# kubectl, render and rendered are fixtures.
from deploy_support import ROOT, build_dir, kubectl, render, rendered  # noqa: E402,F401

PRELOAD = ROOT / "docker" / "preload-data.sh"


@pytest.fixture
def dataset(tmp_path):
    folder = tmp_path / "imagenet"
    result = subprocess.run([str(build_dir() / "generate-dataset"), "--tfrecords", folder,
                             "--classes", "2", "--images-per-class", "8", "--val-per-class", "2",
                             "--width", "40", "--height", "40", "--train-shards", "2",
                             "--val-shards", "1"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for index in folder.glob("*.idx"):  # the generator writes them: the staging must
        index.unlink()
    return folder


def stage(folder, *specs, convert=None):
    env = dict(os.environ, PATH=f"{build_dir()}:{os.environ['PATH']}")
    options = ["--convert", str(convert)] if convert else []
    return subprocess.run(["bash", str(PRELOAD), *options, "--index", str(folder), *specs],
                          capture_output=True, text=True, env=env, timeout=300)


def test_the_staging_job_indexes_the_writable_dataset(rendered):
    job = next(d for d in rendered("stage-data") if d["kind"] == "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][:3] == ["--convert", "/fsx/imagenet-download", "--index"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert not mounts["/fsx/imagenet"].get("readOnly"), "shards and indexes are written there"
    assert mounts["/fsx/imagenet-download"]["readOnly"]
    # The folder imported from S3 belongs to root; the staging runs as uid 1000.
    assert container["securityContext"]["runAsUser"] == 1000
    (init,) = job["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:7] == ["install", "-d", "-o", "1000", "-g", "1000", "-m"]
    assert {"/fsx/runs", "/fsx/imagenet"} <= set(init["command"])


def test_training_reads_the_staged_indexes_and_scans_nothing(dataset, tmp_path):
    result = stage(dataset, "train-*=2", "validation-*=1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "indexed 2 files" in result.stdout and "indexed 1 files" in result.stdout
    shards = sorted(p for p in dataset.iterdir() if p.suffix not in (".idx", ".txt"))
    assert len(shards) == 3
    # A second staging (the Job retried) counts the shards, not their indexes.
    again = stage(dataset, "train-*=2", "validation-*=1")
    assert again.returncode == 0, again.stdout + again.stderr
    indexes = {p: p.with_name(p.name + ".idx").stat() for p in shards}
    assert all(stat.st_size > 0 for stat in indexes.values())
    cache = tmp_path / "index-cache"
    train = subprocess.run(
        [str(build_dir() / "train"), "--arch", "resnet18", "--num_classes", "2",
         "--data_source", "tfrecord", "--train_data", f"{dataset}/train-*",
         "--val_data", f"{dataset}/validation-*", "--image_size", "32", "--val_resize", "36",
         "--batch_size", "4", "--epochs", "1", "--warmup_epochs", "0", "--device", "cpu",
         "--index_cache_dir", cache,
         "--output_dir", tmp_path / "run"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert train.returncode == 0, train.stdout + train.stderr
    assert "final: top-1" in train.stdout + train.stderr
    # The trainer took the staged indexes as they were: none rebuilt, none built into the cache.
    for shard, stat in indexes.items():
        assert shard.with_name(shard.name + ".idx").stat().st_mtime_ns == stat.st_mtime_ns
    built = list(cache.rglob("*.idx")) if cache.exists() else []
    assert not built, f"indexes built at start-up: {built}"


def test_a_damaged_shard_fails_the_staging_naming_it(dataset):
    shard = sorted(dataset.glob("train-*"))[1]
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF  # the first record's length no longer matches its CRC
    shard.write_bytes(data)
    result = stage(dataset, "train-*=2")
    assert result.returncode == 1
    assert f"DAMAGED {shard} at byte 0" in result.stderr
    assert "HINT: a DAMAGED record means a corrupt shard" in result.stderr


def test_the_staging_converts_only_a_whole_download(dataset, tmp_path):
    # Kaggle's layout, one validation image: the converter refuses it (ImageNet has 50,000), and
    # the staging fails with its reason before writing a shard.
    download = tmp_path / "download"
    (download / "ILSVRC/Data/CLS-LOC/val").mkdir(parents=True)
    from PIL import Image
    Image.new("RGB", (8, 8)).save(download / "ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_00000001.JPEG",
                                  format="JPEG")
    (download / "LOC_synset_mapping.txt").write_text("n01440764 tench, Tinca tinca\n")
    (download / "LOC_val_solution.csv").write_text(
        "ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 0 0 7 7 \n")
    out = tmp_path / "converted"
    result = stage(out, "validation-*=128", convert=download)
    assert result.returncode != 0
    assert "holds 1 validation images where ImageNet 2012 has 50000" in result.stderr
    assert not list(out.glob("validation-*"))
    # No download there: the records are expected in place, as imported from S3.
    result = stage(dataset, "train-*=2", "validation-*=1", convert=tmp_path / "none")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "holds no ImageNet download" in result.stdout
