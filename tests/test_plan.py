"""`train --plan_world_size N`: every shipped config plans at the world sizes a user runs it at
(one P3 node to the seed's 20 nodes of 8 GPUs), before any node is billed; a recipe's global
batch holds at every node count, its micro-batch shrinking where the ranks outnumber it; and a
run that could not start is refused with exit 2, the key and the fix."""
import re

import pytest

from conftest import ROOT, run_train

CONFIGS = sorted((ROOT / "configs").glob("*.toml")) + sorted(
    (ROOT / "configs" / "recipes").glob("*.toml"))
WORLD_SIZES = [8, 16, 64, 160]  # 1, 2, 8 and 20 nodes of 8 GPUs


def config_id(path):
    return path.relative_to(ROOT / "configs").as_posix()


def value(text, key):
    """An integer key of a config file (None when unset)."""
    m = re.search(rf"^{key}\s*=\s*(\d+)", text, re.M)
    return int(m[1]) if m else None


def plan(config, world_size, *extra):
    result = run_train("--config", config, "--plan_world_size", world_size, *extra, timeout=120)
    return result.returncode, result.stdout + result.stderr


def field(out, name):
    m = re.search(rf"^  {name}\s+(\d+)", out, re.M)
    assert m, f"no '{name}' in the plan:\n{out}"
    return int(m[1])


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_every_shipped_config_plans_at_every_world_size(config, world_size):
    text = config.read_text()
    code, out = plan(config, world_size)
    batch_size, global_batch = value(text, "batch_size"), value(text, "global_batch") or 0
    generated = value(text, "generated_train_images")
    if '"generated"' in text and generated < batch_size * world_size:
        # A one-machine config (the CPU smoke run, one GPU) whose generated images hold no step
        # of that many ranks: refused, naming the key.
        assert code == 2, out
        assert "'generated_train_images'" in out, out
        return
    assert code == 0, out
    micro, micro_batches = field(out, "micro-batch per GPU"), field(out, "micro-batches per step")
    per_step = field(out, "images per step")
    assert micro <= batch_size
    assert per_step == micro * micro_batches * world_size
    if global_batch:
        # The step is the global batch, or the nearest whole number of micro-batches below it.
        assert global_batch - world_size < per_step <= global_batch, out
        if global_batch % world_size == 0 and (global_batch // world_size) <= batch_size:
            assert per_step == global_batch, out
    else:
        assert (micro, per_step) == (batch_size, batch_size * world_size), out
    assert field(out, "steps per epoch") > 0
    assert field(out, "total steps") >= field(out, "warmup steps")


def test_a_recipe_on_two_nodes_shrinks_its_micro_batch():
    code, out = plan(ROOT / "configs" / "recipes" / "dle-90-epochs.toml", 16)
    assert code == 0, out
    assert field(out, "micro-batch per GPU") == 128, out
    assert "batch_size 256 shrunk to fit global_batch 2048 on 16 ranks" in out
    assert field(out, "images per step") == 2048
    assert field(out, "steps per epoch") == -(-1281167 // 2048)  # ImageNet-1k's, rounded up
    assert "peak learning rate        2.048 " in out  # DLE's 0.256 per 256 images x 2048 / 256
    # 160 ranks: 12 images each, 1,920 a step, the nearest below 2,048, and said so.
    code, out = plan(ROOT / "configs" / "recipes" / "dle-90-epochs.toml", 160)
    assert code == 0, out
    assert (field(out, "micro-batch per GPU"), field(out, "images per step")) == (12, 1920)
    assert "the nearest below" in out


def test_the_epoch_of_another_dataset():
    code, out = plan(ROOT / "configs" / "p3.16xlarge.toml", 8, "--plan_train_images", 100000)
    assert code == 0, out
    assert field(out, "steps per epoch") == -(-100000 // 2048)


def test_a_run_that_cannot_start_is_refused_with_the_fix():
    code, out = plan(ROOT / "configs" / "p3.16xlarge.toml", 16, "--global_batch", 8)
    assert code == 2, out
    assert "'global_batch' = 8 is invalid" in out and "Fix:" in out, out
    code, out = plan(ROOT / "configs" / "p3.16xlarge.toml", -1)
    assert code == 2 and "--plan_world_size" in out, out
