#!/bin/sh
# Locks between two real guests and the host.
#
# Usage (in the guest): /guest-tests/locks.sh A|B [quick|full|counter] [N]
# Two guests run it at once, one as A and one as B, each with its own vfsd on
# the same host directory ($VFSD_SHARE), started by tests/guest/locks.rs,
# which also plays the host's part.  The
# guests and the host meet through marker files in $VFSD_SHARE/sync (run the
# daemons with --cache never, or auto and wait out the 1 s entry timeout, so
# that lookups reach the host).
#
#   s0  each guest takes an OFD lock, a POSIX lock and a flock on a file of its
#       own, in a process that exits: each is free again at once, for the same
#       guest and for the other one (an OFD lock goes with its open file's
#       RELEASE, which no FORGET follows under --cache auto or always).
#   s1  flock: A holds LOCK_EX; B's LOCK_NB attempts (ex and sh) fail; B's
#       blocking flock is granted after A's release (delay measured); A holds
#       LOCK_SH: B's sh is granted, its ex refused.
#   s2  fcntl byte ranges: A holds wr 0-99 and rd 200-299; overlapping requests
#       from B fail, disjoint ones (and rd on rd) are granted; F_GETLK reports
#       the holder with pid 0; B's blocking F_SETLKW is granted after A's release.
#   s3  the host holds flock LOCK_EX and a POSIX wr lock on 0-99 (vfsd-lock on
#       the host): both guests' attempts fail, and both get in after the host
#       releases.
#   full only:
#   s4  a counter incremented N times (default 1000) by each guest under flock,
#       then under fcntl: must end at 2N; then without locks, for contrast
#       (the figure is printed; it is expected to come out short).
#   s5  A holds flock and a POSIX lock, then the host kill -9s A's QEMU: B's
#       blocking request is granted (delay from the kill measured); A never
#       finishes, so it writes its summary before this step.
#   cross: s1, s2 and s4, for two guests on two hosts' client mounts of a
#       distributed file system (tests/guest/gluster.rs): s3 and s5 take flock and
#       a POSIX lock on one file in one process, which GlusterFS and NFS refuse
#       (their clients turn flock into a whole-file POSIX lock of another owner).
#   counter: s4 only, flock counter (for a daemon run with --no-flock, where the
#       guests arbitrate locally: the figure is expected to be short).
#
# Prints "locks[R]: FIGURE name value" lines for the host to collect, and
# "locks[R]: N checks passed, M failed"; writes the same counts to sync/R.summary.
# Exit status: 0 if every check passed, 1 otherwise.

ROLE=${1:?usage: locks.sh A|B [quick|full|counter] [N]}
MODE=${2:-quick}
N=${3:-1000}
case $ROLE in A) OTHER=B ;; B) OTHER=A ;; *) echo "locks: role must be A or B"; exit 2 ;; esac
D=${VFSD_SHARE:?VFSD_SHARE unset}
S=$D/sync
L=vfsd-lock
TEST=locks AWAIT_SECS=180
. /guest-tests/sync.sh
figure() { say "FIGURE $1 $2"; }

expect() {  # expect DESCRIPTION STATUS COMMAND...: the command must exit with STATUS
    desc=$1 want=$2
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    if [ "$rc" = "$want" ]; then ok; else bad "$desc: expected status $want, got $rc: $(echo "$out" | tr '\n' ' ')"; fi
    LAST_OUT=$out
}
# Seconds between two markers' host mtimes (both set by the host's clock).
since() {  # since LATER EARLIER
    # -1 (which fails within) if a marker is missing
    vfsd-lock mtime "$S/$1" "$S/$2" | awk 'NR == 1 {a = $1} NR == 2 {b = $1} END {if (NR == 2) printf "%.3f", a - b; else printf "-1"}'
}
within() {  # within DESCRIPTION SECONDS LIMIT
    if awk -v d="$2" -v l="$3" 'BEGIN {exit !(d >= -0.05 && d < l)}'; then ok; else bad "$1: took $2 s (limit $3 s)"; fi
}
waited() {  # the "granted after N.NNNs" figure from the last vfsd-lock
    echo "$LAST_OUT" | sed -n 's/^granted after \([0-9.]*\)s$/\1/p' | tail -n1
}

[ -d "$S" ] || mkdir -p "$S" 2>/dev/null
mark up
say "mode $MODE, waiting for guest $OTHER"
barrier start 600
say "both guests up"

