"""bench-step on the CPU (ResNet-18, tiny images): every trial of every round measured, each round
starting one trial later; the trials whose keys change nothing named as the defaults; each trial
compared with the first round by round; a budget that ends the rounds early; and a trial that
cannot run refused before any is measured, naming what and the fix. Its figures come from a GPU
(scripts/device/checks.sh decide)."""
import re
import subprocess

from conftest import binary

SHARED = ["--", "--arch", "resnet18", "--num_classes", "4", "--data_source", "synthetic",
          "--image_size", "32", "--batch_size", "2", "--device", "cpu", "--precision", "fp32",
          "--benchmark", "true", "--benchmark_warmup_steps", "1", "--benchmark_steps", "2"]


def bench_step(tmp_path, *args):
    return subprocess.run([str(binary("bench-step")), *args, *SHARED, "--output_dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=300)


def measured(stdout):
    """(label, round) of each measurement, in the order they ran."""
    return re.findall(r"^bench-step (\S+) round (\d+): [0-9.]+ images/s", stdout, re.M)


def test_rounds_alternate_and_the_summary_pairs_them(tmp_path):
    result = bench_step(tmp_path, "--repeats", "2", "--trial", "base=",
                        "--trial", "eager=--cuda_graph false",
                        "--trial", "blocks=--stem_space_to_depth true")
    assert result.returncode == 0, result.stderr
    assert measured(result.stdout) == [("base", "1"), ("eager", "1"), ("blocks", "1"),
                                       ("eager", "2"), ("blocks", "2"), ("base", "2")]
    # cuda_graph is off by default: "--cuda_graph false" is the defaults, as no keys are.
    assert "bench-step base: the defaults" in result.stdout
    assert "bench-step eager: the defaults" in result.stdout
    assert "bench-step blocks: the defaults" not in result.stdout
    summary = re.search(r"^bench-step blocks: median [0-9.]+ images/s, step median [0-9.]+ ms, "
                        r"2 run\(s\), [0-9.]+-[0-9.]+; [0-9.]+x base, faster in [012] of 2 rounds$",
                        result.stdout, re.M)
    assert summary, result.stdout


def test_a_budget_ends_the_rounds(tmp_path):
    # The first measurement always runs; the budget is spent by the time the second would start.
    result = bench_step(tmp_path, "--repeats", "3", "--budget_s", "0.001", "--trial", "a=",
                        "--trial", "b=--cuda_graph false")
    assert result.returncode == 0, result.stderr
    assert measured(result.stdout) == [("a", "1")]
    assert "the 0.001 s budget is spent in round 1" in result.stdout
    assert "bench-step b: not measured (the budget ran out)" in result.stdout


def test_a_trial_that_cannot_run_is_refused_before_any_runs(tmp_path):
    cases = [(["--trial", "a=", "--trial", "b=--cuda_grap true"], "cuda_grap"),
             (["--trial", "=--cuda_graph true"], "has no label. Fix: LABEL=KEYS"),
             (["--trial", "a=--data_source generated"], "Fix: --data_source synthetic")]
    for args, says in cases:
        result = bench_step(tmp_path, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert says in result.stderr, (args, result.stderr)
        assert measured(result.stdout) == []


def test_a_trial_that_fails_is_said_and_the_others_still_run(tmp_path):
    # fp16 has no CPU kernels: the trainer refuses it when the trial is built, not when parsed.
    result = bench_step(tmp_path, "--repeats", "2", "--trial", "a=",
                        "--trial", "half=--precision fp16", "--trial", "c=--cuda_graph false")
    assert result.returncode == 1, result.stderr
    assert measured(result.stdout) == [("a", "1"), ("c", "1"), ("c", "2"), ("a", "2")]
    assert re.search(r"^bench-step half round 1 failed: .*fp16", result.stdout, re.M)
    assert re.search(r"^bench-step half: failed: .*fp16", result.stdout, re.M)
    assert re.search(r"^bench-step c: median .* 2 run\(s\)", result.stdout, re.M)
