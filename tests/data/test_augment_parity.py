"""Augmentation ops against torchvision 0.26's transforms.v2 on a crop of a real photograph: the C++
ops (data/transforms/augment_ops.cpp, run one at a time by augment_parity_tool) equal torchvision's for the
pixel-wise ops and come within a PSNR bound for the geometric ones (identical on the build VM,
see GEOMETRIC_PSNR_DB); the policies' magnitude tables
equal torchvision's bit for bit; random erasing with the mean colour equals torchvision's erasing
with 0 after Normalize to within half a uint8 step. `pytest -s` prints the measured figures."""
import math
import subprocess

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from conftest import PHOTOS, binary

HEIGHT, WIDTH = 144, 176  # not square, so that a width / height mix-up shows
# Geometric ops: data/transforms/augment_ops.cpp's warp() repeats torch's float32 grid arithmetic and
# grid_sample's rounding half to even, so on the build VM (torch 2.11 on AVX-512) the outputs are
# identical. The bound leaves room for a torch build whose grid arithmetic rounds otherwise: only
# pixels whose source lies on a half could then differ (a shear of 0.6 about the corner puts a
# fifth of the rows there; OpenCV's warpAffine, rounding half up, scored 43-44 dB and 7-8% of
# the pixels). On this photograph a shift of one pixel everywhere scores 30-32 dB.
MAX_DIFFERING = 0.10  # fraction of the pixels
GEOMETRIC_PSNR_DB = 40.0
PHOTO = "RainDrops.jpg"  # textured: a one-pixel error shows (the first photograph if absent)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

# Each op at a few magnitudes, negative ones included; Solarize's are v2's fractions of 255 from
# the 31-bin table, most with an integer threshold (bin 18: 0.4 -> 102), where float32 decides
# whether a pixel of exactly that value flips.
SOLARIZE = [float(v) for v in torch.linspace(1.0, 0.0, 31)[[0, 15, 16, 18, 20, 29]]]
PIXEL_OPS = [("Brightness", m) for m in (-0.9, -0.33, 0.27, 0.99)] + \
            [("Color", m) for m in (-0.99, -0.45, 0.3, 0.9)] + \
            [("Contrast", m) for m in (-0.9, -0.2, 0.6, 0.99)] + \
            [("Sharpness", m) for m in (-0.99, -0.5, 0.42, 0.9)] + \
            [("Posterize", m) for m in (2, 4, 7, 8)] + \
            [("Solarize", m) for m in SOLARIZE] + \
            [("AutoContrast", 0.0), ("Equalize", 0.0), ("Invert", 0.0), ("Identity", 0.0)]
GEOMETRIC_OPS = [("ShearX", m) for m in (-0.99, -0.3, 0.1, 0.6)] + \
                [("ShearY", m) for m in (-0.6, -0.1, 0.3, 0.99)] + \
                [("TranslateX", m) for m in (-32.0, -13.7, 5.0, 101.5)] + \
                [("TranslateY", m) for m in (-65.2, -3.0, 13.7, 32.0)] + \
                [("Rotate", m) for m in (-135.0, -30.0, 7.5, 90.0, 133.0)]
