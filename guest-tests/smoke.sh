#!/bin/sh
# Basic file system operations on a virtiofs share, checked one by one.
# Runs in the busybox guest: /guest-tests/smoke.sh [DIR] (default $VFSD_SHARE).
# Leaves DIR/smoke-keep/ and DIR/smoke-manifest.md5 behind so the host can
# check that the data really reached the shared directory (md5sum -c, plus
# smoke-keep/sparse: 4101 MiB long, its last MiB equal to random-1m).
# SMOKE_BLOCKS=size: the host file system counts a file's blocks from its size, holes
# or not (CephFS); the sparse file's st_blocks is then checked against that.
# Exit status: 0 if every check passed, 1 otherwise.

DIR=${1:-${VFSD_SHARE:?no directory given and VFSD_SHARE unset}}
T=$DIR/smoke.$$
NAME=smoke
. /guest-tests/lib.sh

# run DESCRIPTION CMD... : the command must succeed
run() {
    d=$1; shift
    if "$@"; then ok; else bad "$d: '$*' failed with status $?"; fi
}
# fails DESCRIPTION CMD... : the command must fail
fails() {
    d=$1; shift
    if "$@" 2>/dev/null; then bad "$d: '$*' succeeded but should fail"; else ok; fi
}
START=$(date +%s)
section() { echo "smoke: -- $* (t=$(( $(date +%s) - START ))s)"; }

rm -rf "$T"
mkdir "$T" || { echo "smoke: FAIL: cannot create $T"; exit 1; }
cd "$T" || exit 1

section "create, write, read"
echo "hello virtio-fs" > a
check "read back" "hello virtio-fs" "$(cat a)"
printf 'line2\n' >> a
check "append" "2" "$(wc -l < a | tr -d ' ')"
dd if=/dev/urandom of=/tmp/rand1m bs=64k count=16 2>/dev/null
cp /tmp/rand1m data1m
check "1 MiB copy md5" "$(md5sum < /tmp/rand1m)" "$(md5sum < data1m)"
check "size" 1048576 "$(stat -c %s data1m)"
# overwrite a range in the middle without truncating
printf 'XYZ' | dd of=data1m bs=1 seek=4096 conv=notrunc 2>/dev/null
check "pwrite middle" "XYZ" "$(dd if=data1m bs=1 skip=4096 count=3 2>/dev/null)"
check "size unchanged after pwrite" 1048576 "$(stat -c %s data1m)"
sync
run "sync" true
fails "open missing file" cat does-not-exist
: > empty
check "empty file size" 0 "$(stat -c %s empty)"

section "mkdir, rmdir, readdir"
run "mkdir -p" mkdir -p d1/d2/d3
check "dir type" "directory" "$(stat -c %F d1/d2)"
fails "mkdir existing" mkdir d1
fails "rmdir non-empty" rmdir d1
run "rmdir empty" rmdir d1/d2/d3
check "rmdir gone" "no" "$([ -e d1/d2/d3 ] && echo yes || echo no)"
: > d1/f1; : > d1/f2; mkdir d1/sub
check "readdir small" "d2 f1 f2 sub" "$(ls d1 | tr '\n' ' ' | sed 's/ $//')"
check "dir nlink" 4 "$(stat -c %h d1)"

section "rename"
echo one > r1
run "rename file" mv r1 r2
check "old name gone" "no" "$([ -e r1 ] && echo yes || echo no)"
check "new name content" "one" "$(cat r2)"
echo two > r3
run "rename over existing" mv -f r2 r3
check "replaced content" "one" "$(cat r3)"
run "rename across dirs" mv r3 d1/sub/r4
check "moved content" "one" "$(cat d1/sub/r4)"
run "rename dir" mv d1 d1renamed
check "renamed dir content" "one" "$(cat d1renamed/sub/r4)"
mkdir e1; : > e1/x
mkdir e2
fails "rename dir over non-empty dir" mv -T e2 e1

