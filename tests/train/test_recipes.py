"""configs/recipes/: each published recipe cites its source, reads the P3 configs' data, trains
two steps on the CPU with every setting it makes kept in the resolved config.toml (shrunk to
ResNet-18 on a tiny TFRecord set, its techniques left on). tests/run/test_plan.py plans and renders
each at every node count."""
import math
import subprocess
import tomllib

import pytest

from conftest import ROOT, binary, run_train

RECIPES = sorted((ROOT / "configs" / "recipes").glob("*.toml"))
P3 = tomllib.loads((ROOT / "configs" / "p3.16xlarge.toml").read_text())


def recipe_id(path):
    return path.stem


def load(path):
    return tomllib.loads(path.read_text())


def test_there_are_recipes():
    assert len(RECIPES) >= 8, [p.name for p in RECIPES]


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_recipe_cites_its_source_and_reads_the_p3_data(recipe):
    header = recipe.read_text().split("\narch = ", 1)[0]
    for label in ("# Source:", "# Published:", "# Hardware of the source:", "# Launch:"):
        assert label in header, f"{recipe.name}: the header has no '{label}' line"
    assert "top-1" in header
    config = load(recipe)
    for key in ("data_source", "train_data", "val_data", "epoch_order"):
        assert config[key] == P3[key], f"{recipe.name}: {key} differs from p3.16xlarge.toml"
    assert config["output_dir"] == f"/fsx/runs/recipe-{recipe.stem}"
    # One node of 8 GPUs must fit in the step, so the step is the source's on any node count.
    assert config["global_batch"] % (8 * config["batch_size"]) == 0


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """4 classes of 64x48 JPEGs as TFRecords: 32 training images, 12 held out."""
    data = tmp_path_factory.mktemp("records")
    subprocess.run([binary("generate-dataset"), "--tfrecords", data, "--classes", "4",
                    "--images-per-class", "8", "--val-per-class", "3", "--width", "64",
                    "--height", "48", "--train-shards", "2", "--val-shards", "1"],
                   check=True, capture_output=True, timeout=120)
    return data


def cpu_overrides(config, data, out):
    """The keys a 2-step CPU run replaces: device and precision, model and data and their sizes,
    the run's length and outputs. Every other key of the recipe stays as the recipe sets it."""
    overrides = {
        "device": "cpu", "precision": "fp32", "arch": "resnet18", "num_classes": 4,
        "train_data": data / "train-*", "val_data": data / "validation-*",
        "index_cache_dir": out / "index", "decode_threads": 2, "batch_size": 8,
        "global_batch": 0, "image_size": 32, "val_resize": 36, "max_steps": 2,
        "log_every_steps": 1, "output_dir": out / "run", "tensorboard": "false",
        "resume": "none",
    }
    if "val_image_size" in config:
        overrides["val_image_size"] = 0  # the evaluation crop follows image_size
    if config.get("progressive_resize_min_size", 0) > 0:
        # Keeps the ramp on, at CPU sizes (multiples of its step).
        step = config.get("progressive_resize_step", 32)
        overrides["progressive_resize_min_size"] = step
        overrides["progressive_resize_max_size"] = 2 * step
    return overrides


def same(resolved, wanted):
    if isinstance(wanted, float) or isinstance(resolved, float):
        return math.isclose(float(resolved), float(wanted), rel_tol=1e-9)
    return resolved == wanted


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_recipe_trains_on_the_cpu_and_keeps_its_settings(recipe, records, tmp_path):
    config = load(recipe)
    overrides = cpu_overrides(config, records, tmp_path)
    args = [word for key, value in overrides.items() for word in (f"--{key}", value)]
    result = run_train("--config", recipe, *args, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    resolved = load(tmp_path / "run" / "config.toml")
    kept = {key: value for key, value in config.items() if key not in overrides}
    assert {"base_lr", "lr_schedule", "optimizer", "weight_decay"} <= set(kept)
    for key, value in kept.items():
        assert key in resolved, f"{recipe.name}: {key} is missing from the resolved config"
        assert same(resolved[key], value), (
            f"{recipe.name}: {key} = {value!r} resolved as {resolved[key]!r}")
