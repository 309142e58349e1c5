#!/usr/bin/env bash
# Training throughput on synthetic data: this trainer with its step as a CUDA graph, with each trial
# key set on top of the graph, eager, and eager with ATen's batch norm and max pooling
# (fused_batch_norm and compact_max_pool off), next to PyTorch eager and compiled (torchvision's
# model, same batch, precision and memory format, fused SGD), in one command on one device. Ends
# with the figures as rows of docs/BENCHMARKS.md's table, a row a precision and batch.
#   scripts/bench/train.sh [PRECISION:BATCH ...]   e.g. scripts/bench/train.sh fp16:256 bf16:32
#   scripts/bench/train.sh PRECISION BATCH          (one run, e.g. scripts/bench/train.sh fp16 256)
# TRIALS: key sets to try, separated by ";", e.g. "--stem_space_to_depth true;
# --fused_residual_gradient true": one more configuration of this trainer each, the step as a CUDA
# graph with those keys. ATEN_ROW=0 leaves out the eager run on ATen's ops.
# COMPILE_MODES: torch.compile's modes to run, the better of which is the denominator (default
# "reduce-overhead max-autotune": CUDA graphs alone, and CUDA graphs with autotuned kernels, the
# slowest to compile; MAX_AUTOTUNE_CONV=ATEN restricts the latter's convolution tuning to ATen's,
# TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS, which compiles in a fraction of the time).
# REPEATS (default 3): rounds. A round runs every configuration of this trainer at every precision
# and batch in one bench-step process (alternated there, each round starting one later), then
# PyTorch eager and each compiled mode, a process each, so that the card's clocks and temperature
# drift over all of them alike; a cell is the median images/s with the spread (min-max) of the
# rounds.
# PEER_ROUNDS (default REPEATS): PyTorch's runs in the last that many rounds only, so that a short
# session spends its time on this trainer's configurations first, PyTorch's compiles last.
# STEPS and WARMUP_STEPS (default 100 and 20): the timed and untimed steps of every run, both sides.
# BUDGET_S (default 0, none): no run starts past this many seconds, so that a device session's
# call ends in time; the cells then say how many runs they had. Each process's seconds are printed.
# Needs a built tree (scripts/build.sh); on a GPU machine with PyTorch it needs nothing else.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(fp16:256)
[[ ${#runs[@]} -ne 2 || ${runs[1]} != +([0-9]) ]] || runs=("${runs[0]}:${runs[1]}")
for run in "${runs[@]}"; do
  [[ $run =~ ^(fp16|bf16|fp32):[1-9][0-9]*$ ]] || {
    echo "a run is PRECISION:BATCH (fp16, bf16 or fp32), got '$run'" >&2
    exit 2
  }
done
python=${PYTHON:-python3}
build_dir=${BUILD_DIR:-$root/build}
read -r -a compile_modes <<<"${COMPILE_MODES:-reduce-overhead max-autotune}"
repeats=${REPEATS:-3}
budget=${BUDGET_S:-0}
peer_rounds=${PEER_ROUNDS:-$repeats}
steps=${STEPS:-100}
warmup=${WARMUP_STEPS:-20}
for value in "REPEATS=$repeats" "STEPS=$steps" "BUDGET_S=$budget" "PEER_ROUNDS=$peer_rounds" \
  "WARMUP_STEPS=$warmup"; do
  if [[ ! ${value#*=} =~ ^[0-9]+$ || $value == REPEATS=0 || $value == STEPS=0 ]]; then
    echo "${value%%=*} must be a whole number (REPEATS and STEPS at least 1), got" \
      "'${value#*=}'" >&2
    exit 2
  fi
done

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
results=$(mktemp)
trap 'rm -f "$results"' EXIT
out_of_time() { [ "$budget" -gt 0 ] && [ "$SECONDS" -ge "$budget" ]; }

# This trainer's configurations: a label each, and the keys that make it.
configs=(graph)
keys=("--cuda_graph true")
trial_columns=()
IFS=';' read -r -a trials <<<"${TRIALS:-}"
for trial in "${trials[@]}"; do
  read -r -a words <<<"$trial"  # the key set, trimmed
  [ ${#words[@]} -gt 0 ] || continue
  configs+=("trial$((${#configs[@]} - 1))")
  keys+=("--cuda_graph true ${words[*]}")
  trial_columns+=(--trial "${words[*]}")
done
configs+=(eager)
keys+=("--cuda_graph false")
if [ "${ATEN_ROW:-1}" != 0 ]; then
  configs+=(aten)
  keys+=("--cuda_graph false --fused_batch_norm false --compact_max_pool false")
fi
# Every configuration at every precision and batch, labelled PRECISION_BATCH_CONFIG.
labels=()
bench_step=("$build_dir/bench-step")
for run in "${runs[@]}"; do
  for i in "${!configs[@]}"; do
    labels+=("${run/:/_}_${configs[$i]}")
    bench_step+=(--trial "${labels[-1]}=--precision ${run%:*} --batch_size ${run#*:} ${keys[$i]}")
  done
done
bench_step+=(-- --config "$root/configs/one-gpu.toml" --data_source synthetic --benchmark true
  --num_classes 1000 --benchmark_steps "$steps" --benchmark_warmup_steps "$warmup"
  --output_dir "${TMPDIR:-/tmp}/bench-train")

# One round of this trainer ($1): records "label images/s median-ms" per configuration measured
# (from "bench-step fp16_256_graph round 1: 6971.2 images/s, step median 36.72 ms, ..."), the
# label alone for one the process failed to measure, and which configurations are the defaults.
measure_trainer() {
  local output status=0 label figures
  local line=' round [0-9]+: ([0-9.]+) images/s, step median ([0-9.]+) ms.*'
  echo "+ ${bench_step[*]}" >&2
  # Shown as it comes: a device call cut short keeps what its log had.
  output=$("${bench_step[@]}" --repeats 1 --first_round "$1" \
    --budget_s "$((budget > 0 ? budget - SECONDS : 0))" 2>&1 | tee /dev/stderr) || status=$?
  [ "$status" -eq 0 ] || echo "bench-step failed: exit status $status" >&2
  for label in "${labels[@]}"; do
    figures=$(sed -nE "s|^bench-step $label$line|\1 \2|p" <<<"$output")
    # Left out by the budget: no cell to fill. Else a configuration without figures failed.
    [ -n "$figures" ] || ! grep -q "budget is spent" <<<"$output" || continue
    echo "$label $figures" >>"$results"
    if grep -q "^bench-step $label: the defaults" <<<"$output"; then
      echo "@defaults $label" >>"$results"
    fi
  done
}
# A peer's run labelled $1, its output to stderr: records "label images/s median-ms" (from "...
# 6971.2 images/s, step median 36.72 ms ..."), or the label alone when it failed.
measure() {
  local label=$1 figures
  shift
  echo "+ $*" >&2
  figures=$({ "$@" 2>&1 || echo "failed: exit $?"; } | tee /dev/stderr |
    sed -nE 's/.*: ([0-9.]+) images\/s, step median ([0-9.]+) ms.*/\1 \2/p' | tail -1)
  echo "$label $figures" >>"$results"
}
# PyTorch's run $2 (torch_eager or compiled_MODE) at precision:batch $1.
measure_peer() {
  local run=$1 peer=$2
  local pytorch=("$python" "$root/scripts/bench/pytorch_step.py" --precision "${run%:*}"
    --batch-size "${run#*:}" --steps "$steps" --warmup-steps "$warmup")
  case $peer in
    torch_eager) measure "${run/:/_}_$peer" "${pytorch[@]}" ;;
    compiled_max-autotune) if [ "${MAX_AUTOTUNE_CONV:-}" = ATEN ]; then
      measure "${run/:/_}_$peer" env TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS=ATEN \
        "${pytorch[@]}" --compile --compile-mode max-autotune
    else
      measure "${run/:/_}_$peer" "${pytorch[@]}" --compile --compile-mode max-autotune
    fi ;;
    *) measure "${run/:/_}_$peer" "${pytorch[@]}" --compile --compile-mode "${peer#compiled_}" ;;
  esac
}
timed() {
  local started=$SECONDS
  "$@"
  echo "(that took $((SECONDS - started)) s)" >&2
}
for round in $(seq "$repeats"); do
  echo "== round $round of $repeats" >&2
  out_of_time || timed measure_trainer "$round"
  [ "$round" -gt $((repeats - peer_rounds)) ] || continue
  # A kind of peer at every precision and batch before the next kind: the compiles come last.
  for peer in torch_eager "${compile_modes[@]/#/compiled_}"; do
    for run in "${runs[@]}"; do
      if out_of_time; then
        echo "== the $budget s budget is spent: round $round's $run $peer and the rest not run" >&2
        break 3
      fi
      timed measure_peer "$run" "$peer"
    done
  done
done
"$python" "$root/scripts/bench/train_table.py" "$results" --runs "${runs[@]}" --rounds "$repeats" \
  --peer-rounds "$peer_rounds" "${trial_columns[@]}" --max-autotune-conv "${MAX_AUTOTUNE_CONV:-}"
