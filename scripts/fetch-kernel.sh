#!/usr/bin/env bash
# Fetch a Debian "cloud" kernel for the vfsd guest tests and cache it.
#
# The kernel comes from the trixie-backports suite of the Debian mirror that
# this host already uses (read from the apt sources at run time).  apt runs
# with a private state directory under the cache, so the host's own apt
# configuration is never modified.
#
# Usage: scripts/fetch-kernel.sh [--version VER] [--refresh] [--print-config] [--modules]
#   --version VER   kernel ABI to fetch, e.g. 7.3.4+deb13 (default: newest)
#   --refresh       look for a newer kernel even if one is cached
#   --suite NAME    suite to use (default: trixie-backports)
#   --print-config  print the path of the cached kernel config instead
#   --modules       also fetch the kernel's modules (linux-modules-<abi>, with
#                   modules.dep made by depmod) and print their directory
#                   (.../modules/lib/modules/<abi>) instead
#
# Prints the path of the kernel image (vmlinuz) on stdout; progress goes to
# stderr.  Cache: ${VFSD_CACHE:-~/.cache/vfsd}/kernel/<version>/.
set -euo pipefail

CACHE=${VFSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfsd}
KDIR=$CACHE/kernel
SUITE=${VFSD_KERNEL_SUITE:-trixie-backports}
FLAVOUR=cloud-amd64
WANT_VERSION=${VFSD_KERNEL_VERSION:-}
PINNED=0
REFRESH=0
PRINT=vmlinuz

log() { printf 'fetch-kernel: %s\n' "$*" >&2; }
die() { printf 'fetch-kernel: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --version) WANT_VERSION=${2:?--version needs a value}; shift 2 ;;
        --version=*) WANT_VERSION=${1#*=}; shift ;;
        --refresh) REFRESH=1; shift ;;
        --suite) SUITE=${2:?--suite needs a value}; shift 2 ;;
        --print-config) PRINT=config; shift ;;
        --modules) PRINT=modules; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done

for tool in apt-get apt-cache dpkg-deb; do
    command -v "$tool" >/dev/null || die "'$tool' not found: this script needs a Debian-based host"
done

# Verify a cached/extracted kernel directory; prints nothing, returns 1 on failure.
check_config() {
    local cfg=$1 ok=0 opt
    for opt in CONFIG_VIRTIO_FS CONFIG_FUSE_FS CONFIG_VIRTIO_PCI CONFIG_BLK_DEV_INITRD CONFIG_SERIAL_8250_CONSOLE; do
        if ! grep -q "^$opt=y\$" "$cfg"; then
            log "$cfg: $opt is not built in (=y); the guest needs it without modules"
            ok=1
        fi
    done
    return $ok
}

emit() {
    local dir=$1
    case $PRINT in
        config) echo "$dir/config" ;;
        modules) echo "$dir/modules/lib/modules/$(basename "$dir")" ;;
        *) echo "$dir/vmlinuz" ;;
    esac
}

# With --modules: the kernel directory has its modules too.
have_modules() {
    [ "$PRINT" != modules ] || [ -f "$1/modules/lib/modules/$(basename "$1")/modules.dep" ]
}

# Fast path: something usable is cached and no refresh was asked for.
if [ "$REFRESH" = 0 ]; then
    if [ -n "$WANT_VERSION" ]; then cand=$KDIR/$WANT_VERSION-$FLAVOUR; else cand=$KDIR/current; fi
    if [ -f "$cand/vmlinuz" ] && [ -f "$cand/config" ] && check_config "$cand/config" &&
       have_modules "$(cd "$cand" 2>/dev/null && pwd -P)"; then
        cand=$(cd "$cand" && pwd -P)
        log "using cached kernel $(basename "$cand")"
        emit "$cand"
        exit 0
    fi
fi

# --- Find the mirror the host already uses ---------------------------------
# shellcheck source=scripts/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"

MIRROR=${VFSD_DEBIAN_MIRROR:-}
if [ -z "$MIRROR" ]; then
    MIRROR=$(find_mirror) || die "could not find a Debian mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list; set VFSD_DEBIAN_MIRROR=<mirror URI of the Debian archive>"
fi
MIRROR=${MIRROR%/}

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$KEYRING" ] || die "$KEYRING missing: apt-get install debian-archive-keyring"
case $SUITE in
    trixie*) [ -f /usr/share/keyrings/debian-archive-trixie-automatic.gpg ] || [ -f /usr/share/keyrings/debian-archive-trixie-stable.gpg ] ||
        log "warning: the installed debian-archive-keyring may not know the trixie keys; if 'apt-get update' fails with NO_PUBKEY, upgrade debian-archive-keyring" ;;
esac

# --- Private apt state ------------------------------------------------------
APTDIR=$CACHE/apt
mkdir -p "$APTDIR/lists/partial" "$APTDIR/archives/partial" "$KDIR"
SRC=$APTDIR/vfsd-backports.sources
cat > "$SRC.new" <<EOF
# Written by vfsd scripts/fetch-kernel.sh; used only with a private apt state.
Types: deb
URIs: $MIRROR
Suites: $SUITE
Components: main
Signed-By: $KEYRING
EOF
mv "$SRC.new" "$SRC"

APT_OPTS=(
    -o "Dir::Etc::SourceList=$SRC"
    -o "Dir::Etc::SourceParts=$APTDIR/no-parts.d"
    -o "Dir::State::Lists=$APTDIR/lists"
    -o "Dir::Cache=$APTDIR"
    -o "Dir::Cache::Archives=$APTDIR/archives"
    -o "APT::Architecture=amd64"
    -o "APT::Architectures=amd64"
    -o "Acquire::Languages=none"
)
mkdir -p "$APTDIR/no-parts.d"

