#!/usr/bin/env bash
# Runs vfsd's test suite: unit tests, the vhost-user integration tests (real socket,
# real virtqueues in shared memory) and, as root with QEMU installed, the guest tests
# (tests/guest/: a real Linux guest under QEMU, scripts/run-vm.sh's checks among them).
set -euo pipefail
cd "$(dirname "$0")/.."

have_qemu=0
command -v qemu-system-x86_64 >/dev/null 2>&1 && have_qemu=1
if [ "$have_qemu" = 0 ] && [ "${CI:-}" = "true" ]; then
    echo "the guest tests could not run: qemu-system-x86_64 is not installed (scripts/setup.sh)" >&2
    exit 1
fi

# The tests that need root are #[ignore = "needs root"] (or "needs QEMU and root"):
# another user sees them as ignored, root (as CI runs) runs them too.
SUMMARY=${VFSD_GUEST_LOGS:-target/guest-tests}/summary.txt
TIMES=${VFSD_GUEST_LOGS:-target/guest-tests}/times.txt
rm -f "$SUMMARY" "$TIMES"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
# Every test binary runs even when an earlier one fails (--no-fail-fast); the exit status
# is still non-zero if any test failed. Then one line per binary with its counts.
run_tests() {
    local rc=0
    # test-hooks: the test build's fault injection (a serving process that dies, a request
    # that panics, at a chosen request); inert unless a test sets its variable.
    cargo test --release --no-fail-fast --features test-hooks "$@" 2>&1 | tee "$OUT" || rc=$?
    echo "== tests per binary"
    awk '
        /^ *Running / { name = ($2 == "unittests") ? $3 : $2 }
        /^ *Doc-tests / { name = "doc-tests " $2 }
        /^test result:/ { gsub(/;/, ""); printf "  %-32s %s passed, %s failed, %s ignored\n", name, $4, $6, $8; name = "" }
    ' "$OUT"
    return "$rc"
}
rc=0
if [ "$(id -u)" -ne 0 ]; then
    echo "== cargo test (not root: the tests that need root or QEMU are left out, shown as ignored)"
    run_tests || rc=$?
elif [ "$have_qemu" = 1 ]; then
    echo "== cargo test (unit, vhost-user integration and guest tests; at most ${VFSD_GUEST_JOBS:-2} guests at once)"
    run_tests -- --include-ignored || rc=$?
    if [ -s "$SUMMARY" ]; then
        echo "== what the guests reported"
        cat "$SUMMARY"
    fi
    if [ -s "$TIMES" ]; then
        echo "== guest-seconds and wall seconds per test, longest first"
        # The total sorts first.
        awk '{ g[$3] += $1; w[$3] += $2; t += $1 }
             END { for (n in g) printf "%7.1f %7.1f %s\n", g[n], w[n], n; printf "%7.1f guest-seconds in all\n", t }' \
            "$TIMES" | sort -rn
    fi
else
    echo "== cargo test (unit and vhost-user integration tests; the guest tests need qemu-system-x86: scripts/setup.sh)"
    run_tests --lib --bins --test it -- --include-ignored || rc=$?
fi
[ "$rc" = 0 ] || echo "== some tests failed (above); every test binary ran" >&2
exit "$rc"
