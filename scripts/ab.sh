#!/bin/bash
# A/B of two vfsd binaries with the load generator, taking turns run by run so drift hits
# both alike; prints each row's median ops/s and daemon CPU per op, old and new.
#   scripts/ab.sh OLD_BIN NEW_BIN [ROUNDS] [OUT_FILE]
# Rows: one request in flight (a guest waiting on each reply) and eight, on the disk and
# on a tmpfs share (no RWF_NOWAIT, like GlusterFS). AB_ONLY=REGEX keeps the rows whose
# label matches. Needs target/release/vfsd-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1 NEW=$2 ROUNDS=${3:-3} OUT=${4:-$(mktemp /tmp/vfsd-ab.XXXXXX)}
[ -x "$OLD" ] && [ -x "$NEW" ] || { echo "ab.sh: OLD_BIN and NEW_BIN must be executables" >&2; exit 2; }
[ -x target/release/vfsd-bench ] || { echo "ab.sh: build target/release/vfsd-bench first (cargo build --release --features test-frontend)" >&2; exit 2; }
# label|share parent|vfsd-bench arguments
ROWS=(
    "randwrite-4k-d1|/var/tmp|randwrite-perjob --depth 1 --bs 4096 --file-mib 16"
    "seqwrite-1m-d1|/var/tmp|seqwrite --depth 1 --bs 1048576 --file-mib 256"
    "randread-4k-d1-tmpfs|/dev/shm|randread-perjob --depth 1 --bs 4096 --file-mib 16"
    "seqread-1m-d1-tmpfs|/dev/shm|seqread --depth 1 --bs 1048576 --file-mib 256"
    "randwrite-4k-d8|/var/tmp|randwrite-perjob --depth 8 --bs 4096 --file-mib 16"
    "randread-4k-d8-tmpfs|/dev/shm|randread-perjob --depth 8 --bs 4096 --file-mib 16"
)
: > "$OUT"
n=0 total=$(( ${#ROWS[@]} * ROUNDS * 2 ))  # at most, with AB_ONLY
for row in "${ROWS[@]}"; do
    IFS='|' read -r label dir args <<<"$row"
    [[ $label =~ ${AB_ONLY:-.} ]] || continue
    for r in $(seq "$ROUNDS"); do
        # Old first in odd rounds, new first in even ones: whatever one run leaves behind
        # (dirty pages, a warm cache) falls on each side alike.
        order="old new"; [ $((r % 2)) = 0 ] && order="new old"
        for side in $order; do
            bin=$OLD; [ $side = new ] && bin=$NEW
            n=$((n + 1)); echo "ab: $n/$total $label $side (round $r)" >&2
            # shellcheck disable=SC2086
            res=$(QB_DIR=$dir scripts/quickbench.sh "$bin" $args --seconds 3 | tail -1)
            [[ $res == "{"* ]] || { echo "ab.sh: $label on $side failed: $res" >&2; exit 1; }
            echo "{\"row\":\"$label\",\"side\":\"$side\",\"round\":$r,\"result\":$res}" >> "$OUT"
        done
    done
done
python3 - "$OUT" <<'PY'
import json, sys, statistics as st, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    j = json.loads(line)
    rows.setdefault(j["row"], {"old": [], "new": []})[j["side"]].append(j["result"])
print("| row | old ops/s | new ops/s | new/old | old CPU µs/op | new CPU µs/op |")
print("| --- | --- | --- | --- | --- | --- |")
for row, s in rows.items():
    m = {k: st.median(r["ops_per_s"] for r in v) for k, v in s.items()}
    c = {k: st.median(r["daemon_cpu_us_per_op"] for r in v) for k, v in s.items()}
    print(f"| {row} | {m['old']:,.0f} | {m['new']:,.0f} | {m['new']/m['old']:.2f} | {c['old']:.1f} | {c['new']:.1f} |")
print(f"raw results: {sys.argv[1]}")
PY
