"""The training techniques of the fast recipes against the implementations they follow, on the
same tensors: MixUp and CutMix against torchvision.transforms.v2 (with the draw fixed), the
losses against torch.nn.functional (cross-entropy) and timm's BinaryCrossEntropy formula, and the
BlurPool variant against FFCV's BlurPoolConv2d wrapped around torchvision's ResNet, and repeated
augmentation's epochs against torchvision's RASampler."""
import importlib.util
import math
import subprocess

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torchvision.transforms import v2

from conftest import ROOT, binary

# FFCV's BlurPoolConv2d and apply_blurpool (examples/imagenet train_imagenet.py), as the exporter
# writes them for serving: the test holds the trainer's blur and the exported model's to FFCV's.
_export_spec = importlib.util.spec_from_file_location("export", ROOT / "scripts" / "export.py")
export = importlib.util.module_from_spec(_export_spec)
_export_spec.loader.exec_module(export)

CLASSES = 5


def run_tool(tmp_path, mode, inputs):
    src, out = tmp_path / f"{mode}-in.pt", tmp_path / f"{mode}-out.pt"
    torch.save(inputs, src)
    subprocess.run([binary("technique_parity_tool"), mode, src, out], check=True, timeout=120)
    return torch.load(out)


def batch(channels_last=False):
    torch.manual_seed(3)
    images = torch.randn(6, 3, 20, 28)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.tensor([0, 4, 2, 2, 1, 3])
    return images, labels, F.one_hot(labels, CLASSES).float()


@pytest.mark.parametrize("lam", [0.0, 0.37, 1.0])
def test_mixup_is_torchvisions(tmp_path, lam):
    images, labels, targets = batch()
    mixup = v2.MixUp(alpha=0.2, num_classes=CLASSES)
    mixup.make_params = lambda flat_inputs: {"lam": lam}  # torchvision's own draw replaced
    want_images, want_targets = mixup(images, labels)
    got = run_tool(tmp_path, "mix", {"images": images, "targets": targets,
                                     "params": torch.tensor([1, lam, 0, 0, 0, 0])})
    torch.testing.assert_close(got["images"], want_images, rtol=0, atol=1e-6)
    torch.testing.assert_close(got["targets"], want_targets, rtol=0, atol=1e-6)


