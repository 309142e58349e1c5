#!/usr/bin/env bash
# Benchmarks start-up on many shards: the time from launch to the end of the first step and the
# bytes every rank read to get there (both logged by `train` as its "startup" event), for
# `mpirun -np N` on this machine, with the index files absent (the ranks of the node scan their
# share of the shards and write the indexes) and present (written beside the data once by
# index-tfrecords, as the staging Job does).
# Usage: scripts/bench/startup.sh  (BUILD_DIR, BENCH_DIR, SHARDS, RANKS override)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
dir=${BENCH_DIR:-/tmp/bench-startup}
shards=${SHARDS:-1024}
ranks=${RANKS:-1 2 4 8}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

set -x
if [ ! -d "$dir/records" ]; then
  # 8 images per shard, 64x48 JPEGs: small shards, so the start-up cost is per shard, not per byte.
  "$build/generate-dataset" --tfrecords "$dir/records" --classes 8 \
    --images-per-class $((shards)) --width 64 --height 48 --train-shards "$shards"
fi
set +x
data_bytes=$(du -cb "$dir"/records/train-* | tail -n 1 | cut -f 1)
echo "# $shards shards, $data_bytes bytes of TFRecords; $(nproc) cores"
echo "# indexes ranks seconds_to_first_step MB_read MB_read/data"

run() {  # indexes ranks
  local out=$dir/run-$1-$2
  rm -rf "$out" "$dir/index-cache"
  mpirun --oversubscribe -np "$2" -x OMP_NUM_THREADS=1 "$build/train" \
    --data_source tfrecord --train_data "$dir/records/train-*" --val_data "" \
    --index_cache_dir "$dir/index-cache" --arch resnet18 --num_classes 8 --image_size 32 \
    --batch_size 4 --max_steps 1 --device cpu --decode_threads 1 --reader_threads 2 \
    --output_dir "$out" >"$out.log" 2>&1 || { cat "$out.log"; exit 1; }
  python3 - "$out/metrics.jsonl" "$1" "$2" "$data_bytes" <<'EOF'
import json, sys
path, indexes, ranks, data = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
for line in open(path):
    e = json.loads(line)
    if e["event"] == "startup":
        mb = e["bytes_read"] / 1e6
        print(f"{indexes} {ranks} {e['seconds_to_first_step']:.2f} {mb:.1f} {mb * 1e6 / data:.2f}")
EOF
}

for n in $ranks; do
  rm -f "$dir"/records/*.idx
  run absent "$n"
done
"$build/index-tfrecords" "$dir/records/train-*" >/dev/null
for n in $ranks; do run present "$n"; done
