#!/bin/sh
# Features a virtiofsd user may rely on , from a real guest kernel. The host
# starts the daemon with the options each section needs (tests/guest/features.rs,
# "features": --cache never --allow-mmap ...); a section whose feature the daemon was
# not given fails rather than skips, so the suite can't pass on a daemon without it.
#
#   mmap   shared writable mmap of a share file under --cache never (--allow-mmap):
#          fio's mmap engine writes with verify, and a write through one mapping is seen
#          through read(2) and through a second mapping.
#   acl    POSIX ACLs (--posix-acl): nobody reads a root-only file through a named-user
#          entry and loses access when it goes; a default ACL is inherited and the umask
#          is ignored under it but applied elsewhere; chmod updates the ACL mask.
#   chattr chattr/lsattr through FUSE_IOCTL: guest-tests/chattr.sh.
#   tmpfile O_TMPFILE (FUSE_TMPFILE) written, then linked with linkat(AT_EMPTY_PATH) by
#          root and through /proc/self/fd by nobody; an O_EXCL one can't be linked.
#   statx  the birth time (FUSE_STATX) is there and no later than the change time.
#   ids    uid/gid translation (--translate-uid/gid map:65534:3000:1): nobody's new
#          file shows as nobody in the guest; it is left in features-keep/ for the host
#          to check it is owned by 3000 there.
#   xattrmap  xattr mapping (--xattrmap, a rule that keeps security.* under
#          user.virtiofs.): setfattr/getfattr of security.selinux round-trip; the host
#          checks features-keep/labelled has it under the mapped name.
#
# Usage (in the guest): /guest-tests/features.sh [SECTION...] (default: all)
# Prints "features: N checks passed, M failed"; exit status 0 if every check passed.

DIR=${VFSD_SHARE:?VFSD_SHARE unset}
T=$DIR/features.$$
NAME=features
. /guest-tests/lib.sh
run() {  # run DESCRIPTION CMD...: must succeed
    d=$1; shift
    if "$@" > /tmp/features.out 2>&1; then ok; else bad "$d: '$*' failed: $(tail -n 3 /tmp/features.out)"; fi
}

rm -rf "$T"
mkdir "$T" && chmod 0777 "$T" || { echo "features: FAIL: cannot create $T"; exit 1; }
cd "$T" || exit 1

sec_mmap() {
    echo "features: -- mmap under cache=never"
    grep -q " $DIR virtiofs " /proc/mounts || bad "mmap: $DIR is not a virtiofs mount"
    run "mmap: fio mmap engine, random writes with verify" \
        fio --name=mmap --filename="$T/mmap.dat" --ioengine=mmap --rw=randwrite --bs=4k \
            --size=8m --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=terse
    run "mmap: fio mmap engine, random reads" \
        fio --name=mmapr --filename="$T/mmap.dat" --ioengine=mmap --rw=randread --bs=4k \
            --size=8m --output-format=terse
    # A mapping's stores reach the file: vfsd-mmap writes through MAP_SHARED, msyncs and
    # unmaps; read(2) (direct I/O under cache=never) must see them.
    dd if=/dev/zero of=m2 bs=4096 count=4 2>/dev/null
    run "mmap: store through MAP_SHARED" vfsd-mmap write m2 8192 mapped-bytes
    check "mmap: read(2) sees the stored bytes" "mapped-bytes" \
        "$(dd if=m2 bs=1 skip=8192 count=12 2>/dev/null)"
    check "mmap: a second mapping sees them" "mapped-bytes" "$(vfsd-mmap read m2 8192 12)"
    # A non-root user maps too.
    nobody "dd if=/dev/zero of=$T/m3 bs=4096 count=1 2>/dev/null && vfsd-mmap write $T/m3 0 nobody-map" ||
        bad "mmap: nobody's MAP_SHARED store failed"
    check "mmap: nobody's store" "nobody-map" "$(dd if=m3 bs=1 count=10 2>/dev/null)"
}

