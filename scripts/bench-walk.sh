#!/usr/bin/env bash
# The fds and memory a daemon keeps while a guest walks a huge host-made tree (issue 21).
#
# Usage: scripts/bench-walk.sh [--files N] [--daemons "vfsd virtiofsd"] [--out DIR]
#                              [--tree DIR] [--daemon-args A] [--accel A]
#   --files N     files in the tree (default 1000000), 1,000 per directory; made once on
#                 the host under --tree (default ~/.cache/vfsd/walk-tree-N) and kept
#   --daemons D   the daemons to compare, in turn (default "vfsd virtiofsd")
#   --out DIR     where samples and the report go (default docs/benchmarks/walk)
#
# Each daemon runs with its defaults (vfsd: namespace sandbox; virtiofsd: --sandbox none)
# plus --xattr, at the default cache mode (auto: the guest keeps every inode it has seen).
# The guest runs `find | wc -l` over the tree, then `du -s` (a stat of every file). Every
# second the host samples the daemon's open fds (/proc/PID/fd) and RSS (VmRSS); the largest
# process of the daemon's tree is the one sampled. Writes DIR/<daemon>.csv (seconds, fds,
# RSS KiB, phase) and DIR/report.md, and prints the peaks.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
FILES=1000000
DAEMONS="vfsd virtiofsd"
OUT=$REPO/docs/benchmarks/walk
TREE=
DAEMON_ARGS=
ACCEL=tcg
say() { printf 'bench-walk: %s\n' "$*"; }
die() { printf 'bench-walk: error: %s\n' "$*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --files) FILES=${2:?}; shift 2 ;;
        --daemons) DAEMONS=${2:?}; shift 2 ;;
        --out) OUT=${2:?}; shift 2 ;;
        --tree) TREE=${2:?}; shift 2 ;;
        --daemon-args) DAEMON_ARGS=${2?}; shift 2 ;;
        --accel) ACCEL=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done
[[ $FILES =~ ^[0-9]+$ ]] && [ "$FILES" -ge 1000 ] || die "--files wants a number of at least 1000"
CACHE=${VFSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfsd}
TREE=${TREE:-$CACHE/walk-tree-$FILES}
DIRS=$(( FILES / 1000 ))
mkdir -p "$OUT"
if [ ! -f "$TREE/.complete" ]; then
    say "making $FILES files in $DIRS directories under $TREE (once)"
    rm -rf "$TREE"; mkdir -p "$TREE"
    python3 - "$TREE" "$DIRS" <<'PY'
import os, sys
root, dirs = sys.argv[1], int(sys.argv[2])
for d in range(dirs):
    p = os.path.join(root, "d%d" % d)
    os.mkdir(p)
    for f in range(1000):
        os.close(os.open(os.path.join(p, "f%d" % f), os.O_CREAT | os.O_WRONLY, 0o644))
    if d % 100 == 99:
        print("bench-walk:   %d of %d directories" % (d + 1, dirs), flush=True)
PY
    : > "$TREE/.complete"
fi
KERNEL=$("$HERE/fetch-kernel.sh") || die "no guest kernel"
INITRD=$("$HERE/build-initramfs.sh") || die "no initramfs"

sample() {  # sample CSV SOCKET: one line a second while a daemon serving SOCKET lives
    local csv=$1 sock=$2 t0 pid best n rss
    t0=$(date +%s.%N)
    echo "seconds,fds,rss_kib" > "$csv"
    while :; do
        best= n=-1
        for pid in $(pgrep -f -- "$sock" || true); do
            local c
            c=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l) || continue
            if [ "$c" -gt "$n" ]; then n=$c best=$pid; fi
        done
        if [ -n "$best" ]; then
            rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$best/status" 2>/dev/null || echo 0)
            printf '%.1f,%s,%s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$n" "${rss:-0}" >> "$csv"
        elif [ -s "$csv.seen" ]; then
            break
        fi
        [ -n "$best" ] && echo 1 > "$csv.seen"
        sleep 1
    done
    rm -f "$csv.seen"
}

for daemon in $DAEMONS; do
    work=$(mktemp -d "${TMPDIR:-/tmp}/vfsd-walk.XXXXXX")
    csv=$OUT/$daemon.csv
    say "$daemon: guest walks $FILES files (samples in $csv)"
    sample "$csv" "$work/fs0.sock" &
    sampler=$!
    start=$(date +%s)
    "$HERE/run-vm.sh" --daemon "$daemon" ${DAEMON_ARGS:+--daemon-args "$DAEMON_ARGS"} \
        --accel "$ACCEL" --kernel "$KERNEL" --initrd "$INITRD" --mem 4G --timeout 7200 \
        --quiet --log "$work.guest.log" --workdir "$work" --share "$TREE:share0:ro" -- \
        "t=\$(date +%s); echo walk: find \$(find /mnt/share0 | wc -l) entries in \$(( \$(date +%s) - t )) s; t=\$(date +%s); du -s /mnt/share0 > /dev/null; echo walk: du in \$(( \$(date +%s) - t )) s" \
        > "$work.run-vm.log" 2>&1 || { tail -20 "$work.run-vm.log"; die "$daemon: the guest run failed (log: $work.run-vm.log)"; }
    wait "$sampler" || true
    secs=$(( $(date +%s) - start ))
    tr -d '\r' < "$work.guest.log" | grep '^walk:' | sed "s/^/bench-walk:   $daemon: /" | tee "$OUT/$daemon.walk.txt"
    peak=$(awk -F, 'NR > 1 {if ($2 > f) f = $2; if ($3 > r) r = $3} END {printf "%d %d", f, r}' "$csv")
    say "  $daemon: peak fds ${peak% *}, peak RSS $(( ${peak#* } / 1024 )) MiB, ${secs}s"
    echo "$daemon $peak $secs" >> "$OUT/peaks.txt.new"
    rm -rf "$work" "$work.guest.log" "$work.run-vm.log"
done
mv "$OUT/peaks.txt.new" "$OUT/peaks.txt"
{
    echo "# Guest walk of $FILES host-made files: daemon fds and RSS"
    echo
    echo "\`scripts/bench-walk.sh --files $FILES --daemons \"$DAEMONS\"\` on $(date -u +%Y-%m-%d), $(uname -r) host, TCG guest, cache auto."
    echo
    echo "| daemon | peak fds | peak RSS (MiB) | RSS per file (bytes) | wall time (s) | walk |"
    echo "| --- | --- | --- | --- | --- | --- |"
    while read -r d f r s; do
        w=$(tr '\n' ';' < "$OUT/$d.walk.txt" | sed "s/bench-walk:   $d: walk: //g; s/;$//")
        echo "| $d | $f | $(( r / 1024 )) | $(( r * 1024 / FILES )) | $s | $w |"
    done < "$OUT/peaks.txt"
    echo
    echo "Samples (one a second): \`<daemon>.csv\` beside this file."
} > "$OUT/report.md"
cat "$OUT/report.md"
