#!/bin/sh
# Run the whole pjdfstest suite (Rust rewrite, `cargo install pjdfstest`) as
# root on a virtiofs share.
# Usage: /guest-tests/pjdfstest.sh [-d DIR] [-r] [PATTERN...]
#   -d DIR   directory to test in (default $VFSD_SHARE)
#   -r       also run the EROFS tests (they remount the share read-only)
#   PATTERN  only tests whose names match (default: all)
# Prints "pjdfstest: N passed, M failed, K skipped" and the names of the
# failed tests; exits 1 if any test failed.
DIR=${VFSD_SHARE:-}
REMOUNT=false
while getopts d:r o; do
    case $o in
        d) DIR=$OPTARG ;;
        r) REMOUNT=true ;;
        *) echo "usage: $0 [-d DIR] [-r] [PATTERN...]"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ -n "$DIR" ] || { echo "pjdfstest.sh: no directory (-d) and VFSD_SHARE unset"; exit 2; }
command -v pjdfstest >/dev/null || { echo "pjdfstest.sh: pjdfstest is not in this initramfs"; exit 2; }
[ "$(id -u)" = 0 ] || echo "pjdfstest.sh: warning: not root; tests that switch users will be skipped"

# Test users: pjdfstest needs two unprivileged user/group pairs.
grep -q '^tests:' /etc/passwd 2>/dev/null || {
    echo 'tests:x:1001:1001:pjdfstest:/:/bin/false' >> /etc/passwd
    echo 'tests:x:1001:' >> /etc/group
}

CONF=/tmp/pjdfstest.toml
cat > "$CONF" <<TOML
# Linux features that virtio-fs is expected to support
[features]
posix_fallocate = {}
utime_now = {}
utimensat = {}
rename_ctime = {}

[settings]
# Greater than the timestamp granularity; TCG guests are slow, be generous.
naptime = 0.01
allow_remount = $REMOUNT

[dummy_auth]
entries = [ ["nobody", "nogroup"], ["tests", "tests"] ]
TOML

T=$DIR/pjdfstest.$$
rm -rf "$T"; mkdir -p "$T"
# A second file system for the EXDEV tests: the guest's /tmp (tmpfs).
SECOND=/tmp/pjdfstest-secondary
mkdir -p "$SECOND"
start=$(date +%s)
cd "$T" || exit 2
pjdfstest -c "$CONF" -p "$T" -s "$SECOND" "$@" > /tmp/pjdfstest.out 2>&1
rc=$?
cd /
secs=$(( $(date +%s) - start ))

# Strip colours, then report failures with their messages.
sed 's/\x1b\[[0-9;]*m//g' /tmp/pjdfstest.out > /tmp/pjdfstest.txt
awk '
    / FAILED$/ { show = 1; print "pjdfstest: FAILED " $1; next }
    / skipped$/ { skip = $1; next }
    skip != "" && /^\t/ { print "pjdfstest: skipped " skip ": " substr($0, 2); skip = ""; next }
    { skip = "" }
    /^[^\t]/ { show = 0 }
    show && /^\t/ { print "pjdfstest:     " substr($0, 2) }
' /tmp/pjdfstest.txt | head -n 400
summary=$(grep '^Summary:' /tmp/pjdfstest.txt | tail -n1)
if [ -z "$summary" ]; then
    echo "pjdfstest: ERROR: no summary line (exit status $rc); last output:"
    tail -n 30 /tmp/pjdfstest.txt
    rm -rf "$T"
    exit 1
fi
# "Summary: 0 failed, 15 skipped, 383 passed, 0 expected failures, 398 total"
n() { echo "$summary" | sed -n "s/.* \([0-9][0-9]*\) $1.*/\1/p"; }
failed=$(echo "$summary" | sed -n 's/^Summary: \([0-9]*\) failed.*/\1/p')
skipped=$(n skipped); passed=$(n passed); total=$(n total)
echo "pjdfstest: $summary (${secs}s)"
echo "pjdfstest: $passed passed, $failed failed, $skipped skipped of $total"
rm -rf "$T"
[ "$failed" = 0 ] && [ "$rc" = 0 ]
