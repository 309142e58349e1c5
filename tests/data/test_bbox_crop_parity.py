"""train_crop = distorted_bounding_box against TensorFlow: the crops of
distorted_bounding_box_crop (data/transforms/augment.cpp, drawn by augment_parity_tool boxcrop)
and those of tf.image.sample_distorted_bounding_box with the MLPerf ResNet-50 TF2 reference's
arguments (mlcommons/training aa344c7f, retired_benchmarks/resnet-tf2/tensorflow2/
imagenet_preprocessing.py lines 407-414) follow the same distributions, over 20,000 draws each
for a few image sizes and box sets: the means and standard deviations of the crop's area
fraction, aspect ratio and centre, the fractions of whole-image fallbacks and of crops covering a
tenth of some box, and a two-sample Kolmogorov-Smirnov test of the area fraction. The same
comparison tells apart a crop that ignores min_object_covered or draws from another area range,
so it has the power to catch those mistakes. Then two training steps with the option on records
that carry boxes. `pytest -s` prints the measured figures."""
import json
import subprocess

import numpy as np
import pytest

from conftest import binary, run_train

DRAWS = 20_000
MIN_COVERED, MIN_AREA, MAX_AREA = 0.1, 0.05, 1.0  # the reference's; aspect 0.75-1.33, 100 tries
MEANS_SE = 4.0  # means (and standard deviations) within 4 standard errors of their difference
KS_P = 1e-3     # the KS test's p-value must exceed this

# Boxes as the records store them: (xmin, ymin, xmax, ymax), normalised.
SMALL = [(0.40, 0.35, 0.60, 0.60)]  # 5% of the image
LARGE = [(0.10, 0.05, 0.95, 0.90)]
TWO = [(0.05, 0.10, 0.30, 0.40), (0.55, 0.50, 0.95, 0.92)]
CASES = {"no_box": (500, 375, []), "small_box": (500, 375, SMALL),
         "large_box_portrait": (320, 480, LARGE), "two_boxes": (500, 375, TWO),
         "small_box_tiny_image": (64, 48, SMALL)}


def ours(width, height, boxes, min_covered=MIN_COVERED, min_area=MIN_AREA, max_area=MAX_AREA,
         seed=1):
    args = [binary("augment_parity_tool"), "boxcrop", width, height, DRAWS, seed, min_covered,
            min_area, max_area] + [v for box in boxes for v in box]
    out = subprocess.run(list(map(str, args)), check=True, capture_output=True, text=True,
                         timeout=120).stdout
    return np.array([list(map(int, line.split())) for line in out.splitlines()], dtype=np.int64)


def tensorflows(tf, width, height, boxes):
    """(x, y, width, height) of DRAWS crops of the op the reference calls, its own generator,
    seeded: the same draws every run (the global seed alone left the op's seed to TensorFlow,
    and the reference's figures moved from run to run)."""
    tf.random.set_seed(7)
    bbox = tf.constant([[(b[1], b[0], b[3], b[2]) for b in boxes]] if boxes else
                       np.zeros((1, 0, 4)), dtype=tf.float32)  # [1, N, (ymin, xmin, ymax, xmax)]

    def draw(_):
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.constant([height, width, 3]), bounding_boxes=bbox, min_object_covered=MIN_COVERED,
            aspect_ratio_range=[0.75, 1.33], area_range=[MIN_AREA, MAX_AREA], max_attempts=100,
            use_image_if_no_bounding_boxes=True, seed=7)
        return tf.stack([begin[1], begin[0], size[1], size[0]])

    dataset = tf.data.Dataset.range(DRAWS).map(draw).batch(DRAWS)
    return next(iter(dataset)).numpy().astype(np.int64)


def statistics(crops, width, height, boxes):
    x, y, w, h = crops.T.astype(np.float64)
    # Coverage as the kernel judges it: box corners truncated to pixels.
    pixel_boxes = [(int(b[0] * width), int(b[1] * height), int(b[2] * width), int(b[3] * height))
                   for b in boxes] or [(0, 0, width, height)]
    best = np.zeros(len(crops))
    for x0, y0, x1, y1 in pixel_boxes:
        iw = np.clip(np.minimum(x + w, x1) - np.maximum(x, x0), 0, None)
        ih = np.clip(np.minimum(y + h, y1) - np.maximum(y, y0), 0, None)
        best = np.maximum(best, iw * ih / ((x1 - x0) * (y1 - y0)))
    return {"area": w * h / (width * height), "aspect": w / h,
            "centre_x": (x + w / 2) / width, "centre_y": (y + h / 2) / height,
            "fallback": ((w == width) & (h == height)).astype(np.float64),
            "covers": (best >= MIN_COVERED).astype(np.float64)}


