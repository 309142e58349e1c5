#!/usr/bin/env python3
"""Scaling model for data-parallel ResNet-50: predicted images/s and scaling efficiency on P3 /
P3dn (V100), P4d (A100) and P5 (H100) clusters, from the per-step backward time, the gradient
bucket schedule and the ring all-reduce cost 2(N-1)/N x bytes / bandwidth.

Backward is simulated layer by layer in reverse: each layer's gradient is ready after its share
of the backward time (proportional to its FLOPs, from torchvision's ResNet-50 at 224x224); buckets
of up to --bucket-mb, cut from the input side with the input-most one at most --last-bucket-mb
(what src/distributed/gradient_reducer does; --last-bucket-mb 0 cuts from the classifier side instead,
as the trainer did before), fill in that order and are all-reduced one after another on their
own stream as soon as they are full. Communication that ends after backward is exposed; the
rest is hidden.

With --input, the input instead: the JPEG bytes per second the GPUs read at that rate, and what
serves them. FSx for Lustre gives throughput per TiB of storage (SCRATCH_2: 200 MB/s baseline,
bursting to 1,300; PERSISTENT_2: 125 to 1,000 MB/s by choice). With epoch_order = by_node (the
shipped configs; Note [Records by node]) each node reads the same 1/nodes of the data every epoch:
the file system serves the first epoch, the node's page cache every later one (ImageNet's ~140 GB,
or its 1/nodes share, fits a P3's 488 GB of memory).

  python3 scripts/eks/scaling_model.py                      # the table in docs/BENCHMARKS.md
  python3 scripts/eks/scaling_model.py --gpu-images-per-s 1300 --bucket-mb 64
  python3 scripts/eks/scaling_model.py --gpu H100 --gpu-images-per-s 5900   # P5 (bf16, batch 256)
  python3 scripts/eks/scaling_model.py --input --gpu-images-per-s 1300   # docs/eks.md's sizing table
  python3 scripts/eks/scaling_model.py --input --gpu H100 --gpu-images-per-s 5900   # its P5 table
"""
import math
import argparse

import torch
import torchvision

# Per-node fabrics: name -> (inter-node bandwidth GB/s, intra-node NVLink bus bandwidth GB/s, the
# node's GPU). Inter-node: line rate x efficiency (TCP sockets on P3 reach ~80% of 25 Gbps; EFA
# ~85% of its line rate: 100 Gbps on P3dn, 4 x 100 on P4d, 32 x 100 on P5). Intra-node: NCCL
# all_reduce_perf's bus bandwidth on 8 GPUs, order of magnitude: V100 NVLink ~130 GB/s, A100
# NVSwitch ~230, H100 NVSwitch ~450 (model inputs, not measured here).
FABRICS = {
    "p3.16xlarge": (25 / 8 * 0.80, 130.0, "V100"),
    "p3dn.24xlarge": (100 / 8 * 0.85, 130.0, "V100"),
    "p4d.24xlarge": (400 / 8 * 0.85, 230.0, "A100"),
    "p5.48xlarge": (3200 / 8 * 0.85, 450.0, "H100"),
}
GPUS_PER_NODE = 8
LATENCY_S = 50e-6  # per all-reduce launch and ring step start-up, order of magnitude


def layer_profile():
    """(gradient bytes per element-size unit, backward FLOPs) per layer, in backward order."""
    model = torchvision.models.resnet50()
    flops = {}

    def hook(module, inputs, output):
        if isinstance(module, torch.nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels
            flops[module] = 2 * output.numel() * k // module.groups
        elif isinstance(module, torch.nn.Linear):
            flops[module] = 2 * module.in_features * module.out_features

    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224))
    layers = []  # (parameters, flops), forward order; BN parameters ride with their conv
    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            layers.append([sum(p.numel() for p in m.parameters()), flops[m]])
        elif isinstance(m, torch.nn.BatchNorm2d) and layers:
            layers[-1][0] += sum(p.numel() for p in m.parameters())
    return list(reversed(layers))


def bucket_ends(layers, bucket_bytes, last_bucket_bytes, element_bytes):
    """Backward-order indices of the layers that complete a bucket (each bucket's input-most)."""
    sizes = [params * element_bytes for params, _ in layers]
    ends = {len(layers) - 1}
    if last_bucket_bytes == 0:  # cut from the classifier side, the remainder last
        filled = 0
        for i, size in enumerate(sizes):
            filled += size
            if filled >= bucket_bytes:
                ends.add(i)
                filled = 0
        return ends
    filled, cap = 0, min(last_bucket_bytes, bucket_bytes)
    for i in reversed(range(len(layers))):  # from the input side
        if filled and filled + sizes[i] > cap:
            ends.add(i)  # layer i closes the bucket that fills just before
            filled, cap = 0, bucket_bytes
        filled += sizes[i]
    return ends


def exposed_communication(layers, backward_s, ends, element_bytes, busbw_bytes, ranks):
    """Seconds of all-reduce that outlast backward, and the total all-reduce time."""
    total_flops = sum(f for _, f in layers)
    ring = 2 * (ranks - 1) / ranks
    t, comm_end, filled, total_comm = 0.0, 0.0, 0, 0.0
    for i, (params, flops) in enumerate(layers):
        t += backward_s * flops / total_flops
        filled += params * element_bytes
        if i in ends:
            duration = LATENCY_S + ring * filled / busbw_bytes
            comm_end = max(comm_end, t) + duration
            total_comm += duration
            filled = 0
    return max(0.0, comm_end - backward_s), total_comm


