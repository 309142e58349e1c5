#!/usr/bin/env python3
"""docs/BENCHMARKS.md's training table from scripts/bench/train.sh's runs, a row per precision and
batch: each configuration's median images/s (median step ms) and the spread of its rounds; the
ratio of the shipped defaults and of this trainer's best configuration to the better of PyTorch's
compiled modes (each by its median); and, before the table, how each configuration of this
trainer fared against the CUDA graph round by round (the rounds ran side by side, so a card's
drift touched both alike).

    scripts/bench/train_table.py RESULTS --runs fp16:256 bf16:32 [--rounds 3] [--trial KEYS ...]

RESULTS has a line per run: "LABEL IMAGES_PER_S MEDIAN_MS", or "LABEL" alone for a run that
failed (its cell then says so), and "@defaults LABEL" for the configuration that `train` runs
without keys. A label is PRECISION_BATCH_CONFIG; the configurations trial0, trial1... are the
--trial key sets, in order."""
import argparse
import statistics
import sys

TRAINER = [("graph", "this trainer, CUDA graph"), ("eager", "this trainer, eager"),
           ("aten", "eager on ATen ops")]


def read(path):
    runs, defaults = {}, set()
    for line in open(path):
        label, *figures = line.split()
        if label == "@defaults":
            defaults.add(figures[0])
            continue
        runs.setdefault(label, []).append(tuple(map(float, figures)) if figures else None)
    return runs, defaults


def median(runs):
    """(images/s, ms) medians of the runs that gave figures, or None if none did."""
    good = [r for r in runs if r]
    if not good:
        return None
    return statistics.median(r[0] for r in good), statistics.median(r[1] for r in good)


def cell(runs, rounds):
    m = median(runs)
    if m is None:
        return "failed" if runs else "not run"
    good = [r[0] for r in runs if r]
    text = f"{m[0]:,.0f} ({m[1]:.1f} ms)"
    if len(good) > 1:
        text += f", {min(good):,.0f}-{max(good):,.0f}"
    failed = len(runs) - len(good)
    text += f", {failed} of {len(runs)} failed" if failed else ""
    return text + (f", {len(runs)} of {rounds} runs" if len(runs) < rounds else "")


def against_graph(runs, label, name):
    """'NAME: 1.021x the CUDA graph, faster in 3 of 3 rounds', pairing the rounds in order."""
    graph_runs = runs.get("graph", [])
    pairs = [(a, b) for a, b in zip(runs[label], graph_runs) if a and b]
    mine, graph = median(runs[label]), median(graph_runs)
    if not pairs or not mine or not graph:
        return f"{name}: no round to compare with the CUDA graph"
    wins = sum(a[0] > b[0] for a, b in pairs)
    return (f"{name}: {mine[0] / graph[0]:.3f}x the CUDA graph, "
            f"faster in {wins} of {len(pairs)} rounds")


def ratio(numerator, denominator):
    return f"{numerator / denominator:.2f}" if numerator and denominator else "-"


def columns_of(runs, trials, defaults, max_autotune_conv):
    """(config, name) of every configuration measured at any precision and batch, in order."""
    configs = list(dict.fromkeys(label.split("_", 2)[2] for label in runs))  # in run order
    trainer = TRAINER[:1] + [(f"trial{i}", f"CUDA graph, {keys}")
                             for i, keys in enumerate(trials)] + TRAINER[1:]
    trainer = [(c, name + (" (the defaults)" if c in defaults else "")) for c, name in trainer
               if c in configs]
    compiled = []
    for config in (c for c in configs if c.startswith("compiled_")):
        mode = config.removeprefix("compiled_")
        if mode == "max-autotune" and max_autotune_conv:
            mode += f", convolutions {max_autotune_conv}"
        compiled.append((config, f"PyTorch compiled ({mode})"))
    return trainer, [("torch_eager", "PyTorch eager")] + compiled


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results")
    p.add_argument("--runs", nargs="+", required=True, help="PRECISION:BATCH, a row each")
    p.add_argument("--rounds", type=int, default=0, help="the rounds asked for (REPEATS)")
    p.add_argument("--peer-rounds", type=int, default=0,
                   help="the rounds of them with PyTorch's runs (PEER_ROUNDS; 0: every one)")
    p.add_argument("--trial", action="append", default=[], help="a trial's keys (TRIALS)")
    p.add_argument("--max-autotune-conv", default="",
                   help="ATEN when max-autotune's convolution tuning was restricted to ATen")
    args = p.parse_args()
    runs, defaults = read(args.results)
    default_configs = {label.split("_", 2)[2] for label in defaults}
    trainer, peers = columns_of(runs, args.trial, default_configs, args.max_autotune_conv)
    rounds = max([args.rounds] + [len(r) for r in runs.values()])
    peer_rounds = args.peer_rounds or rounds
    rows = []
    for run in args.runs:
        precision, batch = run.split(":")
        mine = {c: runs.get(f"{precision}_{batch}_{c}", []) for c, _ in trainer + peers}
        for config, name in trainer[1:]:
            print(f"{precision} {batch}: {against_graph(mine, config, name)}")
        best_mine = max((m[0] for m in (median(mine[c]) for c, _ in trainer) if m), default=None)
        best_theirs = max((m[0] for m in (median(mine[c]) for c, _ in peers[1:]) if m),
                          default=None)
        shipped = [median(mine[c]) for c, _ in trainer if f"{precision}_{batch}_{c}" in defaults]
        shipped = shipped[0][0] if shipped and shipped[0] else None
        rows.append(f"| {precision} | {batch} | " +
                    " | ".join([cell(mine[c], rounds) for c, _ in trainer] +
                               [cell(mine[c], peer_rounds) for c, _ in peers]) +
                    f" | {ratio(shipped, best_theirs)} | {ratio(best_mine, best_theirs)} |")
    print("| precision | batch | " + " | ".join(name for _, name in trainer + peers) +
          " | defaults / best compiled | best / best compiled |")
    print("| --- | ---: |" + " ---: |" * (len(trainer) + len(peers) + 2))
    print("\n".join(rows))
    print(f"(medians of up to {rounds} alternated rounds, PyTorch's in the last {peer_rounds}, "
          "with their min-max)", file=sys.stderr)


if __name__ == "__main__":
    main()
