#!/usr/bin/env bash
# Runs a command of the README as a freshly installed machine would: in a new Debian 12 container
# (scripts/image/base.sh) where nothing but the project's set-up installs anything, on a copy of
# the committed tree, with this machine's CUDA toolkit mounted read-only (the toolkit is the one
# thing the README expects to be there already). Tests that need podman skip inside it (no nested
# containers): run those on the host. Prints the command's exit status and wall time.
# Usage: scripts/fresh-container.sh [COMMAND...]   (default: bash .ci/run)
#   e.g. scripts/fresh-container.sh scripts/smoke.sh
#   COMMIT      the tree to copy (default: HEAD)
#   CA_BUNDLE   CAs for pip inside the container (default: /etc/ssl/certs/ca-certificates.crt,
#               which carries a TLS-intercepting proxy's CA when the host trusts one)
#   CUDA_HOME   the CUDA toolkit to mount (default: /usr/local/cuda)
#   TIMEOUT_S   the command's limit (default: 5400, CI's)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
commit=${COMMIT:-HEAD}
if [ $# -eq 0 ]; then set -- bash .ci/run; fi
base=localhost/resnet-trainer-base:debian12
cuda=$(realpath "${CUDA_HOME:-/usr/local/cuda}")
ca_bundle=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/docker/podman.conf}
run() {
  echo "+ $*" >&2
  "$@"
}

"$root/scripts/image/base.sh" "$base"
work=$(mktemp -d)
name=fresh-$$
# shellcheck disable=SC2064  # the names now
trap "podman rm -f '$name' >/dev/null 2>&1 || true; rm -rf '$work'" EXIT
# The committed tree, as CI's clone has it: nothing built, nothing cached.
git -C "$root" archive --format=tar --prefix=clone/ "$commit" | tar -C "$work" -x
args=(--rm --name "$name" --volume "$cuda:/usr/local/cuda:ro" --volume "$work/clone:/clone"
  --workdir /clone --env CI=true)
if [ -f "$ca_bundle" ]; then
  args+=(--volume "$ca_bundle:/host-ca.crt:ro" --env CA_BUNDLE=/host-ca.crt)
fi
start=$SECONDS
status=0
run timeout "${TIMEOUT_S:-5400}" podman run "${args[@]}" "$base" "$@" </dev/null || status=$?
echo "+ $* in a fresh Debian 12 container: exit $status after $((SECONDS - start)) s" >&2
exit "$status"
