#!/usr/bin/env python3
"""The fused batch norm on the whole model: does a run with it train as a run without it does?

For each precision, `train` runs ResNet-50 for 200 steps on generated TFRecords three times:
fused from seed 1, unfused from seed 1, and unfused from seed 2. The last two differ as much as
two runs of the same recipe may (another initialisation, another data order): the run-to-run
spread. The fused run must stay within it of the unfused run from its seed, both in its loss
curve (the mean loss of each 20 steps) and in its held-out top-1. Then the fused run's last
checkpoint must load into torchvision (strict) and give there the logits the trainer's model
gives (resnet_parity_tool) on the same held-out images. Exits 1 when a check fails. With
--conv-fusion the fused run also has the convolution-side fusion (fused_conv_batch_norm).

    scripts/device/fused_numerics.py [--out DIR] [--device cuda] [--precisions fp16 bf16] [--conv-fusion]
        [--arch resnet50] [--steps 200] [--batch 64] [--image-size 160] [--classes 100]
        [--bin-dir DIR] [--train-args KEY VALUE ...]

The binaries (`train`, `generate-dataset`, `resnet_parity_tool`) are found on PATH, or in
--bin-dir and its tests/. On a CPU the fusion does not exist and both settings run ATen's ops:
the script then checks itself. scripts/device/checks.sh numerics runs it on the GPU.
"""
import argparse
import json
import math
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
WINDOW = 20  # steps per point of a loss curve: one step's loss is noise, 20 steps' mean is not
LOSS_FLOOR = 0.02  # the least loss difference called a disagreement (identical runs: 0)
RUN_TIMEOUT_S = 900  # one training run; ResNet-50's 200 steps take under a minute on an H100
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # data/transforms/device_input.h
PARITY_IMAGES = 32  # held-out images both models see as the same tensor
PARITY_TOLERANCE = 1e-4  # fp32 logits' relative difference (tests/models/test_torchvision_parity.py)


def window_means(losses, window=WINDOW):
    """The mean of each whole `window` of steps."""
    return [sum(losses[i:i + window]) / window for i in range(0, len(losses) - window + 1, window)]


def curve_distance(a, b, window=WINDOW):
    """The largest difference between two runs' loss curves (means of `window` steps)."""
    means_a, means_b = window_means(a, window), window_means(b, window)
    if not means_a or len(means_a) != len(means_b):
        raise ValueError(f"loss curves of {len(a)} and {len(b)} steps cannot be compared "
                         f"in windows of {window}")
    return max(abs(x - y) for x, y in zip(means_a, means_b))


def top1_tolerance(top1_a, top1_b, images):
    """Two standard errors of the difference of two top-1s (percent) over `images` images."""
    p = min(max((top1_a + top1_b) / 200, 0.05), 0.95)
    return 100 * 2 * math.sqrt(2 * p * (1 - p) / images)


def compare(fused, same_seed, other_seed):
    """Failures (strings) of a fused run against the unfused runs from its seed and another.
    Each run: {"losses": [per step], "top1": percent, "images": held-out images}."""
    failures = []
    loss_spread = curve_distance(same_seed["losses"], other_seed["losses"])
    loss_difference = curve_distance(fused["losses"], same_seed["losses"])
    print(f"  loss curves: fused against unfused {loss_difference:.4f}, run-to-run "
          f"{loss_spread:.4f} (largest difference of {WINDOW}-step means)")
    if loss_difference > max(loss_spread, LOSS_FLOOR):
        failures.append(f"the fused run's loss curve is {loss_difference:.4f} from the unfused "
                        f"run's, more than the run-to-run spread {loss_spread:.4f}")
    first, last = window_means(fused["losses"])[0], window_means(fused["losses"])[-1]
    if not last < first:
        failures.append(f"the fused run did not learn: mean loss {first:.4f} over its first "
                        f"{WINDOW} steps, {last:.4f} over its last")
    top1_spread = abs(same_seed["top1"] - other_seed["top1"])
    top1_difference = abs(fused["top1"] - same_seed["top1"])
    allowed = max(top1_spread, top1_tolerance(fused["top1"], same_seed["top1"], fused["images"]))
    print(f"  held-out top-1: fused {fused['top1']:.2f}%, unfused {same_seed['top1']:.2f}% "
          f"(another seed {other_seed['top1']:.2f}%), allowed difference {allowed:.2f} points")
    if top1_difference > allowed:
        failures.append(f"the fused run's top-1 is {top1_difference:.2f} points from the unfused "
                        f"run's, more than {allowed:.2f}")
    return failures


