#!/usr/bin/env python3
"""What the order of the records costs, on the CPU: the same 1,024 generated records of 16 classes
written in 8 files twice, shuffled across the files (as build_imagenet_data.py and make-tfrecords
write ImageNet) and class after class, each trained by ResNet-18 at 32 px on 4 ranks under
mpirun for 2 epochs with epoch_order = global and = by_node, from several seeds, with the data
order check off (check_data_order = false) so that every run trains to the end. Prints the final
held-out top-1 of each run and, per layout and order, the mean and the range.

    $(scripts/setup.sh | tail -n 1) scripts/dev/data_order_study.py [--seeds 42 1 2 3] [--ranks 4]
        [--out /tmp/data-order-study]

A proxy and no more: 16 classes, 32 px, minutes on 2 cores. No shuffle buffer: the shipped 1,024
records are 0.08% of ImageNet, a fraction of one record here, where 1,024 would hold the set.
"""
import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLASSES, PER_CLASS, VAL_PER_CLASS, FILES = 16, 64, 8, 8
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")


def write_layouts(generated, out, files=FILES, seed=3):
    """The training records of `generated` (generate-dataset --tfrecords) rewritten into `files`
    files twice: out/class_order (by label) and out/shuffled. Returns {layout: folder}."""
    import tensorflow as tf  # the venv's (scripts/setup.sh); only this step needs it
    records = []
    for path in sorted(pathlib.Path(generated).glob("train-*-of-?????")):
        for raw in tf.data.TFRecordDataset(str(path)):
            example = tf.train.Example.FromString(raw.numpy())
            records.append((example.features.feature["image/class/label"].int64_list.value[0],
                            raw.numpy()))
    shuffled = list(range(len(records)))
    random.Random(seed).shuffle(shuffled)
    orders = {"class_order": sorted(range(len(records)), key=lambda i: records[i][0]),
              "shuffled": shuffled}
    folders = {}
    for layout, order in orders.items():
        folder = pathlib.Path(out) / layout
        folder.mkdir(parents=True, exist_ok=True)
        per_file = len(order) // files
        for f in range(files):
            name = folder / f"train-{f:05d}-of-{files:05d}"
            with tf.io.TFRecordWriter(str(name)) as writer:
                for i in order[f * per_file:(f + 1) * per_file]:
                    writer.write(records[i][1])
        folders[layout] = folder
    return folders


def make_data(out, build):
    generated = out / "generated"
    if not (generated / "validation-00000-of-00001").exists():
        subprocess.run([build / "generate-dataset", "--tfrecords", generated, "--classes",
                        str(CLASSES), "--images-per-class", str(PER_CLASS), "--val-per-class",
                        str(VAL_PER_CLASS), "--width", "48", "--height", "40", "--train-shards",
                        "1", "--val-shards", "1"], check=True, capture_output=True, timeout=600)
    return generated, write_layouts(generated, out / "records")


def train(folder, val, out, ranks, order, seed, build):
    args = [build / "train", "--arch", "resnet18", "--num_classes", CLASSES, "--data_source",
            "tfrecord", "--train_data", folder / "train-*", "--val_data", val / "validation-*",
            "--image_size", 32, "--val_resize", 36, "--batch_size", 16, "--epochs", 2,
            "--warmup_epochs", 0.5, "--base_lr", 0.4, "--seed", seed, "--epoch_order", order,
            "--shuffle_buffer", 0, "--check_data_order", "false", "--device", "cpu",
            "--decode_threads", 1, "--reader_threads", 1, "--tensorboard", "false",
            "--resume", "none", "--output_dir", out]
    # A run takes a minute or two; an hour means something is wrong.
    subprocess.run(["mpirun", "--oversubscribe", "-np", str(ranks), *map(str, args)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=MPI_ENV,
                   timeout=3600)
    evals = [e for e in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if e["event"] == "eval"]
    return evals[-1]["top1"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/data-order-study"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2, 3])
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    build = pathlib.Path(os.environ.get("BUILD_DIR", ROOT / "build"))
    generated, layouts = make_data(args.out, build)
    results = {}
    for layout, folder in layouts.items():
        for order in ("global", "by_node"):
            for seed in args.seeds:
                run = args.out / "runs" / f"{layout}-{order}-{seed}"
                top1 = train(folder, generated, run, args.ranks, order, seed, build)
                results.setdefault((layout, order), []).append(top1)
                print(f"{layout:11} {order:7} seed {seed:3}: top-1 {top1:.1f}%", flush=True)
    print(f"\n{args.ranks} ranks, seeds {' '.join(map(str, args.seeds))}: final top-1")
    for (layout, order), top1s in results.items():
        print(f"{layout:11} {order:7} mean {statistics.mean(top1s):5.1f}%  "
              f"range {min(top1s):.1f}-{max(top1s):.1f}%")


if __name__ == "__main__":
    main()
