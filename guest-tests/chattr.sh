#!/bin/sh
# chattr/lsattr from a real guest kernel (FUSE_IOCTL: FS_IOC_GETFLAGS/SETFLAGS).
#
# 1. Root sets and reads +d (nodump) on a file and a directory.
# 2. Root sets +i: writing, appending and removing fail with EPERM; after -i writes work.
# 3. Root sets +a: appending works, overwriting fails with EPERM.
# 4. User nobody may set +d on its own file, but not +i or +a (no CAP_LINUX_IMMUTABLE),
#    and may change nothing on root's file: EPERM, as on a local ext4.
#
# Needs chattr and lsattr in the guest (the initramfs carries e2fsprogs' from the host),
# and vfsd with CAP_LINUX_IMMUTABLE for root's +i/+a (in vfsd's default set).
# Runs in $VFSD_SHARE: /guest-tests/chattr.sh [LABEL]; guest-tests/features.sh runs it.
# Exit status: 0 if every check passed, 1 otherwise.

LABEL=${1:-}
NAME=chattr
. /guest-tests/lib.sh
DIR=${VFSD_SHARE:?VFSD_SHARE unset}
T=$DIR/chattr.$$
# The attribute letters of PATH (the first word of lsattr -d).
attrs() { lsattr -d "$1" 2>/dev/null | { read -r a _ && echo "$a"; }; }
# has PATH LETTER: yes if lsattr shows the attribute.
has() { case $(attrs "$1") in *"$2"*) echo yes ;; *) echo no ;; esac; }
# eperm AS COMMAND: the command must fail with "Operation not permitted".
eperm() {
    if [ "$1" = root ]; then out=$(sh -c "$2" 2>&1); else out=$(nobody "$2" 2>&1); fi
    rc=$?
    case $out in
        *"Operation not permitted"*) [ "$rc" != 0 ] && ok || bad "'$2' as $1: status 0 with '$out'" ;;
        *) bad "'$2' as $1: expected EPERM, got status $rc: '$out'" ;;
    esac
}
# run AS COMMAND: the command must succeed.
run() {
    if [ "$1" = root ]; then out=$(sh -c "$2" 2>&1); else out=$(nobody "$2" 2>&1); fi
    rc=$?
    if [ "$rc" = 0 ]; then ok; else bad "'$2' as $1 failed ($rc): $out"; fi
}

for tool in chattr lsattr su; do
    command -v $tool >/dev/null 2>&1 || {
        echo "chattr: FAIL: no $tool in this guest (busybox without the applet? run chrooted into a userland with e2fsprogs)"
        echo "chattr: 0 checks passed, 1 failed${LABEL:+ ($LABEL)}"
        exit 1
    }
done

rm -rf "$T"
mkdir "$T" && chmod 0777 "$T" || { echo "chattr: FAIL: cannot create $T"; exit 1; }
F=$T/f
A=$T/a
D=$T/d
echo data > "$F"
echo data > "$A"
mkdir "$D"

# 1. +d on a file and a directory.
run root "chattr +d $F"
check "+d on a file" yes "$(has "$F" d)"
run root "chattr +d $D"
check "+d on a directory" yes "$(has "$D" d)"
run root "chattr -d $F $D"
check "-d on a file" no "$(has "$F" d)"
check "-d on a directory" no "$(has "$D" d)"

# 2. +i.
if chattr +i "$F" 2>/dev/null; then
    ok
    check "+i" yes "$(has "$F" i)"
    eperm root "echo x > $F"
    eperm root "echo x >> $F"
    eperm root "rm -f $F"
    eperm root "touch $T/d2 && chattr +i $D && touch $D/new"
    chattr -i "$D" 2>/dev/null
    run root "chattr -i $F"
    check "-i" no "$(has "$F" i)"
    run root "echo rewritten > $F"
    check "content after -i" rewritten "$(cat "$F")"
else
    bad "root cannot set +i: vfsd lacks CAP_LINUX_IMMUTABLE (was it started with --modcaps=-linux_immutable?)"
fi

# 3. +a.
if chattr +a "$A" 2>/dev/null; then
    ok
    check "+a" yes "$(has "$A" a)"
    run root "echo more >> $A"
    eperm root "echo over > $A"
    check "content of +a file" "data
more" "$(cat "$A")"
    run root "chattr -a $A"
    check "-a" no "$(has "$A" a)"
else
    bad "root cannot set +a: vfsd lacks CAP_LINUX_IMMUTABLE (was it started with --modcaps=-linux_immutable?)"
fi

# 4. nobody.
N=$T/n
run nobody "echo mine > $N"
run nobody "chattr +d $N"
check "+d by nobody on its file" yes "$(has "$N" d)"
eperm nobody "chattr +i $N"
check "+i refused to nobody" no "$(has "$N" i)"
eperm nobody "chattr +a $N"
eperm nobody "chattr +d $F"
check "nobody changed nothing on root's file" no "$(has "$F" d)"
run nobody "lsattr -d $F"

chattr -i -a "$F" "$A" "$D" "$N" 2>/dev/null
rm -rf "$T"
counts "$LABEL"
passed