section "symlink"
run "symlink" ln -s a link-a
check "readlink" "a" "$(readlink link-a)"
check "read through symlink" "hello virtio-fs" "$(head -n1 link-a)"
check "lstat type" "symbolic link" "$(stat -c %F link-a)"
run "dangling symlink" ln -s /nonexistent/target dangling
check "dangling readlink" "/nonexistent/target" "$(readlink dangling)"
fails "follow dangling" cat dangling
LONG=$(printf '%0200d' 0 | tr 0 x)
run "long symlink target" ln -s "$LONG/$LONG" longlink
check "long readlink" "$LONG/$LONG" "$(readlink longlink)"

section "hardlink"
echo shared > h1
run "link" ln h1 h2
check "nlink 2" 2 "$(stat -c %h h1)"
check "same inode" "$(stat -c %i h1)" "$(stat -c %i h2)"
echo more >> h2
check "write via other name" "shared more" "$(cat h1 | tr '\n' ' ' | sed 's/ $//')"
run "unlink one" rm h1
check "nlink back to 1" 1 "$(stat -c %h h2)"
fails "hardlink a directory" ln d1renamed dlink

section "chmod, chown, timestamps"
: > perm
run "chmod 0751" chmod 0751 perm
check "mode" 751 "$(stat -c %a perm)"
run "chmod 4755 (setuid)" chmod 4755 perm
check "setuid mode" 4755 "$(stat -c %a perm)"
run "chown 1000:1000" chown 1000:1000 perm
check "owner" "1000:1000" "$(stat -c %u:%g perm)"
run "chown 65534:65534" chown 65534:65534 perm
check "owner nobody" "65534:65534" "$(stat -c %u:%g perm)"
run "chgrp 0" chgrp 0 perm
check "group" "65534:0" "$(stat -c %u:%g perm)"
run "set mtime" touch -d '2001-02-03 04:05:06' perm
check "mtime" "2001-02-03 04:05:06" "$(date -d "@$(stat -c %Y perm)" '+%Y-%m-%d %H:%M:%S')"
# permission enforcement as an unprivileged user
echo secret > private; chmod 600 private
fails "read 0600 file as uid 1000" su -s /bin/sh fsgqa -c "cat $T/private"
chmod 644 private
check "read 0644 file as uid 1000" "secret" "$(su -s /bin/sh fsgqa -c "cat $T/private")"
fails "write 0644 file as uid 1000" su -s /bin/sh fsgqa -c "echo x > $T/private"

section "truncate"
printf '0123456789' > tr
run "truncate shrink" truncate -s 4 tr
check "shrunk content" "0123" "$(cat tr)"
run "truncate extend" truncate -s 8192 tr
check "extended size" 8192 "$(stat -c %s tr)"
check "extended tail is zero" "$(dd if=/dev/zero bs=4096 count=1 2>/dev/null | md5sum)" \
    "$(dd if=tr bs=4096 skip=1 count=1 2>/dev/null | md5sum)"
run "truncate to 0" truncate -s 0 tr
check "zero size" 0 "$(stat -c %s tr)"

section "large sparse file (> 4 GiB)"
dd if=/dev/urandom of=/tmp/blk bs=64k count=16 2>/dev/null
# 1 MiB of data at 5 GiB, and another at 4 GiB - 512 KiB (straddling 4 GiB)
run "write at 5 GiB" dd if=/tmp/blk of=big bs=1M seek=5120 conv=notrunc 2>/dev/null
run "write across 4 GiB" dd if=/tmp/blk of=big bs=512k seek=8191 conv=notrunc 2>/dev/null
check "size" $((5121 * 1048576)) "$(stat -c %s big)"
check "data at 5 GiB" "$(md5sum < /tmp/blk)" "$(dd if=big bs=1M skip=5120 count=1 2>/dev/null | md5sum)"
check "data across 4 GiB" "$(md5sum < /tmp/blk)" "$(dd if=big bs=512k skip=8191 count=2 2>/dev/null | md5sum)"
check "hole reads zeros" "$(dd if=/dev/zero bs=1M count=1 2>/dev/null | md5sum)" \
    "$(dd if=big bs=1M skip=100 count=1 2>/dev/null | md5sum)"
