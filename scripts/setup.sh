#!/usr/bin/env bash
# Installs what vfsd's guest runner and tests need on a Debian host (as root), builds
# vfsd and the pinned xfstests tree. The guest kernel and test tools are fetched on first
# use by run-vm.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
echo "== installing packages (qemu, busybox, fio, ...)"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    qemu-system-x86 busybox-static fio cpio gcc libc6-dev debian-archive-keyring \
    xz-utils zstd kmod strace e2fsprogs mount acl attr bindfs >/dev/null
echo "== building vfsd"
cargo build --release
echo "== building xfstests (fstests) from ../shared/xfstests into ~/.cache/vfsd/xfstests"
scripts/build-xfstests.sh >/dev/null
