#!/usr/bin/env python3
"""The row of docs/BENCHMARKS.md's training table from scripts/bench/train.sh's runs: each
configuration's median images/s (median step ms) and the spread of its repeats, and the ratio of
this trainer's best configuration to the better of PyTorch's compiled modes (each by its median).

    scripts/bench/train_table.py RESULTS --precision fp16 --batch 256 [--trial KEYS]

RESULTS has a line per run: "LABEL IMAGES_PER_S MEDIAN_MS", or "LABEL" alone for a run that
failed (its cell then says so)."""
import argparse
import statistics
import sys

TRAINER = [("graph", "this trainer, CUDA graph"), ("trial", None), ("eager", "this trainer, eager"),
           ("aten", "eager on ATen ops")]


def read(path):
    runs = {}
    for line in open(path):
        label, *figures = line.split()
        runs.setdefault(label, []).append(tuple(map(float, figures)) if figures else None)
    return runs


def median(runs):
    """(images/s, ms) medians of the runs that gave figures, or None if none did."""
    good = [r for r in runs if r]
    if not good:
        return None
    return statistics.median(r[0] for r in good), statistics.median(r[1] for r in good)


def cell(runs):
    m = median(runs)
    if m is None:
        return "failed"
    good = [r[0] for r in runs if r]
    text = f"{m[0]:,.0f} ({m[1]:.1f} ms)"
    if len(good) > 1:
        text += f", {min(good):,.0f}-{max(good):,.0f}"
    failed = len(runs) - len(good)
    return text + (f", {failed} of {len(runs)} failed" if failed else "")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results")
    p.add_argument("--precision", required=True)
    p.add_argument("--batch", required=True)
    p.add_argument("--trial", default="", help="TRIAL_ARGS, the trial column's keys")
    p.add_argument("--max-autotune-conv", default="",
                   help="ATEN when max-autotune's convolution tuning was restricted to ATen")
    args = p.parse_args()
    runs = read(args.results)
    columns = [(label, name or f"CUDA graph, {args.trial}") for label, name in TRAINER
               if label in runs]
    columns.append(("torch_eager", "PyTorch eager"))
    compiled = [label for label in runs if label.startswith("compiled_")]
    for label in compiled:
        mode = label.removeprefix("compiled_")
        if mode == "max-autotune" and args.max_autotune_conv:
            mode += f", convolutions {args.max_autotune_conv}"
        columns.append((label, f"PyTorch compiled ({mode})"))
    mine = [median(runs[label]) for label, _ in columns[:-1 - len(compiled)]]
    theirs = [median(runs[label]) for label in compiled]
    best_mine = max((m[0] for m in mine if m), default=None)
    best_theirs = max((m[0] for m in theirs if m), default=None)
    ratio = f"{best_mine / best_theirs:.2f}" if best_mine and best_theirs else "-"
    print("| precision | batch | " + " | ".join(name for _, name in columns) +
          " | best / best compiled |")
    print("| --- | ---: |" + " ---: |" * (len(columns) + 1))
    print(f"| {args.precision} | {args.batch} | " +
          " | ".join(cell(runs.get(label, [])) for label, _ in columns) + f" | {ratio} |")
    repeats = max(len(r) for r in runs.values())
    print(f"(medians of {repeats} alternated runs each, with their min-max)", file=sys.stderr)


if __name__ == "__main__":
    main()
