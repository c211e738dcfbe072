#!/usr/bin/env bash
# Installs what vfsd's guest runner and tests need on a Debian host (as root), builds
# vfsd, virtiofsd 1.14 (the reference daemon the tests compare with) and the pinned
# xfstests tree. The guest kernel and test tools are fetched on first
# use by run-vm.sh.
#
# QEMU: the project's VMM is QEMU 10. On bookworm it comes from bookworm-backports, whose
# apt source this adds (/etc/apt/sources.list.d/vfsd-bookworm-backports.sources) with the
# URI of the Debian archive the host's apt sources already use; trixie and later have it
# in their own suite. Bookworm's own QEMU 7.2 is unpacked into the cache too
# (scripts/fetch-qemu.sh), for the guest suite's smoke-qemu72 test. libvirt 11 (the same
# suite; only its daemon, QEMU driver and virsh) is installed and started without systemd.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
QEMU_FROM=()
if [ "$codename" = bookworm ]; then
    QEMU_FROM=(-t bookworm-backports)
    # Only where no apt source of the host has bookworm-backports already.
    BPO=/etc/apt/sources.list.d/vfsd-bookworm-backports.sources
    if ! grep -qsE '^[^#]*[[:space:]]bookworm-backports([[:space:]]|$)' \
            /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            $(ls /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -vx "$BPO"); then
        # shellcheck source=scripts/debian-mirror.sh
        . scripts/debian-mirror.sh
        mirror=${VFSD_DEBIAN_MIRROR:-$(find_mirror)} ||
            die "no Debian archive URI in the host's apt sources to take bookworm-backports from; set VFSD_DEBIAN_MIRROR=<URI of the Debian archive>"
        want="# Added by vfsd scripts/setup.sh: QEMU 10 from bookworm-backports (the URI is this host's).
Types: deb
URIs: ${mirror%/}
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
        if [ "$(cat "$BPO" 2>/dev/null)" != "$want" ]; then
            echo "== adding bookworm-backports to apt's sources ($BPO)"
            printf '%s\n' "$want" | $SUDO tee "$BPO.new" >/dev/null && $SUDO mv "$BPO.new" "$BPO"
        fi
    fi
fi

echo "== installing packages (busybox, fio, ..., and what cargo install virtiofsd links against for the comparisons)"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    busybox-static fio cpio gcc libc6-dev debian-archive-keyring \
    xz-utils zstd kmod strace e2fsprogs mount acl attr bindfs \
    libseccomp-dev libcap-ng-dev stress-ng >/dev/null
echo "== installing QEMU${QEMU_FROM[*]:+ from ${QEMU_FROM[1]}}"
$SUDO apt-get install -y -qq --no-install-recommends "${QEMU_FROM[@]}" qemu-system-x86 >/dev/null
qv=$(qemu-system-x86_64 --version 2>/dev/null | sed -n '1s/^QEMU emulator version \([0-9][0-9.]*\).*/\1/p')
[ "${qv%%.*}" -ge 10 ] 2>/dev/null ||
    die "qemu-system-x86_64 is QEMU ${qv:-(none found)}, but vfsd's tests need QEMU >= 10 (on bookworm: apt-get install -t bookworm-backports qemu-system-x86)"
echo "== QEMU $qv: $(command -v qemu-system-x86_64)"
echo "== bookworm's QEMU 7.2 (for the smoke-qemu72 test): $(scripts/fetch-qemu.sh --refresh)"
echo "== libvirt 11 (tests/guest/libvirt.rs; from bookworm-backports on bookworm), started without systemd"
lv=(libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients)
# pkg/bookworm-backports, not -t: -t would take systemd from backports too.
[ "$codename" = bookworm ] && lv=("${lv[@]/%//bookworm-backports}")
! apt-get install -s --no-install-recommends "${lv[@]}" | grep -E '^(Inst|Remv) qemu-system' ||
    die "installing libvirt would change QEMU (above)"
$SUDO apt-get install -y -qq --no-install-recommends "${lv[@]}" >/dev/null
lvv=$(libvirtd --version | sed -n 's/.* \([0-9][0-9]*\)\..*/\1/p')
[ "${lvv:-0}" -ge 11 ] || die "libvirtd is $(libvirtd --version), not 11"
# Without udev /dev/kvm stays root:root 0600, and libvirt probes QEMU again at every start.
if [ -c /dev/kvm ] && [ "$(stat -c %G:%a /dev/kvm)" = root:600 ] && getent group kvm >/dev/null; then
    $SUDO chgrp kvm /dev/kvm && $SUDO chmod 660 /dev/kvm
fi
# Each daemon on its own: a package's start-up script, or /run kept from an earlier boot
# (stale sockets and pid files), can leave libvirtd answering without a virtlogd, and then
# every domain fails to start. virtlogd first: libvirtd hands it the QEMU and daemon logs.
pgrep -x virtlogd >/dev/null || $SUDO virtlogd -d
if ! $SUDO virsh -c qemu:///system version >/dev/null 2>&1; then
    pgrep -x libvirtd >/dev/null || $SUDO libvirtd -d
    for _ in $(seq 30); do $SUDO virsh -c qemu:///system version >/dev/null 2>&1 && break; sleep 1; done
    $SUDO virsh -c qemu:///system version >/dev/null || die "libvirtd does not answer on qemu:///system"
fi
for _ in $(seq 10); do [ -S /run/libvirt/virtlogd-sock ] && pgrep -x virtlogd >/dev/null && break; sleep 1; done
pgrep -x virtlogd >/dev/null || die "virtlogd did not start (libvirt needs it to start a domain)"
echo "== building vfsd"
cargo build --release
# The guest and socket suites run their checks against virtiofsd too (idmapped mounts,
# libvirt, migration, the benchmarks): the same release every time, built from source.
VIRTIOFSD_VERSION=1.14.0
cargo_bin=${CARGO_HOME:-$HOME/.cargo}/bin
if [ "$("$cargo_bin/virtiofsd" --version 2>/dev/null)" != "virtiofsd $VIRTIOFSD_VERSION" ]; then
    echo "== building virtiofsd $VIRTIOFSD_VERSION (the reference daemon) into $cargo_bin"
    cargo install --quiet --locked --version "$VIRTIOFSD_VERSION" virtiofsd ||
        die "cargo install virtiofsd --version $VIRTIOFSD_VERSION failed (it needs libseccomp-dev and libcap-ng-dev, installed above)"
fi
echo "== virtiofsd: $("$cargo_bin/virtiofsd" --version)"
echo "== building xfstests (fstests) from ../shared/xfstests into ~/.cache/vfsd/xfstests"
scripts/build-xfstests.sh >/dev/null
