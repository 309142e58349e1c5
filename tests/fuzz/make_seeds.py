"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/seed-*): small real inputs
made by the libraries that make them in the wild (PIL/libjpeg for JPEGs and PNGs, TensorFlow for
Examples and TFRecords, torch.save for weights and checkpoints, tarfile for archives); and some
inputs of past findings (regression-*), rebuilt here with what each broke (the others are the
fuzzer's own inputs, kept as they were).
Run with the project's venv: python tests/fuzz/make_seeds.py"""

import io
import os
import struct
import tarfile
import zipfile
from collections import OrderedDict

import numpy as np
import tensorflow as tf
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data, kind="seed"):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{kind}-{name}"), "wb") as f:
        f.write(data)


def picture(width, height, mode="RGB"):
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1),
                    (x ^ y) * 16 % 256], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb, "RGB").convert(mode)


def encoded(image, fmt, **options):
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def images():
    """Name -> bytes: the JPEG kinds ImageNet holds (4:2:0, 4:4:4, progressive, grayscale,
    CMYK, EXIF, odd sizes), PNGs (RGB, RGBA, 16-bit grey, palette), and the other formats
    torchvision's ImageFolder reads (BMP, TIFF, WebP, PPM)."""
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation
    return {
        "420.jpg": encoded(picture(40, 30), "JPEG", quality=75),
        "444.jpg": encoded(picture(24, 16), "JPEG", quality=90, subsampling=0),
        "progressive.jpg": encoded(picture(33, 21), "JPEG", progressive=True),
        "grey.jpg": encoded(picture(20, 20, "L"), "JPEG"),
        "cmyk.jpg": encoded(picture(16, 12, "CMYK"), "JPEG"),
        "exif.jpg": encoded(picture(17, 9), "JPEG", exif=exif.tobytes()),
        "rgb.png": encoded(picture(19, 11), "PNG"),
        "rgba.png": encoded(picture(12, 12, "RGBA"), "PNG"),
        "grey16.png": encoded(Image.fromarray(np.arange(64, dtype=np.uint16).reshape(8, 8) * 999),
                              "PNG"),
        "palette.png": encoded(picture(10, 7, "P"), "PNG"),
        "rgb.bmp": encoded(picture(9, 5), "BMP"),
        "rgb.tiff": encoded(picture(8, 6), "TIFF", compression="tiff_lzw"),
        "rgb.webp": encoded(picture(12, 10), "WEBP", quality=50),
        "rgb.ppm": encoded(picture(6, 4), "PPM"),
    }


def tf_example(image, label, boxes=()):
    def b(value):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def i(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    def f(values):
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))

    feature = {
        "image/encoded": b(image), "image/format": b(b"JPEG"), "image/class/label": i(label),
        "image/class/synset": b(b"n01440764"), "image/class/text": b(b"tench, Tinca tinca"),
        "image/height": i(30), "image/width": i(40), "image/colorspace": b(b"RGB"),
        "image/channels": i(3), "image/filename": b(b"n01440764_10026.JPEG"),
    }
    for k, name in enumerate(["xmin", "ymin", "xmax", "ymax"]):
        feature["image/object/bbox/" + name] = f([box[k] for box in boxes])
    feature["image/object/bbox/label"] = tf.train.Feature(
        int64_list=tf.train.Int64List(value=[label] * len(boxes)))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def tfds_example(image, label):
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "file_name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"n01440764_1.JPEG"])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def records(payloads):
    path = os.path.join(HERE, ".records.tmp")
    with tf.io.TFRecordWriter(path) as writer:
        for payload in payloads:
            writer.write(payload)
    with open(path, "rb") as f:
        data = f.read()
    os.remove(path)
    return data


def torch_saved(value):
    out = io.BytesIO()
    torch.save(value, out)
    return out.getvalue()


def state_dict():
    model = torch.nn.Sequential(OrderedDict(
        conv1=torch.nn.Conv2d(3, 2, 1, bias=False), bn1=torch.nn.BatchNorm2d(2),
        fc=torch.nn.Linear(2, 3)))
    return model.state_dict()


def tar_bytes(members, fmt):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("folder")
        info.type = tarfile.DIRTYPE
        archive.addfile(info)
    # tarfile pads to 10 KiB records; the reader stops at the two zero blocks, so keep just those
    # (small seeds fuzz faster).
    data = out.getvalue().rstrip(b"\0")
    return data + bytes(-len(data) % 512 + 1024)