IMAGENET_TRAIN_IMAGES = 1281167
SCRATCH2_MBPS_PER_TIB = (200, 1300)  # baseline, burst
PERSISTENT2_MBPS_PER_TIB = 1000  # the highest of 125 / 250 / 500 / 1000
SCRATCH2_TIB = 2.4  # k8s/fsx's StorageClass


def scratch2_tib(mb_per_s):
    """SCRATCH_2 capacity (1.2 TiB, or a multiple of 2.4 TiB) whose baseline gives `mb_per_s`."""
    tib = mb_per_s / SCRATCH2_MBPS_PER_TIB[0]
    return 1.2 if tib <= 1.2 else 2.4 * math.ceil(tib / 2.4)


def input_table(args):
    """What the GPUs read, per node count, and how long the first epoch takes on the file system:
    with epoch_order = by_node each node reads its 1/nodes of the data once (times the read
    factor: readahead past its records), and its page cache serves every later epoch."""
    dataset_gb = IMAGENET_TRAIN_IMAGES * args.image_kb * 1e3 / 1e9
    shipped_gbs = SCRATCH2_TIB * SCRATCH2_MBPS_PER_TIB[0] / 1e3
    print(f"One {args.gpu} {args.gpu_images_per_s:.0f} images/s; {args.image_kb:g} KB per JPEG "
          f"({dataset_gb:.0f} GB in {IMAGENET_TRAIN_IMAGES:,} images); {args.epochs} epochs; "
          f"epoch_order = by_node, {args.read_factor:g}x the node's share read in the first "
          f"epoch; the shipped {SCRATCH2_TIB} TiB SCRATCH_2 gives {shipped_gbs:.2f} GB/s\n")
    print("| nodes | GPUs | images/s | GB/s read at that rate | epoch s | first epoch s on "
          f"{SCRATCH2_TIB} TiB | run min | TiB for the first epoch at full rate: SCRATCH_2 "
          "baseline; PERSISTENT_2 (1,000 MB/s/TiB) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for nodes in (1, 2, 8, 20):
        gpus = nodes * GPUS_PER_NODE
        rate = gpus * args.gpu_images_per_s
        read = rate * args.image_kb * 1e3 / 1e9 * args.read_factor  # GB/s at the GPUs' rate
        epoch_s = IMAGENET_TRAIN_IMAGES / rate
        first_s = max(epoch_s, dataset_gb * args.read_factor / shipped_gbs)
        run_min = (first_s + (args.epochs - 1) * epoch_s) / 60
        print(f"| {nodes} | {gpus} | {rate:,.0f} | {read:.1f} | {epoch_s:.0f} | {first_s:.0f} | "
              f"{run_min:.0f} | {scratch2_tib(read * 1e3):g}; "
              f"{math.ceil(read * 1e3 / PERSISTENT2_MBPS_PER_TIB)} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gpu-images-per-s", type=float, default=1200.0,
                   help="one V100, mixed precision, batch 256 (NVIDIA DLE PyTorch AMP: 1,200)")
    p.add_argument("--gpu", default="V100", choices=sorted({f[2] for f in FABRICS.values()}),
                   help="the GPU --gpu-images-per-s is of: the fabrics of its nodes are modelled "
                   "(--input's table names it)")
    p.add_argument("--batch", type=int, default=256, help="images per GPU")
    p.add_argument("--backward-fraction", type=float, default=2 / 3,
                   help="share of the step spent in backward")
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--last-bucket-mb", type=float, default=1.0,
                   help="cap of the input-most bucket; 0: buckets cut from the classifier side")
    p.add_argument("--input", action="store_true", help="the input's read rate instead")
    p.add_argument("--image-kb", type=float, default=110.0, help="mean JPEG size, KB")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--read-factor", type=float, default=1.4,
                   help="bytes read per byte of a node's share in its first epoch (by_node; "
                        "scripts/bench/input_throttled.sh measured 1.4)")
    args = p.parse_args()
    if args.input:
        input_table(args)
        return

    layers = layer_profile()
    params = sum(n for n, _ in layers)
    step_s = args.batch / args.gpu_images_per_s
    backward_s = step_s * args.backward_fraction
    print(f"ResNet-50: {params:,} parameters ({params * 4 / 1e6:.1f} MB fp32); one GPU "
          f"{args.gpu_images_per_s:.0f} images/s at batch {args.batch}: step {step_s * 1e3:.0f} ms, "
          f"backward {backward_s * 1e3:.0f} ms; buckets of up to {args.bucket_mb:g} MB, "
          f"the input-most up to {args.last_bucket_mb:g} MB (0: cut from the classifier side)\n")
    print("| nodes | GPUs | fabric | wire | all-reduce ms | exposed ms | images/s | efficiency |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for fabric, (inter_gbs, nvlink_gbs, gpu) in FABRICS.items():
        if gpu != args.gpu:
            continue
        for gpus in (8, 16, 64, 160):
            nodes = gpus // GPUS_PER_NODE
            busbw = (nvlink_gbs if nodes == 1 else inter_gbs) * 1e9
            for wire, element_bytes in (("fp32", 4), ("fp16", 2)):
                ends = bucket_ends(layers, args.bucket_mb * 2**20, args.last_bucket_mb * 2**20,
                                   element_bytes)
                exposed, comm = exposed_communication(layers, backward_s, ends, element_bytes,
                                                      busbw, gpus)
                rate = gpus * args.batch / (step_s + exposed)
                efficiency = rate / (gpus * args.gpu_images_per_s)
                print(f"| {nodes} | {gpus} | {fabric} | {wire} | {comm * 1e3:.1f} | "
                      f"{exposed * 1e3:.1f} | {rate:,.0f} | {efficiency:.1%} |")


if __name__ == "__main__":
    main()
