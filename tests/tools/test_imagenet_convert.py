"""make-tfrecords --imagenet: ImageNet as it is downloaded (image-net.org's nested tars and devkit,
or Kaggle's folders and CSV files), built small here in the real formats, becomes TFRecords whose
labels agree image for image with torchvision.datasets.ImageNet's parse of the same archives
(0-based there, 1-based here); a conversion killed mid-way finishes on a rerun without rewriting
the shards it had finished; a download short of ImageNet's counts is refused unless asked."""
import csv
import io
import os
import pathlib
import signal
import subprocess
import tarfile
import time

import numpy as np
import pytest

from conftest import binary

# The devkit's classes are its synsets without children, with ILSVRC2012_IDs that do not follow
# the WNIDs' order (ID 1 is n02119789 there too), so a converter that labels by ID fails here.
LEAVES = [(1, "n02119789", "kit fox, Vulpes macrotis"), (2, "n02100735", "English setter"),
          (3, "n02110185", "Siberian husky, husky"), (4, "n01440764", "tench, Tinca tinca")]
PARENTS = [(1001, "n00001740", "entity", [1, 2, 3, 4])]  # IDs above 1,000, as in the devkit
TRAIN_PER_CLASS = 3
VAL_CLASSES = [3, 1, 4, 2, 1, 4, 2, 3]  # the ILSVRC2012_ID of validation image 1, 2, ...
CMYK_FILE = "n02110185_1.JPEG"  # ImageNet has 22 CMYK JPEGs; stored re-encoded as RGB
PNG_FILE = "n02100735_2.JPEG"   # and one PNG named .JPEG (n02105855_2933.JPEG)


def run(*args, check=True, tool="make-tfrecords"):
    result = subprocess.run([str(binary(tool)), *map(str, args)], capture_output=True, text=True,
                            timeout=300)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def image_bytes(rng, name, size=(40, 30)):
    from PIL import Image
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    out = io.BytesIO()
    if name == CMYK_FILE:
        image.convert("CMYK").save(out, format="JPEG")
    else:
        image.save(out, format="PNG" if name == PNG_FILE else "JPEG", quality=90)
    return out.getvalue()


def make_images():
    """{split: {file name: (bytes, WNID)}}: the same images for both downloads."""
    rng = np.random.default_rng(0)
    wnid = {id_: w for id_, w, _ in LEAVES}
    train = {f"{w}_{k}.JPEG": w for _, w, _ in LEAVES for k in range(TRAIN_PER_CLASS)}
    val = {f"ILSVRC2012_val_{i + 1:08d}.JPEG": wnid[c] for i, c in enumerate(VAL_CLASSES)}
    return {split: {name: (image_bytes(rng, name), w) for name, w in files.items()}
            for split, files in (("train", train), ("val", val))}


def add_bytes(archive, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def tar_bytes(members):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in members:
            add_bytes(archive, name, data)
    return out.getvalue()


def meta_mat():
    """data/meta.mat as the devkit has it: a struct array `synsets` (n x 1), one element per
    synset, written with scipy's MATLAB writer."""
    import scipy.io
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children",
              "wordnet_height", "num_train_images"]
    rows = [(i, w, words, []) for i, w, words in LEAVES] + PARENTS
    synsets = np.empty((len(rows), 1), dtype=[(f, object) for f in fields])
    for r, (id_, w, words, children) in enumerate(rows):
        synsets[r, 0] = (float(id_), w, words, f"gloss of {w}", float(len(children)),
                         np.array(children, dtype=float).reshape(1, -1), 0.0, 1300.0)
    out = io.BytesIO()
    scipy.io.savemat(out, {"synsets": synsets})
    return out.getvalue()


def write_image_net_org(root, images):
    by_class = {}
    for name, (data, w) in images["train"].items():
        by_class.setdefault(w, []).append((name, data))
    with tarfile.open(root / "ILSVRC2012_img_train.tar", "w") as archive:
        for w, members in sorted(by_class.items()):
            add_bytes(archive, f"{w}.tar", tar_bytes(members))
    with tarfile.open(root / "ILSVRC2012_img_val.tar", "w") as archive:
        for name, (data, _) in reversed(images["val"].items()):  # not in name order
            add_bytes(archive, name, data)
    truth = "".join(f"{c}\n" for c in VAL_CLASSES).encode()
    with tarfile.open(root / "ILSVRC2012_devkit_t12.tar.gz", "w:gz") as archive:
        add_bytes(archive, "ILSVRC2012_devkit_t12/data/meta.mat", meta_mat())
        add_bytes(archive, "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt",
                  truth)


