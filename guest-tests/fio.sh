#!/bin/sh
# Run the fio job files in /guest-tests/fio on a virtiofs share.
# Usage: /guest-tests/fio.sh [-d DIR] [-t SECONDS] [JOB...]
#   -d DIR      directory to test in (default $VFSD_SHARE)
#   -t SECONDS  runtime of the time-based (read) jobs (default 8)
#   JOB         job file names without .fio (default: all)
# Every writing job verifies its data (crc32c); fio exits non-zero on a
# verification error.  Prints one PASS/FAIL line per job file, IOPS and
# bandwidth per job, and exits 1 if any job file failed.

DIR=${VFSD_SHARE:-}
RUNTIME=8
while getopts d:t: o; do
    case $o in
        d) DIR=$OPTARG ;;
        t) RUNTIME=$OPTARG ;;
        *) echo "usage: $0 [-d DIR] [-t SECONDS] [JOB...]"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ -n "$DIR" ] || { echo "fio.sh: no directory (-d) and VFSD_SHARE unset"; exit 2; }
command -v fio >/dev/null || { echo "fio.sh: fio is not in this initramfs"; exit 2; }

JOBDIR=$(dirname "$0")/fio
if [ $# -eq 0 ]; then
    set -- $(cd "$JOBDIR" && ls *.fio | sed 's/\.fio$//')
fi

export FIO_DIR=$DIR/fio.$$ FIO_RUNTIME=$RUNTIME
PASS=0
FAIL=0
for job in "$@"; do
    f=$JOBDIR/$job.fio
    [ -f "$f" ] || { echo "fio.sh: FAIL: no job file $f"; FAIL=$((FAIL + 1)); continue; }
    rm -rf "$FIO_DIR"; mkdir -p "$FIO_DIR"
    start=$(date +%s)
    fio --eta=never --output=/tmp/fio-$job.out "$f"
    rc=$?
    secs=$(( $(date +%s) - start ))
    # one line per job: name and its read/write IOPS and bandwidth
    awk '
        /: \(groupid=/ { name = $1; sub(/:$/, "", name) }
        /^ *(read|write): IOPS=/ { sub(/^ */, ""); sub(/ \(.*$/, ""); printf "fio:   %-32s %s\n", name, $0 }
    ' /tmp/fio-$job.out
    if [ $rc -eq 0 ] && ! grep -q 'verify:.*bad\|err= *[1-9]' /tmp/fio-$job.out; then
        echo "fio: PASS $job (${secs}s)"
        PASS=$((PASS + 1))
    else
        echo "fio: FAIL $job (fio exit status $rc, ${secs}s); output:"
        grep -i 'verify\|error\|err=' /tmp/fio-$job.out | head -n 20
        tail -n 15 /tmp/fio-$job.out
        FAIL=$((FAIL + 1))
    fi
done
rm -rf "$FIO_DIR"
echo "fio: $PASS job files passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
