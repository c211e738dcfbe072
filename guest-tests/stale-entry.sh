#!/bin/sh
# A name the guest holds a negative entry for, made meanwhile by someone else (here
# through the second mount of the same host directory, which the first mount's entry
# knows nothing of): an open with O_CREAT of the name opens the file that is there, with
# the checks an open of an existing file gets, as on a local file system. Root appends
# to it; nobody gets EACCES on root's 0600 file and truncates nothing.
# Usage: /guest-tests/stale-entry.sh A B   (two mounts of one host directory)
# Prints "stale-entry: N checks passed, M failed"; exits 1 if any check failed.
A=${1:?usage: stale-entry.sh A B}
B=${2:?usage: stale-entry.sh A B}
NAME=stale-entry
. /guest-tests/lib.sh

T=stale-entry.$$
mkdir "$A/$T" && chmod 0777 "$A/$T" || { echo "stale-entry: FAIL: cannot make $A/$T"; exit 1; }
# Negative entries on A, for root and for nobody.
for f in secret shared; do
    [ -e "$A/$T/$f" ] && bad "$f exists before it is made"
    nobody "[ -e $A/$T/$f ]" && bad "$f exists for nobody before it is made"
done
printf "root's data" > "$B/$T/secret" && chmod 0600 "$B/$T/secret"
printf "root's data" > "$B/$T/shared" && chmod 0666 "$B/$T/shared"

if nobody "echo nobody > $A/$T/secret" 2>/dev/null; then
    bad "nobody opened root's 0600 file for writing through a stale entry"
else
    ok
fi
check "root's 0600 file after nobody's attempt" "root's data" "$(cat "$B/$T/secret")"
nobody "echo ' and nobody' >> $A/$T/shared" || bad "nobody cannot append to a 0666 file through a stale entry"
check "the 0666 file after nobody's append" "root's data and nobody" "$(cat "$B/$T/shared")"
echo " and root" >> "$A/$T/secret" || bad "root cannot append through a stale entry"
check "root's 0600 file after root's append" "root's data and root" "$(cat "$B/$T/secret")"

rm -rf "${A:?}/$T"
counts
passed
