#!/usr/bin/env bash
# Plain QEMU + vfsd, without the test runner: boots KERNEL/INITRD with DIR
# shared as tag "share0".  Use it to see (or copy) the exact command line;
# scripts/run-vm.sh builds the same one with timeouts, logs and presets.
#
#   vmm-configs/qemu.sh DIR KERNEL INITRD [extra kernel args]
#
# Environment: VFSD (daemon binary, default target/release/vfsd), ACCEL
# (default "tcg,thread=multi"; "kvm" with CPU=host on a working KVM host),
# MEM (MiB, default 2048), SMP (vCPUs, default 2), QUEUES (request queues, default
# one per vCPU: the guest kernel maps each CPU to a queue of its own).
set -euo pipefail
DIR=${1:?usage: $0 DIR KERNEL INITRD [kernel args]}
KERNEL=${2:?kernel image}
INITRD=${3:?initramfs}
EXTRA=${4:-}
VFSD=${VFSD:-target/release/vfsd}
ACCEL=${ACCEL:-tcg,thread=multi}
CPU=${CPU:-max}
MEM=${MEM:-2048}
SMP=${SMP:-2}
QUEUES=${QUEUES:-$SMP}
SOCK=$(mktemp -u /tmp/vfsd-XXXXXX.sock)

# 1. The daemon: one process per shared directory, listening on a socket.
"$VFSD" --socket-path="$SOCK" --shared-dir="$DIR" --sandbox none --xattr &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; rm -f "$SOCK"' EXIT
for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.1; done

# 2. QEMU: guest RAM must be shareable (memfd, share=on) so the daemon can
#    map it; -numa ties the RAM to that backend.  One chardev + one
#    vhost-user-fs-pci device per share; the tag is what the guest mounts:
#    mount -t virtiofs share0 /mnt
qemu-system-x86_64 \
    -nodefaults -no-user-config -nographic -no-reboot \
    -machine q35 -accel "$ACCEL" -cpu "$CPU" -smp "$SMP" -m "${MEM}M" \
    -object memory-backend-memfd,id=mem,size="${MEM}M",share=on \
    -numa node,memdev=mem \
    -chardev socket,id=fs0,path="$SOCK" \
    -device vhost-user-fs-pci,chardev=fs0,tag=share0,num-request-queues="$QUEUES",queue-size=1024 \
    -kernel "$KERNEL" -initrd "$INITRD" \
    -append "console=ttyS0 mitigations=off panic=-1 vfsd.mounts=share0 $EXTRA" \
    -serial mon:stdio
