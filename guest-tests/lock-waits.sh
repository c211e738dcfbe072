#!/bin/sh
# Lock waits never take a request queue: while a host process holds an exclusive flock on
# the share's f, 1,024 flock waits (vfsd-lock -w f ex) run as nobody on one vCPU (the guest has one
# request queue). Half the queue's entries may wait; the rest are refused at once
# (ENOLCK), so a stat and an ls of other names are answered within 10 s, and once the
# host lets go every waiter gets the lock and ends.
# Usage: /guest-tests/lock-waits.sh MOUNT   (MOUNT/sync/host.held: the host holds the lock;
#        the script writes MOUNT/sync/guest.checked, then the host lets go)
# Prints "lock-waits: N checks passed, M failed"; exits 1 if any check failed.
M=${1:?usage: lock-waits.sh MOUNT}
N=1024
SHARE=512 # half of the queue's 1,024 entries
NAME=lock-waits
. /guest-tests/lib.sh
S=$M/sync
for _ in $(seq 600); do [ -e "$S/host.held" ] && break; sleep 1; done
[ -e "$S/host.held" ] || { echo "lock-waits: FAIL: the host never took the lock"; exit 1; }
mkdir -p "$M/other-dir" && echo other > "$M/other-dir/file"
R=/tmp/lock-waits
rm -rf "$R" && mkdir -m 0777 "$R"
# Each waiter leaves its flock's exit status in R when it ends.
PIN=; command -v taskset >/dev/null && PIN="taskset -c 0"
su -s /bin/sh nobody -c "
    i=0
    while [ \$i -lt $N ]; do
        ( $PIN vfsd-lock -w -q $M/f ex 2>/dev/null; echo \$? > $R/\$i ) &
        i=\$((i + 1))
    done
" &
# Every waiter has either ended (refused) or sits in a FUSE request wait.
waiting=0
for _ in $(seq 300); do
    done_n=$(ls "$R" | wc -l)
    waiting=$(grep -l request_wait_answer /proc/[0-9]*/wchan 2>/dev/null | wc -l)
    [ $((done_n + waiting)) -ge "$N" ] && break
    sleep 1
done
echo "lock-waits: $waiting waiting, $done_n refused of $N"
if [ "$waiting" -le "$SHARE" ] && [ "$waiting" -gt 0 ]; then ok; else bad "$waiting waits (at most $SHARE, at least one)"; fi
# vfsd-lock exits 2 on an error other than a busy lock: ENOLCK here.
refused_ok=$(cat "$R"/* 2>/dev/null | grep -cx 2)
[ "$refused_ok" -eq "$done_n" ] && [ "$done_n" -ge $((N - SHARE)) ] && ok ||
    bad "$done_n ended before the host let go, $refused_ok of them refused (exit 2)"
# Other requests on the same queue, as root: answered while the waits last. Run in the
# background, since a request that never gets a queue entry can't be killed.
rm -f /tmp/stat.ok /tmp/ls.ok
( $PIN stat "$M/other-dir/file" >/dev/null && touch /tmp/stat.ok ) &
( $PIN ls "$M/other-dir" >/dev/null && touch /tmp/ls.ok ) &
for _ in $(seq 10); do [ -e /tmp/stat.ok ] && [ -e /tmp/ls.ok ] && break; sleep 1; done
[ -e /tmp/stat.ok ] && ok || bad "a stat of another file was not answered within 10 s"
[ -e /tmp/ls.ok ] && ok || bad "an ls of another directory was not answered within 10 s"
touch "$S/guest.checked"
# The host lets go: every waiter gets the lock in turn and ends with status 0.
for _ in $(seq 300); do [ "$(ls "$R" | wc -l)" -ge "$N" ] && break; sleep 1; done
total=$(ls "$R" | wc -l)
granted=$(cat "$R"/* 2>/dev/null | grep -cx 0)
echo "lock-waits: after the host let go: $total of $N ended, $granted got the lock"
[ "$total" -eq "$N" ] && ok || bad "$((N - total)) waiters never ended after the host let go"
[ "$granted" -eq "$((N - done_n))" ] && ok || bad "$granted waiters got the lock, $((N - done_n)) waited for it"
rm -rf "$R" "$M/other-dir"
counts
passed
