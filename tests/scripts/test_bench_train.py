"""scripts/bench/train.sh away from a GPU, with stand-ins for `train` and for PyTorch's benchmark
that print what the real ones print: every configuration runs REPEATS times, alternated; each
cell is the median with the spread; the denominator is the better of the compiled modes; a failed
run shows in its cell. The figures themselves come from a GPU (scripts/device/checks.sh train)."""
import json
import os
import subprocess
import sys
import textwrap

from conftest import ROOT

# Each stand-in logs its call and prints the benchmark line; its images/s comes from FIGURES, a
# JSON map from a configuration's name to the figures of its successive runs (null: it fails).
STAND_IN = textwrap.dedent('''\
    #!{python}
    import json, os, sys
    args = sys.argv[1:]
    if args and args[0].endswith("bench/train_table.py"):
        os.execv(sys.executable, [sys.executable, *args])
    if "--compile-mode" in args:
        name = "compiled_" + args[args.index("--compile-mode") + 1]
        if os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS"):
            name += "_" + os.environ["TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS"]
    elif any(a.endswith("bench/pytorch_step.py") for a in args):
        name = "torch_eager"
    elif "--fused_batch_norm" in args:
        name = "aten"
    elif "--stem_space_to_depth" in args:
        name = "trial"
    else:
        name = "graph" if args[args.index("--cuda_graph") + 1] == "true" else "eager"
    log = os.environ["STAND_IN_LOG"]
    done = open(log).read().split().count(name) if os.path.exists(log) else 0
    open(log, "a").write(name + "\\n")
    figure = json.loads(os.environ["FIGURES"])[name][done]
    if figure is None:
        print("error: the stand-in failed", file=sys.stderr)
        sys.exit(3)
    print(f"[info] benchmark: {{figure}} images/s, step median {{256000 / figure:.2f}} ms, p90 1 ms")
''')


def bench(tmp_path, figures, **env):
    build = tmp_path / "build"
    build.mkdir()
    for path in (build / "train", tmp_path / "python"):
        path.write_text(STAND_IN.format(python=sys.executable))
        path.chmod(0o755)
    log = tmp_path / "calls"
    full_env = {**os.environ, "BUILD_DIR": str(build), "PYTHON": str(tmp_path / "python"),
                "STAND_IN_LOG": str(log), "FIGURES": json.dumps(figures), **env}
    result = subprocess.run([str(ROOT / "scripts" / "bench" / "train.sh"), "fp16", "256"],
                            capture_output=True, text=True, env=full_env, timeout=120)
    calls = log.read_text().split() if log.exists() else []
    return result, calls


FIGURES = {"graph": [7000, 7200, 7100], "eager": [6900, 6950, 7000], "aten": [6000, 6100, 6050],
           "torch_eager": [6100, 6000, 6200], "compiled_reduce-overhead": [7300, 7250, 7350],
           "compiled_max-autotune": [7400, 7500, 7450]}


def table(result):
    assert result.returncode == 0, result.stderr
    head, rule, row = result.stdout.strip().splitlines()[-3:]
    cells = [c.strip() for c in row.strip("|").split("|")]
    return dict(zip([c.strip() for c in head.strip("|").split("|")], cells))


def test_runs_alternate_and_cells_are_medians_with_their_spread(tmp_path):
    result, calls = bench(tmp_path, FIGURES)
    one_round = ["graph", "eager", "aten", "torch_eager", "compiled_reduce-overhead",
                 "compiled_max-autotune"]
    assert calls == one_round * 3
    row = table(result)
    assert row["this trainer, CUDA graph"] == "7,100 (36.1 ms), 7,000-7,200"
    assert row["PyTorch compiled (max-autotune)"] == "7,450 (34.4 ms), 7,400-7,500"
    # The better compiled mode is the denominator: 7,100 / 7,450.
    assert row["best / best compiled"] == "0.95"


def test_max_autotune_with_atens_convolutions_is_said_in_the_column(tmp_path):
    figures = {**FIGURES, "compiled_max-autotune_ATEN": [7000, 7000, 7000]}
    result, calls = bench(tmp_path, figures, MAX_AUTOTUNE_CONV="ATEN", REPEATS="1")
    assert "compiled_max-autotune_ATEN" in calls and len(calls) == 6
    row = table(result)
    assert row["PyTorch compiled (max-autotune, convolutions ATEN)"] == "7,000 (36.6 ms)"
    assert row["best / best compiled"] == f"{7000 / 7300:.2f}"  # reduce-overhead was better


def test_a_trial_column_and_a_failed_run(tmp_path):
    figures = {**FIGURES, "trial": [7600, None, 7700], "compiled_reduce-overhead": [None] * 3}
    result, _ = bench(tmp_path, figures, TRIAL_ARGS="--stem_space_to_depth true")
    row = table(result)
    assert row["CUDA graph, --stem_space_to_depth true"] == \
        "7,650 (33.5 ms), 7,600-7,700, 1 of 3 failed"
    assert row["PyTorch compiled (reduce-overhead)"] == "failed"
    assert row["best / best compiled"] == f"{7650 / 7450:.2f}"


def test_repeats_must_be_a_count(tmp_path):
    result, calls = bench(tmp_path, FIGURES, REPEATS="three")
    assert result.returncode == 2 and "REPEATS must be a positive whole number" in result.stderr
    assert calls == []
