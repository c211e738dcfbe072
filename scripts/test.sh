#!/usr/bin/env bash
# Runs vfsd's test suite: unit tests and the vhost-user integration tests (real socket,
# real virtqueues in shared memory), then the guest suite when QEMU is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test (unit + vhost-user integration tests)"
# The integration tests that need root are #[ignore = "needs root"]: another user sees them
# as ignored, root (as CI runs) runs them too.
if [ "$(id -u)" -eq 0 ]; then
    cargo test --release -- --include-ignored
else
    echo "not root: the tests that need root are left out (shown as ignored)"
    cargo test --release
fi

if [ -x scripts/guest-suite.sh ] && command -v qemu-system-x86_64 >/dev/null 2>&1; then
    echo "== guest suite (real Linux guest under QEMU)"
    scripts/guest-suite.sh
elif [ -x scripts/guest-suite.sh ] && [ "${CI:-}" = "true" ]; then
    echo "guest suite could not run: qemu-system-x86_64 is not installed" >&2
    exit 1
else
    echo "== guest suite skipped (install qemu-system-x86 to run it)"
fi
