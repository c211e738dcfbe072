#!/bin/bash
# Quick A/B of one vfsd-bench workload against a given vfsd binary (cache never, or
# QB_CACHE):
#   scripts/quickbench.sh BIN WORKLOAD [vfsd-bench options]
# Needs target/release/vfsd-bench (cargo build --release --features test-frontend).
# QB_STRACE=FILE: run the daemon under `strace -f -c` and leave its syscall counts in FILE
# (its timings are then strace's, not vfsd's: compare counts only).
# QB_ARGS: more daemon options (e.g. --xattr for the untar workload).
# QB_PERF=FILE: record the daemon (its sandboxed child, if it forked one) with perf
# (-F 999 -g) into FILE while the load runs.
BIN=$1; W=$2; shift 2
# QB_DIR: where the share goes (default /var/tmp; /dev/shm for a share without RWF_NOWAIT).
D=$(mktemp -d "${QB_DIR:-/var/tmp}/qb.XXXX"); mkdir $D/share
if [ -n "${QB_STRACE:-}" ]; then
    strace -f -c -o "$QB_STRACE" $BIN --socket-path $D/s --shared-dir $D/share --cache ${QB_CACHE:-never} --log-level error ${QB_ARGS:-} & S=$!
else
    $BIN --socket-path $D/s --shared-dir $D/share --cache ${QB_CACHE:-never} --log-level error ${QB_ARGS:-} & S=$!
fi
for i in $(seq 100); do [ -S $D/s ] && break; sleep 0.1; done
# The daemon's pid (under strace: strace's child).
P=$S; [ -n "${QB_STRACE:-}" ] && P=$(pgrep -P $S | head -1)
if [ -n "${QB_PERF:-}" ]; then
    # The socket is bound before the sandbox forks its child: wait for the child
    # (none with --sandbox none).
    for i in $(seq 50); do C=$(pgrep -P $P | paste -sd,); [ -n "$C" ] && break; sleep 0.1; done
    perf record -q -F 999 -g -o "$QB_PERF" -p "${C:-$P}" 2>/dev/null & PR=$!
fi
"$(dirname "$0")/../target/release/vfsd-bench" --socket $D/s --shared-dir $D/share --pid $P --workload $W "$@" 2>&1 | tail -3
[ -n "${QB_PERF:-}" ] && { kill -INT $PR; wait $PR 2>/dev/null; }
# strace writes its counts when it detaches (SIGINT); the daemon then goes on SIGTERM.
[ -n "${QB_STRACE:-}" ] && { kill -INT $S; wait $S 2>/dev/null; }
kill $P 2>/dev/null; wait $P 2>/dev/null; rm -rf $D
