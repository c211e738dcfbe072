#!/bin/sh
# Features a virtiofsd user may rely on (issue 12), from a real guest kernel. The host
# starts the daemon with the options each section needs (scripts/guest-suite.sh,
# "features": --cache never --allow-mmap ...); a section whose feature the daemon was
# not given fails rather than skips, so the suite can't pass on a daemon without it.
#
#   mmap   shared writable mmap of a share file under --cache never (--allow-mmap):
#          fio's mmap engine writes with verify, and a write through one mapping is seen
#          through read(2) and through a second mapping.
#
# Usage (in the guest): /guest-tests/features.sh [SECTION...] (default: all)
# Prints "features: N checks passed, M failed"; exit status 0 if every check passed.

DIR=${VFSD_SHARE:?VFSD_SHARE unset}
T=$DIR/features.$$
PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); }
bad() { FAIL=$((FAIL + 1)); echo "features: FAIL: $*"; }
check() {  # check DESCRIPTION EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then ok; else bad "$1: expected '$2', got '$3'"; fi
}
run() {  # run DESCRIPTION CMD...: must succeed
    d=$1; shift
    if "$@" > /tmp/features.out 2>&1; then ok; else bad "$d: '$*' failed: $(tail -n 3 /tmp/features.out)"; fi
}
nobody() { su -s /bin/sh nobody -c "$1"; }

rm -rf "$T"
mkdir "$T" && chmod 0777 "$T" || { echo "features: FAIL: cannot create $T"; exit 1; }
cd "$T" || exit 1

sec_mmap() {
    echo "features: -- mmap under cache=never"
    grep -q " $DIR virtiofs " /proc/mounts || bad "mmap: $DIR is not a virtiofs mount"
    run "mmap: fio mmap engine, random writes with verify" \
        fio --name=mmap --filename="$T/mmap.dat" --ioengine=mmap --rw=randwrite --bs=4k \
            --size=8m --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=terse
    run "mmap: fio mmap engine, random reads" \
        fio --name=mmapr --filename="$T/mmap.dat" --ioengine=mmap --rw=randread --bs=4k \
            --size=8m --output-format=terse
    # A mapping's stores reach the file: vfsd-mmap writes through MAP_SHARED, msyncs and
    # unmaps; read(2) (direct I/O under cache=never) must see them.
    dd if=/dev/zero of=m2 bs=4096 count=4 2>/dev/null
    run "mmap: store through MAP_SHARED" vfsd-mmap write m2 8192 mapped-bytes
    check "mmap: read(2) sees the stored bytes" "mapped-bytes" \
        "$(dd if=m2 bs=1 skip=8192 count=12 2>/dev/null)"
    check "mmap: a second mapping sees them" "mapped-bytes" "$(vfsd-mmap read m2 8192 12)"
    # A non-root user maps too.
    nobody "dd if=/dev/zero of=$T/m3 bs=4096 count=1 2>/dev/null && vfsd-mmap write $T/m3 0 nobody-map" ||
        bad "mmap: nobody's MAP_SHARED store failed"
    check "mmap: nobody's store" "nobody-map" "$(dd if=m3 bs=1 count=10 2>/dev/null)"
}

SECTIONS=${*:-mmap}
for s in $SECTIONS; do
    case $s in
        mmap) sec_mmap ;;
        *) bad "unknown section '$s'" ;;
    esac
done
cd / && rm -rf "$T"
echo "features: $PASS checks passed, $FAIL failed"
[ "$FAIL" = 0 ]
