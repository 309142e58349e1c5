#!/usr/bin/env python3
"""The peer for `train --benchmark true`: torchvision's ResNet in PyTorch (eager, or compiled with
--compile), same batch, precision and memory format, on a fixed synthetic batch on the device,
SGD with momentum, CUDA-event timing after warm-up. Prints one line in the trainer's units.

PyTorch at its best by default: the fused SGD kernel (`fused=True`, which also takes GradScaler's
scale and overflow flag on the device: no `.item()` per step, unlike the default SGD), and
`--compile-mode` picks torch.compile's mode ("max-autotune" adds CUDA graphs and kernel
autotuning; "reduce-overhead" CUDA graphs alone).

  python3 scripts/bench/pytorch_step.py --arch resnet50 --batch-size 256 --precision fp16
  python3 scripts/bench/pytorch_step.py --precision bf16 --compile --compile-mode max-autotune
"""
import argparse
import statistics
import time

import torch
import torchvision


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp16")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--compile-mode", default="default",
                   choices=["default", "reduce-overhead", "max-autotune",
                            "max-autotune-no-cudagraphs"], help="torch.compile's mode")
    p.add_argument("--fused-sgd", action=argparse.BooleanOptionalAction, default=True,
                   help="SGD's fused kernel (no host sync with GradScaler); else the default")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args()


def main():
    args = parse_args()
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if args.channels_last and device.type == "cuda" else \
        torch.contiguous_format
    model = getattr(torchvision.models, args.arch)().to(device, memory_format=fmt)
    step_model = torch.compile(model, mode=args.compile_mode) if args.compile else model
    fused = args.fused_sgd and device.type == "cuda"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                                fused=fused)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    images = torch.randint(0, 256, (args.batch_size, args.image_size, args.image_size, 3),
                           dtype=torch.uint8, device=device)
    labels = torch.randint(0, 1000, (args.batch_size,), device=device)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device) * 255

    graphs = args.compile and args.compile_mode in ("reduce-overhead", "max-autotune")

    def step():
        if graphs:  # a new iteration: the last step's graph outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        x = ((images.float() - mean) / std).permute(0, 3, 1, 2).contiguous(memory_format=fmt)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(step_model(x).float(), labels,
                                                     label_smoothing=0.1)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup_steps):
        step()
    times = []
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
        events[0].record()
        for i in range(args.steps):
            step()
            events[i + 1].record()
        events[-1].synchronize()
        times = [events[i].elapsed_time(events[i + 1]) for i in range(args.steps)]
    else:
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1000)
    times_sorted = sorted(times)
    mode = f"compiled ({args.compile_mode})" if args.compile else "eager"
    mode += ", fused SGD" if fused else ""
    print(f"pytorch {mode} {args.arch} {args.precision} batch {args.batch_size}: "
          f"{args.steps * args.batch_size / (sum(times) / 1000):.1f} images/s, "
          f"step median {statistics.median(times):.2f} ms, "
          f"p90 {times_sorted[min(len(times) - 1, int(0.9 * len(times)))]:.2f} ms "
          f"({args.steps} timed steps)")


if __name__ == "__main__":
    main()
