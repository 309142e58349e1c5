#!/usr/bin/env python3
"""The converter's speed next to TensorFlow's build_imagenet_data.py on the same images:
images per second of CPU time (the whole process: user + system, so a busy machine changes the
wall time but not the figure) and per second of wall time, each with one writer thread.

    scripts/bench/convert.py --peer PATH/build_imagenet_data.py [--images 2000]

The images are ImageNet-like JPEGs (generate-dataset: 500x375, quality 90), in class folders
named like WNIDs with .JPEG names, the layout build_imagenet_data.py reads. make-tfrecords runs
on that folder and on the same images as image-net.org's tars (a tar per class inside one tar,
and a devkit), read in place. The peer (tensorflow/models research/inception, TF1 code) runs
under tf.compat.v1, with np.int, which NumPy removed, read as int; its fixed cost (importing
TensorFlow, a session) is measured on an empty folder and subtracted.
"""
import argparse
import io
import pathlib
import resource
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def timed(command):
    """(CPU seconds of the child, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run([str(c) for c in command], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, time.monotonic() - start


def image_folder(build, root, images, classes):
    """root/nNNNNNNNN/nNNNNNNNN_K.JPEG, as ImageNet's training folders are named."""
    generated = root / "generated"
    subprocess.run([build / "generate-dataset", "--image-folder", generated, "--classes",
                    str(classes), "--images-per-class", str(images // classes)], check=True,
                   stdout=subprocess.DEVNULL)
    folder = root / "folder"
    for c, class_dir in enumerate(sorted(generated.iterdir())):
        wnid = f"n{c + 1:08d}"
        (folder / wnid).mkdir(parents=True)
        for k, image in enumerate(sorted(class_dir.iterdir())):
            image.rename(folder / wnid / f"{wnid}_{k}.JPEG")
    return folder


def add(archive, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def image_net_org(folder, root):
    """The same images as image-net.org's train tar and devkit (meta.mat via scipy)."""
    import numpy as np
    import scipy.io
    download = root / "download"
    download.mkdir()
    wnids = sorted(p.name for p in folder.iterdir())
    with tarfile.open(download / "ILSVRC2012_img_train.tar", "w") as outer:
        for wnid in wnids:
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w") as archive:
                for image in sorted((folder / wnid).iterdir()):
                    add(archive, image.name, image.read_bytes())
            add(outer, f"{wnid}.tar", inner.getvalue())
    fields = ["ILSVRC2012_ID", "WNID", "words", "num_children"]
    synsets = np.empty((len(wnids), 1), dtype=[(f, object) for f in fields])
    for i, wnid in enumerate(wnids):
        synsets[i, 0] = (float(i + 1), wnid, f"class {i}", 0.0)
    meta = io.BytesIO()
    scipy.io.savemat(meta, {"synsets": synsets})
    with tarfile.open(download / "ILSVRC2012_devkit_t12.tar.gz", "w:gz") as archive:
        add(archive, "ILSVRC2012_devkit_t12/data/meta.mat", meta.getvalue())
    return download


def peer_command(peer, root, train_dir):
    """build_imagenet_data.py on `train_dir`, with its label and metadata files."""
    script = root / "build_imagenet_data_v1.py"
    source = pathlib.Path(peer).read_text()
    source = source.replace("import tensorflow as tf",
                            "import tensorflow.compat.v1 as tf\ntf.disable_eager_execution()")
    script.write_text(source.replace("astype(np.int)", "astype(int)"))
    wnids = sorted(p.name for p in train_dir.iterdir())
    (root / "synsets.txt").write_text("".join(f"{w}\n" for w in wnids))
    (root / "metadata.txt").write_text("".join(f"{w}\tclass {w}\n" for w in wnids))
    (root / "boxes.csv").write_text("")
    (root / "empty").mkdir(exist_ok=True)
    out = root / f"peer-{train_dir.name}"
    out.mkdir()
    return [sys.executable, script, "--train_directory", train_dir, "--validation_directory",
            root / "empty", "--output_directory", out, "--train_shards", "4",
            "--validation_shards", "1", "--num_threads", "1", "--labels_file",
            root / "synsets.txt", "--imagenet_metadata_file", root / "metadata.txt",
            "--bounding_box_file", root / "boxes.csv"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", required=True, help="tensorflow/models' build_imagenet_data.py")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        root = pathlib.Path(temporary)
        folder = image_folder(args.build, root, args.images, args.classes)
        download = image_net_org(folder, root)
        n = sum(1 for _ in folder.glob("*/*.JPEG"))
        convert = [args.build / "make-tfrecords", "--threads", "1", "--progress-seconds", "0"]
        runs = {
            "make-tfrecords, folder": timed(convert + [folder, root / "ours-folder", "--shards", 4]),
            "make-tfrecords --imagenet, tars": timed(
                convert + ["--imagenet", download, root / "ours-tars", "--allow-partial",
                           "--train-shards", 4]),
        }
        empty = root / "no-images"
        (empty / "n00000001").mkdir(parents=True)
        fixed_cpu, fixed_wall = timed(peer_command(args.peer, root, empty))
        cpu, wall = timed(peer_command(args.peer, root, folder))
        runs["build_imagenet_data.py"] = (cpu - fixed_cpu, wall - fixed_wall)
        print(f"{n} images, 500x375 JPEG q90, one writer thread each "
              f"(peer's fixed cost subtracted: {fixed_cpu:.1f} CPU s, {fixed_wall:.1f} s)")
        peer = n / runs["build_imagenet_data.py"][0]
        for name, (cpu, wall) in runs.items():
            print(f"{name:34s} {n / cpu:8.0f} img/s per core  {n / wall:8.0f} img/s wall  "
                  f"{n / cpu / peer:5.1f}x the peer per core")


if __name__ == "__main__":
    main()