def run(command, what):
    """Runs a command to its end (a deadline on each); its output is printed when it fails."""
    print("+", " ".join(map(str, command)), flush=True)
    try:
        result = subprocess.run(list(map(str, command)), capture_output=True, text=True,
                                timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        sys.exit(f"{what} did not end within {RUN_TIMEOUT_S} s")
    if result.returncode != 0:
        print(result.stdout + result.stderr)
        sys.exit(f"{what} failed with exit status {result.returncode}")
    return result.stdout + result.stderr


def make_data(args, binary):
    """Training TFRecords, and held-out images as TFRecords and as files (one call writes both
    from the same images). Every image is square with the evaluation's resize as its side, so
    that the resize before the centre crop leaves it as it is: PIL's and the trainer's resizing
    differ, and flip enough near-ties among 100 classes to hide what this compares."""
    data = args.out / "data"
    per_class = math.ceil(args.steps * args.batch / args.classes)
    common = ["--classes", args.classes, "--width", args.val_resize, "--height", args.val_resize]
    made = " ".join(map(str, [*common, per_class, args.val_per_class]))  # reused when the same
    if (data / "done").exists() and (data / "done").read_text() == made:
        return data
    shutil.rmtree(data, ignore_errors=True)
    run([binary("generate-dataset"), *common, "--images-per-class", per_class, "--tfrecords",
         data / "train", "--train-shards", 8], "generating the training records")
    run([binary("generate-dataset"), *common, "--images-per-class", args.val_per_class,
         "--seed", 1, "--tfrecords", data / "heldout", "--train-shards", 2, "--image-folder",
         data / "heldout/folder"], "generating the held-out images")
    (data / "done").write_text(made)
    return data


def train(args, binary, data, precision, seed, fused):
    """One run; returns its per-step losses, its last evaluation and its last checkpoint."""
    out = args.out / f"{precision}-seed{seed}-{'fused' if fused else 'unfused'}"
    shutil.rmtree(out, ignore_errors=True)
    log = run([binary("train"), "--config", ROOT / "configs/one-gpu.toml", "--arch", args.arch,
               "--num_classes", args.classes, "--device", args.device, "--precision", precision,
               "--data_source", "tfrecord", "--train_data", data / "train/train-*",
               "--val_data", data / "heldout/train-*", "--image_size", args.image_size,
               "--val_resize", args.val_resize, "--batch_size", args.batch, "--epochs", 1,
               "--max_steps", args.steps, "--warmup_epochs", 0.25, "--seed", seed,
               "--fused_batch_norm", str(fused).lower(),
               "--fused_conv_batch_norm", str(fused and args.conv_fusion).lower(),
               "--log_every_steps", 1,
               "--tensorboard", "false", "--resume", "none", "--keep_checkpoints", 1,
               "--output_dir", out, *args.train_args], f"the {out.name} run")
    # "batch norm in Half: cuDNN BN+ReLU and BN+add+ReLU": what the fused setting ran.
    print("  " + next((line for line in log.splitlines() if "batch norm in" in line),
                      "batch norm: ATen's ops (no fused path on this device)"))
    for line in log.splitlines():  # the convolution-side fusion: on, and any block left unfused
        if "inside their convolutions" in line or "runs unfused" in line:
            print("  " + line)
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["event"] == "train"]
    evaluation = [e for e in events if e["event"] == "eval"][-1]
    checkpoint = sorted((out / "checkpoints").glob("checkpoint-*.pt"))[-1]
    return {"losses": losses, "top1": evaluation["top1"], "top5": evaluation["top5"],
            "images": evaluation["images"], "checkpoint": checkpoint}


