#!/bin/bash
# User-space instructions per operation of a daemon under one vfsd-bench workload, counted
# by valgrind's callgrind (instructions, not time: the same count run to run, whatever else
# the host does, where CPU time here moves by 10-20%). The kernel's share is not counted.
#
#   scripts/instr-per-op.sh [--workload W] [--ops A,B] [--out DIR] BIN...
#
# Each BIN (vfsd or virtiofsd) serves a fresh share on an ext4 image in /dev/shm with
# `--cache always --xattr --sandbox none --seccomp none` (valgrind can't follow a
# sandbox's fork), for A and then B operations of W (default untar: ten requests each, one
# in flight; see `vfsd-bench --help`); the difference of the two totals over B-A is the
# cost per operation without the start-up. Prints a table and leaves it in DIR (default
# docs/benchmarks/instr/<date>) with each daemon's 30 costliest functions (the larger run,
# callgrind_annotate, start-up included). Needs root (the loop
# mount), valgrind, and target/release/vfsd-bench (cargo build --release --features
# test-frontend).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
W=untar
OPS=1000,3000
OUT=
while [ $# -gt 0 ]; do
    case $1 in
        --workload) W=$2; shift 2 ;;
        --ops) OPS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "instr-per-op: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || { echo "instr-per-op: name at least one daemon binary (see --help)" >&2; exit 2; }
A=${OPS%,*}; B=${OPS#*,}
[ "$B" -gt "$A" ] 2>/dev/null || { echo "instr-per-op: --ops A,B needs B > A" >&2; exit 2; }
BENCH=$REPO/target/release/vfsd-bench
[ -x "$BENCH" ] || { echo "instr-per-op: no $BENCH (cargo build --release --features test-frontend)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "instr-per-op: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
for b in "$@"; do [ -x "$b" ] || { echo "instr-per-op: $b is not an executable" >&2; exit 1; }; done
OUT=${OUT:-$REPO/docs/benchmarks/instr/$(date +%Y%m%d-%H%M)}
mkdir -p "$OUT"

IMG=$(mktemp /dev/shm/instr-per-op.XXXX.img)
MNT=$(mktemp -d /tmp/instr-per-op.XXXX)
CG=$(mktemp -d /tmp/instr-per-op-cg.XXXX)
cleanup() { umount "$MNT" 2>/dev/null || true; rm -rf "$MNT" "$IMG" "$CG"; }
trap cleanup EXIT
truncate -s 1G "$IMG"
mkfs.ext4 -q "$IMG"
mount -o loop "$IMG" "$MNT"

# total BIN OPS NAME: callgrind's instruction total for OPS operations.
total() {
    local bin=$1 ops=$2 name=$3 d s
    d=$(mktemp -d "$MNT/run.XXXX"); mkdir "$d/share"
    valgrind --tool=callgrind --callgrind-out-file="$CG/$name.callgrind" \
        "$bin" --socket-path "$d/s" --shared-dir "$d/share" --cache always --xattr \
        --sandbox none --seccomp none --log-level error 2>"$CG/$name.valgrind" &
    s=$!
    for _ in $(seq 300); do [ -S "$d/s" ] && break; sleep 0.1; done
    [ -S "$d/s" ] || { echo "instr-per-op: $bin did not start: $(tail -3 "$CG/$name.valgrind")" >&2; kill $s; exit 1; }
    "$BENCH" --socket "$d/s" --shared-dir "$d/share" --pid $s --workload "$W" --depth 1 \
        --ops "$ops" >/dev/null 2>&1
    kill $s; wait $s 2>/dev/null || true
    rm -rf "$d"
    awk '/^totals:/ {print $2}' "$CG/$name.callgrind"
}

{
    echo "# instructions per $W operation (callgrind, user space), ops $A and $B: $(date -u +%F)"
    echo "| daemon | instructions per operation |"
    echo "| --- | --- |"
} > "$OUT/summary.md"
for b in "$@"; do
    n=$(basename "$b")
    echo "instr-per-op: $n, $A then $B operations" >&2
    ta=$(total "$b" "$A" "$n-$A")
    tb=$(total "$b" "$B" "$n-$B")
    echo "| $n | $(( (tb - ta) / (B - A) )) |" >> "$OUT/summary.md"
    callgrind_annotate "$CG/$n-$B.callgrind" 2>/dev/null | grep -v '^--' | grep . |
        sed -n '1,50p' | sed "s|$HOME/.cargo/registry/src/[^/]*/||; s|/rustc/[0-9a-f]*/library/||" |
        cut -c1-200 > "$OUT/$n-top.txt" || true
done
cat "$OUT/summary.md"
echo "instr-per-op: figures and callgrind files in $OUT" >&2