POLICIES = {"trivialaugment_wide": v2.TrivialAugmentWide(),
            "randaugment": v2.RandAugment(),
            "autoaugment_imagenet": v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET)}


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    """A (HEIGHT, WIDTH, 3) uint8 crop of a photograph, and its PNG for the tool."""
    files = sorted(PHOTOS.glob("*.jpg")) if PHOTOS.is_dir() else []
    if not files:
        pytest.skip(f"no photographs in {PHOTOS}; scripts/setup.sh installs mate-backgrounds")
    with Image.open(PHOTOS / PHOTO if (PHOTOS / PHOTO).exists() else files[0]) as image:
        image = image.convert("RGB")
        side = min(image.size) // 2
        crop = image.crop((0, 0, side * WIDTH // HEIGHT, side)).resize((WIDTH, HEIGHT),
                                                                      Image.BILINEAR)
    path = tmp_path_factory.mktemp("augment") / "photo.png"
    crop.save(path)
    return np.asarray(crop), path


def ours(photo_path, tmp_path, *args, after=()):
    out = tmp_path / "out.png"
    subprocess.run([binary("augment_parity_tool"), *map(str, args), photo_path, out, *after],
                   check=True, timeout=60)
    return np.asarray(Image.open(out).convert("RGB"))


def torchvision_op(image, name, magnitude, interpolation="nearest"):
    """The op as the v2 policies apply it: _apply_image_or_video_transform maps the name and
    magnitude to v2.functional (factor 1 + m, int(m) bits and pixels, atan shears about the
    corner, threshold 255 m), nearest interpolation (the policies' default; bilinear with
    interpolation=BILINEAR, as torchvision's classification reference builds them), fill 0
    (fill None: zeros padding)."""
    chw = torch.from_numpy(image.copy()).permute(2, 0, 1)
    policy = POLICIES["randaugment"]
    out = policy._apply_image_or_video_transform(chw, name, magnitude,
                                                 interpolation=InterpolationMode(interpolation),
                                                 fill=policy._fill)
    return out.permute(1, 2, 0).numpy()


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


@pytest.mark.parametrize("name,magnitude", PIXEL_OPS)
def test_pixel_ops_equal_torchvision(photo, tmp_path, name, magnitude):
    image, path = photo
    expected = torchvision_op(image, name, magnitude)
    got = ours(path, tmp_path, "op", name, repr(magnitude))
    diff = np.abs(got.astype(int) - expected.astype(int))
    threshold = 255 * magnitude  # Solarize: pixels equal to an integer threshold flip
    at_threshold = np.count_nonzero(image == round(threshold)) \
        if abs(threshold - round(threshold)) < 1e-3 else 0
    print(f"{name} {magnitude:+.4f}: max |diff| {diff.max()}, values differing "
          f"{np.count_nonzero(diff)} of {diff.size}, changed by the op "
          f"{np.count_nonzero(expected != image)}"
          + (f", values at the threshold {at_threshold}" if name == "Solarize" else ""))
    assert diff.max() == 0


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("name,magnitude", GEOMETRIC_OPS)
def test_geometric_ops_within_psnr(photo, tmp_path, name, magnitude, interpolation):
    image, path = photo
    expected = torchvision_op(image, name, magnitude, interpolation)
    got = ours(path, tmp_path, "op", name, repr(magnitude), after=[interpolation])
    figure = psnr(got, expected)
    differing = np.count_nonzero(np.any(got != expected, axis=2)) / (HEIGHT * WIDTH)
    print(f"{name} {magnitude:+.2f} {interpolation}: PSNR {figure:.1f} dB, pixels differing {differing:.3%}, "
          f"PSNR against the input {psnr(expected, image):.1f} dB")
    assert figure >= GEOMETRIC_PSNR_DB
    assert differing <= MAX_DIFFERING
    assert psnr(expected, image) < GEOMETRIC_PSNR_DB  # the op moved the picture


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_magnitude_tables_equal_torchvision(policy):
    lines = subprocess.run([binary("augment_parity_tool"), "space", policy, str(HEIGHT),
                            str(WIDTH)], check=True, capture_output=True, text=True,
                           timeout=60).stdout.splitlines()
    transform = POLICIES[policy]
    bins = 10 if policy == "autoaugment_imagenet" else transform.num_magnitude_bins
    space = transform._AUGMENTATION_SPACE
    assert [line.split()[0] for line in lines] == list(space)  # the same ops, in the same order
    for line in lines:
        name, is_signed, *values = line.split()
        magnitudes_fn, signed = space[name]
        table = magnitudes_fn(bins, HEIGHT, WIDTH)
        assert bool(int(is_signed)) == signed, name
        expected = [] if table is None else [float(v) for v in table]
        assert [float.fromhex(v) for v in values] == expected, name


def test_autoaugment_and_randaugment_defaults():
    """The keys' defaults are torchvision's: 2 ops at magnitude 9 of 31 bins."""
    defaults = v2.RandAugment()
    assert (defaults.num_ops, defaults.magnitude, defaults.num_magnitude_bins) == (2, 9, 31)
    assert v2.TrivialAugmentWide().num_magnitude_bins == 31
    assert v2.AutoAugment().policy == v2.AutoAugmentPolicy.IMAGENET
    erasing = v2.RandomErasing()
    assert (erasing.scale, erasing.ratio, erasing.value) == ((0.02, 0.33), (0.3, 3.3), [0.0])


def test_random_erasing_is_torchvisions_after_normalize(photo, tmp_path):
    image, path = photo
    top, left, h, w = 17, 40, 50, 23
    got = ours(path, tmp_path, "erase", top, left, h, w)
    chw = torch.from_numpy(image.copy()).permute(2, 0, 1)
    mean_colour = torch.tensor([124, 116, 104], dtype=torch.uint8).view(3, 1, 1)
    expected = F.erase(chw, top, left, h, w, mean_colour).permute(1, 2, 0).numpy()
    assert np.array_equal(got, expected)

    def normalize(x):
        return F.normalize(F.to_dtype(x, torch.float32, scale=True), MEAN, STD)

    # torchvision's recipe: Normalize, then RandomErasing(value=0) on the same rectangle.
    recipe = F.erase(normalize(chw), top, left, h, w, torch.tensor(0.0))
    ours_normalized = normalize(torch.from_numpy(got.copy()).permute(2, 0, 1))
    half_step = 0.5 / 255 / max(STD)
    worst = (recipe - ours_normalized).abs().max().item()
    print(f"random erasing after Normalize: max |ours - torchvision| {worst:.5f} "
          f"(half a uint8 step: {half_step:.5f})")
    assert worst <= half_step
