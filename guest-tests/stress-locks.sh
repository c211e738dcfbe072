#!/bin/sh
# stress-ng's POSIX, lockf and OFD lock stressors on a virtiofs share: two instances of
# each, repeated (a cycle of lock waits among the instances is a matter of timing), as
# root and as the unprivileged user fsgqa. A cycle of lock waits must end (EDEADLK from
# the daemon, as the kernel gives it on a local file system), and so must a stressor's
# own end, where the parent kills its child and waits for it while it still holds the
# lock the child waits for: vfsd answers that wait EDEADLK once the holder has sent
# nothing for --lock-stall-timeout (30 s by default), and the child takes its SIGKILL. A wait
# the daemon never answers can't be killed in the guest (virtio-fs sends no
# FUSE_INTERRUPT), so a stressor still running well past its deadline is reported as
# hung and the script gives up on it.
# Usage: /guest-tests/stress-locks.sh [-d DIR] [-t SECS] [-r PASSES]
#   -d DIR     directory to test in (default $VFSD_SHARE)
#   -t SECS    seconds per stressor (default 4)
#   -r PASSES  passes as root (default 3; one more runs as fsgqa)
# Prints "stress-locks: <user> pass N <stressor>: <bogo ops> ops" per run and
# "stress-locks: N runs, M failed"; exits 1 if any run failed or hung.
DIR=${VFSD_SHARE:-}
SECS=4
PASSES=3
while getopts d:t:r: o; do
    case $o in
        d) DIR=$OPTARG ;;
        t) SECS=$OPTARG ;;
        r) PASSES=$OPTARG ;;
        *) echo "usage: $0 [-d DIR] [-t SECS] [-r PASSES]"; exit 2 ;;
    esac
done
[ -n "$DIR" ] || { echo "stress-locks: no directory (-d) and VFSD_SHARE unset"; exit 2; }
SNG=$(command -v stress-ng) || { echo "stress-locks: FAIL: stress-ng is not in this initramfs (apt-get install stress-ng, then rebuild it)"; exit 2; }

T=$DIR/stress-locks.$$
rm -rf "$T"; mkdir -p "$T"; chmod 1777 "$T"
RUNS=0 FAILED=0
field() { awk -v f="$2" '{print $f}' "/proc/$1/stat" 2>/dev/null; }
# Prints what each stressor process waits in (a forwarded lock wait shows as a FUSE
# request wait, request_wait_answer).
show_procs() {
    for p in /proc/[0-9]*; do
        case "$(cat "$p/comm" 2>/dev/null)" in stress-ng*) ;; *) continue ;; esac
        echo "stress-locks:   pid ${p#/proc/} ppid $(field "${p#/proc/}" 4) state $(field "${p#/proc/}" 3) wchan $(cat "$p/wchan" 2>/dev/null)"
    done
}
# run USER PASS STRESSOR
run() {
    local user=$1 pass=$2 s=$3 out=/tmp/stress-locks.out pid waited=0 rc
    local cmd="$SNG --$s 2 -t $SECS --metrics-brief --temp-path $T"
    RUNS=$((RUNS + 1))
    rm -f "$out"
    if [ "$user" = root ]; then
        $cmd > "$out" 2>&1 &
    else
        su -s /bin/sh "$user" -c "$cmd" > "$out" 2>&1 &
    fi
    pid=$!
    # stress-ng ends its stressors at SECS and reaps them; allow for a slow (TCG) guest
    # and for a killed child's wait, which ends after --lock-stall-timeout.
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$waited" -ge $((SECS * 2 + 90)) ]; then
            echo "stress-locks: FAIL: $user pass $pass $s: still running after ${waited}s (a lock wait that never ends)"
            grep -E 'stress-ng: (fail|error)' "$out" | head -5 | sed 's/^/stress-locks:   | /'
            show_procs
            FAILED=$((FAILED + 1))
            HUNG=1
            return
        fi
        sleep 1
        waited=$((waited + 1))
    done
    wait "$pid"; rc=$?
    ops=$(sed -n "s/^stress-ng: metrc: \[[0-9]*\] $s  *\([0-9][0-9]*\) .*/\1/p" "$out")
    if [ "$rc" != 0 ] || [ -z "$ops" ]; then
        echo "stress-locks: FAIL: $user pass $pass $s: exit status $rc"
        grep -vE 'stress-ng: (info|metrc)' "$out" | head -5 | sed 's/^/stress-locks:   | /'
        FAILED=$((FAILED + 1))
        return
    fi
    echo "stress-locks: $user pass $pass $s: $ops ops in ${SECS}s, ended after ${waited}s"
}

HUNG=0
r=1
while [ "$r" -le "$PASSES" ] && [ "$HUNG" = 0 ]; do
    for s in locka lockf lockofd; do [ "$HUNG" = 0 ] && run root "$r" "$s"; done
    r=$((r + 1))
done
for s in locka lockf lockofd; do [ "$HUNG" = 0 ] && run fsgqa 1 "$s"; done
echo "stress-locks: $RUNS runs, $FAILED failed"
# A hung stressor can't be killed or its directory removed: leave both to the reboot.
[ "$HUNG" = 0 ] && rm -rf "$T"
[ "$FAILED" = 0 ]
