#!/bin/bash
# Guest side of the xfstests guest test (tests/guest/xfstests.rs), second stage: runs fstests' ./check
# chrooted into the writable root that xfstests.sh built, with a watchdog.
#
# Usage: xfstests-check.sh XFSTESTS_DIR PER_TEST_TIMEOUT
# Reads the tests from /mnt/results/tests.list; check's output goes to
# /mnt/results/check.out (and the console), the watchdog's notes to
# /mnt/results/watchdog.log.
#
# Watchdog: a test (or check's own work after it) that takes longer than
# PER_TEST_TIMEOUT seconds is killed and the FUSE connections of the test and
# scratch mounts are aborted through /sys/fs/fuse/connections/N/abort where the
# kernel lists them (it does not list virtiofs connections, and virtiofs also
# refuses umount -f: a process waiting for a reply that was already sent to
# the daemon cannot be freed inside this guest).  The watchdog notes the test
# as failed with what was blocked where, and exits with status 3 at once;
# xfstests.sh then powers the guest off without syncing, and the host boots a
# fresh guest (fresh daemons) for the tests not yet run.
set -u
XFSTESTS=${1:?usage: xfstests-check.sh XFSTESTS_DIR PER_TEST_TIMEOUT}
PER_TEST=${2:?usage: xfstests-check.sh XFSTESTS_DIR PER_TEST_TIMEOUT}
R=/mnt/results
OUT=$R/check.out
WLOG=$R/watchdog.log
say() { echo "xfstests-check: $*"; }

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
export FSTYP=virtiofs
export TEST_DEV=test TEST_DIR=/mnt/test
export SCRATCH_DEV=scratch SCRATCH_MNT=/mnt/scratch
export RESULT_BASE=$R/results
mkdir -p "$TEST_DIR" "$SCRATCH_MNT" "$RESULT_BASE"

mapfile -t TESTS < <(grep -E '^[a-z0-9]+/[0-9]+$' "$R/tests.list")
[ ${#TESTS[@]} -gt 0 ] || { say "error: no tests in $R/tests.list"; exit 2; }
for u in fsgqa fsgqa2 123456-fsgqa; do
    id "$u" >/dev/null 2>&1 || { say "error: user $u missing (scripts/build-xfstests.sh creates it on the host)"; exit 2; }
done
mount -t virtiofs "$TEST_DEV" "$TEST_DIR" || { say "error: cannot mount tag $TEST_DEV on $TEST_DIR"; exit 2; }
cd "$XFSTESTS" || exit 2

# The FUSE connection number of the virtiofs mount of TAG (its st_dev minor).
fuse_conn_of() {
    awk -v tag="$1" '$0 ~ / - virtiofs / { n = split($0, f, " - "); split(f[2], g, " ");
        if (g[2] == tag) { split($3, d, ":"); print d[2] } }' /proc/self/mountinfo
}

# Every descendant of PID (children first listed after their parents).
descendants() {
    local p c
    for p in "$@"; do
        for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do
            echo "$c"; descendants "$c"
        done
    done
}

say "$(date +%T) running ${#TESTS[@]} test(s), watchdog ${PER_TEST}s per test: ${TESTS[*]:0:5}$([ ${#TESTS[@]} -gt 5 ] && echo ' ...')"
: >> "$OUT"
setsid bash -c './check --exact-order "$@" 2>&1 | tee -a '"$OUT" check "${TESTS[@]}" &
CHECK=$!

key=; since=$(date +%s)
while kill -0 "$CHECK" 2>/dev/null; do
    sleep 5
    # A new test line in check's output means progress.
    now_key=$(grep -cE '^[a-z0-9]+/[0-9]+' "$OUT")
    if [ "$now_key" != "$key" ]; then key=$now_key; since=$(date +%s); continue; fi
    # check's own start (mounts, test list) gets 5 minutes more.
    limit=$PER_TEST; [ "$key" = 0 ] && limit=$((PER_TEST + 300))
    [ $(( $(date +%s) - since )) -ge "$limit" ] || continue

    cur=$(grep -oE '^[a-z0-9]+/[0-9]+' "$OUT" | tail -n1)
    cur=${cur:-before the first test}
    # What is stuck, and where in the kernel: uninterruptible sleeps, and
    # waits for FUSE replies (those sleep interruptibly first).
    stuck=
    for p in $(descendants "$CHECK"); do
        st=$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)
        wc=$(cat /proc/"$p"/wchan 2>/dev/null)
        [ "$st" = D ] || [[ $wc == *fuse* || $wc == request_wait_answer ]] || continue
        stuck="$stuck${stuck:+, }$(cat /proc/"$p"/comm 2>/dev/null) ($st) in $wc"
    done
    why="no progress for ${limit}s${stuck:+; blocked: $stuck}"
    say "WATCHDOG: $cur: $why"
    # Kill the test's processes first, then release requests the daemon
    # never answers, then stop check itself.
    for p in $(descendants "$CHECK"); do kill -9 "$p" 2>/dev/null; done
    sleep 2
    aborted=
    for tag in "$TEST_DEV" "$SCRATCH_DEV"; do
        for n in $(fuse_conn_of "$tag"); do
            if [ -w /sys/fs/fuse/connections/"$n"/abort ]; then
                echo 1 > /sys/fs/fuse/connections/"$n"/abort && aborted="$aborted $tag(conn $n)"
            fi
        done
    done
    [ -n "$aborted" ] || aborted=" none (virtiofs connections are not in /sys/fs/fuse/connections)"
    kill -9 -- -"$CHECK" 2>/dev/null
    printf '%s\t%s; aborted FUSE connections:%s\n' "$cur" "$why" "$aborted" >> "$WLOG"
    say "aborted FUSE connections:$aborted"
    umount -l "$SCRATCH_MNT" 2>/dev/null
    umount -l "$TEST_DIR" 2>/dev/null
    # Killed processes waiting for a reply stay until the guest goes: do not wait for them.
    exit 3
done
wait "$CHECK" 2>/dev/null
say "$(date +%T) check finished"
umount "$SCRATCH_MNT" 2>/dev/null
umount "$TEST_DIR" 2>/dev/null
sync
exit 0
