#!/bin/sh
# The guest's part of the upgrade-in-place test (tests/guest/upgrade.rs).
#
# Usage (in the guest): /guest-tests/upgrade.sh [LIMIT]
#   The host prepares $VFSD_SHARE/up/src.tar and src.sha256 (sha256sum of its
#   files), then upgrades vfsd in place several times while two workloads run, one
#   as root in up/root and one as user fsgqa (uid 1000) in up/user, each:
#   - a vfsd-lock process holding flock LOCK_EX and a POSIX write lock on 0-99 of
#     lock-file (the host probes them),
#   - unl, open on fds 6 (append) and 7 (read) and unlinked; a line through fd 6
#     every ten appends,
#   - fio: 4 KiB O_DIRECT random writes over 4 MiB, crc32c verified as it goes
#     (verify_backlog), rate-limited, stopped by a trigger file,
#   - src.tar untarred into tree.N every second or so, each checked with sha256sum -c,
#   - in the foreground, "N CENTISECONDS" appended to data.log, each line through a
#     new open, until the host creates up/host.done, then 20 more.
#   Each workload writes up/ROLE.ready once running.  After host.done: every line of
#   data.log and of the unlinked file there in order, fio's status and verify, the
#   untar rounds, the lock still held (another open file is refused), then released
#   (up/ROLE.released); the host probes the released lock and answers with
#   up/host.ROLE.probed.
#   LIMIT: seconds to wait for host.done (default 600).
#   Prints "upgrade[ROLE]: FIGURE ..." lines, "upgrade[ROLE]: N checks passed, M
#   failed" and "upgrade: PASS" or "upgrade: FAIL".  Exit status 0 on PASS.
#
#   /guest-tests/upgrade.sh -r ROLE LIMIT runs one workload (as the user it is to run as).

D=${VFSD_SHARE:?VFSD_SHARE unset}
UP=$D/up

if [ "$1" != -r ]; then
    LIMIT=${1:-600}
    cd "$UP" || { echo "upgrade: FAIL: no $UP (the host makes it)"; exit 1; }
    mkdir -p root user && chown 1000:1000 user || { echo "upgrade: FAIL: cannot make up/root and up/user"; exit 1; }
    "$0" -r root "$LIMIT" & rootpid=$!
    su -s /bin/sh fsgqa -c "VFSD_SHARE=$D $0 -r user $LIMIT" & userpid=$!
    wait $rootpid; rrc=$?
    wait $userpid; urc=$?
    if [ "$rrc" = 0 ] && [ "$urc" = 0 ]; then echo "upgrade: PASS"; exit 0; fi
    echo "upgrade: FAIL (root: $rrc, user: $urc)"
    exit 1
fi

ROLE=$2 LIMIT=$3
AFTER=20
T=/tmp/upgrade.$ROLE
NAME="upgrade[$ROLE]"
. /guest-tests/lib.sh
finish() {
    counts
    passed && [ "$PASS" -gt 0 ]
    exit $?
}
give_up() { : > "$UP/guest.abort"; finish; }

cd "$UP/$ROLE" || { bad "cannot enter $UP/$ROLE"; give_up; }
rm -rf "$T"; mkdir -p "$T" || { bad "cannot make $T"; give_up; }

# The lock, held until $T/release (guest-local: polling it sends no requests).
: > lock-file
vfsd-lock -q -m "$T/held" -u "$T/release" lock-file ex wr:0:100 & lockpid=$!
n=0
while [ ! -e "$T/held" ]; do
    n=$((n + 1)); [ $n -gt 300 ] && { bad "the locks were not granted within 30 s"; give_up; }
    usleep 100000
done

# The unlinked file.
{ echo before > unl && exec 6>>unl && exec 7<unl && rm unl; } ||
    { bad "setting up the unlinked file failed"; give_up; }

# fio, until $T/fio.stop.
cat > "$T/fio.job" <<EOF
[global]
directory=$UP/$ROLE
bs=4k
size=4m
verify=crc32c
verify_fatal=1
verify_backlog=16
time_based=1
runtime=$((LIMIT + 300))

[randwrite-verify]
filename=fio.dat
rw=randwrite
ioengine=libaio
iodepth=4
direct=1
rate_iops=50
EOF
fio --eta=never --trigger-file="$T/fio.stop" --aux-path="$T" --output="$T/fio.out" "$T/fio.job" \
    2>"$T/fio.err" & fiopid=$!
n=0
while [ $n -lt 300 ] && kill -0 $fiopid 2>/dev/null && [ ! -s fio.dat ]; do n=$((n + 1)); usleep 100000; done
sleep 1
kill -0 $fiopid 2>/dev/null || { wait $fiopid; bad "fio ended before the upgrades (status $?): $(tail -n 5 "$T/fio.out" "$T/fio.err" | tr '\n' ' ')"; give_up; }

# The untar rounds, until $T/untar.stop; each round's result in $T/untar.N.
(
    k=0
    while [ ! -e "$T/untar.stop" ]; do
        k=$((k + 1))
        if mkdir "tree.$k" && tar -xf ../src.tar -C "tree.$k" 2>"$T/untar.$k.err" &&
            (cd "tree.$k" && sha256sum -c -s ../../src.sha256) 2>>"$T/untar.$k.err"; then
            echo ok > "$T/untar.$k"
        else
            echo "bad: $(tr '\n' ' ' < "$T/untar.$k.err")" > "$T/untar.$k"
        fi
        sleep 1
    done
) & untarpid=$!

