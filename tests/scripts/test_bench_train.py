"""scripts/bench/train.sh away from a GPU, with stand-ins for bench-step and for PyTorch's benchmark
that print what the real ones print: every round runs this trainer's configurations in one
bench-step process, then each peer; each cell is the median with the spread; the denominator is
the better of the compiled modes; the defaults' column and its ratio; each trial against the CUDA
graph round by round; a failed run shows in its cell; a budget ends the runs in time. The figures
themselves come from a GPU (scripts/device/checks.sh train)."""
import json
import os
import subprocess
import sys
import textwrap

from conftest import ROOT

# Each stand-in logs each configuration it measures and prints its benchmark line; its images/s
# comes from FIGURES, a JSON map from a configuration's label to the figures of its successive
# runs (null: it fails). bench-step's stand-in measures its --trial labels in order; SLEEP_S
# makes it slow.
STAND_IN = textwrap.dedent('''\
    #!{python}
    import json, os, sys, time
    args = sys.argv[1:]
    if args and args[0].endswith("bench/train_table.py"):
        os.execv(sys.executable, [sys.executable, *args])
    log = os.environ["STAND_IN_LOG"]
    figures = json.loads(os.environ["FIGURES"])

    def figure(name):
        done = open(log).read().split().count(name) if os.path.exists(log) else 0
        open(log, "a").write(name + "\\n")
        # The label's own figures, else its configuration's (the label less PRECISION_BATCH_).
        value = figures.get(name, figures.get(name.split("_", 2)[2]))[done]
        if value == "crash":
            sys.exit(134)
        if value is None:
            return None
        return f"{{value}} images/s, step median {{256000 / value:.2f}} ms, p90 1 ms"

    if sys.argv[0].endswith("bench-step"):
        shared = args[args.index("--") + 1:]
        assert "--benchmark" in shared and args[args.index("--repeats") + 1] == "1"
        rounds = open(log).read().count("fp16_256_graph") if os.path.exists(log) else 0
        assert args[args.index("--first_round") + 1] == str(rounds + 1)
        labels = [args[i + 1].split("=")[0] for i, a in enumerate(args) if a == "--trial"]
        for label in labels:
            if label.endswith("_" + os.environ.get("DEFAULTS", "none")):
                print(f"bench-step {{label}}: the defaults (its keys change nothing)")
        failed = False
        for label in labels:
            time.sleep(float(os.environ.get("SLEEP_S", "0")))
            line = figure(label)
            failed = failed or line is None
            print(f"bench-step {{label}} round 1" + (f": {{line}}" if line else " failed: no"),
                  flush=True)
        sys.exit(1 if failed else 0)
    if "--compile-mode" in args:
        name = "compiled_" + args[args.index("--compile-mode") + 1]
        if os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS"):
            name += "_" + os.environ["TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS"]
    else:
        name = "torch_eager"
    precision, batch = (args[args.index(k) + 1] for k in ("--precision", "--batch-size"))
    name = f"{{precision}}_{{batch}}_{{name}}"
    line = figure(name)
    if line is None:
        sys.exit("error: the stand-in failed")
    print(f"pytorch {{name}}: {{line}}")
''')


def bench(tmp_path, figures, *runs, **env):
    build = tmp_path / "build"
    build.mkdir()
    for path in (build / "bench-step", tmp_path / "python"):
        path.write_text(STAND_IN.format(python=sys.executable))
        path.chmod(0o755)
    log = tmp_path / "calls"
    full_env = {**os.environ, "BUILD_DIR": str(build), "PYTHON": str(tmp_path / "python"),
                "STAND_IN_LOG": str(log), "FIGURES": json.dumps(figures), **env}
    script = ROOT / "scripts" / "bench" / "train.sh"
    result = subprocess.run([str(script), *(runs or ("fp16", "256"))], capture_output=True,
                            text=True, env=full_env, timeout=120)
    calls = log.read_text().split() if log.exists() else []
    return result, [c.removeprefix("fp16_256_") for c in calls]


FIGURES = {"graph": [7000, 7200, 7100], "eager": [6900, 6950, 7000], "aten": [6000, 6100, 6050],
           "torch_eager": [6100, 6000, 6200], "compiled_reduce-overhead": [7300, 7250, 7350],
           "compiled_max-autotune": [7400, 7500, 7450]}


