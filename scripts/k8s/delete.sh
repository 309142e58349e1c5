#!/usr/bin/env bash
# Deletes what scripts/k8s/apply.sh TARGET created (the same objects, rendered the same way).
# Deleting the fsx target deletes the claim, and with it the FSx file system and everything on it
# (export the runs first: scripts/eks/export.sh); deleting fsx-existing deletes the claim and the
# volume object, and leaves the file system (its volume's reclaim policy is Retain).
# Prints the commands it runs.
# Usage: scripts/k8s/delete.sh TARGET [--config NAME|FILE]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${1:?usage: $0 TARGET}
manifest=$root/build/k8s/$target.yaml
mkdir -p "$(dirname "$manifest")"

echo "+ scripts/k8s/render.sh $* > $manifest" >&2
"$root/scripts/k8s/render.sh" "$@" >"$manifest"
set -x
"${KUBECTL:-kubectl}" delete --ignore-not-found -f "$manifest"
