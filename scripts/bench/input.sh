#!/usr/bin/env bash
# Benchmarks the input pipeline alone (no model): generates ImageNet-like JPEGs (500x375 and
# 375x500, quality 90, 4:2:0), converts them to TFRecords, runs bench-input with 1 and 2 decode
# threads for the training and evaluation transforms, then the peers on the same images in the
# same run: torchvision ImageFolder + DataLoader (PIL), tf.data with decode_and_crop_jpeg and
# DALI's CPU pipeline.
# POLICIES="none randaugment ..." also times the training transform with those auto_augment
# policies, and ERASING="0 0.5" with those random_erasing probabilities (bench-input only).
# Usage: scripts/bench/input.sh  (BUILD_DIR, BENCH_DIR, IMAGES_PER_CLASS, THREADS override)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
python=$("$root/scripts/setup.sh" | tail -n 1)
build=${BUILD_DIR:-$root/build}
dir=${BENCH_DIR:-/tmp/bench-input}
per_class=${IMAGES_PER_CLASS:-40}
threads=${THREADS:-1 2}
timed=${TIMED_IMAGES:-3000}
policies=${POLICIES:-none}
erasing=${ERASING:-0}

# DALI (200 MB, with its own CUDA libraries) goes into a venv of its own, on first use, so that
# the build's venv keeps the one CUDA runtime and NCCL the trainer links; without network its
# rows say "skipped".
dali_venv=${TRAINER_CACHE:-$HOME/.cache/resnet-trainer}/dali-venv
if ! "$dali_venv/bin/python" -c "import nvidia.dali" 2>/dev/null; then
  python3 -m venv "$dali_venv" &&
    "$dali_venv/bin/pip" install -q "nvidia-dali-cuda130==2.4.0" || echo "DALI not installed" >&2
fi

set -x
if [ ! -d "$dir/folder" ]; then
  "$build/generate-dataset" --image-folder "$dir/folder" --classes 10 \
    --images-per-class "$per_class" --width 500 --height 375 --quality 90
  "$build/make-tfrecords" "$dir/folder" "$dir/records" --shards 4 --prefix train
fi
# shellcheck disable=SC2086
"$build/bench-input" "$dir/records/train-*" --threads $threads --transforms train val \
  --images "$timed" --reader-threads 1 --index-cache-dir "$dir/index" \
  --auto-augment $policies --random-erasing $erasing
# shellcheck disable=SC2086
"$python" "$root/scripts/bench/input_peers.py" --folder "$dir/folder" \
  --records "$dir/records/train-*" --threads $threads --images "$timed" --peers torchvision tf.data
if [ -x "$dali_venv/bin/python" ]; then
  # shellcheck disable=SC2086
  "$dali_venv/bin/python" "$root/scripts/bench/input_peers.py" --folder "$dir/folder" \
    --records "$dir/records/train-*" --threads $threads --images "$timed" --peers dali
fi