blocks=$(stat -c %b big); bsz=$(stat -c %B big)
if [ "${SMOKE_BLOCKS:-}" = size ]; then
    # The host file system reports st_blocks from the size, holes or not (CephFS):
    # then the guest must see exactly that figure.
    check "blocks from the size (SMOKE_BLOCKS=size)" $(((5121 * 1048576 + bsz - 1) / bsz)) "$blocks"
elif [ $((blocks * bsz)) -lt $((64 * 1048576)) ]; then ok; else bad "big file is not sparse: $blocks blocks of $bsz"; fi
run "truncate big to 6 GiB" truncate -s 6G big
check "6 GiB size" 6442450944 "$(stat -c %s big)"
check "data kept after extend" "$(md5sum < /tmp/blk)" "$(dd if=big bs=1M skip=5120 count=1 2>/dev/null | md5sum)"
run "truncate big to 4 GiB + 1" truncate -s 4294967297 big
check "4 GiB + 1 size" 4294967297 "$(stat -c %s big)"
rm -f big /tmp/blk

section "xattr"
if command -v vfsd-xattr >/dev/null; then
    : > xf
    if vfsd-xattr set xf user.vfsd hello 2>/tmp/xerr; then
        ok
        check "getxattr" "hello" "$(vfsd-xattr get xf user.vfsd)"
        run "replace xattr" vfsd-xattr set xf user.vfsd world
        check "replaced xattr" "world" "$(vfsd-xattr get xf user.vfsd)"
        run "second xattr" vfsd-xattr set xf user.other 1
        check "listxattr" "user.other user.vfsd" "$(vfsd-xattr list xf | grep '^user\.' | sort | tr '\n' ' ' | sed 's/ $//')"
        run "removexattr" vfsd-xattr remove xf user.vfsd
        fails "get removed xattr" vfsd-xattr get xf user.vfsd
        mkdir xd
        run "xattr on a directory" vfsd-xattr set xd user.dir yes
        check "dir xattr" "yes" "$(vfsd-xattr get xd user.dir)"
    elif grep -q 'not supported' /tmp/xerr; then
        echo "smoke: SKIP: xattrs not supported by this share (daemon without --xattr?): $(cat /tmp/xerr)"
    else
        bad "setxattr: $(cat /tmp/xerr)"
    fi
else
    echo "smoke: SKIP: xattr checks (vfsd-xattr helper not in the initramfs; install a C compiler and rebuild it)"
fi

section "special files"
run "mkfifo" mkfifo fifo
check "fifo type" "fifo" "$(stat -c %F fifo)"
run "mknod char" mknod cdev c 1 3
check "char dev numbers (hex)" "1,3" "$(stat -c '%t,%T' cdev)"

section "readdir of 10,000 entries"
mkdir many
cd many || { echo "smoke: FAIL: cannot enter many/"; exit 1; }
i=0
while [ $i -lt 10000 ]; do
    : > "entry-$i"
    i=$((i + 1))
done
cd ..
check "ls count" 10000 "$(ls many | wc -l | tr -d ' ')"
check "find count" 10000 "$(find many -type f | wc -l | tr -d ' ')"
check "names intact" "$(seq 0 9999 | sed 's/^/entry-/' | sort | md5sum)" "$(ls many | sort | md5sum)"
check "lookup after readdir" "regular empty file" "$(stat -c %F many/entry-9999)"
run "remove 10,000 entries" rm -rf many
check "removed" "no" "$([ -e many ] && echo yes || echo no)"

section "statfs"
check "df works" 0 "$(df -k "$T" >/dev/null 2>&1; echo $?)"

section "persisted data for the host"
cd "$DIR" || exit 1
rm -rf smoke-keep smoke-manifest.md5
mkdir smoke-keep
cp /tmp/rand1m smoke-keep/random-1m
echo "hello virtio-fs" > smoke-keep/hello
dd if=/tmp/rand1m of=smoke-keep/sparse bs=1M seek=4100 2>/dev/null
# (sparse is checked by size and by its last MiB, which equals random-1m)
( cd smoke-keep && md5sum random-1m hello ) > smoke-manifest.md5
sync
run "manifest written" test -s smoke-manifest.md5

rm -rf "$T" /tmp/rand1m
counts "$(( $(date +%s) - START ))s"
passed
