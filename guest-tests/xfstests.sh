#!/bin/sh
# Guest side of the xfstests guest test (tests/guest/xfstests.rs), first stage (busybox, in the initramfs).
#
# Usage: xfstests.sh XFSTESTS_DIR MODULES_DIR [PER_TEST_TIMEOUT]
#   XFSTESTS_DIR  the built fstests tree, a host path (the host's root is the
#                 share "hostroot", mounted read-only at /mnt/hostroot)
#   MODULES_DIR   the guest kernel's modules, a host path (.../lib/modules/<abi>)
# The tests to run are in /mnt/results/tests.list (one name a line).
#
# Builds a writable root for fstests: an overlay of the host's root (read-only,
# lower) and a tmpfs (upper), so the fstests tree, /etc and /var are writable
# and the guest kernel's modules appear under /lib/modules.  Then runs
# xfstests-check.sh chrooted into it.  Exit status: that of xfstests-check.sh
# (0 list done), 2 set-up failed; after the watchdog stopped a hung test (3)
# it reports 3 itself and powers off at once.
XFSTESTS=${1:?usage: xfstests.sh XFSTESTS_DIR MODULES_DIR [PER_TEST_TIMEOUT]}
MODULES=${2:?usage: xfstests.sh XFSTESTS_DIR MODULES_DIR [PER_TEST_TIMEOUT]}
PER_TEST=${3:-600}
HOST=/mnt/hostroot
NEW=/xfsroot
fail() { echo "xfstests.sh: error: $*"; exit 2; }

[ -d "$HOST/usr" ] || fail "the host root is not mounted at $HOST"
[ -d /mnt/results ] || fail "the results share is not mounted at /mnt/results"
[ -x "$HOST$XFSTESTS/check" ] || fail "$XFSTESTS/check not found: run scripts/build-xfstests.sh on the host"
KVER=$(uname -r)
[ "$(basename "$MODULES")" = "$KVER" ] || fail "modules $MODULES are not for the running kernel $KVER"
[ -f "$HOST$MODULES/modules.dep" ] || fail "$MODULES/modules.dep missing: run scripts/fetch-kernel.sh --modules"

# overlayfs is a module itself: load it with the host's insmod (it reads .ko.xz).
ovl=$(find "$HOST$MODULES/kernel/fs/overlayfs" -name 'overlay.ko*' 2>/dev/null | head -n1)
if ! grep -qw overlay /proc/filesystems; then
    [ -n "$ovl" ] || fail "overlay.ko not found under $MODULES"
    chroot "$HOST" /usr/sbin/insmod "${ovl#"$HOST"}" || fail "insmod overlay failed"
fi
mkdir -p /tmp/ovl/upper /tmp/ovl/work "$NEW"
mount -t overlay overlay -o "lowerdir=$HOST,upperdir=/tmp/ovl/upper,workdir=/tmp/ovl/work" "$NEW" ||
    fail "cannot mount the overlay root (see dmesg)"
for d in proc sys dev dev/pts dev/shm; do
    mkdir -p "$NEW/$d" && mount --bind "/$d" "$NEW/$d" || fail "bind /$d"
done
mount -t tmpfs -o size=40% tmpfs "$NEW/tmp" || fail "tmpfs /tmp"
mount -t tmpfs tmpfs "$NEW/run" || fail "tmpfs /run"
mount -t tmpfs tmpfs "$NEW/mnt" || fail "tmpfs /mnt"
mkdir -p "$NEW/mnt/results" "$NEW/mnt/test" "$NEW/mnt/scratch" "$NEW/mnt/guest-tests"
mount --bind /mnt/results "$NEW/mnt/results" || fail "bind the results share"
mount --bind /guest-tests "$NEW/mnt/guest-tests" || fail "bind /guest-tests"
mkdir -p "$NEW/usr/lib/modules/$KVER"
mount --bind "$HOST$MODULES" "$NEW/usr/lib/modules/$KVER" || fail "bind the modules"
mount -t fusectl fusectl "$NEW/sys/fs/fuse/connections" 2>/dev/null
mount -t debugfs debugfs "$NEW/sys/kernel/debug" 2>/dev/null
ip link set lo up 2>/dev/null || fail "cannot bring lo up"

chroot "$NEW" /bin/bash /mnt/guest-tests/xfstests-check.sh "$XFSTESTS" "$PER_TEST"
rc=$?
if [ "$rc" = 3 ]; then
    # The watchdog stopped a hung test: a sync (as /init does before it reports)
    # could wait forever for the daemon, so report and power off here.
    printf '\nVFSD-RESULT: 3\nVFSD-RESULT: 3\n'
    echo o > /proc/sysrq-trigger
    sleep 30
fi
exit $rc
