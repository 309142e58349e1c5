#!/usr/bin/env python3
"""Exports a trained model for serving: ONNX and TorchScript with a dynamic batch axis, plus the
preprocessing the server must reproduce, then checks both against the PyTorch model they came
from (onnxruntime and TorchScript on two batch sizes).

    scripts/export.py CHECKPOINT OUT_DIR [--weights model|ema]

CHECKPOINT is one of the trainer's checkpoint-*.pt files (arch, num_classes and the evaluation
sizes come from the configuration inside it) or a PyTorch state dict (give --arch; the width of
its classifier gives num_classes). Writes OUT_DIR/model.onnx, OUT_DIR/model.torchscript.pt and
OUT_DIR/preprocessing.json (with the classes in logit order, logits[:, i] being classes[i], when
the checkpoint names them: its run had a synsets.txt beside the data, or class_names_file), and,
from a checkpoint, each set of weights it holds as its own torchvision state dict:
OUT_DIR/model_state_dict.pt and, with EMA on, OUT_DIR/ema_state_dict.pt.
--weights ema exports the EMA of the weights instead of the weights. A BlurPool checkpoint becomes
torchvision's ResNet with FFCV's blur before its strided convolutions. Exits 1 when an exported
model disagrees with PyTorch.
"""
import argparse
import json
import pathlib
import re
import sys

import torch
import torchvision

# The trainer's normalisation (data/transforms/device_input.h): RGB in [0, 1], minus mean, over std.
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
TOLERANCE = 1e-4  # largest difference from PyTorch's logits, relative to their largest magnitude


def config_value(config, key, default):
    """`key = value` of the checkpoint's resolved configuration (flat TOML), as a string."""
    match = re.search(rf'^{key} = "?([^"\n]*)"?$', config, re.MULTILINE)
    return match.group(1) if match else default


class BlurPoolConv2d(torch.nn.Module):
    """FFCV's BlurPoolConv2d (examples/imagenet train_imagenet.py): a depthwise [1 2 1] x [1 2 1]
    / 16 blur, stride 1, before the wrapped strided convolution (the trainer's blurpool = true,
    models/resnet.h). tests/train/test_technique_parity.py holds it to the trainer's."""

    def __init__(self, conv):
        super().__init__()
        taps = torch.tensor([[[[1, 2, 1], [2, 4, 2], [1, 2, 1]]]]) / 16.0
        self.conv = conv
        self.register_buffer("blur_filter", taps.repeat(conv.in_channels, 1, 1, 1))

    def forward(self, x):
        blurred = torch.nn.functional.conv2d(x, self.blur_filter, padding=1,
                                             groups=self.conv.in_channels)
        return self.conv(blurred)


def apply_blurpool(module):
    """FFCV's apply_blurpool: every strided Conv2d with 16 or more input channels."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Conv2d) and max(child.stride) > 1 and \
                child.in_channels >= 16:
            setattr(module, name, BlurPoolConv2d(child))
        else:
            apply_blurpool(child)


def class_names(saved):
    """The checkpoint's classes in logit order, as preprocessing.json lists them; [] without."""
    synsets = saved.get("class_synsets") or []
    texts = saved.get("class_texts") or [""] * len(synsets)
    return [{"index": i, "synset": synset, "name": text or synset}
            for i, (synset, text) in enumerate(zip(synsets, texts))]


def load(path, arch, weights):
    """(torchvision model in eval mode, its arch, evaluation image size, evaluation resize, the
    checkpoint's state dicts by name, its classes in logit order)."""
    saved = torch.load(path, map_location="cpu")
    config = saved.get("config", "") if isinstance(saved.get("config"), str) else ""
    checkpoint = bool(config) and "model" in saved
    state_dicts = {name: saved[name] for name in ("model", "ema") if checkpoint and name in saved}
    if weights == "ema" and "ema" not in state_dicts:
        raise SystemExit(f"{path} holds no EMA of the weights (the run had ema_decay and "
                         "ema_half_life_images at 0): export its weights, without --weights ema")
    state = saved[weights] if checkpoint else saved.get("model", saved.get("state_dict", saved))
    state = {name.removeprefix("module."): tensor for name, tensor in state.items()}
    arch = arch or config_value(config, "arch", None)
    if arch is None:
        raise SystemExit(f"{path} is a state dict without a configuration: give --arch "
                         "(resnet18, resnet34, resnet50, resnet101, resnet152)")
    model = getattr(torchvision.models, arch)(num_classes=state["fc.weight"].shape[0])
    model.load_state_dict(state, strict=True)
    if str(saved.get("architecture", "")).endswith("-blurpool"):
        apply_blurpool(model)
    # The evaluation crop: val_image_size (FixRes), whose 0 means the training crop image_size.
    image_size = (int(config_value(config, "val_image_size", 0))
                  or int(config_value(config, "image_size", 224)))
    return (model.eval(), arch, image_size, int(config_value(config, "val_resize", 256)),
            state_dicts, class_names(saved) if checkpoint else [])