log "updating package list for $SUITE from the host's Debian mirror"
if ! apt-get "${APT_OPTS[@]}" -q update >"$APTDIR/update.log" 2>&1; then
    cat "$APTDIR/update.log" >&2
    die "apt-get update for $SUITE failed (see above). Check network access to the Debian mirror and the archive keyring."
fi

[ -n "$WANT_VERSION" ] && PINNED=1
if [ -z "$WANT_VERSION" ]; then
    # The metapackage linux-image-cloud-amd64 depends on linux-image-<ver>-cloud-amd64.
    img=$(apt-cache "${APT_OPTS[@]}" depends "linux-image-$FLAVOUR" 2>/dev/null |
          sed -n "s/^ *Depends: \(linux-image-[0-9][^ ]*-$FLAVOUR\)\$/\1/p" | head -n1)
    [ -n "$img" ] || die "no linux-image-$FLAVOUR in $SUITE; is the suite name right?"
    WANT_VERSION=${img#linux-image-}
    WANT_VERSION=${WANT_VERSION%-$FLAVOUR}
fi
ABI=$WANT_VERSION-$FLAVOUR
DEST=$KDIR/$ABI

if [ -f "$DEST/vmlinuz" ] && [ -f "$DEST/config" ] && check_config "$DEST/config"; then
    log "newest kernel $ABI is already cached"
else
    # Newer Debian kernels split linux-image-<abi> into a metapackage plus
    # linux-binary-<abi> (vmlinuz) and linux-base-<abi> (config, System.map).
    # Older ones ship both files in linux-image-<abi> itself.  Fetch whichever
    # of these exist.
    pkgs=()
    for p in "linux-image-$ABI" "linux-binary-$ABI" "linux-base-$ABI"; do
        if apt-cache "${APT_OPTS[@]}" show "$p" >/dev/null 2>&1; then pkgs+=("$p"); fi
    done
    [ ${#pkgs[@]} -gt 0 ] || die "linux-image-$ABI is not in $SUITE. Available: $(apt-cache "${APT_OPTS[@]}" pkgnames linux-image- 2>/dev/null | grep -E "^linux-image-[0-9].*-$FLAVOUR\$" | sort -V | tail -n3 | tr '\n' ' ')"
    TMP=$(mktemp -d "$KDIR/.fetch.XXXXXX")
    trap 'rm -rf "$TMP"' EXIT
    chmod 755 "$TMP"   # apt's download sandbox user must be able to write here
    log "downloading ${pkgs[*]}"
    ( cd "$TMP" && apt-get "${APT_OPTS[@]}" -q download "${pkgs[@]}" ) >"$TMP/download.log" 2>&1 || {
        cat "$TMP/download.log" >&2; die "apt-get download failed (see above)"; }
    mkdir -p "$TMP/root"
    for deb in "$TMP"/*.deb; do dpkg-deb -x "$deb" "$TMP/root"; done
    vmlinuz=$(find "$TMP/root" \( -path "*/modules/$ABI/vmlinuz" -o -name "vmlinuz-$ABI" \) -type f | head -n1)
    config=$(find "$TMP/root" \( -path "*/modules/$ABI/config" -o -name "config-$ABI" \) -type f | head -n1)
    [ -n "$vmlinuz" ] || die "no vmlinuz found in ${pkgs[*]}"
    [ -n "$config" ] || die "no kernel config found in ${pkgs[*]}"
    check_config "$config" || die "kernel $ABI lacks required built-in options (see above); pick another with --version"
    mkdir -p "$TMP/out"
    cp "$vmlinuz" "$TMP/out/vmlinuz"
    cp "$config" "$TMP/out/config"
    printf '%s\n' "${pkgs[@]}" > "$TMP/out/packages"
    rm -rf "$DEST"
    mv "$TMP/out" "$DEST"
    log "cached $ABI in $DEST ($(du -h "$DEST/vmlinuz" | cut -f1) vmlinuz)"
fi
if [ "$PRINT" = modules ] && ! have_modules "$DEST"; then
    # The modules are a package of their own; modules.order and modules.builtin
    # come with linux-base-<abi>.
    command -v depmod >/dev/null || die "depmod not found: apt-get install kmod"
    MTMP=$(mktemp -d "$KDIR/.modules.XXXXXX")
    trap 'rm -rf "$MTMP"' EXIT
    chmod 755 "$MTMP"
    log "downloading linux-modules-$ABI linux-base-$ABI"
    ( cd "$MTMP" && apt-get "${APT_OPTS[@]}" -q download "linux-modules-$ABI" "linux-base-$ABI" ) >"$MTMP/download.log" 2>&1 || {
        cat "$MTMP/download.log" >&2; die "apt-get download of linux-modules-$ABI failed (see above)"; }
    mkdir -p "$MTMP/root"
    for deb in "$MTMP"/*.deb; do dpkg-deb -x "$deb" "$MTMP/root"; done
    mdir=$(find "$MTMP/root" -type d -path "*/modules/$ABI" | head -n1)
    [ -n "$mdir" ] && [ -d "$mdir/kernel" ] || die "no modules for $ABI in linux-modules-$ABI"
    mkdir -p "$MTMP/out/lib/modules"
    mv "$mdir" "$MTMP/out/lib/modules/$ABI"
    depmod -b "$MTMP/out" "$ABI" || die "depmod for $ABI failed"
    rm -rf "$DEST/modules"
    mv "$MTMP/out" "$DEST/modules"
    log "cached the modules of $ABI in $DEST/modules ($(du -sh "$DEST/modules" | cut -f1))"
fi
if [ "$PINNED" = 0 ]; then
    ln -sfn "$ABI" "$KDIR/current.new" && mv -T "$KDIR/current.new" "$KDIR/current"
fi
emit "$DEST"