sec_acl() {
    echo "features: -- POSIX ACLs"
    command -v setfacl > /dev/null || { bad "acl: setfacl missing from the guest image"; return; }
    echo secret > acl-f
    chmod 0600 acl-f
    if nobody "cat $T/acl-f" > /dev/null 2>&1; then bad "acl: nobody read a 0600 root file"; else ok; fi
    run "acl: setfacl -m u:nobody:r" setfacl -m u:nobody:r acl-f
    check "acl: nobody reads through the ACL entry" secret "$(nobody "cat $T/acl-f" 2>&1)"
    case $(getfacl -c acl-f 2>/dev/null) in
        *user:nobody:r--*) ok ;;
        *) bad "acl: getfacl does not show user:nobody:r--: $(getfacl -c acl-f 2>&1 | tr '\n' ' ')" ;;
    esac
    # chmod changes the mask: group bits 0 mask out the named entry.
    chmod 0600 acl-f
    if nobody "cat $T/acl-f" > /dev/null 2>&1; then bad "acl: nobody read after chmod set the mask to ---"; else ok; fi
    run "acl: setfacl -m m::r" setfacl -m m::r acl-f
    run "acl: setfacl -x u:nobody" setfacl -x u:nobody acl-f
    if nobody "cat $T/acl-f" > /dev/null 2>&1; then bad "acl: nobody still reads after the entry went"; else ok; fi
    # Default ACL: inherited, and the umask does not apply under it.
    mkdir acl-d && chmod 0755 acl-d
    run "acl: setfacl -d -m u:nobody:rwx" setfacl -d -m u:nobody:rwx acl-d
    (umask 077; echo x > acl-d/new; mkdir acl-d/sub)
    case $(getfacl -c acl-d/new 2>/dev/null) in
        *user:nobody:rwx*) ok ;;
        *) bad "acl: the default ACL is not inherited by a file: $(getfacl -c acl-d/new 2>&1 | tr '\n' ' ')" ;;
    esac
    case $(getfacl -c acl-d/sub 2>/dev/null) in
        *default:user:nobody:rwx*) ok ;;
        *) bad "acl: a subdirectory does not inherit the default ACL: $(getfacl -c acl-d/sub 2>&1 | tr '\n' ' ')" ;;
    esac
    check "acl: umask 077 ignored under a default ACL (file)" 664 "$(stat -c %a acl-d/new)"
    run "acl: nobody writes through the inherited entry" nobody "echo y >> $T/acl-d/new"
    mkdir acl-p
    (umask 027; mkdir acl-p/sub; echo x > acl-p/f)
    check "acl: umask applied without a default ACL (dir)" 750 "$(stat -c %a acl-p/sub)"
    check "acl: umask applied without a default ACL (file)" 640 "$(stat -c %a acl-p/f)"
}

sec_chattr() {
    echo "features: -- chattr/lsattr"
    if sh /guest-tests/chattr.sh; then ok; else bad "chattr: guest-tests/chattr.sh failed (its lines above)"; fi
}

sec_tmpfile() {
    echo "features: -- O_TMPFILE"
    run "tmpfile: root, linkat(AT_EMPTY_PATH)" vfsd-newops tmpfile "$T" tmp-root
    check "tmpfile: root's data" "tmpfile data" "$(cat tmp-root 2>&1)"
    check "tmpfile: one link" 1 "$(stat -c %h tmp-root)"
    run "tmpfile: nobody, linkat through /proc" nobody "vfsd-newops tmpfile $T tmp-nobody proc"
    check "tmpfile: nobody's file" "tmpfile data 65534" "$(cat tmp-nobody) $(stat -c %u tmp-nobody)"
    run "tmpfile: O_EXCL can't be linked" vfsd-newops tmpfile-excl "$T" tmp-excl
    [ -e tmp-excl ] && bad "tmpfile: the O_EXCL tmpfile got a name" || ok
}

sec_statx() {
    echo "features: -- statx birth time"
    echo x > bt
    b=$(vfsd-newops btime bt)
    case $b in
        none|''|0) bad "statx: no birth time ('$b')" ;;
        *) ok; [ "$b" -le "$(stat -c %Z bt)" ] && ok || bad "statx: btime $b after ctime $(stat -c %Z bt)" ;;
    esac
}

sec_ids() {
    echo "features: -- uid/gid translation"
    mkdir -p "$DIR/features-keep" && chmod 0777 "$DIR/features-keep"
    rm -f "$DIR/features-keep/nobody-file"
    run "ids: nobody creates a file" nobody "echo mine > $DIR/features-keep/nobody-file"
    check "ids: the guest sees nobody as its owner" "65534:65534" \
        "$(stat -c %u:%g "$DIR/features-keep/nobody-file")"
    run "ids: nobody writes its own file" nobody "echo more >> $DIR/features-keep/nobody-file"
    run "ids: chown to nobody" chown 65534:65534 "$DIR/features-keep"
    check "ids: chown seen as nobody" "65534:65534" "$(stat -c %u:%g "$DIR/features-keep")"
    chmod 0777 "$DIR/features-keep"
}

sec_xattrmap() {
    echo "features: -- xattr mapping"
    command -v setfattr > /dev/null || { bad "xattrmap: setfattr missing from the guest image"; return; }
    mkdir -p "$DIR/features-keep"
    echo x > "$DIR/features-keep/labelled"
    run "xattrmap: setfattr security.selinux" \
        setfattr -n security.selinux -v guest_label "$DIR/features-keep/labelled"
    check "xattrmap: getfattr reads it back" guest_label \
        "$(getfattr --absolute-names --only-values -n security.selinux "$DIR/features-keep/labelled" 2>&1)"
    case $(getfattr --absolute-names -d -m - "$DIR/features-keep/labelled" 2>&1) in
        *user.virtiofs.*) bad "xattrmap: the host's mapped name is visible in the guest" ;;
        *security.selinux*) ok ;;
        *) bad "xattrmap: listxattr lacks security.selinux" ;;
    esac
}

SECTIONS=${*:-mmap acl chattr tmpfile statx ids xattrmap}
for s in $SECTIONS; do
    case $s in
        mmap) sec_mmap ;;
        acl) sec_acl ;;
        chattr) sec_chattr ;;
        tmpfile) sec_tmpfile ;;
        statx) sec_statx ;;
        ids) sec_ids ;;
        xattrmap) sec_xattrmap ;;
        *) bad "unknown section '$s'" ;;
    esac
done
cd / && rm -rf "$T"
counts
passed
