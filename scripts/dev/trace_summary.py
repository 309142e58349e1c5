#!/usr/bin/env python3
"""Where a traced step's time goes, in text: the GPU kernels of a `profile_steps` trace
(<output_dir>/profile/rank<R>.<step>.pt.trace.json) by kind (batch norm, convolution, element-wise,
pooling, optimizer, all-reduce...) and the costliest kernels by name, per traced step. A trace with
no GPU kernels (a CPU run) is summarised by its operators' self time instead.

Usage: scripts/dev/trace_summary.py TRACE [--top N]
"""
import argparse
import collections
import json
import pathlib
import re
import sys

# First match wins: cuDNN's batch norm kernels are named cudnn::bn_*, so batch norm comes before
# the convolutions' cudnn / xmma / sm90 kernels.
KINDS = [
    ("batch norm", r"bn_|batch_?norm|welford"),
    ("convolution", r"conv(?!ert)|xmma|implicit|dgrad|wgrad|fprop|cudnn|sm\d\d_|cutlass"),
    ("matmul", r"gemm|cublas"),
    ("pooling", r"pool"),
    ("optimizer and loss scale", r"multi_tensor|fused_sgd|sgd|amp_|foreach|lars"),
    ("all-reduce", r"nccl"),
    ("loss", r"softmax|nll|cross_entropy|log_softmax"),
    ("reduction", r"reduce"),
    ("element-wise and copies", r"elementwise|vectorized|unrolled|copy|cast|fill|memcpy|memset"),
]


def kind_of(name):
    lowered = name.lower()
    for kind, pattern in KINDS:
        if re.search(pattern, lowered):
            return kind
    return "other"


def gpu_work(events):
    """The kernels, copies and sets on the GPU: (name, microseconds)."""
    return [(e["name"], e["dur"]) for e in events
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]


def operator_self_times(events):
    """Each host operator's time less that of the operators inside it, on the same thread."""
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and "dur" in e),
                 key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    out, stack = [], []  # stack: [end, index into out] of the operators still open
    for e in ops:
        start, end = e["ts"], e["ts"] + e["dur"]
        while stack and (stack[-1][2] != e["tid"] or stack[-1][0] <= start):
            stack.pop()
        if stack:
            out[stack[-1][1]][1] -= e["dur"]
        out.append([e["name"], e["dur"]])
        stack.append((end, len(out) - 1, e["tid"]))
    return [(name, max(us, 0.0)) for name, us in out]


def traced_steps(events):
    return sum(1 for e in events
               if e.get("cat") == "user_annotation" and re.fullmatch(r"step \d+", e["name"]))


def summarise(trace, top):
    events = trace["traceEvents"]
    steps = max(traced_steps(events), 1)
    work = gpu_work(events)
    what = "GPU kernels, copies and sets"
    if not work:
        work = operator_self_times(events)
        what = "host operators (self time)"
    total = sum(us for _, us in work)
    lines = [f"{steps} traced step(s); {what}: {len(work)} ({len(work) / steps:.0f} a step), "
             f"{total / 1000:.1f} ms ({total / 1000 / steps:.2f} ms a step)"]
    if not work:
        return lines
    by_kind = collections.defaultdict(lambda: [0.0, 0])
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for name, us in work:
        for table, key in ((by_kind, kind_of(name)), (by_name, name)):
            table[key][0] += us
            table[key][1] += 1
    lines.append(f"{'by kind':<28}{'ms a step':>10}{'share':>8}{'a step':>8}")
    for kind, (us, count) in sorted(by_kind.items(), key=lambda item: -item[1][0]):
        lines.append(f"{kind:<28}{us / 1000 / steps:>10.3f}{us / total:>8.1%}{count / steps:>8.0f}")
    lines.append(f"the {top} costliest by name:")
    for name, (us, count) in sorted(by_name.items(), key=lambda item: -item[1][0])[:top]:
        lines.append(f"{us / 1000 / steps:>10.3f} ms {us / total:>6.1%} x{count / steps:<5.0f} "
                     f"{name[:110]}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=pathlib.Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    try:
        trace = json.loads(args.trace.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"trace_summary.py: cannot read {args.trace} as a trace: {e}")
    print(f"{args.trace}:")
    print("\n".join(summarise(trace, args.top)))


if __name__ == "__main__":
    main()
