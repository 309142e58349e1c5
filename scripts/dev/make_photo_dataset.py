#!/usr/bin/env python3
"""A small dataset of real photographs for CPU experiments and tests: each photo is a class, its
images are crops of it. Training crops come from the left part of each photo and held-out crops
from the right part, so evaluation sees pixels training never did. Writes an ImageFolder tree
(OUT/train/<class>/*.jpg, OUT/val/<class>/*.jpg) for make-tfrecords.

    scripts/dev/make_photo_dataset.py OUT [--photos /usr/share/backgrounds/mate/nature]

The default photos come with Debian's mate-backgrounds package (scripts/setup.sh installs it).
Held-out crops are saved at --val-size on each side: with val_resize = --val-size the trainer's
evaluation resize leaves them as they are, and only the centre crop remains.
"""
import argparse
import pathlib
import random

from PIL import Image

TRAIN_PART = 0.7  # the left 70% of each photo's width gives training crops, the rest held-out


def random_square(rng, left, right, height, low, high):
    """A square (x, y, side) inside columns [left, right) and rows [0, height), with its side a
    random fraction in [low, high] of the region's shorter side."""
    shorter = min(right - left, height)
    side = max(8, int(shorter * rng.uniform(low, high)))
    x = rng.randint(left, right - side)
    y = rng.randint(0, height - side)
    return x, y, side


def crops(photo, rng, count, region, size, scale):
    width, height = photo.size
    left, right = int(width * region[0]), int(width * region[1])
    for _ in range(count):
        x, y, side = random_square(rng, left, right, height, *scale)
        yield photo.crop((x, y, x + side, y + side)).resize((size, size), Image.BILINEAR)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--photos", type=pathlib.Path,
                        default=pathlib.Path("/usr/share/backgrounds/mate/nature"))
    parser.add_argument("--classes", type=int, default=10, help="photos used, in name order")
    parser.add_argument("--train-per-class", type=int, default=40)
    parser.add_argument("--val-per-class", type=int, default=10)
    parser.add_argument("--train-size", type=int, default=96, help="training crops, pixels")
    parser.add_argument("--val-size", type=int, default=72, help="held-out crops, pixels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    photos = sorted(p for p in args.photos.iterdir() if p.suffix.lower() in (".jpg", ".jpeg"))
    if len(photos) < args.classes:
        raise SystemExit(f"{args.photos} has {len(photos)} JPEG photos, fewer than --classes "
                         f"{args.classes}. Fix: apt-get install mate-backgrounds, or --photos DIR")
    rng = random.Random(args.seed)
    for path in photos[:args.classes]:
        photo = Image.open(path).convert("RGB")
        for split, count, region, size, scale in (
                ("train", args.train_per_class, (0, TRAIN_PART), args.train_size, (0.2, 0.6)),
                ("val", args.val_per_class, (TRAIN_PART, 1), args.val_size, (0.3, 0.6))):
            folder = args.out / split / path.stem.lower()
            folder.mkdir(parents=True, exist_ok=True)
            for i, crop in enumerate(crops(photo, rng, count, region, size, scale)):
                crop.save(folder / f"{i:04d}.jpg", quality=90)
    print(f"{args.classes} classes in {args.out}/train and {args.out}/val")


if __name__ == "__main__":
    main()
