#!/usr/bin/env bash
# Memory and fd churn: drives N create/getattr/release/unlink/forget cycles through a
# daemon (what a guest does with short-lived files) and samples the serving process's
# RSS and open fds. FORGET must really free nodes: both should stay flat.
#
#   scripts/churn.sh [CYCLES] [DAEMON]     (defaults: 1000000, vfsd; or virtiofsd)
# Prints a table and writes docs/benchmarks/churn-<daemon>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
CYCLES=${1:-1000000}
DAEMON=${2:-vfsd}
cargo build --release --quiet --features test-frontend
W=$(mktemp -d /var/tmp/vfsd-churn.XXXXXX)
trap 'kill $PID 2>/dev/null; rm -rf "$W"' EXIT
mkdir -p "$W/share" docs/benchmarks
case $DAEMON in
    vfsd) target/release/vfsd --socket-path "$W/sock" --shared-dir "$W/share" --log-level error & ;;
    virtiofsd) virtiofsd --socket-path "$W/sock" --shared-dir "$W/share" --log-level error --sandbox none & ;;
    *) echo "churn.sh: unknown daemon '$DAEMON'" >&2; exit 2 ;;
esac
PID=$!
while [ ! -S "$W/sock" ]; do sleep 0.05; done
serving() { local c; c=$(cat /proc/$PID/task/$PID/children 2>/dev/null | awk '{print $1}'); echo "${c:-$PID}"; }
sample() {
    local p; p=$(serving)
    [ -r /proc/$p/status ] || return 0   # the daemon exits when the load generator leaves
    printf '%s\t%s\t%s\n' "$1" "$(awk '/VmRSS/{print $2}' /proc/$p/status)" "$(ls /proc/$p/fd | wc -l)"
}
OUT=docs/benchmarks/churn-$DAEMON.txt
{
    echo "# scripts/churn.sh $CYCLES $DAEMON — $(date -u +%F)"
    printf 'elapsed_s\trss_kib\topen_fds\n'
    sample 0
    target/release/vfsd-bench --socket "$W/sock" --shared-dir "$W/share" --pid $PID \
        --workload churn --queues 1 --depth 32 --ops "$CYCLES" > "$W/result.json" &
    B=$!
    T0=$(date +%s)
    while kill -0 $B 2>/dev/null; do
        sleep 5
        sample $(( $(date +%s) - T0 ))
    done
    wait $B
    echo "# bench: $(cat "$W/result.json")"
} | tee "$OUT"