def write_kaggle(root, images, boxes):
    data = root / "ILSVRC/Data/CLS-LOC"
    for name, (content, w) in images["train"].items():
        (data / "train" / w).mkdir(parents=True, exist_ok=True)
        (data / "train" / w / name).write_bytes(content)
    (data / "val").mkdir(parents=True)
    for name, (content, _) in images["val"].items():
        (data / "val" / name).write_bytes(content)
    (root / "LOC_synset_mapping.txt").write_text(
        "".join(f"{w} {words}\n" for _, w, words in sorted(LEAVES, key=lambda leaf: leaf[1])))
    for split, file in (("train", "LOC_train_solution.csv"), ("val", "LOC_val_solution.csv")):
        with open(root / file, "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["ImageId", "PredictionString"])
            for name, (_, w) in images[split].items():
                if split == "val" or name in boxes:
                    box = boxes.get(name, (1, 2, 30, 20))
                    writer.writerow([name.removesuffix(".JPEG"),
                                     f"{w} {' '.join(map(str, box))} {w} 0 0 39 29 "])


def dump(records, split):
    """{file name: stored label} of the records of one split, read by verify-tfrecords."""
    out = records.parent / f"{records.name}-{split}.tsv"
    run(records / f"{split}-*", "--dump", out, tool="verify-tfrecords")
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    return {row[5]: int(row[2]) for row in rows}


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet")
    images = make_images()
    (root / "org").mkdir()
    write_image_net_org(root / "org", images)
    (root / "kaggle").mkdir()
    write_kaggle(root / "kaggle", images, {"n01440764_0.JPEG": (4, 3, 20, 15)})
    return root, images


def torchvision_targets(root, split, monkeypatch):
    """{file name: target} from torchvision.datasets.ImageNet on the same three archives (it
    checks their MD5s against the real files', which these small ones cannot match)."""
    from torchvision.datasets import imagenet
    monkeypatch.setattr(imagenet, "_verify_archive", lambda *args, **kwargs: None)
    dataset = imagenet.ImageNet(str(root), split=split)
    return {pathlib.Path(path).name: target for path, target in dataset.samples}, dataset


def test_image_net_org_labels_match_torchvision(downloads, tmp_path, monkeypatch):
    root, images = downloads
    out = tmp_path / "records"
    result = run("--imagenet", root / "org", out, "--allow-partial", "--train-shards", 3,
                 "--validation-shards", 2)
    assert "ImageNet from image-net.org, 4 classes" in result.stdout
    assert "train: 12 images in 3 shards, fewer than ImageNet's 1281167" in result.stdout
    assert "validation: 8 images in 2 shards" in result.stdout
    shards = sorted(p.name for p in out.glob("*-of-*") if not p.name.endswith(".idx"))
    assert shards == ["train-00000-of-00003", "train-00001-of-00003", "train-00002-of-00003",
                      "validation-00000-of-00002", "validation-00001-of-00002"]
    # A copy for torchvision, which unpacks the archives beside them.
    theirs = tmp_path / "torchvision"
    theirs.mkdir()
    for archive in (root / "org").iterdir():
        os.link(archive, theirs / archive.name)
    for split, prefix in (("train", "train"), ("val", "validation")):
        targets, dataset = torchvision_targets(theirs, split, monkeypatch)
        labels = dump(out, prefix)
        assert len(labels) == len(images[split])
        assert {name: label - 1 for name, label in labels.items()} == targets
    # synsets.txt: the classes in label order with their words, torchvision's order and names.
    lines = (out / "synsets.txt").read_text().splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == dataset.wnids
    assert [tuple(line.split(" ", 1)[1].split(", ")) for line in lines] == dataset.classes


def test_kaggle_labels_and_boxes_match_the_same_images(downloads, tmp_path, tf):
    root, images = downloads
    org, kaggle = tmp_path / "org", tmp_path / "kaggle"
    run("--imagenet", root / "org", org, "--allow-partial", "--train-shards", 2,
        "--validation-shards", 1)
    result = run("--imagenet", root / "kaggle", kaggle, "--allow-partial", "--train-shards", 2,
                 "--validation-shards", 1)
    assert "ImageNet from Kaggle, 4 classes" in result.stdout
    for split in ("train", "validation"):
        assert dump(kaggle, split) == dump(org, split)
    assert (kaggle / "synsets.txt").read_text() == (org / "synsets.txt").read_text()
    examples = {}
    for path in kaggle.glob("*-of-*"):
        if path.suffix != ".idx":
            for record in tf.data.TFRecordDataset(str(path)):
                example = tf.train.Example.FromString(record.numpy()).features.feature
                examples[example["image/filename"].bytes_list.value[0].decode()] = example
    boxed = examples["n01440764_0.JPEG"]  # 40 x 30 pixels; boxes (4, 3, 20, 15), (0, 0, 39, 29)
    assert list(boxed["image/object/bbox/xmin"].float_list.value) == pytest.approx([0.1, 0])
    assert list(boxed["image/object/bbox/ymax"].float_list.value) == pytest.approx([0.5, 29 / 30])
    assert list(boxed["image/object/bbox/label"].int64_list.value) == [1, 1]
    assert list(examples["n01440764_1.JPEG"]["image/object/bbox/xmin"].float_list.value) == []
    assert len(examples["ILSVRC2012_val_00000001.JPEG"]["image/object/bbox/xmin"].float_list.value) == 2
    # The CMYK JPEG and the PNG are stored as RGB JPEGs; the other images byte for byte.
    for name, example in examples.items():
        split = "val" if name.startswith("ILSVRC2012_val") else "train"
        stored = example["image/encoded"].bytes_list.value[0]
        assert stored[:2] == b"\xff\xd8" and example["image/format"].bytes_list.value[0] == b"JPEG"
        assert tf.io.decode_jpeg(stored).shape == (30, 40, 3)
        assert (stored == images[split][name][0]) == (name not in (CMYK_FILE, PNG_FILE))


def test_a_partial_download_is_refused_before_anything_is_written(downloads, tmp_path):
    root, _ = downloads
    result = run("--imagenet", root / "org", tmp_path / "out", check=False)
    assert result.returncode == 2
    assert "holds 12 train images where ImageNet 2012 has 1281167" in result.stderr
    assert "--allow-partial" in result.stderr
    assert not (tmp_path / "out").exists()


def test_damaged_or_missing_downloads_are_named(downloads, tmp_path):
    root, _ = downloads
    result = run("--imagenet", tmp_path, tmp_path / "out", check=False)
    assert result.returncode == 2 and "holds neither ImageNet download" in result.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    for archive in (root / "org").iterdir():
        data = archive.read_bytes()
        # The training tar cut short inside its last class's inner tar.
        cut = data[:len(data) * 3 // 4] if archive.name == "ILSVRC2012_img_train.tar" else data
        (broken / archive.name).write_bytes(cut)
    result = run("--imagenet", broken, tmp_path / "out", "--allow-partial", check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "ILSVRC2012_img_train.tar" in result.stderr and "incomplete download" in result.stderr


def slow_image_folder(root, classes=2, per_class=12):
    """PNGs of 1,000 x 1,000: each is decoded and re-encoded as JPEG (tens of milliseconds), so a
    conversion of one image per shard lasts long enough to be killed part-way."""
    from PIL import Image
    ramp = np.linspace(0, 255, 1000, dtype=np.uint8)
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = np.stack([*np.meshgrid(ramp, ramp), np.full((1000, 1000), 20 * i, np.uint8)],
                              axis=-1)
            Image.fromarray(pixels).save(root / f"class_{c}" / f"{c}_{i}.png")


def finished_shards(out):
    return {p.name: p.stat().st_mtime_ns for p in out.glob("train-*-of-*") if p.suffix != ".idx"}


def test_a_rerun_after_a_kill_keeps_the_finished_shards(tmp_path):
    folder, out = tmp_path / "folder", tmp_path / "records"
    slow_image_folder(folder)
    args = [binary("make-tfrecords"), folder, out, "--shards", 24, "--threads", 1]
    process = subprocess.Popen(list(map(str, args)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:  # kill it once three shards are finished; give up if it ends or the deadline passes
        while len(finished_shards(out)) < 3 and process.poll() is None:
            assert time.monotonic() < deadline, "no three shards within 120 s"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the conversion ended before it was killed"
    before = finished_shards(out)
    assert 3 <= len(before) < 24
    result = run(folder, out, "--shards", 24, "--threads", 2, "--progress-seconds", 0.05)
    progress = [line for line in result.stderr.splitlines() if line.startswith("train: ")]
    assert progress and all(f"/{24 - len(before)} images (" in line for line in progress)
    assert all(line.endswith(" left") for line in progress)  # with the time left
    assert f"24 images in 24 shards ({len(before)} kept from an earlier run)" in result.stdout
    after = finished_shards(out)
    assert len(after) == 24 and all(after[name] == mtime for name, mtime in before.items())
    assert not list(out.glob(".*"))  # no partial shard left behind
    labels = dump(out, "train")
    assert sorted(labels.values()) == [1] * 12 + [2] * 12
    assert (out / "synsets.txt").read_text() == "class_0\nclass_1\n"


def test_an_empty_class_folder_is_named(tmp_path):
    folder = tmp_path / "folder"
    slow_image_folder(folder, classes=1, per_class=1)
    (folder / "class_9").mkdir()  # sorts last: its label would be unused, synsets.txt one line off
    result = run(folder, tmp_path / "out", check=False)
    assert result.returncode == 2
    assert f"class folder '{folder / 'class_9'}' holds no images" in result.stderr
