#!/usr/bin/env bash
# Measures one rank of a multi-node job reading TFRecords from storage throttled to a file
# system's rate (READ_MBPS, default 5 MB/s), with its node's page cache to itself: for each
# epoch_order, the page cache is dropped, then bench-input --epochs trains EPOCHS epochs of rank
# RANK of WORLD (one rank a node) and prints each epoch's images/s and the MB it read from storage.
# The first epoch runs at the throttle's rate; later ones at the decode rate where the page cache
# serves them (by_node), or reading anew what the node has not read before (global).
# Needs root, and the cgroup v1 blkio or v2 io controller for the device holding BENCH_DIR.
# Usage: scripts/bench/input_throttled.sh  (BUILD_DIR, BENCH_DIR, IMAGES_PER_CLASS, READ_MBPS,
#        RANK, WORLD, EPOCHS, THREADS override)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
dir=${BENCH_DIR:-/tmp/bench-input-throttled}
per_class=${IMAGES_PER_CLASS:-200}
read_mbps=${READ_MBPS:-5}
rank=${RANK:-1}
world=${WORLD:-4}
epochs=${EPOCHS:-3}
threads=${THREADS:-2}

if [ "$(id -u)" != 0 ]; then
  echo "bench-input-throttled: needs root (to drop the page cache and throttle reads)" >&2
  exit 2
fi
if [ ! -d "$dir/records" ]; then
  "$build/generate-dataset" --image-folder "$dir/folder" --classes 10 \
    --images-per-class "$per_class" --width 500 --height 375 --quality 90
  "$build/make-tfrecords" "$dir/folder" "$dir/records" --shards 16 --prefix train
  "$build/index-tfrecords" "$dir/records/train-*"  # indexes beside the data: no scan timed
fi

# The device the records live on, and a cgroup that caps its reads.
device=$(stat -c '%d' "$dir/records")  # st_dev: major * 256 + minor
device="$((device / 256)):$((device % 256))"
bytes=$((read_mbps * 1000 * 1000))
if [ -d /sys/fs/cgroup/blkio ]; then
  group=/sys/fs/cgroup/blkio/bench-input-throttled
  mkdir -p "$group"
  echo "$device $bytes" >"$group/blkio.throttle.read_bps_device"
elif grep -qw io /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  group=/sys/fs/cgroup/bench-input-throttled
  mkdir -p "$group"
  echo "$device rbps=$bytes" >"$group/io.max"
else
  echo "bench-input-throttled: no blkio (cgroup v1) or io (cgroup v2) controller here" >&2
  exit 2
fi
trap 'rmdir "$group" 2>/dev/null || true' EXIT

size=$(du -sm "$dir/records" | cut -f1)
echo "records: $size MB in 16 files; reads capped at $read_mbps MB/s on device $device;"
echo "rank $rank of $world (one rank a node), $threads decode threads"
for order in global by_node; do
  sync
  echo 3 >/proc/sys/vm/drop_caches
  echo
  echo "epoch_order = $order"
  sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$group" \
    "$build/bench-input" "$dir/records/train-*" --num-classes 10 --batch-size 16 \
    --reader-threads 2 --threads "$threads" --epochs "$epochs" --rank "$rank" \
    --world-size "$world" --epoch-order "$order"
done
