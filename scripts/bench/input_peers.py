"""Peers of bench-input on the same images: torchvision ImageFolder + DataLoader with PIL
transforms, tf.data with decode_and_crop_jpeg (the TF ResNet recipe) and DALI's CPU pipeline
(fn.readers.tfrecord + decoders.image_random_crop, NVIDIA's ResNet-50 recipe). Same transforms:
train = RandomResizedCrop(224) + flip; val = shorter side 256 + centre crop 224; uint8 output.
Each is timed after the same warm-up as bench-input, and its CPU time (every thread, and the
DataLoader's worker processes) gives images per CPU-second."""
import argparse
import glob
import os
import time


def child_pids():
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids += f.read().split()
        except OSError:  # the thread has ended
            pass
    return pids


def cpu_seconds():
    """CPU time so far of this process (all threads) and of its live children."""
    t = os.times()
    total = t.user + t.system
    for pid in child_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def rate(batches, images, warmup):
    """(images/s, images per CPU-second) over `images` images after `warmup` images."""
    warm = 0
    while warm < max(warmup, 1):
        warm += len(next(batches)[1])
    done, start, cpu_start = 0, time.perf_counter(), cpu_seconds()
    while done < images:
        done += len(next(batches)[1])
    return done / (time.perf_counter() - start), done / (cpu_seconds() - cpu_start)


def forever(make):
    while True:
        yield from make()


def torchvision_rate(folder, threads, mode, images, warmup):
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
    return rate(forever(lambda: iter(loader)), images, warmup)


def record_files(records):
    return sorted(f for f in glob.glob(records) if not f.endswith(".idx"))


def tfdata_rate(records, threads, mode, images, warmup):
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
    data = (tf.data.TFRecordDataset(record_files(records)).repeat()
            .map(train if mode == "train" else val, num_parallel_calls=threads)
            .batch(64).prefetch(2).with_options(options))
    return rate(iter(data.as_numpy_iterator()), images, warmup)


def dali_rate(records, threads, mode, images, warmup):
    from nvidia.dali import fn, pipeline_def, types
    import nvidia.dali.tfrecord as tfrec
    files = record_files(records)

    @pipeline_def(batch_size=64, num_threads=threads, device_id=None, prefetch_queue_depth=2)
    def pipeline():
        f = fn.readers.tfrecord(
            path=files, index_path=[p + ".idx" for p in files], random_shuffle=mode == "train",
            initial_fill=1024,
            features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                      "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
        if mode == "train":
            image = fn.decoders.image_random_crop(
                f["image/encoded"], device="cpu", output_type=types.RGB,
                random_aspect_ratio=[0.75, 4.0 / 3.0], random_area=[0.08, 1.0], num_attempts=10)
            image = fn.resize(image, resize_x=224, resize_y=224)
            image = fn.flip(image, horizontal=fn.random.coin_flip())
        else:
            image = fn.decoders.image(f["image/encoded"], device="cpu", output_type=types.RGB)
            image = fn.crop(fn.resize(image, resize_shorter=256), crop=(224, 224))
        return image, f["image/class/label"]

    pipe = pipeline()
    pipe.build()
    return rate(iter(pipe.run, None), images, warmup)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--records", required=True)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--warmup-images", type=int, default=1500)
    parser.add_argument("--peers", nargs="+", default=["torchvision", "tf.data", "dali"],
                        choices=["torchvision", "tf.data", "dali"])
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(f"{'peer':<24} {'mode':<6} {'threads':>8} {'images/s':>12} {'images/s/thread':>18}"
          f" {'images/cpu-s':>16}")
    peers = {"torchvision": ("torchvision+PIL", torchvision_rate, args.folder),
             "tf.data": ("tf.data", tfdata_rate, args.records),
             "dali": ("DALI (CPU)", dali_rate, args.records)}
    for name, fn, source in (peers[p] for p in args.peers):
        for mode in ["train", "val"]:
            for threads in args.threads:
                try:
                    r, per_cpu = fn(source, threads, mode, args.images, args.warmup_images)
                    print(f"{name:<24} {mode:<6} {threads:>8} {r:>12.1f} {r / threads:>18.1f}"
                          f" {per_cpu:>16.1f}", flush=True)
                except ImportError as error:
                    print(f"{name:<24} {mode:<6} {threads:>8} skipped: {error}", flush=True)


if __name__ == "__main__":
    main()
