#!/bin/sh
# Counts the FUSE requests of making and reading files, per share, in the guest kernel
# (tests/guest/no_open.rs checks the counts each daemon's options must give).
# On each share in turn ($VFSD_TAGS): makes 40 files and reads them, then counts with the
# fuse:fuse_request_send trace event, that share's connection only, the requests per
# opcode of making 40 more ("requests TAG create: CREATE=n ...") and of reading the
# first 40 again ("requests TAG read: OPEN=n ..."), and checks what was read.
# Runs in the busybox guest: /guest-tests/request-counts.sh
# Exit status: 0 if every file read back right, 1 otherwise.
set -e
t=/sys/kernel/tracing
mount -t tracefs nodev $t 2>/dev/null || true
echo 65536 > $t/buffer_size_kb
traced() {  # traced WHAT OPS COMMAND...: prints "requests TAG WHAT: OP=n ..."
    what=$1 ops=$2; shift 2
    echo > $t/trace
    echo 1 > $t/events/fuse/fuse_request_send/enable
    "$@"
    echo 0 > $t/events/fuse/fuse_request_send/enable
    line="requests $tag $what:"
    for op in $ops; do
        line="$line $op=$(grep "connection $conn " $t/trace | grep -c "(FUSE_$op)" || true)"
    done
    echo "$line"
    if grep -q "LOST" $t/trace; then echo "requests: LOST EVENTS"; fi
}
make() { for i in $(seq 1 40); do echo "new $i" > $d/n$i; done; }
read_all() { for i in $(seq 1 40); do cat $d/f$i > /dev/null; done; }
for tag in $VFSD_TAGS; do
    d=/mnt/$tag
    # The connection the trace names: the mount's device number as the kernel holds it
    # (major << 20 | minor), from stat's user-space encoding.
    dev=$(stat -c %d $d)
    conn=$(( (((dev >> 8) & 0xfff) << 20) | (dev & 0xff) | ((dev >> 12) & ~0xff) ))
    for i in $(seq 1 40); do echo "file $i" > $d/f$i; done
    cat $d/f1 > /dev/null
    traced create "CREATE MKNOD OPEN RELEASE FLUSH" make
    traced read "OPEN RELEASE FLUSH READ" read_all
    for i in $(seq 1 40); do
        grep -qx "file $i" $d/f$i && grep -qx "new $i" $d/n$i || { echo "requests: $tag: $i read wrong"; exit 1; }
    done
    echo "requests $tag: read back"
done