def main():
    pictures = images()
    for name, data in pictures.items():
        # fuzz_image_decode reads 10 bytes of crop and output size first.
        write("image_decode", name, struct.pack(">HHB4B", 64, 48, 0, 32, 16, 192, 200) + data)
        write("image_decode", "outside-" + name, struct.pack(">HHB4B", 7, 5, 1, 0, 250, 3, 255) + data)
    jpeg = pictures["420.jpg"]
    tf_record = tf_example(jpeg, 1, boxes=[(0.1, 0.2, 0.8, 0.9), (0.0, 0.0, 1.0, 1.0)])
    write("example", "tensorflow.pb", tf_record)
    write("example", "tensorflow-no-box.pb", tf_example(pictures["grey.jpg"], 1000))
    write("example", "tfds.pb", tfds_example(pictures["rgb.png"], 0))
    write("records", "tensorflow.tfrecord", records([tf_record, tf_example(jpeg, 7)]))
    write("records", "tfds.tfrecord", records([tfds_example(jpeg, 3)]))
    write("records", "empty-payload.tfrecord", records([b"", b"x"]))

    weights = state_dict()
    write("torch_save", "state_dict.pt", torch_saved(weights))
    write("torch_save", "wrapped.pt", torch_saved({"state_dict": weights, "epoch": 3}))
    write("torch_save", "ddp.pt", torch_saved({"model": OrderedDict(
        ("module." + k, v) for k, v in weights.items())}))
    write("torch_save", "checkpoint.pt", torch_saved({  # the layout of this trainer's checkpoints
        "model": dict(weights), "optimizer": {"momentum_buffer.fc.weight": torch.zeros(3, 2)},
        "architecture": "resnet50", "loss_scale": 65536.0, "loss_scale_growth_tracker": 0,
        "step": 10, "epoch": 1, "samples_in_epoch": 64, "eval_pending": False,
        "target_reached": False, "world_size": 2, "global_batch": 32, "samples_per_epoch": 1024,
        "config": "arch = \"resnet50\"\n", "class_synsets": ["n01440764", "n01443537", "n01484850"],
        "class_texts": ["tench", "goldfish", "great white shark"]}))
    write("torch_save", "half-and-views.pt", torch_saved({
        "a": torch.arange(6, dtype=torch.float16).view(2, 3), "b": torch.arange(8)[2:6],
        "c": torch.ones(2, 2).t(), "n": [1, 2.5, "s", (True, None)]}))

    write("tar", "ustar.tar", tar_bytes([("n01440764_1.JPEG", jpeg[:300])], tarfile.USTAR_FORMAT))
    write("tar", "gnu-long-name.tar", tar_bytes([("n" * 120 + ".JPEG", b"abc")], tarfile.GNU_FORMAT))
    write("tar", "pax.tar", tar_bytes([("p" * 150 + "/x.JPEG", b"abcd"), ("b.txt", b"")],
                                      tarfile.PAX_FORMAT))
    inner = tar_bytes([("n01440764_2.JPEG", b"jpeg bytes")], tarfile.GNU_FORMAT)
    write("tar", "tar-in-tar.tar", tar_bytes([("n01440764.tar", inner)], tarfile.GNU_FORMAT))

    # Configs as users edit them (the shipped ones in configs/ are seeds too): comments, spacing,
    # single quotes, integers written as floats, a valid small run on generated data.
    write("config", "edited.toml", b"""# my run
arch = 'resnet18'   # smaller
data_source="synthetic"
image_size = 64
batch_size = 8
epochs = 1
base_lr = 1e-1
device = "cpu"
precision = "fp32"
output_dir = "/tmp/trainer-fuzz-run"
log_every_steps = 1
""")
    write("config", "choices.toml", b"""lr_schedule = "step"
optimizer = "lars"
auto_augment = "randaugment"
train_crop = "distorted_bounding_box"
epoch_order = "global"
resume = "none"
channels_last = false
""")

    write("augment", "small.bin", bytes(range(64)))
    write("augment", "grey-ramp.bin", struct.pack(">HHB", 1000, 800, 2) + bytes(200))


def augment_input(op, magnitude_exponent, bilinear, sign=1):
    """fuzz_augment's bytes (tests/fuzz/fuzz_augment.cpp reads them in this order) for one op at a
    magnitude of sign x 2^magnitude_exponent on an 8x8 image."""
    u16 = lambda v: struct.pack(">H", v)
    crop = u16(0) + u16(99) + u16(99) + bytes([0]) + u16(0) + u16(0) + u16(0)  # seed, samplers
    size = u16(7) + u16(7)  # integer(1, 48): 8 x 8
    # op, then a plain magnitude (ignored) and the special one: number(-1, 1) = sign,
    # integer(-60, 60) = the exponent
    magnitude = u16(0) + bytes([0]) + u16(65535 if sign > 0 else 0) + u16(magnitude_exponent + 60)
    policy = bytes([1 if bilinear else 0, 0]) + u16(0) + u16(0) + u16(0)
    return crop + size + bytes([op]) + magnitude + policy + bytes(range(192))


def regressions(pictures):
    # A PNG whose header claims 2^32 - 1 x 2^32 - 1: the pixel count overflowed a 64-bit product
    # (UndefinedBehaviorSanitizer) and passed the size limit.
    png = bytearray(pictures["rgb.png"])
    png[16:24] = b"\xff" * 8  # IHDR width and height
    write("image_decode", "png-sides-2e32.png", struct.pack(">HHB4B", 8, 8, 0, 0, 0, 255, 255) + png,
          "regression")
    # A shear of 2^60, bilinear and nearest: source points past an int were converted (UBSan).
    write("augment", "shear-2e60-bilinear.bin", augment_input(1, 60, True), "regression")
    write("augment", "shear-2e60-nearest.bin", augment_input(1, 60, False), "regression")
    # Posterize at -2^40: the magnitude was converted to int before clamping (UBSan).
    write("augment", "posterize-minus-2e40.bin", augment_input(10, 40, False, sign=-1),
          "regression")
    # A pickle string claiming 2 GB: LibTorch's unpickler allocated it before reading.
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}X\x00\x00\x00\x77ws.")
        archive.writestr("archive/byteorder", b"little")
        archive.writestr("archive/version", b"3\n")
    write("torch_save", "pickle-string-2gb.pt", out.getvalue(), "regression")
    # An Example without image/format: it is written back as JPEG (the round trip's rule).
    example = tf.train.Example.FromString(tf_example(pictures["420.jpg"], 1))
    del example.features.feature["image/format"]
    write("example", "no-format.pb", example.SerializeToString(), "regression")


if __name__ == "__main__":
    main()
    regressions(images())
