"""The data order check from the command line (Note [Data order that skews training] in
src/run/data_order_check.h): the same 512 records of 16 classes written class after class stop the
run early in its first epoch, under mpirun with epoch_order = by_node and alone with the global
order, with an error that names the fix; written shuffled they train to the end, and
check_data_order = false trains the class-ordered ones anyway."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, binary

sys.path.insert(0, str(ROOT / "scripts" / "dev"))
from data_order_study import write_layouts  # noqa: E402

MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
CLASSES, PER_CLASS, FILES = 16, 32, 8


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, tf):
    """{"class_order": folder, "shuffled": folder}: the same generated records written both ways
    (scripts/dev/data_order_study.py's write_layouts)."""
    root = tmp_path_factory.mktemp("data-order")
    args = [binary("generate-dataset"), "--tfrecords", root / "generated", "--classes", CLASSES,
            "--images-per-class", PER_CLASS, "--val-per-class", 1, "--width", 40, "--height", 40,
            "--train-shards", 1, "--val-shards", 1]
    result = subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return write_layouts(root / "generated", root / "records", files=FILES)


def train(folder, out, ranks, *extra):
    # No shuffle buffer: the shipped 1,024 records are 0.08% of ImageNet, a fraction of one record
    # here, where 1,024 would hold the whole set.
    args = [binary("train"), "--arch", "resnet18", "--num_classes", CLASSES, "--data_source",
            "tfrecord", "--train_data", f"{folder}/train-*", "--image_size", 32, "--batch_size",
            8, "--epochs", 1, "--warmup_epochs", 0.2, "--device", "cpu", "--decode_threads", 1,
            "--reader_threads", 1,
            "--shuffle_buffer", 0, "--log_every_steps", 1, "--output_dir", out, *extra]
    launcher = []
    if ranks > 1:
        if shutil.which("mpirun") is None:
            pytest.skip("OpenMPI not installed")
        launcher = ["mpirun", "--oversubscribe", "-np", str(ranks)]
    result = subprocess.run([*launcher, *map(str, args)], capture_output=True, text=True,
                            env=MPI_ENV, timeout=600)
    return result.returncode, result.stdout + result.stderr


def steps_trained(out):
    metrics = out / "metrics.jsonl"
    events = map(json.loads, metrics.read_text().splitlines()) if metrics.exists() else []
    return sum(event["event"] == "train" for event in events)


@pytest.mark.parametrize("ranks, order, why", [
    (2, "by_node", "each GPU trains a few of the classes"),
    (1, "global", "each run of steps trains a few of the classes")])
def test_class_ordered_records_stop_early_in_the_first_epoch(layouts, tmp_path, ranks, order, why):
    rc, log = train(layouts["class_order"], tmp_path / "run", ranks, "--epoch_order", order)
    assert rc == 2, log
    assert "the order of the training records skews what is trained, over the first 16 steps" \
        in log, log
    assert why in log and "make-tfrecords" in log and "check_data_order = false" in log, log
    steps_per_epoch = CLASSES * PER_CLASS // (8 * ranks)
    assert steps_trained(tmp_path / "run") <= 16 < steps_per_epoch


@pytest.mark.parametrize("ranks, order", [(2, "by_node"), (1, "global")])
def test_shuffled_records_train_to_the_end(layouts, tmp_path, ranks, order):
    rc, log = train(layouts["shuffled"], tmp_path / "run", ranks, "--epoch_order", order)
    assert rc == 0, log
    assert "data order over the first 16 steps" in log, log
    assert steps_trained(tmp_path / "run") == CLASSES * PER_CLASS // (8 * ranks)


def test_the_check_turned_off_trains_class_ordered_records(layouts, tmp_path):
    rc, log = train(layouts["class_order"], tmp_path / "run", 1, "--check_data_order", "false")
    assert rc == 0, log
    assert "data order" not in log
    assert steps_trained(tmp_path / "run") == CLASSES * PER_CLASS // 8
