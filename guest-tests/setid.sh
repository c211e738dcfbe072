#!/bin/sh
# Set-id bits and non-root creates, from a real guest kernel.
#
# 1. Guest root makes a file mode 06777 in a 0777 directory. User nobody then appends,
#    writes 4 KiB with O_DIRECT, writes through the page cache, truncates, opens with
#    O_TRUNC and fallocates; after each the mode must be 0777 (S_ISUID gone, S_ISGID gone as
#    group-exec is set), as on a local file system. S_ISGID without group-exec
#    stays only when nobody is in the file's group (the host kernel's
#    setattr_should_drop_sgid). Root's own writes keep 06777.
# 2. nobody can mkdir, touch, mkfifo, ln -s, ln and mv in a 0777 subdirectory
#    (these failed with EPERM under --inode-file-handles mandatory/prefer).
#
# Runs in the busybox guest: /guest-tests/setid.sh [LABEL] in $VFSD_SHARE; the daemon's
# cache and file-handle modes are chosen on the host (tests/guest/setid.rs boots it once per
# combination); LABEL only names them in the output.
# Exit status: 0 if every check passed, 1 otherwise.

LABEL=${1:-}
NAME=setid
. /guest-tests/lib.sh
DIR=${VFSD_SHARE:?VFSD_SHARE unset}
T=$DIR/setid.$$
run_as() {  # run_as USER DESCRIPTION COMMAND: the command must succeed
    if [ "$1" = root ]; then sh -c "$3"; else nobody "$3"; fi
    rc=$?
    if [ "$rc" = 0 ]; then ok; else bad "$2: '$3' as $1 failed with status $rc"; fi
}
mode() { stat -c %a "$1"; }

rm -rf "$T"
mkdir "$T" && chmod 0777 "$T" || { echo "setid: FAIL: cannot create $T"; exit 1; }
F=$T/f

# fresh MODE: a root-owned file of 8 KiB with MODE
fresh() {
    rm -f "$F"
    dd if=/dev/zero of="$F" bs=4096 count=2 2>/dev/null
    chmod "$1" "$F"
    check "root sets $1" "${1#0}" "$(mode "$F")"
}

# Each data change, as a shell command on $F.
OPS="append|echo appended >> $F
direct write|dd if=/dev/zero of=$F bs=4096 count=1 oflag=direct conv=notrunc 2>/dev/null
buffered write|dd if=/dev/zero of=$F bs=4096 count=1 seek=1 conv=notrunc 2>/dev/null
truncate|truncate -s 100 $F
O_TRUNC open|: > $F
fallocate|fallocate -l 65536 $F"

IFS_SAVE=$IFS
IFS='
'
for op in $OPS; do
    name=${op%%|*}
    cmd=${op#*|}
    IFS=$IFS_SAVE
    fresh 06777
    run_as nobody "$name" "$cmd"
    check "$name by nobody clears S_ISUID and S_ISGID" 777 "$(mode "$F")"
    # S_ISGID without group-exec: kept only for a member of the file's group.
    fresh 06767
    run_as nobody "$name" "$cmd"
    check "$name by nobody (not in the group) clears S_ISUID and S_ISGID without group-exec" 767 "$(mode "$F")"
    fresh 06767
    chgrp 65534 "$F" && chmod 06767 "$F"
    run_as nobody "$name" "$cmd"
    check "$name by nobody (in the group) clears S_ISUID, keeps S_ISGID without group-exec" 2767 "$(mode "$F")"
    fresh 06777
    run_as root "$name" "$cmd"
    check "$name by root keeps both" 6777 "$(mode "$F")"
    IFS='
'
done
IFS=$IFS_SAVE

# 2. Creates by nobody in a subdirectory.
S=$T/sub
mkdir "$S" && chmod 0777 "$S"
run_as nobody "mkdir" "mkdir $S/d"
run_as nobody "touch" "touch $S/f"
run_as nobody "mkfifo" "mkfifo $S/p"
run_as nobody "symlink" "ln -s f $S/s"
run_as nobody "hard link" "ln $S/f $S/h"
run_as nobody "rename" "mv $S/f $S/g"
run_as nobody "create in the new directory" "echo x > $S/d/x"
check "owner of the new entries" "65534:65534 65534:65534 65534:65534 65534:65534 65534:65534" \
    "$(stat -c %u:%g "$S/d" "$S/g" "$S/p" "$S/d/x" "$S/h" | tr '\n' ' ' | sed 's/ $//')"
check "types" "directory fifo symbolic link" \
    "$(stat -c %F "$S/d" "$S/p" "$S/s" | tr '\n' ' ' | sed 's/ $//')"
check "hard link count" 2 "$(stat -c %h "$S/g")"
check "renamed away" no "$([ -e "$S/f" ] && echo yes || echo no)"
run_as nobody "remove" "rm -r $S/d $S/g $S/h $S/p $S/s"

rm -rf "$T"
counts "$LABEL"
passed
