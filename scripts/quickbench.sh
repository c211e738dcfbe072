#!/bin/bash
# Quick A/B of one vfsd-bench workload against a given vfsd binary (cache never):
#   scripts/quickbench.sh BIN WORKLOAD [vfsd-bench options]
# Needs target/release/vfsd-bench (cargo build --release --features test-frontend).
BIN=$1; W=$2; shift 2
# QB_DIR: where the share goes (default /var/tmp; /dev/shm for a share without RWF_NOWAIT).
D=$(mktemp -d "${QB_DIR:-/var/tmp}/qb.XXXX"); mkdir $D/share
$BIN --socket-path $D/s --shared-dir $D/share --cache never --log-level error & P=$!
for i in $(seq 50); do [ -S $D/s ] && break; sleep 0.1; done
"$(dirname "$0")/../target/release/vfsd-bench" --socket $D/s --shared-dir $D/share --pid $P --workload $W "$@" 2>&1 | tail -3
kill $P; wait $P 2>/dev/null; rm -rf $D