: > "$UP/$ROLE.ready"
say "ready: lock held, unl open and unlinked, fio (pid $fiopid) and the untar rounds running"

i=0 after=-1 u=0 t0=$(centis)
while :; do
    i=$((i + 1))
    now=$(centis)
    if ! echo "$i $now" >> data.log; then bad "append of line $i failed"; break; fi
    if [ $((i % 10)) = 0 ]; then
        u=$((u + 1))
        echo "u $u" >&6 || { bad "write $u through fd 6 of the unlinked file failed"; break; }
    fi
    if [ "$after" -lt 0 ]; then
        if [ -e ../host.done ]; then
            say "host.done seen at line $i"
            after=$AFTER
        elif [ -e ../host.abort ] || [ -e ../guest.abort ]; then
            bad "stopped at line $i: $(ls ../*.abort)"; break
        elif [ $(( (now - t0) / 100 )) -ge "$LIMIT" ]; then
            bad "no host.done after ${LIMIT}s"; : > ../guest.abort; break
        fi
    else
        after=$((after - 1))
        [ "$after" -le 0 ] && break
    fi
    usleep 50000
done

# The untar rounds and fio stop before the checks.
: > "$T/untar.stop"
wait $untarpid
fio_at_end=ended; kill -0 $fiopid 2>/dev/null && fio_at_end=running
: > "$T/fio.stop"
n=0
while kill -0 $fiopid 2>/dev/null && [ $n -lt 600 ]; do n=$((n + 1)); usleep 100000; done
kill -0 $fiopid 2>/dev/null && { bad "fio did not end within 60 s of its stop"; kill -9 $fiopid; }
wait $fiopid; frc=$?
[ "$fio_at_end" = running ] && ok || bad "fio had ended before host.done"
[ "$frc" = 0 ] && ok || bad "fio: exit status $frc: $(tail -n 5 "$T/fio.err" | tr '\n' ' ')"
if grep -qiE 'verify fail|bad magic|bad header|verify:.*bad|err= *[1-9]' "$T/fio.out" "$T/fio.err"; then
    bad "fio: $(grep -hiE 'verify|err= *[1-9]|expected|received' "$T/fio.out" "$T/fio.err" | head -n 8 | tr '\n' ' ')"
else ok; fi
writes=$(awk '/^ *write: IOPS=/ { l = $0; sub(/^ *write: /, "", l); sub(/ \(.*$/, "", l); print l; exit }' "$T/fio.out")
say "FIGURE fio randwrite-verify $writes"

# data.log: "N CENTIS" for N = 1..i, in order; the largest gap between two appends.
res=$(awk -v n="$i" '$1 != NR { printf "line %d is \"%s\"", NR, $0; bad = 1; exit }
    NR > 1 && $2 - prev > gap { gap = $2 - prev; at = NR } { prev = $2 }
    END { if (bad) exit; if (NR != n) printf "%d lines, expected %d", NR, n; else printf "GAP %d %d", gap * 10, at }' data.log 2>&1)
case $res in
    GAP*) ok; set -- $res; say "FIGURE lines $i, largest gap between appends $2 ms (before line $3)" ;;
    *) bad "data.log: $res" ;;
esac

# The unlinked file: "before", then "u 1" .. "u $u", read through fd 7.
res=$(awk -v n="$u" 'NR == 1 && $0 != "before" { print "line 1 is \"" $0 "\""; bad = 1; exit }
    NR > 1 && $0 != "u " (NR - 1) { print "line " NR " is \"" $0 "\""; bad = 1; exit }
    END { if (!bad && NR != n + 1) print NR " lines, expected " n + 1 }' <&7 2>&1)
[ -z "$res" ] && ok || bad "the unlinked file through fd 7: $res"
exec 6>&- 7<&-
say "FIGURE unlinked file: $u writes through its fd"

# Every untar round completed and matched src.sha256.
rounds=0
for r in "$T"/untar.[0-9]*; do
    case $r in *.err) continue ;; esac
    rounds=$((rounds + 1))
    [ "$(cat "$r")" = ok ] || bad "untar round ${r##*.}: $(cat "$r")"
done
[ "$rounds" -gt 0 ] && ok || bad "no untar round ran"
say "FIGURE untar rounds $rounds"

# The lock: still there for another open file, then released.
kill -0 $lockpid 2>/dev/null && ok || bad "the lock holder died"
vfsd-lock -q lock-file ex; rc=$?
[ "$rc" = 1 ] && ok || bad "flock ex by another open file: expected busy (1), got $rc"
vfsd-lock -q lock-file wr:50:10; rc=$?
[ "$rc" = 1 ] && ok || bad "POSIX wr 50-59 by another process: expected busy (1), got $rc"
: > "$T/release"
wait $lockpid; rc=$?
[ "$rc" = 0 ] && ok || bad "the lock holder exited with $rc"
: > "$UP/$ROLE.released"
n=0
while [ ! -e "$UP/host.$ROLE.probed" ] && [ ! -e "$UP/host.abort" ]; do
    n=$((n + 1)); [ $n -gt 600 ] && { bad "no host.$ROLE.probed within 60 s"; break; }
    usleep 100000
done
finish
