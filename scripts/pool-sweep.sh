#!/usr/bin/env bash
# How --thread-pool-size affects one request queue with 32 requests in flight (the
# measurement behind vfsd's default pool size), with virtiofsd alongside.
#   scripts/pool-sweep.sh [RUNS] [SECONDS]   -> docs/benchmarks/pool-sweep.txt
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3} SECS=${2:-3}
cargo build --release --quiet --features test-frontend
VIRTIOFSD=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")
W=$(mktemp -d /var/tmp/vfsd-pool.XXXXXX); trap 'rm -rf "$W"' EXIT
mkdir -p "$W/share" docs/benchmarks
one() { # daemon pool workload
    rm -f "$W/s"
    if [ "$1" = vfsd ]; then
        target/release/vfsd --socket-path "$W/s" --shared-dir "$W/share" --cache never --sandbox none --log-level error --thread-pool-size "$2" &
    else
        "$VIRTIOFSD" --socket-path "$W/s" --shared-dir "$W/share" --cache never --sandbox none --log-level error --thread-pool-size "$2" 2>/dev/null &
    fi
    local p=$!
    while [ ! -S "$W/s" ]; do sleep 0.05; done
    target/release/vfsd-bench --socket "$W/s" --shared-dir "$W/share" --pid $p --workload "$3" \
        --queues 1 --depth 32 --seconds "$SECS" --file-mib 64 --guest-locking false
    wait $p || true
}
OUT=docs/benchmarks/pool-sweep.txt
{
    echo "# scripts/pool-sweep.sh $RUNS $SECS — $(date -u +%F), $(nproc) CPUs; 1 queue, 32 in flight, --cache never,"
    echo "# --guest-locking false (daemon throughput only); median of $RUNS runs: ops/s and daemon CPU µs/op"
    for wl in randread-shared randwrite-shared lookup-getattr; do
        for cfg in "vfsd 0" "vfsd 2" "vfsd 4" "vfsd 8" "virtiofsd 0" "virtiofsd 4"; do
            set -- $cfg
            for r in $(seq "$RUNS"); do one "$1" "$2" "$wl"; done > "$W/runs"
            python3 - "$W/runs" "$wl" "$1" "$2" <<'PY'
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
ops = statistics.median(r["ops_per_s"] for r in rs)
cpu = statistics.median(r["daemon_cpu_us_per_op"] for r in rs)
runs = ", ".join("%.0f" % r["ops_per_s"] for r in rs)
print(f"{sys.argv[2]:18} {sys.argv[3]:10} pool {sys.argv[4]:>2}: {ops:>9,.0f} ops/s  {cpu:5.1f} us/op  (runs: {runs})")
PY
        done
    done
} | tee "$OUT"