def table(result, rows=1):
    """The last row of the table, or its last `rows` rows, each as {column: cell}."""
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()[-2 - rows:]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [dict(zip(head, (c.strip() for c in row.strip("|").split("|")))) for row in lines[2:]]
    return cells[0] if rows == 1 else cells


def test_rounds_alternate_and_cells_are_medians_with_their_spread(tmp_path):
    result, calls = bench(tmp_path, FIGURES, DEFAULTS="eager")
    one_round = ["graph", "eager", "aten", "torch_eager", "compiled_reduce-overhead",
                 "compiled_max-autotune"]
    assert calls == one_round * 3
    row = table(result)
    assert row["this trainer, CUDA graph"] == "7,100 (36.1 ms), 7,000-7,200"
    assert row["PyTorch compiled (max-autotune)"] == "7,450 (34.4 ms), 7,400-7,500"
    # The shipped defaults (eager here) and the best of this trainer over the better compiled mode.
    assert row["this trainer, eager (the defaults)"] == "6,950 (36.8 ms), 6,900-7,000"
    assert row["defaults / best compiled"] == f"{6950 / 7450:.2f}"
    assert row["best / best compiled"] == f"{7100 / 7450:.2f}"
    assert "this trainer, eager (the defaults): 0.979x the CUDA graph, faster in 0 of 3 rounds" \
        in result.stdout


def test_several_precisions_and_batches_alternate_within_each_round(tmp_path):
    figures = {**FIGURES, "bf16_32_graph": [4500, 4400], "bf16_32_eager": [2100, 2000]}
    result, calls = bench(tmp_path, figures, "fp16:256", "bf16:32", REPEATS="2", ATEN_ROW="0",
                          COMPILE_MODES="reduce-overhead", DEFAULTS="graph")
    # A round: every configuration of this trainer in one process, then each run's peers.
    one_round = ["graph", "eager", "bf16_32_graph", "bf16_32_eager", "torch_eager",
                 "bf16_32_torch_eager", "compiled_reduce-overhead",
                 "bf16_32_compiled_reduce-overhead"]
    assert calls == one_round * 2
    fp16, bf16 = table(result, rows=2)
    assert fp16["precision"] == "fp16" and bf16["batch"] == "32"
    assert bf16["this trainer, CUDA graph (the defaults)"] == "4,450 (57.5 ms), 4,400-4,500"
    assert bf16["defaults / best compiled"] == f"{4450 / 7275:.2f}"
    assert "eager on ATen ops" not in fp16
    assert "bf16 32: this trainer, eager: 0.461x the CUDA graph, faster in 0 of 2 rounds" \
        in result.stdout


def test_peers_in_the_last_rounds_and_the_steps_on_both_sides(tmp_path):
    result, calls = bench(tmp_path, FIGURES, PEER_ROUNDS="1", ATEN_ROW="0", STEPS="50",
                          WARMUP_STEPS="10", COMPILE_MODES="reduce-overhead")
    assert calls == ["graph", "eager"] * 3 + ["torch_eager", "compiled_reduce-overhead"]
    assert result.stderr.count("--benchmark_steps 50 --benchmark_warmup_steps 10") == 3
    assert result.stderr.count("--steps 50 --warmup-steps 10") == 2
    row = table(result)
    assert row["this trainer, CUDA graph"] == "7,100 (36.1 ms), 7,000-7,200"
    assert row["PyTorch eager"] == "6,100 (42.0 ms)"  # as many runs as asked: one


def test_a_run_is_a_precision_and_a_batch(tmp_path):
    result, calls = bench(tmp_path, FIGURES, "fp16:256", "int8:32")
    assert result.returncode == 2 and "a run is PRECISION:BATCH" in result.stderr
    assert "'int8:32'" in result.stderr and calls == []


