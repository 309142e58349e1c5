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


def stage(folder, *specs):
    env = dict(os.environ, PATH=f"{build_dir()}:{os.environ['PATH']}")
    return subprocess.run(["bash", str(PRELOAD), "--index", str(folder), *specs],
                          capture_output=True, text=True, env=env, timeout=300)


def test_the_staging_job_indexes_the_writable_dataset(rendered):
    job = next(d for d in rendered("stage-data") if d["kind"] == "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "--index"
    dataset = next(m for m in container["volumeMounts"] if m["mountPath"] == "/fsx/imagenet")
    assert not dataset.get("readOnly"), "the index files need a writable dataset folder"
    # The folder imported from S3 belongs to root; the staging runs as uid 1000.
    assert container["securityContext"]["runAsUser"] == 1000
    (init,) = job["spec"]["template"]["spec"]["initContainers"]
    assert "chown 1000:1000 /fsx/imagenet" in " ".join(init["command"])


def test_training_reads_the_staged_indexes_and_scans_nothing(dataset, tmp_path):
    result = stage(dataset, "train-*=2", "validation-*=1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "indexed 2 files" in result.stdout and "indexed 1 files" in result.stdout
    shards = sorted(p for p in dataset.iterdir() if not p.name.endswith(".idx"))
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
