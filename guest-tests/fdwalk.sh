#!/bin/sh
# A tree of more files than the daemon may hold fds: the host side runs the
# daemon at --rlimit-nofile=1024 and makes a 6,000-file tree (60 directories of 100) in
# $VFSD_SHARE/fdwalk-tree (without one, the guest makes it); the guest walks it (find),
# reads and stats every file, and creates 60 more, all while
# the default cache mode keeps every inode it has seen referenced. Nothing may fail with
# EMFILE ("Too many open files").
# Runs in the busybox guest: /guest-tests/fdwalk.sh [LABEL] [DIRS] [PER_DIR]
# Exit status: 0 if every check passed, 1 otherwise.

LABEL=${1:-}
NAME=fdwalk
. /guest-tests/lib.sh
DIRS=${2:-60}
PER=${3:-100}
D=${VFSD_SHARE:?VFSD_SHARE unset}/fdwalk.$$
START=$(date +%s)
progress() { echo "fdwalk: $* (t=$(( $(date +%s) - START ))s)"; }

if [ -d "$VFSD_SHARE/fdwalk-tree" ]; then
    # Made by the host before the boot (tests/guest/fdwalk.rs): nothing of it is known
    # to the guest yet.
    D=$VFSD_SHARE/fdwalk-tree
    progress "walking the host-made tree"
else
    mkdir -p "$D" || { echo "fdwalk: FAIL: cannot create $D"; exit 1; }
    chmod 0777 "$D"
    progress "making $((DIRS * PER)) files in $DIRS directories"
    errs=0
    d=0
    while [ $d -lt $DIRS ]; do
        mkdir "$D/d$d" || errs=$((errs + 1))
        f=0
        while [ $f -lt $PER ]; do
            echo "$d/$f" > "$D/d$d/f$f" 2>>"$D.err" || errs=$((errs + 1))
            f=$((f + 1))
        done
        d=$((d + 1))
    done
    check "files made without an error" 0 "$errs"
    [ -s "$D.err" ] && bad "create errors: $(sort "$D.err" | uniq -c | head -3 | tr '\n' ' ')"
fi
progress "walking"
n=$(find "$D" -type f 2>"$D.err" | wc -l)
check "find sees every file" $((DIRS * PER)) "$n"
[ -s "$D.err" ] && bad "find: $(head -c 200 "$D.err")"
n=$(find "$D" -type f -exec cat {} + 2>"$D.err" | wc -l)
check "every file read" $((DIRS * PER)) "$n"
[ -s "$D.err" ] && bad "cat: $(head -c 200 "$D.err")"
n=$(find "$D" -type f -exec stat -c %i {} + 2>"$D.err" | sort -u | wc -l)
check "every file stat'ed, each its own inode" $((DIRS * PER)) "$n"
check "file d7/f42 holds its own name" "7/42" "$(cat "$D/d7/f42")"
progress "creating more"
i=0
while [ $i -lt 60 ]; do
    echo new > "$D/new$i" 2>>"$D.err" || bad "create new$i: $(tail -n1 "$D.err")"
    i=$((i + 1))
done
# A rootless daemon maps only the guest's root (--uid-map=:0:UID:1:, libvirt's map for a
# user without subordinate ids): another guest user has no host id there.
if [ "$LABEL" != rootless ] && command -v su >/dev/null 2>&1; then
    su -s /bin/sh nobody -c "echo user > $D/by-nobody" && ok || bad "a non-root create failed"
fi
n=$(ls "$D" | wc -l)
extra=0; [ -e "$D/by-nobody" ] && extra=1
check "the new files are there" $((DIRS + 60 + extra)) "$n"
rm -rf "$D" "$D.err" || bad "rm -rf of the tree failed"
progress "done"
counts "$LABEL"
passed
