#!/usr/bin/env bash
# Malformed-input fuzzing of vfsd's request path and migration stream (see docs/fuzzing.md).
#
#   scripts/fuzz.sh [SECONDS]     run every target for SECONDS (default 60) each, in turn
#
# Environment:
#   FUZZ_TARGETS   targets to run (default: every target in fuzz/fuzz_targets/)
#   FUZZ_JOBS      cargo build jobs (default: 2)
#   FUZZ_ARGS      extra libFuzzer arguments (e.g. "-seed=1")
#
# Builds each cargo-fuzz target in fuzz/ (libFuzzer + AddressSanitizer + debug assertions;
# the stable toolchain is told to accept cargo-fuzz's -Z flags with RUSTC_BOOTSTRAP=1),
# then runs it for the budget. Prints executions and crashes per target and exits non-zero
# if any target crashed, hung (timeout), ran out of memory or leaked. The inputs kept in
# fuzz/regressions/<target>/ (earlier finds) run first on every run. Crashing inputs land in
# fuzz/artifacts/<target>/, the growing corpus in fuzz/corpus/<target>/, logs in fuzz/logs/.
set -uo pipefail
cd "$(dirname "$0")/.."

BUDGET=${1:-60}
# Every target there is, so a new one runs in CI without being named here.
TARGETS=${FUZZ_TARGETS:-$(for f in fuzz/fuzz_targets/*.rs; do basename "$f" .rs; done)}
JOBS=${FUZZ_JOBS:-2}
CARGO_FUZZ_VERSION=0.13.2
export RUSTC_BOOTSTRAP=1
export CARGO_TERM_COLOR=never
export CARGO_BUILD_JOBS=$JOBS

if ! [[ $BUDGET =~ ^[0-9]+$ ]] || [ "$BUDGET" -lt 1 ]; then
    echo "usage: $0 [SECONDS]" >&2
    exit 2
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked || exit 1
fi

# The fuzzed filesystem lives in temporary directories. As root, put them on a small
# filesystem so that nothing a guest request does (fallocate with KEEP_SIZE ignores
# RLIMIT_FSIZE) can fill the host disk; otherwise the harness caps FALLOCATE lengths itself
# (see docs/fuzzing.md). A 256 MiB ext4 loop mount is preferred over tmpfs: ext4 supports
# RWF_NOWAIT, so READs also take the queue thread's no-wait path and its fallback.
MNT="" IMG=""
cleanup() {
    if [ -n "$MNT" ]; then
        umount "$MNT" 2>/dev/null
        rmdir "$MNT" 2>/dev/null
    fi
    [ -n "$IMG" ] && rm -f "$IMG"
}
trap cleanup EXIT
if [ "$(id -u)" = 0 ]; then
    MNT=$(mktemp -d /tmp/vfsd-fuzz-mnt.XXXXXX)
    IMG=$(mktemp /var/tmp/vfsd-fuzz-fs.XXXXXX)
    if truncate -s 256m "$IMG" && mkfs.ext4 -q -F "$IMG" 2>/dev/null &&
        mount -o loop "$IMG" "$MNT" 2>/dev/null; then
        chmod 1777 "$MNT"
        export VFSD_FUZZ_TMP=$MNT
    elif mount -t tmpfs -o size=256m,mode=1777 vfsd-fuzz "$MNT" 2>/dev/null; then
        export VFSD_FUZZ_TMP=$MNT
    else
        rmdir "$MNT"
        MNT=""
    fi
fi
echo "== fuzz filesystem: ${VFSD_FUZZ_TMP:-${TMPDIR:-/tmp} (unbounded: FALLOCATE lengths capped)}"

mkdir -p fuzz/logs
# FUZZ_TARGET_DIR: where the instrumented builds go (fuzz/target by default).
tdir=()
[ -n "${FUZZ_TARGET_DIR:-}" ] && tdir=(--target-dir "$FUZZ_TARGET_DIR")
status=0
summary=()
for t in $TARGETS; do
    echo "== building $t"
    if ! cargo fuzz build -a "${tdir[@]}" "$t" >"fuzz/logs/$t.build.log" 2>&1; then
        tail -30 "fuzz/logs/$t.build.log"
        echo "build of $t failed" >&2
        exit 1
    fi
done

for t in $TARGETS; do
    corpus=fuzz/corpus/$t
    artifacts=fuzz/artifacts/$t
    log=fuzz/logs/$t.log
    mkdir -p "$corpus" "$artifacts"
    before=$(find "$artifacts" -type f | wc -l)
    echo "== running $t for ${BUDGET}s"
    # Inputs kept from earlier finds (fuzz/regressions/TARGET) are run first, every time.
    kept=()
    [ -d "fuzz/regressions/$t" ] && kept=("fuzz/regressions/$t")
    cmd=(cargo fuzz run -a "${tdir[@]}" "$t" "$corpus" "${kept[@]}" --
        -max_total_time="$BUDGET" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        ${FUZZ_ARGS:-})
    echo "   ${cmd[*]}"
    # VFSD_FUZZ_SEEDS: the target writes its seed inputs into the corpus before starting.
    VFSD_FUZZ_SEEDS=$corpus "${cmd[@]}" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    if [ -z "$execs" ]; then
        execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
    fi
    after=$(find "$artifacts" -type f | wc -l)
    crashes=$((after - before))
    if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
        crashes=1 # the target died without leaving an input (see the log)
    fi
    line="$t: ${execs:-0} executions, $crashes crashes in ${BUDGET}s (exit $rc)"
    summary+=("$line")
    echo "   $line"
    if [ "$crashes" -ne 0 ]; then
        status=1
        grep -E "panicked|ERROR: |SUMMARY|Test unit written" "$log" | head -10 | sed 's/^/   /'
        echo "   full log: $log"
    fi
done

echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
