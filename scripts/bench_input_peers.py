"""Peers of bench-input on the same images: torchvision ImageFolder + DataLoader with PIL
transforms, and tf.data with decode_and_crop_jpeg (the TF ResNet recipe). Same transforms:
train = RandomResizedCrop(224) + flip; val = shorter side 256 + centre crop 224; uint8 output."""
import argparse
import glob
import os
import time


def rate(batches, images):
    next(batches)  # warm-up: workers started
    done, start = 0, time.perf_counter()
    while done < images:
        done += len(next(batches)[1])
    return done / (time.perf_counter() - start)


def forever(make):
    while True:
        yield from make()


def torchvision_rate(folder, threads, mode, images):
    import torch
    from torchvision import datasets, transforms
    torch.set_num_threads(1)
    if mode == "train":
        t = [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip()]
    else:
        t = [transforms.Resize(256), transforms.CenterCrop(224)]
    data = datasets.ImageFolder(folder, transforms.Compose(t + [transforms.PILToTensor()]))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True, num_workers=threads,
                                         persistent_workers=True, drop_last=True)
    return rate(forever(lambda: iter(loader)), images)


def tfdata_rate(records, threads, mode, images):
    import tensorflow as tf
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

    def train(record):
        f = tf.io.parse_single_example(record, spec)
        shape = tf.io.extract_jpeg_shape(f["image/encoded"])
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, tf.zeros([0, 0, 4]), min_object_covered=0.1, aspect_ratio_range=[0.75, 1.33],
            area_range=[0.08, 1.0], max_attempts=10, use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = tf.io.decode_and_crop_jpeg(f["image/encoded"], window, channels=3)
        image = tf.image.random_flip_left_right(tf.image.resize(image, [224, 224]))
        return tf.cast(image, tf.uint8), f["image/class/label"]

    def val(record):
        f = tf.io.parse_single_example(record, spec)
        image = tf.io.decode_jpeg(f["image/encoded"], channels=3)
        shape = tf.cast(tf.shape(image)[:2], tf.float32)
        scale = 256.0 / tf.reduce_min(shape)
        image = tf.image.resize(image, tf.cast(tf.round(shape * scale), tf.int32))
        image = tf.image.resize_with_crop_or_pad(image, 224, 224)
        return tf.cast(image, tf.uint8), f["image/class/label"]

    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    data = (tf.data.TFRecordDataset(sorted(f for f in glob.glob(records) if not f.endswith(".idx"))).repeat()
            .map(train if mode == "train" else val, num_parallel_calls=threads)
            .batch(64).prefetch(2).with_options(options))
    return rate(iter(data.as_numpy_iterator()), images)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--records", required=True)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--images", type=int, default=3000)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(f"{'peer':<24} {'mode':<6} {'threads':>8} {'images/s':>12} {'images/s/thread':>18}")
    for name, fn, source in [("torchvision+PIL", torchvision_rate, args.folder),
                             ("tf.data", tfdata_rate, args.records)]:
        for mode in ["train", "val"]:
            for threads in args.threads:
                try:
                    r = fn(source, threads, mode, args.images)
                    print(f"{name:<24} {mode:<6} {threads:>8} {r:>12.1f} {r / threads:>18.1f}",
                          flush=True)
                except ImportError as error:
                    print(f"{name:<24} {mode:<6} {threads:>8} skipped: {error}", flush=True)


if __name__ == "__main__":
    main()
