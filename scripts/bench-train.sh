#!/usr/bin/env bash
# Training throughput on synthetic data: this trainer, with its step as a CUDA graph and without,
# and with its fused batch norm and without, next to PyTorch eager and compiled (torchvision's model, same batch, precision and memory format,
# fused SGD), in one command on one device.
#   scripts/bench-train.sh [PRECISION] [BATCH]      e.g. scripts/bench-train.sh fp16 256
# COMPILE_MODE picks torch.compile's mode (default max-autotune: CUDA graphs and autotuned
# kernels, its fastest for this model and the slowest to compile; reduce-overhead: graphs only).
# Needs a built tree (scripts/build.sh); on a GPU machine with PyTorch it needs nothing else.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
precision=${1:-fp16}
batch=${2:-256}
python=${PYTHON:-python3}
build_dir=${BUILD_DIR:-$root/build}
compile_mode=${COMPILE_MODE:-max-autotune}

set -x
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
# This trainer: the step as a CUDA graph, then eager, then eager without the fused batch norm.
for variant in "true true" "true false" "false false"; do
  read -r fused graph <<<"$variant"
  "$build_dir/train" --config "$root/configs/one-gpu.toml" --data_source synthetic \
    --benchmark true --precision "$precision" --batch_size "$batch" --num_classes 1000 \
    --fused_batch_norm "$fused" --cuda_graph "$graph" --output_dir "${TMPDIR:-/tmp}/bench-train"
done
"$python" "$root/scripts/bench_pytorch.py" --precision "$precision" --batch-size "$batch"
"$python" "$root/scripts/bench_pytorch.py" --precision "$precision" --batch-size "$batch" --compile \
  --compile-mode "$compile_mode"
