#!/usr/bin/env bash
# Runs vfsd's test suite: unit tests and the vhost-user integration tests (real socket,
# real virtqueues in shared memory), then the guest suite when QEMU is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test (unit + vhost-user integration tests)"
cargo test --release

if [ -x scripts/guest-suite.sh ] && command -v qemu-system-x86_64 >/dev/null 2>&1; then
    echo "== guest suite (real Linux guest under QEMU)"
    scripts/guest-suite.sh
elif [ -x scripts/guest-suite.sh ] && [ "${CI:-}" = "true" ]; then
    echo "guest suite could not run: qemu-system-x86_64 is not installed" >&2
    exit 1
else
    echo "== guest suite skipped (install qemu-system-x86 to run it)"
fi
