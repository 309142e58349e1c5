#!/usr/bin/env bash
# Training throughput on synthetic data: this trainer with its step as a CUDA graph, eager, and
# eager with ATen's batch norm and max pooling (fused_batch_norm and compact_max_pool off), next to
# PyTorch eager and compiled (torchvision's model, same batch, precision and memory format, fused
# SGD), in one command on one device. Ends with the figures as a row of docs/BENCHMARKS.md's table.
#   scripts/bench-train.sh [PRECISION] [BATCH]      e.g. scripts/bench-train.sh fp16 256
# TRIAL_ARGS: keys to try, e.g. "--fused_residual_gradient true": one more run of this trainer,
# the step as a CUDA graph with those keys, measured in the same command as the rest.
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

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
# Runs a benchmark, its output to stderr, and prints its "images/s median-ms" (from "... 6971.2
# images/s, step median 36.72 ms ..."), or nothing when it failed (the table says so).
measure() {
  echo "+ $*" >&2
  { "$@" 2>&1 || echo "failed: exit $?"; } | tee /dev/stderr |
    sed -nE 's/.*: ([0-9.]+) images\/s, step median ([0-9.]+) ms.*/\1 \2/p' | tail -1
}
trainer=("$build_dir/train" --config "$root/configs/one-gpu.toml" --data_source synthetic
  --benchmark true --precision "$precision" --batch_size "$batch" --num_classes 1000
  --output_dir "${TMPDIR:-/tmp}/bench-train")
pytorch=("$python" "$root/scripts/bench_pytorch.py" --precision "$precision" --batch-size "$batch")
# This trainer: the step as a CUDA graph, eagerly, and eagerly on ATen's ops.
graph=$(measure "${trainer[@]}" --cuda_graph true)
eager=$(measure "${trainer[@]}" --cuda_graph false)
aten=$(measure "${trainer[@]}" --cuda_graph false --fused_batch_norm false --compact_max_pool false)
trial_args=${TRIAL_ARGS:-}
trial=
# shellcheck disable=SC2086  # TRIAL_ARGS is a list of keys and values
[ -z "$trial_args" ] || trial=$(measure "${trainer[@]}" --cuda_graph true $trial_args)
torch_eager=$(measure "${pytorch[@]}")
compiled=$(measure "${pytorch[@]}" --compile --compile-mode "$compile_mode")
# The table row of docs/BENCHMARKS.md: images/s (median step ms), the ratio of the best of this
# trainer's steps to compiled PyTorch. The trial's column only when TRIAL_ARGS asked for one.
awk -v p="$precision" -v b="$batch" -v m="$compile_mode" -v g="$graph" -v e="$eager" -v a="$aten" \
  -v t="$torch_eager" -v c="$compiled" -v r="$trial" -v ra="$trial_args" 'function cell(x, f) {
    split(x, f, " "); return x == "" ? "failed" : sprintf("%d (%.1f ms)", f[1], f[2]) }
  BEGIN {
    split(g, G, " "); split(e, E, " "); split(c, C, " "); split(r, R, " ")
    best = G[1] > E[1] ? G[1] : E[1]
    if (R[1] > best) best = R[1]
    head = "| precision | batch | this trainer, CUDA graph |"
    rule = "| --- | ---: | ---: |"
    row = sprintf("| %s | %s | %s |", p, b, cell(g))
    if (ra != "") {
      head = head " CUDA graph, " ra " |"; rule = rule " ---: |"; row = row " " cell(r) " |"
    }
    print head " this trainer, eager | eager on ATen ops | PyTorch eager | PyTorch compiled (" m ") | ratio to compiled |"
    print rule " ---: | ---: | ---: | ---: | ---: |"
    printf "%s %s | %s | %s | %s | %s |\n", row, cell(e), cell(a), cell(t), cell(c),
      (C[1] > 0 && best > 0 ? sprintf("%.2f", best / C[1]) : "-")
  }'
