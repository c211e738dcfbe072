#!/usr/bin/env bash
# Fetch Debian bookworm's QEMU 7.2 (qemu-system-x86, qemu-system-common with
# its modules, TCG among them, and qemu-system-data) and extract it into the cache, beside the system's QEMU (10, from
# bookworm-backports: scripts/setup.sh installs that).  The guest suite's
# smoke-qemu72 test boots it with run-vm.sh --qemu, so that the oldest QEMU a
# Debian stable user may still have keeps working.
#
# The version is the newest 7.2 that the host's apt sources offer from
# bookworm, bookworm-updates or bookworm-security (apt-cache madison), so the
# host needs bookworm in its sources and an up-to-date package list
# ('apt-get update').  Nothing is installed: the packages are downloaded and
# unpacked with dpkg-deb -x.  The extracted QEMU finds its own data files
# and modules (relocatable); run-vm.sh adds the host's firmware directories
# (seabios).  It runs with the host's bookworm libraries.
#
# Usage: scripts/fetch-qemu.sh [--refresh]
#   --refresh   look for a newer 7.2 even if one is cached (setup.sh does)
#
# Prints the path of the 7.2 qemu-system-x86_64 on stdout; progress goes to
# stderr.  Cache: ${VFSD_CACHE:-~/.cache/vfsd}/qemu-7.2/ (usr/bin,
# usr/lib/<triplet>/qemu, usr/share/qemu).
set -euo pipefail

CACHE=${VFSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfsd}
DEST=$CACHE/qemu-7.2
BIN=$DEST/usr/bin/qemu-system-x86_64
REFRESH=0

log() { printf 'fetch-qemu: %s\n' "$*" >&2; }
die() { printf 'fetch-qemu: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --refresh) REFRESH=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done

# The Debian version the cached binary was built as, e.g. 1:7.2+dfsg-7+deb12u18+b3
# (from its --version line: "QEMU emulator version 7.2.22 (Debian 1:7.2+...)").
cached_version() {
    [ -x "$BIN" ] || return 1
    compgen -G "$DEST/usr/lib/*/qemu/accel-tcg-x86_64.so" >/dev/null || return 1
    "$BIN" --version 2>/dev/null | sed -n '1s/^QEMU emulator version 7\.2\.[0-9]* (Debian \(.*\))$/\1/p' | grep .
}

if [ "$REFRESH" = 0 ] && have=$(cached_version); then
    log "using cached QEMU $have"
    echo "$BIN"
    exit 0
fi

for tool in apt-cache apt-get dpkg-deb dpkg; do
    command -v "$tool" >/dev/null || die "'$tool' not found: this script needs a Debian host"
done

# newest_72 PACKAGE: the newest 1:7.2 version of PACKAGE in bookworm's own suites.
newest_72() {
    local best= v
    for v in $(apt-cache madison "$1" 2>/dev/null |
               awk -F' *[|] *' '$2 ~ /^1:7\.2[+~]/ && $3 ~ / bookworm(-updates|-security)?\// { print $2 }'); do
        if [ -z "$best" ] || dpkg --compare-versions "$v" gt "$best"; then best=$v; fi
    done
    [ -n "$best" ] && echo "$best"
}

VER=$(newest_72 qemu-system-x86) ||
    die "no QEMU 7.2 (qemu-system-x86 1:7.2) in the host's apt sources: this needs bookworm or bookworm-security there, and 'apt-get update'"
# qemu-system-data is arch: all, so it has no binNMU suffix (+bN).
DATA_VER=${VER%+b[0-9]*}
if ! apt-cache madison qemu-system-data 2>/dev/null | awk -F' *[|] *' -v v="$DATA_VER" '$2 == v { f = 1 } END { exit !f }'; then
    DATA_VER=$(newest_72 qemu-system-data) || die "no qemu-system-data 1:7.2 in the host's apt sources"
fi

if have=$(cached_version) && [ "$have" = "$VER" ]; then
    log "newest bookworm QEMU $VER is already cached"
    echo "$BIN"
    exit 0
fi

mkdir -p "$CACHE"
TMP=$(mktemp -d "$CACHE/.qemu-7.2.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP"   # apt's download sandbox user must be able to write here
# qemu-system-common has the same (binary) version as qemu-system-x86.
log "downloading qemu-system-x86=$VER qemu-system-common=$VER qemu-system-data=$DATA_VER"
( cd "$TMP" && apt-get -q download "qemu-system-x86=$VER" "qemu-system-common=$VER" "qemu-system-data=$DATA_VER" ) >"$TMP/download.log" 2>&1 || {
    cat "$TMP/download.log" >&2; die "apt-get download failed (see above)"; }
mkdir -p "$TMP/root"
for deb in "$TMP"/*.deb; do dpkg-deb -x "$deb" "$TMP/root"; done
"$TMP/root/usr/bin/qemu-system-x86_64" --version >"$TMP/version" 2>&1 || {
    cat "$TMP/version" >&2; die "the extracted QEMU $VER does not run (missing libraries? see above)"; }
rm -rf "$DEST"
mv "$TMP/root" "$DEST"
have=$(cached_version) || die "$BIN does not report a Debian 7.2 version ($(head -n1 "$TMP/version")) or its TCG module is missing"
log "cached QEMU $have in $DEST"
echo "$BIN"
