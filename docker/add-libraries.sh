#!/usr/bin/env bash
# Adds to this image the shared libraries of the trainer that it lacks, then checks that every
# program in /opt/resnet-trainer/bin finds every library it needs. Run in a stage made like the
# runtime image (its packages installed, /opt/resnet-trainer copied in); OUT_DIR receives the same
# files at the same paths, for the runtime stage to copy. A library the image already has (the C
# runtime, OpenMPI's and OpenSSH's dependencies, at whatever version its packages brought) is left
# alone; only the ones no runtime package provides (OpenCV and what it links, protobuf, spdlog)
# are added, and not what their packages depend on besides (Mesa, LLVM, GDAL's data files).
# Usage: docker/add-libraries.sh CANDIDATES_DIR OUT_DIR   (CANDIDATES_DIR: from stage-runtime.sh)
set -euo pipefail
candidates=${1:?usage: $0 CANDIDATES_DIR OUT_DIR}
out=${2:?usage: $0 CANDIDATES_DIR OUT_DIR}
programs=/opt/resnet-trainer/bin

mkdir -p "$out"
known=$(ldconfig -p | awk 'NR > 1 {print $1}' | sort -u)
added=0
while IFS= read -r -d '' file; do
  path=${file#"$candidates"}
  name=$(basename "$path")
  if [ -e "$path" ] || grep -qxF "$name" <<<"$known"; then continue; fi
  install -D -m 0644 "$file" "$out$path"
  install -D -m 0644 "$file" "$path"
  added=$((added + 1))
done < <(find "$candidates" -type f -print0)
echo "+ added $added libraries ($(du -sh "$out" | cut -f1)) to the image's own"

# No ldconfig: the runtime stage copies the files, not a cache, so they must be found without one.
missing=$(ldd "$programs"/* | awk '/not found/ {print $1}' | sort -u)
if [ -n "$missing" ]; then
  echo "add-libraries: the programs in $programs do not find: $missing" \
    "HINT: docker/stage-runtime.sh stages what ldd listed in the build stage" >&2
  exit 1
fi
echo "+ every program in $programs finds its libraries"