def preprocessing(image_size, resize, classes):
    spec = {
        "input": "images: float32, (batch, 3, height, width) NCHW, RGB channel order",
        "resize": f"shorter side to {resize} pixels (bilinear, antialiased), aspect kept",
        "crop": f"centre {image_size} x {image_size}",
        "scale": "pixel values / 255 into [0, 1]",
        "mean": MEAN,
        "std": STD,
        "normalize": "(x - mean) / std per channel",
        "output": "logits: float32, (batch, num_classes); class index = training label - "
                  "label_offset (ImageNet TFRecords: label 1..1000 -> 0..999)",
        "image_size": image_size,
        "resize_shorter_side": resize,
    }
    if classes:
        spec["output"] = ("logits: float32, (batch, num_classes); logits[:, i] is classes[i] "
                          "(its synset and name)")
        spec["classes"] = classes
    return spec


def export(model, out, image_size):
    example = torch.randn(2, 3, image_size, image_size)
    onnx_path, script_path = out / "model.onnx", out / "model.torchscript.pt"
    batch = torch.export.Dim("batch", min=1, max=4096)
    torch.onnx.export(model, (example,), onnx_path, input_names=["images"],
                      output_names=["logits"], dynamic_shapes={"x": {0: batch}}, dynamo=True,
                      external_data=False)  # one file: ResNet-50's weights are far below 2 GB
    with torch.no_grad():
        torch.jit.trace(model, example).save(str(script_path))
    return onnx_path, script_path


def check(model, onnx_path, script_path, image_size):
    """Largest relative difference of each export from PyTorch, over batches of 1 and 3."""
    import onnxruntime
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    scripted = torch.jit.load(str(script_path))
    worst = {"onnxruntime": 0.0, "torchscript": 0.0}
    generator = torch.Generator().manual_seed(0)
    for batch in (1, 3):
        images = torch.randn(batch, 3, image_size, image_size, generator=generator)
        with torch.no_grad():
            expected = model(images)
            onnx_logits = session.run(None, {"images": images.numpy()})[0]
            got = {"onnxruntime": torch.from_numpy(onnx_logits), "torchscript": scripted(images)}
        for name, logits in got.items():
            error = ((logits - expected).abs().max() / expected.abs().max()).item()
            worst[name] = max(worst[name], error)
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=pathlib.Path)
    parser.add_argument("out_dir", type=pathlib.Path)
    parser.add_argument("--arch", help="for a state dict without configuration, e.g. resnet50")
    parser.add_argument("--image-size", type=int, help="evaluation crop (default: the "
                        "checkpoint's val_image_size, else its image_size, else 224)")
    parser.add_argument("--weights", choices=["model", "ema"], default="model",
                        help="a checkpoint's weights, or their EMA")
    args = parser.parse_args()
    model, arch, image_size, resize, state_dicts, classes = load(args.checkpoint, args.arch,
                                                                 args.weights)
    image_size = args.image_size or image_size
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, state in state_dicts.items():  # each loads into torchvision with strict=True
        torch.save(state, args.out_dir / f"{name}_state_dict.pt")
    onnx_path, script_path = export(model, args.out_dir, image_size)
    (args.out_dir / "preprocessing.json").write_text(
        json.dumps(preprocessing(image_size, resize, classes), indent=2) + "\n")
    worst = check(model, onnx_path, script_path, image_size)
    for name, error in worst.items():
        print(f"{name}: largest difference from PyTorch {error:.2e} of the largest logit")
    print(f"exported {arch} ({model.fc.out_features} classes"
          f"{', named in preprocessing.json' if classes else ', unnamed: index = label'}) to "
          f"{onnx_path} and {script_path}")
    if max(worst.values()) > TOLERANCE:
        print(f"export check failed: above the tolerance {TOLERANCE:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
