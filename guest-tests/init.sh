#!/bin/sh
# /init of the vfsd test initramfs (busybox).  Installed by scripts/build-initramfs.sh.
#
# Kernel command line parameters (set by the guest-test fixture, tests/guest/fixture/):
#   vfsd.mounts=TAG[:OPTS][,TAG[:OPTS]...]
#                             virtiofs tags to mount at /mnt/TAG (first = $VFSD_SHARE);
#                             OPTS are mount options joined with '+', e.g. ro+dax
#   vfsd.mntopts=OPTS         extra mount options for every share (mount -o)
#   vfsd.cmd=BASE64           command to run with sh -c (base64 encoded)
#   vfsd.shell=1              start an interactive shell on the console instead
#   vfsd.chroot=TAG           (with vfsd.cmd) run the command chrooted into /mnt/TAG
#
# Reports "VFSD-RESULT: <rc>" on the console, then powers off.
# rc 120 means the guest could not set itself up (e.g. a mount failed).

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=${TERM:-vt100}
umask 022

/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /tmp /run
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs -o size=50% tmpfs /tmp
mount -t tmpfs tmpfs /run
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin; ln -sf /proc/self/fd/1 /dev/stdout; ln -sf /proc/self/fd/2 /dev/stderr
hostname vfsd-guest
ip link set lo up 2>/dev/null
echo 0 > /proc/sys/kernel/printk_ratelimit 2>/dev/null
# Keep kernel chatter off the console while tests print, but do show oopses.
echo 4 > /proc/sys/kernel/printk 2>/dev/null

exec </dev/console >/dev/console 2>&1
# The first line a host-side runner waits for: the kernel booted and /init runs.
echo "vfsd-init: started"

param() {  # param NAME -> value of NAME= on the kernel command line
    for w in $(cat /proc/cmdline); do
        case $w in "$1="*) echo "${w#*=}"; return 0 ;; esac
    done
    return 1
}

report() {
    sync
    # Print the marker on its own line (twice, in case kernel messages interleave).
    printf '\nVFSD-RESULT: %s\n' "$1"
    printf 'VFSD-RESULT: %s\n' "$1"
    sync
    poweroff -f
    sleep 10
    echo o > /proc/sysrq-trigger
}

MOUNTS=$(param vfsd.mounts || true)
MNTOPTS=$(param vfsd.mntopts || true)
VFSD_TAGS=
VFSD_SHARE=
for ent in $(echo "$MOUNTS" | tr ',' ' '); do
    tag=${ent%%:*}
    opts=
    case $ent in *:*) opts=$(echo "${ent#*:}" | tr '+' ',') ;; esac
    opts=$opts${opts:+${MNTOPTS:+,}}$MNTOPTS
    mkdir -p "/mnt/$tag"
    if ! mount -t virtiofs ${opts:+-o "$opts"} "$tag" "/mnt/$tag"; then
        echo "vfsd-init: ERROR: mounting virtiofs tag '$tag' failed (is the daemon running and the tag right?)"
        dmesg | tail -n 20
        report 120
    fi
    VFSD_TAGS="$VFSD_TAGS${VFSD_TAGS:+ }$tag"
    [ -n "$VFSD_SHARE" ] || VFSD_SHARE=/mnt/$tag
done
export VFSD_TAGS VFSD_SHARE
[ -n "$VFSD_TAGS" ] && echo "vfsd-init: mounted $VFSD_TAGS under /mnt"

if [ "$(param vfsd.shell || true)" = 1 ]; then
    echo "vfsd-init: interactive shell; shares are under /mnt. 'poweroff -f' (or exit) ends the VM."
    cd "${VFSD_SHARE:-/}"
    setsid cttyhack sh -l
    report 0
fi

CMD_B64=$(param vfsd.cmd || true)
if [ -z "$CMD_B64" ]; then
    echo "vfsd-init: no command given; booted fine"
    report 0
fi
CMD=$(echo "$CMD_B64" | base64 -d) || { echo "vfsd-init: ERROR: vfsd.cmd is not valid base64"; report 120; }
echo "vfsd-init: running: $CMD"
CHROOT=$(param vfsd.chroot || true)
cd "${VFSD_SHARE:-/tmp}"
if [ -n "$CHROOT" ]; then
    root=/mnt/$CHROOT
    for d in proc sys dev dev/pts tmp run; do
        [ -d "$root/$d" ] && mount --bind "/$d" "$root/$d" 2>/dev/null
    done
    # Make the other shares and the test scripts visible inside the chroot.
    if [ -d "$root/mnt" ]; then
        mount -t tmpfs tmpfs "$root/mnt" 2>/dev/null
        for tag in $VFSD_TAGS; do
            [ "$tag" = "$CHROOT" ] && continue
            mkdir -p "$root/mnt/$tag" && mount --bind "/mnt/$tag" "$root/mnt/$tag"
        done
        mkdir -p "$root/mnt/guest-tests" && mount --bind /guest-tests "$root/mnt/guest-tests"
    fi
    chroot "$root" /bin/sh -c "cd /; $CMD"
    rc=$?
else
    sh -c "$CMD"
    rc=$?
fi
cd /
echo "vfsd-init: command exited with status $rc"
report "$rc"