s0() {
    # Each guest on a file of its own: locks end with the close that ends them on a
    # local file system. An OFD lock is its open file's, so it must go with the last
    # close (FUSE RELEASE), though the guest's FLUSH names the process, not the file.
    F=$D/close-file.$ROLE
    say "s0: locks end with close"
    : > "$F"
    for spec in owr:0:10 wr:0:10 ex; do
        expect "s0: $spec taken, then the process exits" 0 $L "$F" $spec
        expect "s0: $spec taken again after the close" 0 $L "$F" $spec
    done
    # The other guest must find them free too (the host holds nothing).
    mark s0-done
    await "$OTHER.s0-done"
    for spec in owr:0:10 wr:0:10 ex; do
        expect "s0: $spec on the other guest's file after its close" 0 $L "$D/close-file.$OTHER" $spec
    done
    barrier s0-end
}

s1() {
    F=$D/flock-file
    say "s1: flock between the guests"
    if [ "$ROLE" = A ]; then
        expect "s1: A takes flock LOCK_EX" 0 $L -m "$S/A.s1-held" -u "$S/B.s1-waiting" -t 3 -s "$S/A.s1-releasing" "$F" ex
        barrier s1-done
        expect "s1: A takes flock LOCK_SH" 0 $L -m "$S/A.s1b-held" -u "$S/B.s1b-done" "$F" sh
        barrier s1b-done-2
    else
        await A.s1-held
        expect "s1: B's flock -n -x refused while A holds LOCK_EX" 1 $L "$F" ex
        expect "s1: B's flock -n -s refused while A holds LOCK_EX" 1 $L "$F" sh
        mark s1-waiting
        expect "s1: B's blocking flock -x granted after A's release" 0 $L -w -m "$S/B.s1-granted" "$F" ex
        d=$(since B.s1-granted A.s1-releasing)
        figure flock-wake "$d"
        say "s1: B blocked $(waited)s; granted ${d}s after A released"
        within "s1: flock wake-up after A's release" "$d" 1.0
        barrier s1-done
        await A.s1b-held
        expect "s1: B's flock -n -s granted beside A's LOCK_SH" 0 $L "$F" sh
        expect "s1: B's flock -n -x refused while A holds LOCK_SH" 1 $L "$F" ex
        mark s1b-done
        barrier s1b-done-2
    fi
}

s2() {
    F=$D/range-file
    say "s2: fcntl byte ranges between the guests"
    if [ "$ROLE" = A ]; then
        expect "s2: A takes wr 0-99 and rd 200-299" 0 $L -m "$S/A.s2-held" -u "$S/B.s2-waiting" -t 3 -s "$S/A.s2-releasing" \
            "$F" wr:0:100 rd:200:100
        barrier s2-done
    else
        await A.s2-held
        expect "s2: wr 50-149 overlaps A's wr 0-99" 1 $L "$F" wr:50:100
        expect "s2: rd 99 overlaps A's wr 0-99" 1 $L "$F" rd:99:1
        expect "s2: wr 250-259 overlaps A's rd 200-299" 1 $L "$F" wr:250:10
        expect "s2: OFD wr 0 overlaps A's wr 0-99" 1 $L "$F" owr:0:1
        expect "s2: wr 100-199 is disjoint" 0 $L "$F" wr:100:100
        expect "s2: rd 250-259 beside A's rd 200-299" 0 $L "$F" rd:250:10
        expect "s2: wr 300-EOF is disjoint" 0 $L "$F" wr:300:0
        expect "s2: OFD wr 100-199 is disjoint" 0 $L "$F" owr:100:100
        expect "s2: F_GETLK wr 50-59 reports the conflict" 1 $L -g "$F" wr:50:10
        case $LAST_OUT in
            *"conflicts with wr lock at 0 len 100 pid 0") ok ;;
            *) bad "s2: F_GETLK answer: expected wr lock at 0 len 100 pid 0 (holder outside this guest), got: $LAST_OUT" ;;
        esac
        expect "s2: F_GETLK wr 100-199 finds no conflict" 0 $L -g "$F" wr:100:100
        mark s2-waiting
        expect "s2: B's blocking wr 0-299 granted after A's release" 0 $L -w -m "$S/B.s2-granted" "$F" wr:0:300
        d=$(since B.s2-granted A.s2-releasing)
        figure fcntl-wake "$d"
        say "s2: B blocked $(waited)s; granted ${d}s after A released"
        within "s2: fcntl wake-up after A's release" "$d" 1.0
        barrier s2-done
    fi
}

