#!/usr/bin/env bash
# Runs vfsd as an unprivileged user, as libvirt runs it for a session (rootless) VM:
# no CAP_DAC_READ_SEARCH, so file handles can't be reopened; --uid-map/--gid-map map the
# guest's root onto that user (a run-vm.sh --daemon template for the guest suite).
#   scripts/rootless-daemon.sh SOCKET SHARE [vfsd options...]
# The share and the socket's directory are handed to the user first (test directories).
# ROOTLESS_UID (default 65534) picks the user; VFSD_BIN the binary.
set -euo pipefail
SOCK=${1:?usage: rootless-daemon.sh SOCKET SHARE [options]}
SHARE=${2:?usage: rootless-daemon.sh SOCKET SHARE [options]}
shift 2
U=${ROOTLESS_UID:-65534}
BIN=${VFSD_BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release/vfsd}
# The user must reach both through their parents (test directories made 0700).
reach() {
    local d
    d=$(cd "$1" && pwd)
    while [ "$d" != / ]; do
        chmod o+x "$d"
        d=$(dirname "$d")
    done
}
chown "$U:$U" "$(dirname "$SOCK")"
reach "$(dirname "$SOCK")"
chown -R "$U:$U" "$SHARE"
reach "$SHARE"
exec setpriv --reuid="$U" --regid="$U" --clear-groups "$BIN" --socket-path="$SOCK" \
    --shared-dir="$SHARE" --xattr --uid-map=":0:$U:1:" --gid-map=":0:$U:1:" "$@"