@pytest.mark.parametrize("box", [(3, 2, 17, 11), (0, 0, 28, 20), (5, 7, 5, 7), (20, 10, 28, 20)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cutmix_is_torchvisions(tmp_path, box, channels_last):
    images, labels, targets = batch(channels_last)
    x1, y1, x2, y2 = box
    lam = 1.0 - (x2 - x1) * (y2 - y1) / (28 * 20)
    cutmix = v2.CutMix(alpha=1.0, num_classes=CLASSES)
    cutmix.make_params = lambda flat_inputs: {"box": box, "lam_adjusted": lam}
    want_images, want_targets = cutmix(images, labels)
    got = run_tool(tmp_path, "mix", {"images": images, "targets": targets,
                                     "params": torch.tensor([2, lam, x1, y1, x2, y2])})
    assert torch.equal(got["images"], want_images)  # a copy of pixels: exact
    torch.testing.assert_close(got["targets"], want_targets, rtol=0, atol=1e-6)


def timm_binary_cross_entropy(logits, target, smoothing):
    """timm.loss.BinaryCrossEntropy (reduction mean, no threshold): indices become smoothed
    one-hot rows (off = s / K, on = 1 - s + off); probabilities (after timm's Mixup, which smooths
    the same way) are smoothed likewise."""
    classes = logits.shape[-1]
    if target.dim() == 1:
        off = smoothing / classes
        target = torch.full_like(logits, off).scatter_(1, target.view(-1, 1), 1.0 - smoothing + off)
    else:
        target = target * (1.0 - smoothing) + smoothing / classes
    return F.binary_cross_entropy_with_logits(logits, target, reduction="mean")


@pytest.mark.parametrize("kind", ["cross_entropy", "bce"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("soft", [False, True])
def test_losses_are_the_references(tmp_path, kind, smoothing, soft):
    torch.manual_seed(4)
    logits = torch.randn(8, CLASSES) * 3
    targets = torch.randint(0, CLASSES, (8,))
    if soft:  # a MixUp of the one-hot rows
        one_hot = F.one_hot(targets, CLASSES).float()
        targets = 0.7 * one_hot + 0.3 * one_hot.roll(1, 0)
    if kind == "cross_entropy":
        want = F.cross_entropy(logits, targets, label_smoothing=smoothing)
    else:
        want = timm_binary_cross_entropy(logits, targets, smoothing)
    got = run_tool(tmp_path, "loss", {"logits": logits, "targets": targets,
                                      "params": torch.tensor([kind == "bce", smoothing])})
    torch.testing.assert_close(got["loss"], want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_blurpool_is_ffcvs_and_loads_into_torchvision(tmp_path, arch):
    out = tmp_path / "blurpool.pt"
    subprocess.run([binary("technique_parity_tool"), "blurpool", arch, out], check=True,
                   timeout=300)
    got = torch.load(out)
    state = {k[len("model."):]: v for k, v in got.items() if k.startswith("model.")}
    net = getattr(torchvision.models, arch)(num_classes=10)
    net.load_state_dict(state, strict=True)  # the variant keeps torchvision's names and shapes
    net.eval()
    with torch.no_grad():
        plain = net(got["input"])
        export.apply_blurpool(net)
        blurred = net(got["input"])
    torch.testing.assert_close(got["logits"], blurred, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(plain, blurred, rtol=1e-3, atol=1e-3), "the blur changed nothing"


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """torchvision's (references/classification/utils.py), as its recipe uses it: an
    AveragedModel that averages the BN buffers with the weights (use_buffers=True; at f923aeb2
    its own update_parameters averaged every state-dict entry, the same arithmetic)."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def weights_per_step(steps, classes):
    """A ResNet-18's state dict at the start and after each of `steps` steps: weights and BN
    statistics that move each step (the running variances stay positive)."""
    torch.manual_seed(5)
    net = torchvision.models.resnet18(num_classes=classes)
    states = []
    for _ in range(steps + 1):
        with torch.no_grad():
            for name, t in net.state_dict().items():
                if "running_var" in name:
                    t.mul_(torch.empty_like(t).uniform_(0.8, 1.25))
                elif t.is_floating_point():
                    t.add_(torch.randn_like(t) * 0.1)
                else:
                    t.add_(8)  # num_batches_tracked
        states.append({k: v.clone() for k, v in net.state_dict().items()})
    return net, states


@pytest.mark.parametrize("buffers", ["average", "copy"])
def test_ema_with_warmup_reset_is_torchvisions(tmp_path, buffers):
    """train.py's loop: an update every `every` steps, and in the warmup epochs n_averaged set back
    to 0 after it, so that the next update copies. The update steps follow the trainer's (every
    every-th step of the run; train.py's are the 0th, every-th, ... batch of each epoch, a
    difference the torchvision-v2 recipe declares)."""
    steps, classes, decay, every = 14, 4, 0.7, 2
    images_per_step, samples_per_epoch, warmup_epochs = 8, 32, 1  # 4 steps per epoch
    net, states = weights_per_step(steps, classes)
    net.load_state_dict(states[0])
    ema = ExponentialMovingAverage(net, decay)
    for step in range(1, steps + 1):
        net.load_state_dict(states[step])
        if step % every == 0:
            ema.update_parameters(net)
            epoch = (step - 1) * images_per_step // samples_per_epoch
            if epoch < warmup_epochs:
                ema.n_averaged.fill_(0)
    inputs = {f"{step}.{name}": t for step, state in enumerate(states) for name, t in state.items()}
    inputs["params"] = torch.tensor([steps, classes, decay, every, buffers == "average", 1,
                                     images_per_step, samples_per_epoch, warmup_epochs],
                                    dtype=torch.float64)
    got = run_tool(tmp_path, "ema", inputs)
    want = ema.module.state_dict()
    for name, tensor in want.items():
        if not tensor.is_floating_point():
            assert torch.equal(got[name], states[steps][name]), name  # the model's counter
        elif buffers == "copy" and "running_" in name:
            assert torch.equal(got[name], states[steps][name]), name  # the model's statistics
        else:
            torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    # The average moved away from the weights after the warmup: it is not a copy.
    assert not torch.allclose(got["fc.weight"], states[steps]["fc.weight"])


class RASampler(torch.utils.data.Sampler):
    """torchvision's references/classification/sampler.py @ f923aeb2 (the --ra-reps version), the
    arithmetic as written there: each index of the epoch's permutation `repetitions` times in a
    row, dealt index by index to the replicas, the epoch cut to a multiple of 256 images."""

    def __init__(self, dataset_len, num_replicas, rank, seed=0, repetitions=3):
        self.dataset_len, self.num_replicas, self.rank = dataset_len, num_replicas, rank
        self.epoch, self.seed, self.repetitions = 0, seed, repetitions
        self.num_samples = int(math.ceil(dataset_len * float(repetitions) / num_replicas))
        self.total_size = self.num_samples * num_replicas
        self.num_selected_samples = int(math.floor(dataset_len // 256 * 256 / num_replicas))

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        indices = torch.randperm(self.dataset_len, generator=g).tolist()
        indices = [ele for ele in indices for i in range(self.repetitions)]
        indices += indices[: (self.total_size - len(indices))]
        indices = indices[self.rank: self.total_size: self.num_replicas]
        return iter(indices[: self.num_selected_samples])


def repetition_summary(rank_records):
    """What repeated augmentation makes of an epoch, whatever the shuffle: images per rank,
    distinct images, copies per image, and how many images have their copies on each set of
    ranks."""
    ranks_of = {}
    for rank, records in enumerate(rank_records):
        for record in records:
            ranks_of.setdefault(record, []).append(rank)
    rank_sets = {}
    for ranks in ranks_of.values():
        key = tuple(sorted(ranks))
        rank_sets[key] = rank_sets.get(key, 0) + 1
    copies = {len(ranks) for ranks in ranks_of.values()}
    return [len(r) for r in rank_records], len(ranks_of), copies, rank_sets


@pytest.mark.parametrize("world,batch", [(8, 16), (16, 8), (4, 32)])
def test_repeated_augmentation_is_rasamplers(tmp_path, world, batch):
    """--ra-sampler --ra-reps 4 on 1,024 images: each rank trains as many images as RASampler
    gives it, a quarter of the images are shown, each 4 times, on 4 consecutive ranks (the same
    sets of ranks, as often), with torchvision's arithmetic beside ours."""
    records, reps = 1024, 4
    keys = run_tool(tmp_path, "ra", {"params": torch.tensor([records, world, batch, reps, 5, 3])})
    ours = repetition_summary((keys["keys"] // reps).tolist())
    theirs = repetition_summary([list(RASampler(records, world, rank, repetitions=reps))
                                 for rank in range(world)])
    print(f"{world} ranks: ours {ours[:3]}, RASampler {theirs[:3]}")
    assert ours == theirs
    assert ours[1] == records // reps and ours[2] == {reps}
