#!/usr/bin/env bash
# Training throughput on synthetic data: this trainer with its step as a CUDA graph, eager, and
# eager with ATen's batch norm and max pooling (fused_batch_norm and compact_max_pool off), next to
# PyTorch eager and compiled (torchvision's model, same batch, precision and memory format, fused
# SGD), in one command on one device. Ends with the figures as a row of docs/BENCHMARKS.md's table.
#   scripts/bench/train.sh [PRECISION] [BATCH]      e.g. scripts/bench/train.sh fp16 256
# TRIAL_ARGS: keys to try, e.g. "--fused_residual_gradient true": one more run of this trainer,
# the step as a CUDA graph with those keys, measured in the same command as the rest.
# COMPILE_MODES: torch.compile's modes to run, the better of which is the denominator (default
# "reduce-overhead max-autotune": CUDA graphs alone, and CUDA graphs with autotuned kernels, the
# slowest to compile; MAX_AUTOTUNE_CONV=ATEN restricts the latter's convolution tuning to ATen's,
# TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS, which compiles in a fraction of the time).
# REPEATS (default 3): each configuration runs that many times, alternated (one of each, then the
# next round), so that the card's clocks and temperature drift over all of them alike; a cell is
# the median images/s with the spread (min-max) of the repeats.
# Needs a built tree (scripts/build.sh); on a GPU machine with PyTorch it needs nothing else.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
precision=${1:-fp16}
batch=${2:-256}
python=${PYTHON:-python3}
build_dir=${BUILD_DIR:-$root/build}
read -r -a compile_modes <<<"${COMPILE_MODES:-reduce-overhead max-autotune}"
repeats=${REPEATS:-3}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || {
  echo "REPEATS must be a positive whole number, got '$repeats'" >&2
  exit 2
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
results=$(mktemp)
trap 'rm -f "$results"' EXIT
# Runs a benchmark labelled $1, its output to stderr, and records "label images/s median-ms" (from
# "... 6971.2 images/s, step median 36.72 ms ..."), or the label alone when it failed.
measure() {
  local label=$1 figures
  shift
  echo "+ $*" >&2
  figures=$({ "$@" 2>&1 || echo "failed: exit $?"; } | tee /dev/stderr |
    sed -nE 's/.*: ([0-9.]+) images\/s, step median ([0-9.]+) ms.*/\1 \2/p' | tail -1)
  echo "$label $figures" >>"$results"
}
trainer=("$build_dir/train" --config "$root/configs/one-gpu.toml" --data_source synthetic
  --benchmark true --precision "$precision" --batch_size "$batch" --num_classes 1000
  --output_dir "${TMPDIR:-/tmp}/bench-train")
pytorch=("$python" "$root/scripts/bench/pytorch_step.py" --precision "$precision" --batch-size "$batch")
trial_args=${TRIAL_ARGS:-}
for round in $(seq "$repeats"); do
  echo "== round $round of $repeats" >&2
  # This trainer: the step as a CUDA graph, eagerly, and eagerly on ATen's ops.
  measure graph "${trainer[@]}" --cuda_graph true
  # shellcheck disable=SC2086  # TRIAL_ARGS is a list of keys and values
  [ -z "$trial_args" ] || measure trial "${trainer[@]}" --cuda_graph true $trial_args
  measure eager "${trainer[@]}" --cuda_graph false
  measure aten "${trainer[@]}" --cuda_graph false --fused_batch_norm false --compact_max_pool false
  measure torch_eager "${pytorch[@]}"
  for mode in "${compile_modes[@]}"; do
    if [ "$mode" = max-autotune ] && [ "${MAX_AUTOTUNE_CONV:-}" = ATEN ]; then
      measure "compiled_$mode" env TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS=ATEN "${pytorch[@]}" \
        --compile --compile-mode "$mode"
    else
      measure "compiled_$mode" "${pytorch[@]}" --compile --compile-mode "$mode"
    fi
  done
done
"$python" "$root/scripts/bench/train_table.py" "$results" --precision "$precision" \
  --batch "$batch" --trial "$trial_args" --max-autotune-conv "${MAX_AUTOTUNE_CONV:-}"
