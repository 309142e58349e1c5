#!/usr/bin/env python3
"""The peer for the capped-link benchmark (scripts/bench/capped_link.py): torchvision's ResNet on
the CPU under PyTorch's DistributedDataParallel on Gloo, one process a host, launched by
torchrun; the model, batch, image size and bucket size of `train --benchmark true` beside it.
SGD with momentum on a fixed synthetic batch. Rank 0 prints one JSON line of medians, in ms:

- step: a whole step (forward, backward with DDP's all-reduce overlapped, update);
- no_sync: the same step under no_sync() (backward with no all-reduce): the compute alone;
- allreduce: the gradients alone, all-reduced as DDP's buckets (bucket_cap_mb each, the
  parameters in reverse order), one after another, with no backward beside them;
- overlap: the share of that all-reduce that the step hides behind backward,
  1 - (step - no_sync) / allreduce.

  torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      scripts/bench/ddp_step.py --arch resnet18 --batch-size 16 --image-size 64
"""
import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--bucket-mb", type=int, default=25)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    return p.parse_args()


def median_ms(run, times):
    taken = []
    for _ in range(times):
        start = time.perf_counter()
        run()
        taken.append(1000 * (time.perf_counter() - start))
    return statistics.median(taken)


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torchvision.models.__dict__[args.arch](num_classes=args.num_classes)
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    labels = torch.randint(0, args.num_classes, (args.batch_size,))

    def step(sync=True):
        with contextlib.nullcontext() if sync else ddp.no_sync():
            loss = F.cross_entropy(ddp(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        optimizer.step()

    for _ in range(args.warmup_steps):
        step()
    whole = median_ms(step, args.steps)
    alone = median_ms(lambda: step(sync=False), args.steps)

    # DDP's buckets: the parameters in reverse order (backward's), cut at bucket_cap_mb.
    buckets, size, cap = [], 0, args.bucket_mb << 20
    for param in reversed(list(model.parameters())):
        if not buckets or size + param.numel() * 4 > cap:
            buckets.append(0)
            size = 0
        buckets[-1] += param.numel()
        size += param.numel() * 4
    flats = [torch.zeros(n) for n in buckets]
    dist.barrier()
    reduce = median_ms(lambda: [dist.all_reduce(flat) for flat in flats], args.steps)
    if dist.get_rank() == 0:
        print(json.dumps({"step": whole, "no_sync": alone, "allreduce": reduce,
                          "overlap": max(0.0, 1 - (whole - alone) / reduce),
                          "buckets": len(buckets), "world": dist.get_world_size()}), flush=True)
    dist.barrier()
    # Not Python's teardown: freeing DDP's reducer at exit can deadlock with Gloo's threads
    # over the GIL (seen with torch 2.11 on this benchmark).
    os._exit(0)


if __name__ == "__main__":
    main()
