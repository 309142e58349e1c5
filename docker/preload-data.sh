#!/usr/bin/env bash
# Stages a dataset that FSx for Lustre imports from S3: the file system lists the S3 objects at
# once but fetches a file's contents on its first read, so the first epoch would wait on S3.
# Reading every shard once here moves that wait before training. Also checks the shard counts.
# Usage: preload-data DIR [GLOB=COUNT ...]   e.g. preload-data /fsx/imagenet 'train-*=1024' 'validation-*=128'
# A COUNT of 0 reads without checking; PRELOAD_JOBS sets how many files are read at once (32).
set -euo pipefail
dir=${1:?usage: $0 DIR [GLOB=COUNT ...]}
shift
[ $# -gt 0 ] || set -- '*=0'
jobs=${PRELOAD_JOBS:-32}

status=0
for spec in "$@"; do
  glob=${spec%=*}
  want=${spec##*=}
  files=()
  for f in "$dir"/$glob; do
    [ -f "$f" ] && files+=("$f")
  done
  echo "+ reading ${#files[@]} files $dir/$glob with $jobs readers"
  start=$SECONDS
  if [ ${#files[@]} -gt 0 ]; then
    printf '%s\0' "${files[@]}" | xargs -0 -n 8 -P "$jobs" cat >/dev/null
  fi
  bytes=$(du -cb "${files[@]}" /dev/null | tail -n 1 | cut -f1)
  echo "  $((bytes / 1000000)) MB in $((SECONDS - start)) s"
  if [ "$want" != 0 ] && [ "${#files[@]}" -ne "$want" ]; then
    echo "preload-data: $dir/$glob matches ${#files[@]} files, expected $want." \
      "HINT: check the S3 import path of the FSx StorageClass (k8s/fsx) and the bucket's layout." >&2
    status=1
  fi
done
exit "$status"
