#!/usr/bin/env bash
# Builds a Debian package of vfsd from this tree: target/debian/vfsd_VERSION_ARCH.deb.
#   /usr/libexec/vfsd                            the daemon
#   /usr/share/qemu/vhost-user/50-vfsd.json      the vhost-user descriptor libvirt and other
#                                                management tools look for (docs/libvirt.md)
#   /usr/share/man/man1/vfsd.1.gz                man page, and bash, zsh and fish completions,
#                                                generated from the CLI (src/bin/vfsd-gen.rs)
# Install it with: apt install ./target/debian/vfsd_*.deb
# --prebuilt packs the release build already in target/ (a test running under cargo).
# Both use $CARGO_TARGET_DIR (an absolute path) instead of target/ when it is set.
set -euo pipefail
# The package's modes are not the builder's umask: under 077 dpkg-deb refuses a 0700
# control directory, under 002 directories and files would ship group-writable.
umask 022
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
die() { printf 'package: error: %s\n' "$*" >&2; exit 1; }
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (a Debian host builds the package)"
[ "${1:-}" = --prebuilt ] || cargo build --release --quiet --bin vfsd --bin vfsd-gen
for b in vfsd vfsd-gen; do [ -x "$target/release/$b" ] || die "$target/release/$b missing: cargo build --release"; done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/vfsd
install -D -m 755 "$target/release/vfsd" "$root/usr/libexec/vfsd"
objcopy --strip-debug "$root/usr/libexec/vfsd"
"$target/release/vfsd-gen" man "$stage/gen"
"$target/release/vfsd-gen" completions "$stage/gen"
install -D -m 644 "$stage/gen/vfsd.1" "$root/usr/share/man/man1/vfsd.1"
gzip -9n "$root/usr/share/man/man1/vfsd.1"
install -D -m 644 "$stage/gen/vfsd.bash" "$root/usr/share/bash-completion/completions/vfsd"
install -D -m 644 "$stage/gen/_vfsd" "$root/usr/share/zsh/vendor-completions/_vfsd"
install -D -m 644 "$stage/gen/vfsd.fish" "$root/usr/share/fish/vendor_completions.d/vfsd.fish"
# QEMU's docs/interop/vhost-user.json: libvirt takes the first "fs" descriptor by file name
# and asks its binary for its features (--print-capabilities).
mkdir -p "$root/usr/share/qemu/vhost-user"
printf '{\n  "description": "vfsd: virtio-fs device backend",\n  "type": "fs",\n  "binary": "/usr/libexec/vfsd"\n}\n' \
    > "$root/usr/share/qemu/vhost-user/50-vfsd.json"
mkdir -p "$root/usr/share/doc/vfsd"
printf 'vfsd\nLicense: Apache-2.0 (/usr/share/common-licenses/Apache-2.0)\n' > "$root/usr/share/doc/vfsd/copyright"
mkdir -p "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<CONTROL
Package: vfsd
Version: $version
Architecture: $arch
Maintainer: vfsd developers <vfsd@localhost>
Depends: libc6, libgcc-s1
Section: admin
Priority: optional
Installed-Size: $(du -sk "$root/usr" | cut -f1)
Description: virtio-fs device backend (vhost-user-fs daemon)
 Shares a host directory with virtual machines over virtio-fs, as a vhost-user
 device for QEMU, libvirt and cloud-hypervisor; a drop-in for virtiofsd's options,
 with parallel direct writes.
CONTROL
# Directories 0755, files 0644, programs 0755, whatever made them.
chmod -R u=rwX,go=rX "$root"
mkdir -p "$target/debian"
out=$target/debian/vfsd_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$out" >/dev/null
echo "$out"
