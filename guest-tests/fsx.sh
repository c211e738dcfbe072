#!/bin/sh
# Run fsx (Rust fsx-rs, `cargo install fsx`) on a virtiofs share.
# Usage: /guest-tests/fsx.sh [-d DIR] [-N OPS] [-D OPS] [-S SEED]
#   -d DIR   directory to test in (default $VFSD_SHARE)
#   -N OPS   operations for the buffered run (default 100000)
#   -D OPS   operations for the O_DIRECT run (default 20000; 0 skips it)
#   -S SEED  random seed (default: derived from the time; printed)
# fsx-rs has no O_DIRECT switch: the second run adds O_DIRECT to its opens
# with an LD_PRELOAD shim (guest-tests/src/fsx-preload.c) and uses 4 KiB-
# aligned operations.  The same shim also unmaps the mappings that fsx-rs
# 0.3.2 leaks on every mapread, which would otherwise make long runs
# quadratically slow.  Exits 1 if any run failed.
DIR=${VFSD_SHARE:-}
OPS=100000
DOPS=20000
SEED=$(( $(date +%s) % 100000 ))
while getopts d:N:D:S: o; do
    case $o in
        d) DIR=$OPTARG ;;
        N) OPS=$OPTARG ;;
        D) DOPS=$OPTARG ;;
        S) SEED=$OPTARG ;;
        *) echo "usage: $0 [-d DIR] [-N OPS] [-D OPS] [-S SEED]"; exit 2 ;;
    esac
done
[ -n "$DIR" ] || { echo "fsx.sh: no directory (-d) and VFSD_SHARE unset"; exit 2; }
command -v fsx >/dev/null || { echo "fsx.sh: fsx is not in this initramfs"; exit 2; }

T=$DIR/fsx.$$
rm -rf "$T"; mkdir -p "$T"
# Buffered run: all operations fsx-rs supports on Linux, 256 KiB file.
# No posix_fallocate: fsx-rs can draw a zero-length one (seed 82855: op 41956,
# "0x159ea => 0x159e9 (0x0 bytes)"), which fails with EINVAL on the host's own ext4
# too ("Test file system does not support posix_fallocate"); xfstests and the load
# generator cover fallocate.
cat > /tmp/fsx.toml <<'TOML'
flen = 262144
[weights]
close_open = 1
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 2
fsync = 1
fdatasync = 1
posix_fallocate = 0
punch_hole = 1
sendfile = 1
posix_fadvise = 1
copy_file_range = 1
TOML

# O_DIRECT run: aligned sizes and offsets (what O_DIRECT users do), mmap kept
# to check cache coherency between mapped pages and direct I/O.
cat > /tmp/fsx-direct.toml <<'TOML'
flen = 1048576
[opsize]
max = 131072
align = 4096
[weights]
close_open = 1
read = 10
write = 10
mapread = 2
mapwrite = 2
truncate = 2
fsync = 1
fdatasync = 1
punch_hole = 1
TOML
# (no posix_fallocate here: with align > 1 fsx-rs can issue zero-length
# fallocate calls, which fail with EINVAL on any file system)

run_fsx() {  # NAME OPS CONFIG [env...]
    name=$1 ops=$2 conf=$3; shift 3
    start=$(date +%s)
    echo "fsx: $name: $ops operations, seed $SEED"
    env "$@" fsx -q -N "$ops" -S "$SEED" -f "$conf" -P /tmp "$T/$name.dat" > /tmp/fsx-$name.out 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    if [ $rc -eq 0 ]; then
        echo "fsx: PASS $name ($ops ops, ${secs}s)"
        echo pass > /tmp/fsx-$name.result
    else
        echo "fsx: FAIL $name (exit status $rc after ${secs}s; reproduce with -S $SEED); last output:"
        tail -n 40 /tmp/fsx-$name.out
        echo fail > /tmp/fsx-$name.result
    fi
}

# The two runs use different files and go in parallel (the guest has 2+
# vCPUs; one fsx process mostly waits for the daemon's round trips).
# Results are collected in files because the runs are subshells.
rm -f /tmp/fsx-*.result /tmp/fsx-*.log /tmp/fsx-*.out
SHIM=/usr/local/lib/fsx-preload.so
if [ -f "$SHIM" ]; then
    run_fsx buffered "$OPS" /tmp/fsx.toml LD_PRELOAD=$SHIM VFSD_FSX_UNMAP=1 > /tmp/fsx-buffered.log &
else
    echo "fsx: note: $SHIM missing (no C compiler when the initramfs was built); long runs will be slow"
    run_fsx buffered "$OPS" /tmp/fsx.toml > /tmp/fsx-buffered.log &
fi
if [ "$DOPS" -gt 0 ]; then
    if [ -f "$SHIM" ]; then
        run_fsx direct "$DOPS" /tmp/fsx-direct.toml LD_PRELOAD=$SHIM VFSD_FSX_UNMAP=1 VFSD_ODIRECT_FILE=direct.dat > /tmp/fsx-direct.log &
    else
        echo "fsx: SKIP direct: $SHIM missing (no C compiler when the initramfs was built)"
    fi
fi
wait
for name in buffered direct; do
    [ -f /tmp/fsx-$name.log ] && cat /tmp/fsx-$name.log
done
PASS=$(cat /tmp/fsx-*.result 2>/dev/null | grep -c '^pass')
FAIL=$(cat /tmp/fsx-*.result 2>/dev/null | grep -c '^fail')
if [ -f /tmp/fsx-direct.out ] && ! grep -q 'fsx-preload: opening' /tmp/fsx-direct.out; then
    echo "fsx: FAIL direct: the O_DIRECT shim did not take effect"
    FAIL=$((FAIL + 1))
fi
rm -rf "$T"
echo "fsx: $PASS runs passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
