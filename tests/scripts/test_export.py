"""scripts/export.py from the outside: a checkpoint of `train` becomes ONNX and TorchScript files
whose logits, in onnxruntime and in TorchScript, match those of the trainer's own model (its C++
forward in evaluation mode) on the same images preprocessed as preprocessing.json describes, at
more than one batch size."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from conftest import PHOTO_VAL_SIZE, ROOT, binary, run_train

TOLERANCE = 1e-4  # largest logit difference, relative to the largest logit


@pytest.fixture(scope="module")
def exported(photo_dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    records = photo_dataset["tfrecords"]
    result = run_train("--arch", "resnet18", "--num_classes", 10, "--data_source", "tfrecord",
                       "--train_data", records / "train-*", "--val_data",
                       records / "validation-*", "--image_size", 64, "--val_resize",
                       PHOTO_VAL_SIZE, "--batch_size", 32, "--max_steps", 3, "--warmup_epochs",
                       0, "--device", "cpu", "--tensorboard", "false", "--output_dir",
                       root / "run")
    assert result.returncode == 0, result.stdout + result.stderr
    checkpoint = sorted((root / "run" / "checkpoints").glob("checkpoint-*.pt"))[-1]
    export = subprocess.run([sys.executable, ROOT / "scripts/export.py", checkpoint,
                             root / "model"], capture_output=True, text=True, timeout=600)
    assert export.returncode == 0, export.stdout + export.stderr
    return {"checkpoint": checkpoint, "dir": root / "model", "log": export.stdout}


def preprocessed(folder, spec, count):
    """The first `count` held-out crops, preprocessed as preprocessing.json says."""
    preprocess = transforms.Compose([
        transforms.Resize(spec["resize_shorter_side"]),
        transforms.CenterCrop(spec["image_size"]), transforms.ToTensor(),
        transforms.Normalize(spec["mean"], spec["std"])])
    paths = sorted((folder / "val").glob("*/*.jpg"))[:count]
    return torch.stack([preprocess(Image.open(p).convert("RGB")) for p in paths])


def trainer_logits(checkpoint, images, tmp_path, weights="model", arch="resnet18"):
    """Logits of the trainer's own ResNet (C++, evaluation mode) for `images`."""
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"model": torch.load(checkpoint)[weights], "input": images}, src)
    subprocess.run([binary("resnet_parity_tool"), "forward", arch, "10", src, out],
                   check=True, timeout=300)
    return torch.load(out)["logits"]


def relative_error(got, expected):
    return (torch.as_tensor(got) - expected).abs().max().item() / expected.abs().max().item()


def test_preprocessing_is_the_checkpoints(exported):
    spec = json.loads((exported["dir"] / "preprocessing.json").read_text())
    assert (spec["image_size"], spec["resize_shorter_side"]) == (64, PHOTO_VAL_SIZE)
    assert spec["mean"] == [0.485, 0.456, 0.406] and spec["std"] == [0.229, 0.224, 0.225]
    assert "onnxruntime: largest difference" in exported["log"]


@pytest.mark.parametrize("batch", [1, 7])
def test_exported_models_match_the_trainer(exported, photo_dataset, tmp_path, batch):
    import onnxruntime
    spec = json.loads((exported["dir"] / "preprocessing.json").read_text())
    images = preprocessed(photo_dataset["folder"], spec, batch)
    expected = trainer_logits(exported["checkpoint"], images, tmp_path)
    session = onnxruntime.InferenceSession(str(exported["dir"] / "model.onnx"),
                                           providers=["CPUExecutionProvider"])
    onnx_logits = session.run(None, {"images": images.numpy().astype(np.float32)})[0]
    scripted = torch.jit.load(str(exported["dir"] / "model.torchscript.pt"))
    with torch.no_grad():
        script_logits = scripted(images)
    assert onnx_logits.shape == (batch, 10)
    print(f"batch {batch}: onnxruntime {relative_error(onnx_logits, expected):.1e}, "
          f"TorchScript {relative_error(script_logits, expected):.1e}")
    assert relative_error(onnx_logits, expected) < TOLERANCE
    assert relative_error(script_logits, expected) < TOLERANCE


def test_ema_of_a_blurpool_run_exports_as_the_trainer_computes_it(photo_dataset, tmp_path):
    """EMA and BlurPool on: --weights ema exports the average, each set of weights is written as
    a torchvision state dict, and the exported model is the trainer's BlurPool model."""
    import torchvision
    records = photo_dataset["tfrecords"]
    result = run_train("--arch", "resnet18", "--num_classes", 10, "--data_source", "tfrecord",
                       "--train_data", records / "train-*", "--val_data", "", "--image_size", 64,
                       "--val_resize", PHOTO_VAL_SIZE, "--batch_size", 16, "--max_steps", 2,
                       "--warmup_epochs", 0, "--ema_decay", 0.5, "--blurpool", "true",
                       "--device", "cpu", "--tensorboard", "false", "--output_dir",
                       tmp_path / "run")
    assert result.returncode == 0, result.stdout + result.stderr
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-000000002.pt"
    export = subprocess.run([sys.executable, ROOT / "scripts/export.py", checkpoint,
                             tmp_path / "model", "--weights", "ema"],
                            capture_output=True, text=True, timeout=600)
    assert export.returncode == 0, export.stdout + export.stderr
    saved = torch.load(checkpoint)
    for name in ("model", "ema"):
        state = torch.load(tmp_path / "model" / f"{name}_state_dict.pt")
        torchvision.models.resnet18(num_classes=10).load_state_dict(state, strict=True)
        assert all(torch.equal(state[k], saved[name][k]) for k in saved[name])
    assert not torch.equal(saved["ema"]["fc.weight"], saved["model"]["fc.weight"])

    spec = json.loads((tmp_path / "model" / "preprocessing.json").read_text())
    images = preprocessed(photo_dataset["folder"], spec, 3)
    expected = trainer_logits(checkpoint, images, tmp_path, "ema", "resnet18-blurpool")
    with torch.no_grad():
        got = torch.jit.load(str(tmp_path / "model" / "model.torchscript.pt"))(images)
    assert relative_error(got, expected) < TOLERANCE
