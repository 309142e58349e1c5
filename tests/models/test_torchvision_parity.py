"""Numeric parity with torchvision: our ResNet-50's state_dict loads into torchvision with
strict=True and gives the same logits, and torchvision's weights give the same logits in ours."""
import subprocess

import pytest
import torch
import torchvision

from conftest import binary

REL_TOL = 1e-4


def relative_error(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("arch,classes", [("resnet50", 1000), ("resnet18", 10)])
def test_our_weights_in_torchvision(tmp_path, arch, classes):
    out = tmp_path / "ours.pt"
    subprocess.run([binary("resnet_parity_tool"), "export", arch, str(classes), out], check=True)
    state = torch.load(out)
    io = torch.load(f"{out}.io")
    net = getattr(torchvision.models, arch)(num_classes=classes)
    net.load_state_dict(state, strict=True)
    net.eval()
    with torch.no_grad():
        logits = net(io["input"])
    assert relative_error(logits, io["logits"]) < REL_TOL


def test_torchvision_weights_in_ours(tmp_path):
    torch.manual_seed(1)
    net = torchvision.models.resnet50()
    net.train()
    with torch.no_grad():  # non-trivial BN running statistics
        for _ in range(2):
            net(torch.randn(4, 3, 64, 64) * 2 + 0.5)
    net.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = net(x)
    src, out = tmp_path / "tv.pt", tmp_path / "logits.pt"
    torch.save({"model": dict(net.state_dict()), "input": x}, src)
    subprocess.run([binary("resnet_parity_tool"), "forward", "resnet50", "1000", src, out],
                   check=True)
    assert relative_error(torch.load(out)["logits"], expected) < REL_TOL
