#!/usr/bin/env bash
# Build the initramfs for the vfsd guest tests.
#
# Contents: busybox (static), fio, pjdfstest, fsx, the host's sleep, and
# getfattr/setfattr and stress-ng when present, each with the shared libraries ldd reports; guest-tests/ at
# /guest-tests; guest-tests/init.sh as /init.
#
# Usage: scripts/build-initramfs.sh [-o OUTPUT] [--force] [--no-tools]
#   -o OUTPUT    where to write it (default: $VFSD_CACHE/initramfs.cpio.gz)
#   --force      rebuild even if the inputs did not change
#   --no-tools   only busybox + guest-tests (fast; for --shell or boot probes)
#
# pjdfstest and fsx are taken from PATH or ~/.cargo/bin; if missing they are
# installed with 'cargo install --locked' into $VFSD_CACHE/tools (once).
# Prints the path of the image on stdout; progress goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${VFSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfsd}
OUT=
FORCE=0
TOOLS=1
PJDFSTEST_VERSION=${PJDFSTEST_VERSION:-0.2.2}
FSX_VERSION=${FSX_VERSION:-}

log() { printf 'build-initramfs: %s\n' "$*" >&2; }
die() { printf 'build-initramfs: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        -o|--output) OUT=${2:?-o needs a path}; shift 2 ;;
        --force) FORCE=1; shift ;;
        --no-tools) TOOLS=0; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done
if [ -z "$OUT" ]; then
    if [ "$TOOLS" = 1 ]; then OUT=$CACHE/initramfs.cpio.gz; else OUT=$CACHE/initramfs-min.cpio.gz; fi
fi
mkdir -p "$CACHE" "$(dirname "$OUT")"

BUSYBOX=${BUSYBOX:-}
if [ -z "$BUSYBOX" ]; then
    for b in /bin/busybox /usr/bin/busybox; do
        if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then BUSYBOX=$b; break; fi
    done
fi
[ -n "$BUSYBOX" ] || die "no static busybox found: apt-get install busybox-static"
command -v cpio >/dev/null || die "cpio not found: apt-get install cpio"

find_tool() {  # find_tool NAME -> path or empty
    local p
    p=$(command -v "$1" 2>/dev/null || true)
    [ -z "$p" ] && [ -x "$HOME/.cargo/bin/$1" ] && p=$HOME/.cargo/bin/$1
    [ -z "$p" ] && [ -x "$CACHE/tools/bin/$1" ] && p=$CACHE/tools/bin/$1
    echo "$p"
}

cargo_tool() {  # cargo_tool NAME CRATE VERSION
    local name=$1 crate=$2 ver=$3 p
    p=$(find_tool "$name")
    if [ -z "$p" ]; then
        command -v cargo >/dev/null || die "$name not found and cargo is missing; install Rust or put $name on PATH"
        log "installing $crate with cargo (one time; into $CACHE/tools)"
        cargo install --locked -j "${CARGO_BUILD_JOBS:-1}" --root "$CACHE/tools" "$crate" ${ver:+--version "$ver"} >&2 ||
            die "cargo install $crate failed; install it by hand (cargo install $crate) and retry"
        p=$CACHE/tools/bin/$name
    fi
    echo "$p"
}

BINS=()   # host binaries to install into /usr/local/bin
if [ "$TOOLS" = 1 ]; then
    FIO=$(find_tool fio)
    [ -n "$FIO" ] || die "fio not found: apt-get install fio"
    BINS+=("$FIO")
    BINS+=("$(cargo_tool pjdfstest pjdfstest "$PJDFSTEST_VERSION")")
    BINS+=("$(cargo_tool fsx fsx "$FSX_VERSION")")
    for t in getfattr setfattr getfacl setfacl chattr lsattr stress-ng; do
        p=$(find_tool $t); [ -n "$p" ] && BINS+=("$p")
    done
    # A real sleep binary: pjdfstest's ETXTBSY tests copy `which sleep` under
    # a random name and run it, which a busybox applet link cannot survive.
    for p in /usr/bin/sleep /bin/sleep; do
        if [ -x "$p" ] && [ "$(readlink -f "$p")" != "$(readlink -f "$BUSYBOX")" ]; then BINS+=("$p"); break; fi
    done
fi

# --- Skip the build when nothing changed ------------------------------------
sig() {
    {
        echo "tools=$TOOLS cc=$(command -v "${CC:-cc}" || true)"
        for f in "$HERE/build-initramfs.sh" "$HERE/../guest-tests/init.sh" "$BUSYBOX" "${BINS[@]}"; do
            stat -L -c "$(basename "$f") %s %Y" "$f"
        done
        find "$REPO/guest-tests" -type f -printf '%P %s %T@\n' | sort
        for b in "${BINS[@]}"; do ldd "$b" 2>/dev/null | sed "s/ (0x[0-9a-f]*)//" || true; done
    } | sha256sum | cut -d' ' -f1
}
SIG=$(sig)
if [ "$FORCE" = 0 ] && [ -f "$OUT" ] && [ "$(cat "$OUT.sig" 2>/dev/null)" = "$SIG" ]; then
    log "up to date: $OUT"
    echo "$OUT"
    exit 0
fi

ROOT=$(mktemp -d "${TMPDIR:-/tmp}/vfsd-initramfs.XXXXXX")
chmod 755 "$ROOT"
trap 'rm -rf "$ROOT"' EXIT
log "assembling in $ROOT"
mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,proc,sys,dev,tmp,run,mnt,root,var/tmp}
chmod 1777 "$ROOT/tmp" "$ROOT/var/tmp"
# Mirror a merged-/usr host so library paths from ldd resolve unchanged.
for d in lib lib64; do
    if [ -L "/$d" ]; then
        t=$(readlink "/$d")
        mkdir -p "$ROOT/${t#/}"
        ln -s "$t" "$ROOT/$d"
    fi