def torchvision_check(args, binary, data, fused):
    """Failures of the fused run's last checkpoint in torchvision: it must load (strict) and give
    the logits the trainer's own model gives on the same held-out images (fp32, eval mode, on the
    CPU, through resnet_parity_tool). Also prints torchvision's top-1 over the held-out files."""
    import torch
    import torchvision
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    state = torch.load(fused["checkpoint"])["model"]
    net = getattr(torchvision.models, args.arch)(num_classes=args.classes)
    net.load_state_dict(state, strict=True)
    net.eval()
    preprocess = transforms.Compose([transforms.Resize(args.val_resize),
                                     transforms.CenterCrop(args.image_size),
                                     transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    images = ImageFolder(data / "heldout/folder", transform=preprocess)
    loader = torch.utils.data.DataLoader(images, batch_size=PARITY_IMAGES)
    batch = next(iter(loader))[0]
    parity_in, parity_out = args.out / "parity-in.pt", args.out / "parity-out.pt"
    torch.save({"model": dict(state), "input": batch}, parity_in)
    run([binary("resnet_parity_tool"), "forward", args.arch, args.classes, parity_in, parity_out],
        "the trainer's model on the fused checkpoint")
    with torch.no_grad():
        expected = net(batch)
    error = ((torch.load(parity_out)["logits"] - expected).norm() / expected.norm()).item()
    device = "cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu"
    net.to(device)
    hits = 0
    with torch.no_grad():
        for batch, labels in loader:
            hits += (net(batch.to(device)).argmax(1).cpu() == labels).sum().item()
    # Not compared: PIL decodes with the accurate IDCT and fancy chroma upsampling, the trainer
    # with the fast ones, which flips enough near-ties among 100 similar classes to hide a fault.
    print(f"  in torchvision: logits {error:.2e} from the trainer's (relative) on "
          f"{PARITY_IMAGES} held-out images; top-1 {100 * hits / len(images):.2f}% over "
          f"{len(images)} (PIL's decoding; train's own evaluation {fused['top1']:.2f}%)")
    if error > PARITY_TOLERANCE:
        return [f"the fused checkpoint's logits in torchvision are {error:.2e} from the "
                f"trainer's, more than {PARITY_TOLERANCE}"]
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/fused-numerics"))
    parser.add_argument("--bin-dir", type=pathlib.Path, help="where train, generate-dataset and "
                        "resnet_parity_tool are, or in its tests/ (default: PATH)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precisions", nargs="+", default=["fp16", "bf16"])
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=160)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--val-per-class", type=int, default=10)
    parser.add_argument("--conv-fusion", action="store_true",
                        help="the fused runs also apply bottlenecks' bn1 and bn2 inside their "
                        "convolutions (fused_conv_batch_norm)")
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                        help="keys added to every run (e.g. --cuda_graph true); last")
    args = parser.parse_args()
    args.val_resize = round(args.image_size * 256 / 224)
    if args.steps < 2 * WINDOW:
        parser.error(f"--steps must be at least {2 * WINDOW} (two {WINDOW}-step means)")

    def binary(name):
        # A build tree keeps the test tools in tests/; the device bundle has them all in bin/.
        where = f"{args.bin_dir}:{args.bin_dir / 'tests'}" if args.bin_dir else None
        path = shutil.which(name, path=where)
        if not path:
            sys.exit(f"{name} is not on {'--bin-dir' if args.bin_dir else 'PATH'}: build it "
                     "(scripts/build.sh) or unpack the device bundle")
        return path

    data = make_data(args, binary)
    failures = []
    for precision in args.precisions:
        print(f"== {precision}: {args.arch}, {args.steps} steps of {args.batch} images at "
              f"{args.image_size} px, {args.classes} classes", flush=True)
        fused = train(args, binary, data, precision, 1, True)
        same_seed = train(args, binary, data, precision, 1, False)
        other_seed = train(args, binary, data, precision, 2, False)
        found = compare(fused, same_seed, other_seed)
        found += torchvision_check(args, binary, data, fused)
        failures += [f"{precision}: {failure}" for failure in found]
    for failure in failures:
        print("FAILED:", failure)
    print("fused batch norm trains as the unfused one" if not failures else
          f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
