#!/usr/bin/env bash
# Boots a guest whose shares vfsd (or virtiofsd) serves: a shell on this terminal
# (--shell), or one command, exiting with its status. A front end to the guest-test
# fixture (tests/guest/run_vm.rs); --help lists the options.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin vfsd --example run-vm
exec "${CARGO_TARGET_DIR:-target}/release/examples/run-vm" "$@"