done

cp "$BUSYBOX" "$ROOT/bin/busybox"
for applet in $("$BUSYBOX" --list); do
    [ "$applet" = busybox ] && continue
    [ -e "$ROOT/bin/$applet" ] || ln -s busybox "$ROOT/bin/$applet"
done

copy_lib() {  # copy one library to the same (canonical-directory) path, keeping symlinks
    local src=$1 dir base p dst real
    dir=$(readlink -f "$(dirname "$src")")
    base=$(basename "$src")
    p=$dir/$base
    dst=$ROOT$p
    { [ -e "$dst" ] || [ -L "$dst" ]; } && return 0
    mkdir -p "$ROOT$dir"
    if [ -L "$p" ]; then
        real=$(readlink -f "$p")
        copy_lib "$real"
        ln -s "$real" "$dst"
    else
        cp "$p" "$dst"
    fi
}
for b in "${BINS[@]}"; do
    cp -L "$b" "$ROOT/usr/local/bin/"
    # lines: "libx.so => /path (addr)" or "/lib64/ld-linux-x86-64.so.2 (addr)"
    while read -r lib; do
        [ -n "$lib" ] && copy_lib "$lib"
    done < <(ldd "$b" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
done
if [ ${#BINS[@]} -gt 0 ]; then
    # A loader cache so libraries in non-default dirs (e.g. ceph's) are found.
    find "$ROOT" -name '*.so*' \( -type f -o -type l \) -printf '/%P\n' | xargs -r -n1 dirname | sort -u |
        sed 's#^/##; s#^#/#' > "$ROOT/etc/ld.so.conf"
    ldconfig -r "$ROOT" 2>/dev/null || log "warning: ldconfig -r failed; relying on default library paths"
fi

# Small helpers from guest-tests/src (xattr tool, fsx preload shim, lock tool).
if [ "$TOOLS" = 1 ]; then
    CC=${CC:-cc}
    if command -v "$CC" >/dev/null; then
        mkdir -p "$ROOT/usr/local/lib"
        "$CC" -O2 -Wall -o "$ROOT/usr/local/bin/vfsd-xattr" "$REPO/guest-tests/src/vfsd-xattr.c" ||
            die "compiling guest-tests/src/vfsd-xattr.c failed"
        "$CC" -O2 -Wall -shared -fPIC -o "$ROOT/usr/local/lib/fsx-preload.so" \
            "$REPO/guest-tests/src/fsx-preload.c" -ldl || die "compiling guest-tests/src/fsx-preload.c failed"
        # The lock tool (locks.sh): static when libc.a is there, else dynamic.
        "$CC" -O2 -Wall -static -o "$ROOT/usr/local/bin/vfsd-lock" "$REPO/guest-tests/src/vfsd-lock.c" 2>/dev/null ||
            "$CC" -O2 -Wall -o "$ROOT/usr/local/bin/vfsd-lock" "$REPO/guest-tests/src/vfsd-lock.c" ||
            die "compiling guest-tests/src/vfsd-lock.c failed"
        "$CC" -O2 -Wall -o "$ROOT/usr/local/bin/vfsd-mmap" "$REPO/guest-tests/src/vfsd-mmap.c" ||
            die "compiling guest-tests/src/vfsd-mmap.c failed"
        "$CC" -O2 -Wall -o "$ROOT/usr/local/bin/vfsd-newops" "$REPO/guest-tests/src/vfsd-newops.c" ||
            die "compiling guest-tests/src/vfsd-newops.c failed"
        "$CC" -O2 -Wall -o "$ROOT/usr/local/bin/vfsd-idmap" "$REPO/guest-tests/src/vfsd-idmap.c" ||
            die "compiling guest-tests/src/vfsd-idmap.c failed"
    else
        log "warning: no C compiler ($CC); the xattr checks and the fsx O_DIRECT run will be skipped (apt-get install gcc)"
    fi
fi

mkdir -p "$ROOT/guest-tests"
cp -a "$REPO/guest-tests/." "$ROOT/guest-tests/"
cp "$HERE/../guest-tests/init.sh" "$ROOT/init"
chmod 755 "$ROOT/init"
find "$ROOT/guest-tests" -name '*.sh' -exec chmod 755 {} +

cat > "$ROOT/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/:/bin/false
bin:x:2:2:bin:/:/bin/false
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
fsgqa:x:1000:1000:fsgqa:/tmp:/bin/sh
EOF
cat > "$ROOT/etc/group" <<'EOF'
root:x:0:
daemon:x:1:
bin:x:2:
nogroup:x:65534:
fsgqa:x:1000:
EOF
echo 'root::0:0:99999:7:::' > "$ROOT/etc/shadow"
printf 'hosts: files\npasswd: files\ngroup: files\n' > "$ROOT/etc/nsswitch.conf"
echo '127.0.0.1 localhost vfsd-guest' > "$ROOT/etc/hosts"
touch "$ROOT/etc/fstab"
ln -s /proc/mounts "$ROOT/etc/mtab"

COMP=(gzip -1)
log "packing $(du -sh "$ROOT" | cut -f1) into $OUT"
( cd "$ROOT" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet | "${COMP[@]}" ) > "$OUT.tmp.$$"
# Built by two runs at once, each packs its own and the last rename wins whole.
mv "$OUT.tmp.$$" "$OUT"
echo "$SIG" > "$OUT.sig"
log "done: $OUT ($(du -h "$OUT" | cut -f1))"
echo "$OUT"
