#!/bin/sh
# The guest half of scripts/bench-mmap.sh: fio psync and mmap 4 KiB random read and
# write on one 64 MiB file in $VFSD_SHARE, SECONDS each (default 10). Prints
# "BENCH job IOPS" per job, or "BENCH job failed: ..." when fio can't run it (mmap of a
# direct-I/O file without FUSE_DIRECT_IO_ALLOW_MMAP fails with ENODEV).
T=${1:-10}
cd "${VFSD_SHARE:?VFSD_SHARE unset}" || exit 1
dd if=/dev/urandom of=bench.dat bs=1M count=64 2>/dev/null
for job in psync:randread psync:randwrite mmap:randread mmap:randwrite; do
    engine=${job%:*} rw=${job#*:}
    r=$(fio --name=b --filename=bench.dat --size=64m --bs=4k --ioengine="$engine" --rw="$rw" \
        --time_based --runtime="$T" --output-format=terse --terse-version=3 2>&1 | tail -n 1)
    case $r in
        # terse v3: field 8 is read IOPS, field 49 write IOPS
        "3;"*) echo "BENCH $engine-$rw $(echo "$r" | cut -d';' -f8,49 | tr ';' ' ')" ;;
        *) echo "BENCH $engine-$rw failed: $r" ;;
    esac
done
rm -f bench.dat