def test_max_autotune_with_atens_convolutions_is_said_in_the_column(tmp_path):
    figures = {**FIGURES, "compiled_max-autotune_ATEN": [7000, 7000, 7000]}
    result, calls = bench(tmp_path, figures, MAX_AUTOTUNE_CONV="ATEN", REPEATS="1")
    assert "compiled_max-autotune_ATEN" in calls and len(calls) == 6
    row = table(result)
    assert row["PyTorch compiled (max-autotune, convolutions ATEN)"] == "7,000 (36.6 ms)"
    assert row["best / best compiled"] == f"{7000 / 7300:.2f}"  # reduce-overhead was better
    assert row["defaults / best compiled"] == "-"  # no configuration said it was the defaults


def test_each_trial_is_a_column_set_against_the_graph_round_by_round(tmp_path):
    figures = {**FIGURES, "trial0": [7600, 7000, 7700], "trial1": [7100, 7300, 7150]}
    result, calls = bench(tmp_path, figures, REPEATS="3", TRIALS=(
        "--stem_space_to_depth true ;--fused_residual_gradient true --stem_input_channels 8"))
    assert calls[:4] == ["graph", "trial0", "trial1", "eager"]
    row = table(result)
    assert row["CUDA graph, --stem_space_to_depth true"] == "7,600 (33.7 ms), 7,000-7,700"
    assert row["CUDA graph, --fused_residual_gradient true --stem_input_channels 8"] == \
        "7,150 (35.8 ms), 7,100-7,300"
    assert row["best / best compiled"] == f"{7600 / 7450:.2f}"
    # Paired by round: trial0 beat the graph's 7,000 and 7,100 but not its 7,200.
    assert "CUDA graph, --stem_space_to_depth true: 1.070x the CUDA graph, faster in 2 of 3 " \
        "rounds" in result.stdout
    assert "--stem_input_channels 8: 1.007x the CUDA graph, faster in 3 of 3 rounds" \
        in result.stdout


def test_a_failed_run_shows_in_its_cell(tmp_path):
    # The trial fails in round 2 and bench-step measures the rest; in round 3 the process ends
    # at eager (a crash), so that round has no eager or ATen figure. Reduce-overhead always fails.
    figures = {**FIGURES, "trial0": [7600, None, 7700], "eager": [6900, 6950, "crash"],
               "compiled_reduce-overhead": [None] * 3}
    result, calls = bench(tmp_path, figures, TRIALS="--stem_space_to_depth true")
    assert calls.count("eager") == 3 and calls.count("aten") == 2
    assert calls.count("torch_eager") == 3
    row = table(result)
    assert row["CUDA graph, --stem_space_to_depth true"] == \
        "7,650 (33.5 ms), 7,600-7,700, 1 of 3 failed"
    assert row["this trainer, eager"] == "6,925 (37.0 ms), 6,900-6,950, 1 of 3 failed"
    assert row["eager on ATen ops"] == "6,050 (42.3 ms), 6,000-6,100, 1 of 3 failed"
    assert row["PyTorch compiled (reduce-overhead)"] == "failed"
    assert row["best / best compiled"] == f"{7650 / 7450:.2f}"
    assert "bench-step failed: exit status 1" in result.stderr
    assert "bench-step failed: exit status 134" in result.stderr


def test_a_budget_ends_the_runs_in_time(tmp_path):
    # Each trainer configuration takes 0.8 s: round 1's trainer process ends past the 2 s budget
    # (bash counts whole seconds), so no peer starts, and the cells say how many runs they had.
    result, calls = bench(tmp_path, FIGURES, BUDGET_S="2", SLEEP_S="0.8")
    assert calls == ["graph", "eager", "aten"]
    assert "the 2 s budget is spent: round 1's fp16:256 torch_eager and the rest not run" \
        in result.stderr
    row = table(result)
    assert row["this trainer, CUDA graph"] == "7,000 (36.6 ms), 1 of 3 runs"
    assert row["PyTorch eager"] == "not run"
    assert row["best / best compiled"] == "-"


def test_repeats_and_budget_must_be_counts(tmp_path):
    for i, (key, value) in enumerate((("REPEATS", "three"), ("REPEATS", "0"), ("STEPS", "0"),
                                      ("BUDGET_S", "-5"), ("PEER_ROUNDS", "x"))):
        (tmp_path / str(i)).mkdir()
        result, calls = bench(tmp_path / str(i), FIGURES, **{key: value})
        assert result.returncode == 2 and f"{key} must be a whole number" in result.stderr
        assert calls == []