s3() {
    F=$D/host-file
    say "s3: the host holds locks"
    mark s3-ready
    await host.s3-held 120
    expect "s3: flock -n -x refused while the host holds LOCK_EX" 1 $L "$F" ex
    expect "s3: wr 0-9 refused while the host holds wr 0-99" 1 $L "$F" wr:0:10
    expect "s3: rd 50-59 refused while the host holds wr 0-99" 1 $L "$F" rd:50:10
    # Each guest takes its own range beside the host's: both run this step at
    # once, and a shared range would make them conflict with each other.
    case $ROLE in A) beside=100 ;; B) beside=200 ;; esac
    expect "s3: wr $beside-$((beside + 9)) beside the host's lock" 0 $L "$F" wr:$beside:10
    expect "s3: F_GETLK reports the host's lock" 1 $L -g "$F" wr:0:10
    case $LAST_OUT in
        *"conflicts with wr lock at 0 len 100 pid 0") ok ;;
        *) bad "s3: F_GETLK answer: expected wr lock at 0 len 100 pid 0, got: $LAST_OUT" ;;
    esac
    mark s3-waiting
    expect "s3: blocking flock -x + wr 0-99 granted after the host's release" 0 \
        $L -w -m "$S/$ROLE.s3-granted" "$F" ex wr:0:100
    d=$(since "$ROLE.s3-granted" host.s3-releasing)
    figure host-wake "$d"
    say "s3: blocked $(waited)s; granted ${d}s after the host released"
    within "s3: wake-up after the host's release" "$d" 2.0
    barrier s3-done
}

counter() {  # counter NAME KIND: N increments by each guest; prints the total
    C=$D/counter-$1
    barrier "s4-$1-go"
    expect "s4: $N increments under $2" 0 $L count "$C" "$N" "$2"
    say "s4: $LAST_OUT"
    figure "counter-$1-secs" "$(echo "$LAST_OUT" | sed -n 's/.* in \([0-9.]*\)s.*/\1/p')"
    barrier "s4-$1-end"
    TOTAL=$(cat "$C")
    figure "counter-$1" "$TOTAL"
    say "s4: counter under $2: $TOTAL (expected $((2 * N)) with working locks)"
}

s4() {
    say "s4: counters, $N increments per guest"
    counter flock flock
    [ "$TOTAL" = $((2 * N)) ] && ok || bad "s4: counter under flock ended at $TOTAL, not $((2 * N))"
    counter fcntl fcntl
    [ "$TOTAL" = $((2 * N)) ] && ok || bad "s4: counter under fcntl ended at $TOTAL, not $((2 * N))"
    counter none none
    say "s4: without locks: $TOTAL of $((2 * N)) ($(( 2 * N - TOTAL )) increments lost)"
}

s5() {
    F=$D/kill-file
    say "s5: kill -9 of guest A's QEMU while A holds locks"
    if [ "$ROLE" = A ]; then
        summary   # this guest does not come back
        $L -m "$S/A.s5-held" -t 120 "$F" ex wr:0:100
        bad "s5: A was not killed"
    else
        await A.s5-held
        expect "s5: flock -n -x refused while A holds it" 1 $L "$F" ex
        expect "s5: wr 0-9 refused while A holds wr 0-99" 1 $L "$F" wr:0:10
        mark s5-waiting
        expect "s5: blocking flock -x + wr 0-99 granted after A's QEMU was killed" 0 \
            $L -w -m "$S/B.s5-granted" "$F" ex wr:0:100
        d=$(since B.s5-granted host.s5-killing)
        figure kill-release "$d"
        say "s5: blocked $(waited)s; granted ${d}s after the host's kill -9 of A's QEMU"
        within "s5: locks freed after kill -9" "$d" 2.0
    fi
}

case $MODE in
    quick) s0; s1; s2; s3 ;;
    full) s0; s1; s2; s3; s4; s5 ;;
    cross) s0; s1; s2; s4 ;;
    counter) counter flock flock
             say "s4: under flock: $TOTAL of $((2 * N))" ;;
    *) abort "unknown mode $MODE" ;;
esac
finish
