#!/usr/bin/env bash
# Stages a dataset that FSx for Lustre imports from S3: the file system lists the S3 objects at
# once but fetches a file's contents on its first read, so the first epoch would wait on S3.
# Reading every shard once here moves that wait before training. Also checks the shard counts.
# Usage: preload-data [--convert DOWNLOAD] [--index] DIR [GLOB=COUNT ...]
#   e.g. preload-data --convert /fsx/imagenet-download --index /fsx/imagenet 'train-*=1024' 'validation-*=128'
# A COUNT of 0 reads without checking; PRELOAD_JOBS sets how many files are read at once (32).
# --convert: when DOWNLOAD holds ImageNet as downloaded (image-net.org's tars and devkit, or
# Kaggle's folders), first converts it into DIR (make-tfrecords --imagenet, which writes the
# index files and synsets.txt too; a rerun keeps the shards already written); when it does not,
# the records are expected in DIR already.
# --index also writes each file's index (<file>.idx, index-tfrecords) beside it, once for all:
# otherwise every node of every run scans the shards for their record offsets before its first
# step. A damaged record found on the way fails the staging, naming the file and the byte.
set -euo pipefail
index="" convert=""
while [ $# -gt 0 ]; do
  case "$1" in
    --index) index=1; shift ;;
    --convert) convert=${2:?--convert needs the download folder}; shift 2 ;;
    *) break ;;
  esac
done
dir=${1:?usage: $0 [--convert DOWNLOAD] [--index] DIR [GLOB=COUNT ...]}
shift
# The tools sit beside this script in the image, on PATH elsewhere.
tool() {
  if [ -x "$(dirname "$0")/$1" ]; then echo "$(dirname "$0")/$1"; else echo "$1"; fi
}
indexer=$(tool index-tfrecords)
[ $# -gt 0 ] || set -- '*=0'
jobs=${PRELOAD_JOBS:-32}

if [ -n "$convert" ]; then
  if [ -f "$convert/ILSVRC2012_devkit_t12.tar.gz" ] || [ -f "$convert/LOC_synset_mapping.txt" ]; then
    echo "+ make-tfrecords --imagenet $convert $dir"
    "$(tool make-tfrecords)" --imagenet "$convert" "$dir"
  else
    echo "+ $convert holds no ImageNet download (ILSVRC2012_devkit_t12.tar.gz or" \
      "LOC_synset_mapping.txt): the records are expected in $dir already"
  fi
fi

status=0
for spec in "$@"; do
  glob=${spec%=*}
  want=${spec##*=}
  files=()
  for f in "$dir"/$glob; do
    # Index files match a data glob such as train-* too; they are not data.
    [ -f "$f" ] && [[ "$f" != *.idx ]] && files+=("$f")
  done
  echo "+ reading ${#files[@]} files $dir/$glob with $jobs readers"
  start=$SECONDS
  if [ ${#files[@]} -gt 0 ]; then
    printf '%s\0' "${files[@]}" | xargs -0 -n 8 -P "$jobs" cat >/dev/null
  fi
  bytes=$(du -cb "${files[@]}" /dev/null | tail -n 1 | cut -f1)
  echo "  $((bytes / 1000000)) MB in $((SECONDS - start)) s"
  if [ -n "$index" ] && [ ${#files[@]} -gt 0 ]; then
    start=$SECONDS
    if ! printf '%s\0' "${files[@]}" | xargs -0 -n 8 -P "$jobs" "$indexer" >/dev/null; then
      echo "preload-data: indexing $dir/$glob failed (above: the file and why)." \
        "HINT: a DAMAGED record means a corrupt shard: copy it again from its source." >&2
      status=1
    fi
    echo "  indexed ${#files[@]} files in $((SECONDS - start)) s"
  fi
  if [ "$want" != 0 ] && [ "${#files[@]}" -ne "$want" ]; then
    echo "preload-data: $dir/$glob matches ${#files[@]} files, expected $want." \
      "HINT: check the S3 import path of the FSx StorageClass (k8s/fsx) and the bucket's layout." >&2
    status=1
  fi
done
exit "$status"
