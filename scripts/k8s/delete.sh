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

kubectl=${KUBECTL:-kubectl}

echo "+ scripts/k8s/render.sh $* --no-plan > $manifest" >&2
"$root/scripts/k8s/render.sh" "$@" --no-plan >"$manifest"

# A kind the cluster does not serve (its operator never installed, or removed) has no objects
# to delete, and kubectl delete fails on it, --ignore-not-found or not ("no matches for kind",
# exit 1). So the objects of such kinds are left out, with a line naming them, and the rest are
# deleted. The kinds served: `kubectl api-resources` (APIVERSION and KIND, its last columns);
# it may exit non-zero with a partial list when one API group does not answer, which still
# names the kinds of the groups that did.
served=$("$kubectl" api-resources --no-headers 2>/dev/null | awk '{print $(NF - 2), $NF}') || true
if [ -n "$served" ]; then
  awk -v target="$target" -v served="$served" '
    BEGIN { n = split(served, lines, "\n"); for (i = 1; i <= n; i++) known[lines[i]] = 1 }
    function flush() {
      if (doc == "") return
      if ((version " " kind) in known) { printf "%s", (kept++ ? "---\n" : "") doc }
      else printf "k8s-delete: the cluster serves no %s (%s): no %s %s of %s to delete\n",
        kind, version, kind, name, target > "/dev/stderr"
      doc = version = kind = name = ""
    }
    /^---$/ { flush(); next }
    /^apiVersion: / { version = $2 }
    /^kind: / { kind = $2 }
    /^  name: / && name == "" { name = $2 }
    { doc = doc $0 "\n" }
    END { flush() }' "$manifest" >"$manifest.served"
  mv "$manifest.served" "$manifest"
fi
if [ ! -s "$manifest" ]; then
  echo "k8s-delete: nothing of $target on this cluster" >&2
  exit 0
fi
set -x
"$kubectl" delete --ignore-not-found -f "$manifest"
