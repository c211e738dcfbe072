#!/bin/sh
# A program running from a file keeps the file whole: open(O_RDONLY|O_TRUNC) of it fails
# with ETXTBSY and changes nothing, as on a local file system, for root and for user
# nobody owning the file; once the program has ended the same open truncates it. Each DIR
# is checked (shares, and the guest's /tmp as the local file system to match).
# Usage: /guest-tests/running-program.sh DIR...
# Prints "running-program: N checks passed, M failed"; exits 1 if any check failed.
NAME=running-program
. /guest-tests/lib.sh
as_user() { if [ "$1" = root ]; then sh -c "$2"; else su -s /bin/sh nobody -c "$2"; fi; }
size() { stat -c %s "$1"; }
SRC=$(which sleep)

for d in "$@"; do
    T=$d/running-program.$$
    mkdir -p "$T" && chmod 1777 "$T" || { bad "cannot make $T"; continue; }
    for u in root nobody; do
        P=$T/prog-$u
        as_user $u "cp $SRC $P && chmod 755 $P" || { bad "$u cannot copy a program to $P"; continue; }
        # Not through as_user: $! must be the program's pid (su and sh exec it).
        if [ $u = root ]; then sh -c "exec $P 120" & else su -s /bin/sh nobody -c "exec $P 120" & fi
        pid=$!
        # Until the program runs.
        n=0
        while [ "$(readlink /proc/$pid/exe 2>/dev/null)" != "$P" ] && [ $n -lt 200 ]; do
            sleep 0.05
            n=$((n + 1))
        done
        [ "$(readlink /proc/$pid/exe 2>/dev/null)" = "$P" ] || bad "$P did not start as $u"
        got=$(as_user $u "vfsd-newops open-trunc $P")
        if [ "$got" = ETXTBSY ]; then ok; else bad "$u's O_RDONLY|O_TRUNC open of the running $P: expected ETXTBSY, got '$got'"; fi
        if cmp -s "$SRC" "$P"; then ok; else bad "the running $P changed: $(size "$P") bytes, $(size "$SRC") before"; fi
        kill "$pid"
        wait "$pid" 2>/dev/null
        got=$(as_user $u "vfsd-newops open-trunc $P")
        if [ "$got" = opened ] && [ "$(size "$P")" = 0 ]; then ok; else bad "$u's O_RDONLY|O_TRUNC open of the ended $P: got '$got', $(size "$P") bytes left"; fi
    done
    rm -rf "$T"
done
counts
passed
