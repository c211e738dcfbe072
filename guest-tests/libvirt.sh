#!/bin/sh
# The guest's part of the libvirt tests (tests/guest/libvirt.rs):
# run in a domain libvirt starts, in $VFSD_SHARE/lv, where the host put a static vfsd-lock.
# Usage: /guest-tests/libvirt.sh MODE AFTER LIMIT
#   write  open data.log once and write "line N" through that fd every 100 ms (holding a
#          flock and a POSIX lock, each in a vfsd-lock of the share's lv/, when lv/hold-locks
#          exists), guest.ready after AFTER lines; once the host creates host.restored (after
#          a save and restore, say), 20 more lines, then check the fd still names data.log,
#          the same inode, every line there once and in order, and a create; release the
#          locks once the host creates lv/release
#   locks  take the two locks and wait for lv/release
#   mount  the share is usable
# Writes "PASS|FAIL N M ..." to lv/guest.result and prints "lv: N checks passed, M failed".
MODE=$1 AFTER=${2:-20} LIMIT=${3:-3000}
D=$VFSD_SHARE/lv
cd "$D" || { echo "lv: FAIL no $D"; exit 1; }
NAME=lv
. /guest-tests/lib.sh
finish() {
    counts
    if [ "$FAIL" = 0 ] && [ "$PASS" -gt 0 ]; then r=PASS; else r=FAIL; fi
    say "$r"
    echo "$r $PASS $FAIL $*" > guest.result.tmp && mv guest.result.tmp guest.result
    exit 0
}
take_locks() {  # a flock and a POSIX lock, each held by a vfsd-lock until lv/release exists
    rm -f flock.held posix.held release
    : > flockf; : > posixf
    ./vfsd-lock -q -m flock.held -u release flockf ex & p1=$!
    ./vfsd-lock -q -m posix.held -u release posixf wr:0:0 & p2=$!
    k=0
    while [ ! -e flock.held ] || [ ! -e posix.held ]; do
        k=$((k + 1)); [ $k -gt 300 ] && { bad "locks not taken in 30 s"; break; }
        usleep 100000
    done
    echo "lv: holding flock and POSIX lock"
}
release_locks() {  # wait for the holders (the host creates lv/release after its checks)
    wait $p1 || bad "flock holder exited $?"
    wait $p2 || bad "POSIX lock holder exited $?"
    ok
}
case $MODE in
write)
    rm -f data.log host.restored guest.result
    [ -e hold-locks ] && take_locks
    exec 3>data.log || { bad "open data.log"; finish; }
    ino=$(stat -c %i data.log)
    i=0
    echo "lv: ready, data.log inode $ino"
    while [ ! -e host.restored ]; do
        i=$((i + 1)); echo "line $i" >&3 || bad "write line $i"
        [ "$i" = "$AFTER" ] && : > guest.ready
        [ $((i % 50)) = 0 ] && echo "lv: wrote $i lines"
        [ "$i" -ge "$LIMIT" ] && { bad "no host.restored after $i lines"; finish; }
        usleep 100000
    done
    pre=$i
    echo "lv: host.restored seen after line $pre"
    j=0
    while [ $j -lt 20 ]; do
        i=$((i + 1)); j=$((j + 1)); echo "line $i" >&3 || bad "write line $i after"
        usleep 100000
    done
    fdname=$(readlink /proc/$$/fd/3)
    if [ "$fdname" = "$D/data.log" ]; then ok; else bad "fd 3 is '$fdname', not $D/data.log"; fi
    if [ "$(stat -c %i data.log)" = "$ino" ]; then ok; else bad "data.log inode changed"; fi
    n=$(wc -l < data.log)
    if [ "$n" = "$i" ]; then ok; else bad "data.log has $n lines, wrote $i"; fi
    if awk '$0 != "line " NR { print "lv: line " NR " is \"" $0 "\""; e = 1 } END { exit e }' data.log; then ok
    else bad "data.log is not line 1..$i in order"; fi
    exec 3>&-
    echo post > post.txt && [ "$(cat post.txt)" = post ] && ok || bad "create/read after restore"
    [ -e hold-locks ] && release_locks
    finish "lines=$i before=$pre"
    ;;
locks)
    rm -f guest.result
    take_locks
    release_locks
    finish
    ;;
mount)
    ls -la "$VFSD_SHARE" >/dev/null && echo mounted > mounted.txt && ok || bad "share not usable"
    finish "lv-owner=$(stat -c %u:%g .) mounted.txt-owner=$(stat -c %u:%g mounted.txt)"
    ;;
esac
