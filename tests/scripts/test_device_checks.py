"""scripts/device/checks.sh decide away from a GPU, on a bundle of stand-ins that log their calls
and print what the real programs print: the one call of a device session runs its stages in
order, each with its seconds; the train stage measures each trial at every precision and batch
for three rounds of 50 steps within the budget, PyTorch's runs once after them, and ends in the
table; the V100 setting and the graph under mpirun then run with every candidate key on. A shell
slip here would cost a GPU session its call. The figures come from a GPU."""
import json
import re
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT

# One program for every stand-in, by the name it is called as. CALLS gets a JSON line per call.
STAND_IN = textwrap.dedent('''\
    #!{python}
    import json, os, sys
    name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
    if name == "python3" and not (args and args[0].endswith("pytorch_step.py")):
        os.execv("{python}", ["{python}", *args])  # the machine's Python, with PyTorch
    if name == "mpirun":  # one process: what follows -np 1
        os.execvp(args[2], args[2:])
    env = {{k: v for k, v in os.environ.items() if k.startswith("TORCHINDUCTOR")}}
    with open(os.environ["CALLS"], "a") as calls:
        calls.write(json.dumps({{"name": name, "args": args, "env": env}}) + "\\n")
    line = "6000.0 images/s, step median 42.67 ms, p90 43.00 ms"
    if name == "train" and "--gpu_memory_gib" in args:
        if args[args.index("--gpu_memory_gib") + 1] == "4":
            print("error: the GPU has not the memory this run needs")
            sys.exit(2)
        print("GPU memory: 15.0 GiB of 139.8\\nepoch 2: 1700 img/s\\nfinal: top-1 10%")
    elif name == "train":
        print(f"benchmark resnet50 fp16 batch 32: {{line}}")
    elif name == "bench-step":
        labels = [args[i + 1].split("=")[0] for i, a in enumerate(args) if a == "--trial"]
        for label in labels:
            if label.endswith("_eager"):
                print(f"bench-step {{label}}: the defaults (its keys change nothing)")
        for label in labels:
            print(f"bench-step {{label}} round {{args[args.index('--first_round') + 1]}}: {{line}}")
    elif name == "python3":
        print(f"pytorch: {{line}}")
''')


def run_checks(tmp_path, *stages, **env):
    bin_dir = tmp_path / "trainer-bundle" / "bundle" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("train", "bench-step", "trainer_tests", "distributed_tests", "mpirun",
                 "python3"):
        (bin_dir / name).write_text(STAND_IN.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    # The script asks python3 where PyTorch is before the bundle is on its PATH.
    full_env = {**os.environ, "TMPDIR": str(tmp_path), "OUT": str(tmp_path / "out"),
                "CALLS": str(tmp_path / "calls"), "PATH": f"{bin_dir}:{os.environ['PATH']}",
                **env}
    result = subprocess.run([str(ROOT / "scripts" / "device" / "checks.sh"), *stages],
                            capture_output=True, text=True, env=full_env, timeout=300)
    calls_file = tmp_path / "calls"
    calls = [json.loads(line) for line in calls_file.read_text().splitlines()] \
        if calls_file.exists() else []
    return result, calls


CANDIDATES = "--stem_space_to_depth true --fused_residual_gradient true"


def test_decide_runs_its_stages_with_the_candidates_within_the_budget(tmp_path):
    result, calls = run_checks(tmp_path, "decide")
    assert result.returncode == 0, result.stdout + result.stderr
    log = (tmp_path / "out" / "device-checks.log").read_text()
    stages = [line.split()[1] for line in log.splitlines() if line.startswith("== ") and
              line.endswith(" s") and " took " in line]
    assert stages == ["tests", "train", "v100", "graph"]
    assert "== every stage passed" in log

    tests = [c for c in calls if c["name"].endswith("_tests")]
    assert [c["args"] for c in tests] == [["--gtest_filter=*Gpu.*"],
                                          ["--gtest_filter=Distributed.Gpu*"]]
    # The V100 setting (eager and the graph; the 4 GiB run as shipped) and the graph's stage.
    trains = [" ".join(c["args"]) for c in calls if c["name"] == "train"]
    assert len(trains) == 5
    for command in trains[:2] + trains[3:]:
        assert f"{CANDIDATES} --cuda_graph" in command, command
    assert CANDIDATES not in trains[2] and "--gpu_memory_gib 4" in trains[2]

    # This trainer: three rounds, a process each, every trial at every precision and batch.
    steps = [c["args"] for c in calls if c["name"] == "bench-step"]
    assert [a[a.index("--first_round") + 1] for a in steps] == ["1", "2", "3"]
    trials = [steps[0][i + 1] for i, a in enumerate(steps[0]) if a == "--trial"]
    assert len(trials) == 4 * 6  # graph, 4 trials, eager; no ATen row
    assert "bf16_32_trial2=--precision bf16 --batch_size 32 --cuda_graph true " \
        f"{CANDIDATES}" in trials
    assert "fp16_256_trial3=--precision fp16 --batch_size 256 --cuda_graph true " \
        "--stem_input_channels 8" in trials
    assert "--benchmark_steps 50 --benchmark_warmup_steps 10" in " ".join(steps[0])
    budget = float(steps[0][steps[0].index("--budget_s") + 1])
    assert 60 <= budget <= 450 - 75  # what the v100 and graph stages need is kept for them
    # PyTorch: each mode once per precision and batch, after this trainer's last round.
    peers = [c for c in calls if c["name"] == "python3"]
    assert len(peers) == 4 * 3
    assert calls.index(peers[0]) > calls.index([c for c in calls if c["args"] == steps[2]][0])
    autotuned = [c for c in peers if "max-autotune" in c["args"]]
    assert len(autotuned) == 4
    conv = "TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS"
    assert [c["env"].get(conv) for c in peers].count("ATEN") == 4
    assert all(c["env"].get(conv) == "ATEN" for c in autotuned)

    rows = [line for line in log.splitlines() if line.startswith("| fp16 |") or
            line.startswith("| bf16 |")]
    assert len(rows) == 4
    assert "this trainer, eager (the defaults)" in log
    assert "fp16 256: CUDA graph, --stem_space_to_depth true: 1.000x the CUDA graph" in log


def test_decide_is_a_plan_of_its_own(tmp_path):
    result, calls = run_checks(tmp_path, "decide", "tests")
    assert result.returncode == 2 and "unknown stage decide" in result.stderr
    assert calls == []


def test_the_bundle_holds_every_program_the_device_scripts_run():
    # The programs this build makes; the bundle carries those the device's scripts name (and
    # only those: with the repository it must fit the 64 MiB a device call carries).
    built = set()
    for cmake in ROOT.rglob("CMakeLists.txt"):
        text = cmake.read_text()
        built |= set(re.findall(r"add_(?:executable|trainer_test)\(([\w-]+)", text))
        for tools in re.findall(r"foreach\(tool ([^)]*)\)", text):
            built |= set(tools.split())
    assert {"train", "bench-step", "trainer_tests", "data_tests"} <= built
    device = ROOT / "scripts" / "device"
    scripts = (device / "checks.sh").read_text() + (device / "fused_numerics.py").read_text()
    named = {b for b in built if re.search(rf"(?<![\w/-]){re.escape(b)}(?![\w.-])", scripts)}
    bundle = (device / "bundle.sh").read_text()
    listed = re.search(r"for binary in (.*?); do", bundle, re.S)[1].replace("\\\n", " ").split()
    assert named <= {Path(b).name for b in listed}, named - {Path(b).name for b in listed}
    assert "trainer_tests" in named and "resnet_parity_tool" in named and "data_tests" not in named
