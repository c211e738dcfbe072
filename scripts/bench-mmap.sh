#!/usr/bin/env bash
# Should --allow-mmap be vfsd's default?  Measures, in one run, a guest under
# --cache never without and with --allow-mmap (FUSE_DIRECT_IO_ALLOW_MMAP), and
# --cache auto for reference: fio psync 4 KiB random read and write (does the flag
# cost ordinary direct I/O anything?) and fio's mmap engine (what it makes possible).
# The guest half is guest-tests/mmap-bench.sh. Prints one line per configuration and job, and saves them to
# docs/benchmarks/allow-mmap.txt (or the file given with -o).
#
# Usage: scripts/bench-mmap.sh [-t SECONDS per job (default 10)] [-o FILE]
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
T=10
OUT=$REPO/docs/benchmarks/allow-mmap.txt
while getopts t:o: o; do
    case $o in t) T=$OPTARG ;; o) OUT=$OPTARG ;; *) exit 2 ;; esac
done
results=()
for cfg in "never:--cache=never" "never+allow-mmap:--cache=never --allow-mmap" "auto:--cache=auto"; do
    label=${cfg%%:*} args=${cfg#*:}
    echo "bench-mmap: $label ($args)" >&2
    log=$(mktemp)
    "$HERE/run-vm.sh" --accel tcg --quiet --log "$log" --daemon-args "$args" -- "/guest-tests/mmap-bench.sh $T" >/dev/null 2>&1
    while read -r _ name a b; do
        # terse v3: field 8 read IOPS, field 49 write IOPS
        if [ "$a" = failed: ]; then iops=failed; elif [ "${a:-0}" != 0 ]; then iops=$a; else iops=$b; fi
        results+=("$(printf '%-18s %-16s %s' "$label" "$name" "$iops")")
    done < <(tr -d '\r' < "$log" | grep '^BENCH ')
    rm -f "$log"
done
{
    echo "# scripts/bench-mmap.sh -t $T ($(date -u +%Y-%m-%d), TCG guest, 2 host cores; IOPS, 4 KiB, one job each)"
    printf '%-18s %-16s %s\n' config job iops
    printf '%s\n' "${results[@]}"
} | tee "$OUT"
