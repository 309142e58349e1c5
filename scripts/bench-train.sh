#!/usr/bin/env bash
# Training throughput on synthetic data: this trainer next to PyTorch eager and compiled
# (torchvision's model, same batch, precision and memory format), in one command on one device.
#   scripts/bench-train.sh [PRECISION] [BATCH]      e.g. scripts/bench-train.sh fp16 256
# Needs a built tree (scripts/build.sh); on a GPU machine with PyTorch it needs nothing else.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
precision=${1:-fp16}
batch=${2:-256}
python=${PYTHON:-python3}
build_dir=${BUILD_DIR:-$root/build}

set -x
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$build_dir/train" --config "$root/configs/one-gpu.toml" --data_source synthetic \
  --benchmark true --precision "$precision" --batch_size "$batch" --num_classes 1000 \
  --output_dir "${TMPDIR:-/tmp}/bench-train"
"$python" "$root/scripts/bench_pytorch.py" --precision "$precision" --batch-size "$batch"
"$python" "$root/scripts/bench_pytorch.py" --precision "$precision" --batch-size "$batch" --compile
