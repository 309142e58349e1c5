#!/usr/bin/env bash
# The checks that need a GPU, run on a GPU machine with PyTorch 2.11 (cu130) from the repository
# root, using the bundle that scripts/device/bundle.sh made on the build machine (no compiler,
# packages or network needed there). Stages, in order (default: all):
#   tests      the GPU tests (fused input kernel, fused batch norm, the convolution-side fusion
#              and the residual gradient's dgrad-add (cuDNN builds them for every ResNet-50
#              block) against float64 and the whole ResNet against float32, the compact max
#              pooling against ATen's bit for bit, fp16/bf16 steps in channels_last, loss
#              scaling) and the gradient all-reduce over NCCL under `mpirun -np 1`
#              (fp32/fp16/bf16 wire)
#   overhead   the gradient path at world size one: `train --benchmark` alone against
#              `mpirun -np 1 train --benchmark` (bucketing, hooks, NCCL), alternated, twice
#   allreduce  bench-allreduce over NCCL
#   graph      the step as a CUDA graph (cuda_graph) against the eager step under `mpirun -np 1`
#              (the gradient all-reduce recorded in the graph), fp16 at batch 32 (the graph alone:
#              the train stage)
#   stem       the stem convolution's forms, alternated in one process (bench-step): the 7x7/2
#              convolution of 3 or 8 input channels (stem_input_channels) and the 4x4/1 one over
#              2x2 pixel blocks (stem_space_to_depth), bf16 and fp16 at batch 256, eager
#   v100       configs/p3.16xlarge.toml's work per GPU (ResNet-50, fp16, 256 images of 224 px) in
#              a 16 GB V100's memory (gpu_memory_gib 15), eager and with the step as a CUDA graph:
#              generated images, each epoch 6 full steps, a short one and an evaluation; then
#              in 4 GiB, where the run must stop with exit status 2 and say what to change
#   numerics   scripts/device/fused_numerics.py: ResNet-50 trained 200 steps on generated TFRecords with
#              the fused batch norm, the convolution-side fusion with it (fused_conv_batch_norm),
#              and without either (same seed), and without them from another
#              seed, fp16 and bf16: loss curves and top-1 within the run-to-run spread, and the
#              fused checkpoint giving in torchvision the logits it gives in the trainer's model
#   fusion     bench-conv-fusion, fp16 and bf16 at batch 256, fp16 at 32: whether cuDNN builds the
#              convolution-side batch norm fusion here (cudnn-frontend graphs), its forward against
#              ATen, and each convolution with its BN fused against the trainer's path today; and
#              bench-max-pool at the same settings: the stem's compact max pooling against ATen's
#   profile    where the step's time goes: `train --benchmark --profile_steps 2` (ResNet-50, batch
#              256) in fp16 and in bf16, each trace summarised by scripts/dev/trace_summary.py
#              (kernels by kind and by name, per step)
#   train      scripts/bench/train.sh: this trainer (CUDA graph, each of TRIALS with the graph,
#              eager, eager on ATen's batch norm and max pooling) next to PyTorch eager and
#              compiled, fp16 and bf16 at batch 256 and 32 (TRAIN_RUNS), rounds alternated across
#              all of them, ending in the table's rows; TRIALS, COMPILE_MODES, MAX_AUTOTUNE_CONV,
#              REPEATS, ATEN_ROW and BUDGET_S pass through (default: reduce-overhead and
#              max-autotune, 3 rounds; max-autotune's first compile takes minutes,
#              MAX_AUTOTUNE_CONV=ATEN a fraction of that, and later rounds reuse Inductor's cache)
#   pipeline   TFRecords into the GPU: generated ImageNet-sized JPEGs as TFRecords, bench-input on
#              one core and on all, then ResNet-50 (fp16) trained on them for 3 epochs
#   recipes    every configs/recipes/*.toml in benchmark mode (synthetic data, its precision, batch
#              and techniques)
#   techniques the recipes' techniques on the GPU: `train --benchmark` (bf16) with each one on
#              against none, then the smoke run in fp16 with all of them on (EMA evaluated)
# Usage: [TRAIN_ARGS="--cuda_graph true"] scripts/device/checks.sh [STAGE ...]
#        scripts/device/checks.sh decide
# decide: the one call that decides the step's defaults, within DECIDE_BUDGET_S (default 450)
# seconds: tests; the train stage at every TRAIN_RUNS with each candidate key alone, both, and
# the 8-channel stem as TRIALS, 3 rounds, then reduce-overhead and max-autotune with ATen's
# convolutions once each, in what is left of the budget (no run starts past it); then v100 and
# graph with every candidate key on (CANDIDATES, default "--stem_space_to_depth true
# --fused_residual_gradient true"). Its table says which configuration is the defaults and how
# each trial fared against the graph round by round.
# TRAIN_RUNS: the train stage's PRECISION:BATCH runs (default "fp16:256 bf16:256 fp16:32 bf16:32").
# TRIALS: key sets the train stage also measures with the graph, separated by ";"
# (scripts/bench/train.sh), e.g. TRIALS="--fused_residual_gradient true; --stem_input_channels 8".
# GPU_TESTS: the tests stage's gtest filter of trainer_tests (default every *Gpu suite).
# TRAIN_ARGS: keys added to every run of `train` in the graph, v100, numerics, profile, recipes,
# techniques and pipeline stages (e.g. every recipe with the step as a CUDA graph).
# Output goes to the terminal and to $OUT/device-checks.log (OUT defaults to /tmp/device-out),
# with each stage's seconds. A failing stage does not stop the next ones; the script then ends
# by naming the failed stages, with exit status 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
stages=("$@")
[ ${#stages[@]} -gt 0 ] ||
  stages=(tests graph stem v100 numerics fusion profile overhead allreduce train pipeline recipes
    techniques)
decide_budget=0
if [ "${stages[*]}" = decide ]; then
  decide_budget=${DECIDE_BUDGET_S:-450}
  s2d="--stem_space_to_depth true" residual="--fused_residual_gradient true"
  export TRAIN_ARGS=${TRAIN_ARGS:-${CANDIDATES:-$s2d $residual}}
  export TRIALS=${TRIALS:-"$s2d; $residual; $s2d $residual; --stem_input_channels 8"}
  # This trainer's rounds first, PyTorch's runs once after them, 50 timed steps on both sides: a
  # fresh machine compiles PyTorch's model anew for every precision and batch.
  export COMPILE_MODES=${COMPILE_MODES:-reduce-overhead max-autotune}
  export MAX_AUTOTUNE_CONV=${MAX_AUTOTUNE_CONV-ATEN} REPEATS=${REPEATS:-3} ATEN_ROW=${ATEN_ROW:-0}
  export PEER_ROUNDS=${PEER_ROUNDS:-1} STEPS=${STEPS:-50} WARMUP_STEPS=${WARMUP_STEPS:-10}
  stages=(tests train v100 graph)
fi
known=" tests overhead allreduce graph stem v100 numerics fusion profile train pipeline recipes techniques "
for stage in "${stages[@]}"; do
  [[ $known == *" $stage "* ]] || {
    echo "unknown stage $stage (known:$known)" >&2
    exit 2
  }
done
out=${OUT:-/tmp/device-out}
mkdir -p "$out"
exec > >(tee -a "$out/device-checks.log") 2>&1

unpacked=${TMPDIR:-/tmp}/trainer-bundle
if [ ! -x "$unpacked/bundle/bin/train" ]; then
  mkdir -p "$unpacked"
  # Python's tarfile reads xz itself: the machine may lack the xz tool, never Python.
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
    "$root/.device/bundle.tar.xz" "$unpacked"
fi
bundle=$unpacked/bundle
site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
nvidia_libs=$(find "$site/nvidia" -maxdepth 2 -name lib -type d | tr '\n' ':')
export LD_LIBRARY_PATH=$bundle/lib:$site/torch/lib:$nvidia_libs${LD_LIBRARY_PATH:-}
export PATH=$bundle/usr/bin:$bundle/bin:$PATH
# OpenMPI relocated into the bundle; one machine, so no ssh launcher; root in a container.
export OPAL_PREFIX=$bundle/usr OMPI_MCA_plm=isolated
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

echo "== $(date -u +%F) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
read -r -a train_args <<<"${TRAIN_ARGS:-}"
benchmark=(train --config "$root/configs/one-gpu.toml" --data_source synthetic --benchmark true
  --num_classes 1000 --output_dir "${TMPDIR:-/tmp}/device-bench")

run_stage() {
  case $1 in
    tests)
      # Both suites run, whichever fails: one failure must not hide the other suite's results.
      status=0
      trainer_tests --gtest_filter="${GPU_TESTS:-*Gpu.*}" || status=$?
      mpirun -np 1 distributed_tests --gtest_filter='Distributed.Gpu*' || status=$?
      exit "$status"
      ;;
    overhead)
      for run in 1 2; do
        echo "-- run $run: alone (no data parallelism)"
        "${benchmark[@]}" 2>&1 | grep 'benchmark '
        echo "-- run $run: mpirun -np 1 (gradient buckets, NCCL)"
        mpirun -np 1 "${benchmark[@]}" 2>&1 | grep -E 'benchmark |NCCL'
      done
      ;;
    graph)
      # The graph alone is measured by the train stage; here, with the gradient all-reduce in it.
      for graph in false true; do
        echo "-- mpirun -np 1, fp16 batch 32, cuda_graph $graph"
        mpirun -np 1 "${benchmark[@]}" --batch_size 32 "${train_args[@]}" \
          --cuda_graph "$graph" 2>&1 | grep -E 'benchmark |CUDA graph|error'
      done
      ;;
    stem)
      for precision in bf16 fp16; do
        bench-step --repeats 1 --trial "3-channel=--stem_input_channels 3" \
          --trial "8-channel=--stem_input_channels 8" \
          --trial "space-to-depth=--stem_space_to_depth true" \
          -- "${benchmark[@]:1}" --precision "$precision" --batch_size 256
      done
      ;;
    allreduce) mpirun -np 1 bench-allreduce ;;
    profile)
      traces=${TMPDIR:-/tmp}/device-bench/profile  # the benchmark runs' output_dir's
      for precision in fp16 bf16; do
        rm -rf "$traces"
        "${benchmark[@]}" --precision "$precision" --batch_size 256 --profile_steps 2 \
          --profile_first_step 22 "${train_args[@]}" 2>&1 | grep -E 'benchmark |error'
        python3 "$root/scripts/dev/trace_summary.py" "$traces/rank0.22.pt.trace.json"
      done
      ;;
    fusion)
      status=0
      for run in "fp16 256" "bf16 256" "fp16 32"; do
        read -r precision batch <<<"$run"
        bench-conv-fusion --precision "$precision" --batch "$batch" || status=$?
        bench-max-pool --precision "$precision" --batch "$batch" || status=$?
      done
      exit "$status"
      ;;
    numerics)
      python3 "$root/scripts/device/fused_numerics.py" --out "${TMPDIR:-/tmp}/device-numerics" \
        --conv-fusion --train-args "${train_args[@]}"
      ;;
    v100)
      # 15 GiB: a V100's 15.8 less its CUDA context and NCCL's buffers, which the cap leaves out.
      log=${TMPDIR:-/tmp}/device-v100.log
      for graph in false true; do
        echo "-- cuda_graph $graph"
        rm -rf "${TMPDIR:-/tmp}/device-v100"
        status=0
        train --config "$root/configs/p3.16xlarge.toml" --data_source generated --num_classes 10 \
          --generated_classes 10 --generated_train_images 1636 --generated_val_images 512 \
          --epoch_order global --epochs 2 --warmup_epochs 1 --log_every_steps 1 \
          --gpu_memory_gib 15 "${train_args[@]}" --cuda_graph "$graph" \
          --output_dir "${TMPDIR:-/tmp}/device-v100" \
          >"$log" 2>&1 || status=$?
        grep -E -A1 'GPU memory|CUDA graph|img/s|eval epoch|final|error' "$log" || true
        [ "$status" -eq 0 ] || {
          echo "the run failed: exit status $status"
          exit 1
        }
      done
      echo "-- in 4 GiB: the run stops with exit status 2, saying what to change"
      status=0
      train --config "$root/configs/p3.16xlarge.toml" --data_source synthetic --num_classes 10 \
        --epoch_order global --max_steps 5 --gpu_memory_gib 4 \
        --output_dir "${TMPDIR:-/tmp}/device-v100-small" >"$log" 2>&1 || status=$?
      grep -E -A1 'GPU memory|memory this run needs' "$log" || true
      echo "exit status $status"
      [ "$status" -eq 2 ] && grep -q 'memory this run needs' "$log"
      ;;
    train)
      read -r -a runs <<<"${TRAIN_RUNS:-fp16:256 bf16:256 fp16:32 bf16:32}"
      # Within decide, what is left of its budget less the v100 and graph stages' (about 75 s),
      # and at least a minute: one round of this trainer.
      left=$((decide_budget - SECONDS - 75))
      [ "$decide_budget" -eq 0 ] || export BUDGET_S=$((left > 60 ? left : 60))
      BUILD_DIR=$bundle/bin PYTHON=python3 "$root/scripts/bench/train.sh" "${runs[@]}"
      ;;
    pipeline)
      data=${TMPDIR:-/tmp}/device-records
      [ -d "$data" ] || generate-dataset --tfrecords "$data" --classes 10 --images-per-class 400 \
        --val-per-class 50 --train-shards 8 --val-shards 2 >/dev/null
      bench-input "$data/train-*" --threads 1 "$(nproc)" --transforms train val --images 3000 \
        --reader-threads 2 --index-cache-dir "${TMPDIR:-/tmp}/device-index" \
        --auto-augment none trivialaugment_wide randaugment autoaugment_imagenet
      train --config "$root/configs/one-gpu.toml" --data_source tfrecord --num_classes 10 \
        --train_data "$data/train-*" --val_data "$data/validation-*" --epochs 3 \
        --warmup_epochs 1 --log_every_steps 5 --output_dir "${TMPDIR:-/tmp}/device-pipeline" \
        --index_cache_dir "${TMPDIR:-/tmp}/device-index" "${train_args[@]}" 2>&1 |
        grep -E 'CUDA graph|img/s|eval|final|error'
      cp "${TMPDIR:-/tmp}/device-pipeline/metrics.jsonl" "$out/pipeline-metrics.jsonl"  # input waits
      echo "-- the same with every technique on: progressive resizing 160 -> 224 with FixRes,"
      echo "   TrivialAugmentWide and erasing, MixUp/CutMix, EMA, BlurPool"
      train --config "$root/configs/one-gpu.toml" --data_source tfrecord --num_classes 10 \
        --train_data "$data/train-*" --val_data "$data/validation-*" --epochs 3 \
        --warmup_epochs 1 --log_every_steps 5 --output_dir "${TMPDIR:-/tmp}/device-recipe" \
        --index_cache_dir "${TMPDIR:-/tmp}/device-index" --progressive_resize_min_size 160 \
        --progressive_resize_max_size 224 --progressive_resize_end_epoch 2 --val_image_size 224 \
        --auto_augment trivialaugment_wide --random_erasing 0.25 --mixup_alpha 0.2 \
        --cutmix_alpha 1.0 --ema_decay 0.99 --blurpool true "${train_args[@]}" 2>&1 |
        grep -E 'CUDA graph|img/s|crop|eval|final|error'
      ;;
    recipes)
      for recipe in "$root"/configs/recipes/*.toml; do
        echo "-- $(basename "$recipe")"
        # Synthetic data has no files, boxes or held-out set: the keys that need them off.
        train --config "$recipe" --data_source synthetic --benchmark true --device cuda \
          --auto_augment none --random_erasing 0 --epoch_order global --repeated_augmentation 1 \
          --train_crop random_resized --target_top1 0 \
          --output_dir "${TMPDIR:-/tmp}/device-recipes" "${train_args[@]}" 2>&1 |
          grep -E 'batch norm in|CUDA graph|benchmark |error'
      done
      ;;
    techniques)
      for technique in "" "--mixup_alpha 0.2 --cutmix_alpha 1.0" "--ema_decay 0.9999" \
        "--blurpool true" "--loss bce"; do
        echo "-- ${technique:-no technique}"
        # shellcheck disable=SC2086  # the technique's keys and values, split
        "${benchmark[@]}" --precision bf16 $technique "${train_args[@]}" 2>&1 |
          grep -E 'CUDA graph|benchmark |error'
      done
      echo "-- smoke run, fp16, every technique on"
      train --config "$root/configs/smoke.toml" --device cuda --precision fp16 --mixup_alpha 0.2 \
        --cutmix_alpha 1.0 --loss bce --blurpool true --ema_half_life_images 2000 \
        --output_dir "${TMPDIR:-/tmp}/device-smoke" "${train_args[@]}" 2>&1 |
        grep -E 'CUDA graph|eval|final|error'
      ;;
  esac
}

# A failing stage does not stop the next ones, so that one call of a short device session answers
# every question asked of it; the failed stages are listed at the end (exit status 1).
failed=()
for stage in "${stages[@]}"; do
  echo "== $stage"
  started=$SECONDS
  set +e
  (
    set -e
    run_stage "$stage"
  )
  status=$?
  set -e
  [ "$status" -eq 0 ] || failed+=("$stage (exit status $status)")
  # A session's device time is short: what each stage costs, to plan the next call.
  echo "== $stage took $((SECONDS - started)) s"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed: ${failed[*]}"
  exit 1
fi
echo "== every stage passed"