def differences(a, b):
    """What tells the crops `a` and `b` (statistics()) apart, as messages; [] when nothing does."""
    from scipy import stats
    found = []
    for name in a:
        u, v = a[name], b[name]
        se = np.sqrt(u.var() / len(u) + v.var() / len(v))
        if abs(u.mean() - v.mean()) > MEANS_SE * se + 1e-12:
            found.append(f"{name} mean {u.mean():.4f} vs {v.mean():.4f} (se {se:.4f})")
        if name in ("fallback", "covers"):
            continue  # proportions: the mean says it all
        # The standard error of a standard deviation, from the fourth moment (any distribution).
        se_sd = np.sqrt(sum((np.mean((s - s.mean()) ** 4) - s.var() ** 2) / (4 * s.var() * len(s))
                            for s in (u, v)))
        if abs(u.std() - v.std()) > MEANS_SE * se_sd:
            found.append(f"{name} std {u.std():.4f} vs {v.std():.4f} (se {se_sd:.4f})")
    ks = stats.ks_2samp(a["area"], b["area"])
    if ks.pvalue <= KS_P:
        found.append(f"area KS statistic {ks.statistic:.4f}, p {ks.pvalue:.2e}")
    return found


def summary(s):
    return ", ".join(f"{k} {v.mean():.4f}" + (f"±{v.std():.4f}" if k not in ("fallback", "covers")
                                               else "") for k, v in s.items())


@pytest.fixture(scope="module")
def reference(tf):
    return {name: statistics(tensorflows(tf, w, h, boxes), w, h, boxes)
            for name, (w, h, boxes) in CASES.items()}


@pytest.mark.parametrize("case", CASES)
def test_crops_follow_tensorflows_distribution(reference, case):
    width, height, boxes = CASES[case]
    crops = ours(width, height, boxes)
    assert (crops[:, 2] >= 1).all() and (crops[:, 3] >= 1).all()
    assert (crops[:, 0] >= 0).all() and (crops[:, 0] + crops[:, 2] <= width).all()
    assert (crops[:, 1] >= 0).all() and (crops[:, 1] + crops[:, 3] <= height).all()
    mine = statistics(crops, width, height, boxes)
    print(f"\n{case} ours:       {summary(mine)}\n{case} tensorflow: {summary(reference[case])}")
    assert differences(mine, reference[case]) == []


# The comparison's power: the same crop with min_object_covered ignored (0), or with
# RandomResizedCrop's area range (0.08-1) or a halved upper bound, is told apart from TensorFlow's.
# (Not without boxes: covering a tenth of the whole image already keeps the area above 0.1, and
# the kernel's height is uniform, so any lower bound under 0.1 gives the same crops.)
@pytest.mark.parametrize("case, change", [
    ("small_box", {"min_covered": 0.0}), ("two_boxes", {"min_covered": 0.0}),
    ("small_box", {"min_area": 0.08}), ("two_boxes", {"min_area": 0.08}),
    ("small_box", {"max_area": 0.5})])
def test_comparison_detects_a_wrong_crop(reference, case, change):
    width, height, boxes = CASES[case]
    found = differences(statistics(ours(width, height, boxes, **change), width, height, boxes),
                        reference[case])
    print(f"\n{case} {change}: {found}")
    assert found


def example(tf, label, jpeg, boxes):
    def floats(values):
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    feature = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
               "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
    for i, corner in enumerate(("xmin", "ymin", "xmax", "ymax")):
        feature[f"image/object/bbox/{corner}"] = floats([b[i] for b in boxes])
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def test_two_training_steps_with_the_records_boxes(tf, tmp_path):
    """Records with no box, one and two boxes (TensorFlow's layout, labels 1-based) train two
    steps with train_crop = distorted_bounding_box, every record decoded."""
    rng = np.random.default_rng(0)
    box_sets = [[], SMALL, TWO, LARGE]
    with tf.io.TFRecordWriter(str(tmp_path / "train-00000-of-00001")) as writer:
        for i in range(16):
            pixels = rng.integers(0, 255, (60 + i, 80, 3)).astype(np.uint8)
            jpeg = tf.io.encode_jpeg(pixels, quality=90).numpy()
            writer.write(example(tf, i % 4 + 1, jpeg, box_sets[i % 4]))
    out = tmp_path / "run"
    result = run_train("--arch", "resnet18", "--num_classes", 4, "--data_source", "tfrecord",
                       "--train_data", tmp_path / "train-*", "--image_size", 32,
                       "--batch_size", 8, "--device", "cpu", "--decode_threads", 2,
                       "--train_crop", "distorted_bounding_box", "--max_steps", 2,
                       "--bad_record_policy", "fail", "--log_every_steps", 1,
                       "--output_dir", out, "--resume", "none")
    assert result.returncode == 0, result.stdout + result.stderr
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["event"] == "train"]
    assert len(losses) == 2 and all(np.isfinite(losses))
