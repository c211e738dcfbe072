#!/usr/bin/env bash
# cloud-hypervisor + vfsd.  Needs a working KVM (cloud-hypervisor has no TCG),
# so it is not exercised by the CI here.
#
#   vmm-configs/cloud-hypervisor.sh DIR KERNEL INITRD
#
# Differences from QEMU: memory is shared with "--memory ...,shared=on"
# (no memfd/numa objects), and each share is one "--fs" argument.
# Tip: cloud-hypervisor boots an uncompressed vmlinux or a bzImage with
# --kernel; the console is on ttyS0 with --serial tty --console off.
set -euo pipefail
DIR=${1:?usage: $0 DIR KERNEL INITRD}
KERNEL=${2:?kernel image}
INITRD=${3:?initramfs}
VFSD=${VFSD:-target/release/vfsd}
SOCK=$(mktemp -u /tmp/vfsd-XXXXXX.sock)

"$VFSD" --socket-path="$SOCK" --shared-dir="$DIR" --sandbox none --xattr &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; rm -f "$SOCK"' EXIT
for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.1; done

cloud-hypervisor \
    --cpus boot=2 \
    --memory size=2G,shared=on \
    --kernel "$KERNEL" \
    --initramfs "$INITRD" \
    --cmdline "console=ttyS0 panic=-1 vfsd.mounts=share0" \
    --fs tag=share0,socket="$SOCK",num_queues=1,queue_size=1024 \
    --serial tty --console off
