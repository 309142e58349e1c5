#!/usr/bin/env python3
"""A small time-to-accuracy study on the CPU, a proxy for the fast ImageNet recipes: ResNet-18 on
crops of real photographs (scripts/dev/make_photo_dataset.py: each photo a class, held-out crops
from a part of each photo that training never sees), trained by two recipes for the same number
of epochs, with the held-out top-1 after every epoch plotted against the wall time since launch:

  baseline  64 px training crop, evaluated at 64 px (a 73 px resize, the 224/256 ratio), no label
            smoothing, no EMA
  fast      FixRes + progressive resizing + EMA + label smoothing: training crops growing from
            48 to 64 px (FFCV's per-epoch ramp), evaluated at 80 px of an 84 px resize (the
            torchvision V2 ratios, 224/176 and 232/224), an EMA of the weights with a half-life of
            half an epoch, label smoothing 0.1

Both share the data, seed, optimizer, schedule and batch. Writes OUT/<recipe>/metrics.jsonl, the
plot (PNG) and prints the figures. The plot shows, for the fast recipe, the better of the
weights and their EMA at each evaluation, which is what a user of that recipe would keep.

    $(scripts/setup.sh | tail -n 1) scripts/dev/time_to_accuracy.py [--out /tmp/time-to-accuracy]
        [--epochs 12] [--png docs/time-to-accuracy-cpu.png]

It is a proxy and says only that: 12 classes of one photo each, 64 px, minutes on 2 cores. The
ImageNet figures are the published ones (docs/training.md#recipes) until a GPU run.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

from PIL import Image, ImageDraw

ROOT = pathlib.Path(__file__).resolve().parents[2]
PHOTOS = pathlib.Path("/usr/share/backgrounds/mate/nature")
CLASSES, TRAIN_PER_CLASS, VAL_PER_CLASS, VAL_SIZE = 12, 100, 30, 96

COMMON = ["--arch", "resnet18", "--num_classes", CLASSES, "--data_source", "tfrecord",
          "--batch_size", 32, "--base_lr", 0.8, "--warmup_epochs", 1, "--weight_decay", 5e-5,
          "--device", "cpu", "--log_every_steps", 1000, "--tensorboard", "false",
          "--checkpoint_every_steps", 0, "--keep_checkpoints", 1, "--resume", "none"]
RECIPES = {
    "baseline": ["--image_size", 64, "--val_resize", 73, "--label_smoothing", 0],
    "fast": ["--image_size", 64, "--val_image_size", 80, "--val_resize", 84,
             "--progressive_resize_min_size", 48, "--progressive_resize_max_size", 64,
             "--progressive_resize_step", 16, "--progressive_resize_start_epoch", 1,
             "--progressive_resize_end_epoch", None,  # set from --epochs: two thirds through
             "--ema_half_life_images", CLASSES * TRAIN_PER_CLASS // 2, "--label_smoothing", 0.1],
}


def make_data(out, build):
    records = out / "records"
    if (records / "train-00000-of-00002").exists():
        return records
    folder = out / "photos"
    subprocess.run([sys.executable, ROOT / "scripts/dev/make_photo_dataset.py", folder, "--photos",
                    PHOTOS, "--classes", str(CLASSES), "--train-per-class",
                    str(TRAIN_PER_CLASS), "--val-per-class", str(VAL_PER_CLASS), "--train-size",
                    "128", "--val-size", str(VAL_SIZE)], check=True, timeout=600)
    for split, prefix in (("train", "train"), ("val", "validation")):
        subprocess.run([build / "make-tfrecords", folder / split, records, "--prefix", prefix,
                        "--shards", "2"], check=True, capture_output=True, timeout=600)
    return records


def train(name, args, out, records, build, epochs):
    run_dir = out / name
    command = [build / "train", *COMMON, *args, "--epochs", epochs, "--train_data",
               records / "train-*", "--val_data", records / "validation-*", "--output_dir",
               run_dir]
    metrics = run_dir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    start = time.time()
    # A run takes minutes; an hour means something is wrong (train's own waits have deadlines).
    subprocess.run([str(c) for c in command], check=True, stdout=subprocess.DEVNULL, timeout=3600)
    evals = [e for e in map(json.loads, metrics.read_text().splitlines()) if e["event"] == "eval"]
    return [{"seconds": e["time"] - start, "epoch": e["epoch"], "top1": e["top1"],
             "ema_top1": e.get("ema_top1")} for e in evals]


def plot(curves, png):
    """Top-1 against wall time, one line per recipe, drawn with PIL (no plotting package)."""
    width, height, left, right, top, bottom = 900, 520, 70, 30, 40, 60
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    t_max = max(p["seconds"] for points in curves.values() for p in points) * 1.05
    x = lambda s: left + (width - left - right) * s / t_max
    y = lambda top1: height - bottom - (height - top - bottom) * top1 / 100
    for top1 in range(0, 101, 20):  # grid and y ticks
        draw.line([(left, y(top1)), (width - right, y(top1))], fill=(225, 225, 225))
        draw.text((left - 35, y(top1) - 6), f"{top1}%", fill="black")
    step = max(10, round(t_max / 6 / 10) * 10)  # about six ticks, whole tens of seconds
    for s in range(0, int(t_max) + 1, step):
        draw.text((x(s) - 10, height - bottom + 8), f"{s}s", fill="black")
    draw.line([(left, top), (left, height - bottom), (width - right, height - bottom)],
              fill="black")
    colours = {"baseline": (200, 60, 40), "fast": (40, 90, 200)}
    for row, (name, points) in enumerate(curves.items()):
        xy = [(x(p["seconds"]), y(best(p))) for p in points]
        draw.line(xy, fill=colours[name], width=3)
        for px, py in xy:
            draw.ellipse([px - 4, py - 4, px + 4, py + 4], fill=colours[name])
        draw.line([(left + 20, top + 10 + 18 * row), (left + 50, top + 10 + 18 * row)],
                  fill=colours[name], width=3)
        draw.text((left + 58, top + 4 + 18 * row), LABELS[name], fill="black")
    draw.text((left, 12), "ResNet-18 on 12 photo classes, CPU (2 cores): held-out top-1 "
              "after each epoch against wall time since launch", fill="black")
    draw.text((width // 2 - 60, height - 28), "wall time since launch", fill="black")
    image.save(png)


LABELS = {"baseline": "baseline: 64 px, no label smoothing, no EMA",
          "fast": "FixRes + progressive 48->64 px + EMA + label smoothing (best of weights, EMA)"}


def best(point):
    return max(point["top1"], point["ema_top1"] or 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/time-to-accuracy"))
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--png", type=pathlib.Path, default=ROOT / "docs/time-to-accuracy-cpu.png")
    args = parser.parse_args()
    if not PHOTOS.is_dir():
        raise SystemExit(f"{PHOTOS} is missing. Fix: scripts/setup.sh (installs mate-backgrounds)")
    build = pathlib.Path(os.environ.get("BUILD_DIR", ROOT / "build"))
    records = make_data(args.out, build)
    RECIPES["fast"][RECIPES["fast"].index(None)] = max(2, 2 * args.epochs // 3)
    curves = {name: train(name, recipe, args.out, records, build, args.epochs)
              for name, recipe in RECIPES.items()}
    for name, points in curves.items():
        for p in points:
            ema = f", EMA {p['ema_top1']:.1f}%" if p["ema_top1"] is not None else ""
            print(f"{name:8} epoch {p['epoch']:2} {p['seconds']:7.1f} s  top-1 {p['top1']:.1f}%{ema}")
    budget = curves["baseline"][-1]["seconds"]
    within = [p for p in curves["fast"] if p["seconds"] <= budget]
    if within:
        print(f"at the baseline's wall time ({budget:.0f} s): baseline "
              f"{curves['baseline'][-1]['top1']:.1f}%, fast {best(within[-1]):.1f}% "
              f"(epoch {within[-1]['epoch']})")
    target = curves["baseline"][-1]["top1"]
    reached = [p for p in curves["fast"] if best(p) >= target]
    print(f"fast reaches the baseline's final {target:.1f}% after "
          f"{reached[0]['seconds']:.0f} s" if reached else "fast never reaches the baseline's final top-1")
    plot(curves, args.png)
    print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
