#!/usr/bin/env bash
# Build the pinned xfstests (fstests) tree once, into a cache directory.
#
# Usage: scripts/build-xfstests.sh [--no-deps] [--force]
#   --no-deps   do not install the Debian packages (build and run dependencies)
#   --force     unpack and build again even if a built tree is there
#
# The tarball is looked for in $VFSD_XFSTESTS_TARBALL, else
# ../shared/xfstests/xfstests-*.tar.xz beside the repository.  The tree goes to
# ${VFSD_CACHE:-~/.cache/vfsd}/xfstests (not under /tmp: the xfstests guest test shows
# the host's root to the guest, and /tmp there is the guest's own).  Also
# creates the users fstests needs (fsgqa, fsgqa2, 123456-fsgqa).
# Prints the tree's path on stdout; progress goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${VFSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfsd}
DEST=$CACHE/xfstests
DEPS=1
FORCE=0

log() { printf 'build-xfstests: %s\n' "$*" >&2; }
die() { printf 'build-xfstests: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --no-deps) DEPS=0; shift ;;
        --force) FORCE=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done

TARBALL=${VFSD_XFSTESTS_TARBALL:-}
if [ -z "$TARBALL" ]; then
    for t in "$REPO"/../shared/xfstests/xfstests-*.tar.xz; do
        [ -f "$t" ] && TARBALL=$t
    done
fi
[ -n "$TARBALL" ] && [ -r "$TARBALL" ] ||
    die "xfstests tarball not found (looked for ${TARBALL:-$REPO/../shared/xfstests/xfstests-*.tar.xz}); set VFSD_XFSTESTS_TARBALL=PATH"
TARBALL=$(cd "$(dirname "$TARBALL")" && pwd)/$(basename "$TARBALL")
STAMP_WANT="$(basename "$TARBALL") $(stat -c %s "$TARBALL")"

SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo

# Build and run dependencies of fstests (Debian package names).
PACKAGES=(autoconf automake libtool make gcc pkg-config xfslibs-dev uuid-dev
    libattr1-dev libacl1-dev libaio-dev libgdbm-dev libgdbm-compat-dev libcap-dev
    liburing-dev attr acl bc dbench xfsprogs e2fsprogs psmisc quota indent file gawk
    kmod fio perl sed xz-utils)
if [ "$DEPS" = 1 ]; then
    missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
            $SUDO apt-get update -qq >/dev/null 2>&1 || true
            $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
                die "apt-get install of the fstests dependencies failed (${missing[*]})"
        }
    fi
    # Users fstests runs tests as.
    for u in fsgqa fsgqa2 123456-fsgqa; do
        id "$u" >/dev/null 2>&1 || $SUDO useradd -m "$u" || die "useradd $u failed"
    done
    getent group fsgqa >/dev/null || $SUDO groupadd fsgqa || die "groupadd fsgqa failed"
fi

if [ "$FORCE" = 0 ] && [ -x "$DEST/check" ] && [ -x "$DEST/ltp/fsstress" ] &&
   [ "$(cat "$DEST/.vfsd-built" 2>/dev/null)" = "$STAMP_WANT" ]; then
    log "already built in $DEST"
    echo "$DEST"
    exit 0
fi

mkdir -p "$CACHE"
TMP=$(mktemp -d "$CACHE/.xfstests-build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log "unpacking $(basename "$TARBALL")"
tar -xJf "$TARBALL" -C "$TMP" || die "cannot unpack $TARBALL"
[ -d "$TMP/xfstests" ] || die "$TARBALL has no top-level xfstests/ directory"
# The tree is built where it will stay (configure records paths).
rm -rf "$DEST"
mv "$TMP/xfstests" "$DEST"
log "building in $DEST (make -j${VFSD_XFSTESTS_JOBS:-2}; about 70 s on 2 cores)"
if ! make -C "$DEST" -j"${VFSD_XFSTESTS_JOBS:-2}" >"$CACHE/xfstests-build.log" 2>&1; then
    tail -n 20 "$CACHE/xfstests-build.log" >&2
    die "make failed in $DEST (log: $CACHE/xfstests-build.log)"
fi
[ -x "$DEST/check" ] && [ -x "$DEST/ltp/fsstress" ] || die "build finished but $DEST/ltp/fsstress is missing (log: $CACHE/xfstests-build.log)"
echo "$STAMP_WANT" > "$DEST/.vfsd-built"
log "built $DEST"
echo "$DEST"
