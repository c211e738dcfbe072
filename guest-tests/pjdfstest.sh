#!/bin/sh
# Run the whole pjdfstest suite (Rust rewrite, `cargo install pjdfstest`) as
# root on a virtiofs share.
# Usage: /guest-tests/pjdfstest.sh [-d DIR] [-r] [-k FILE] [PATTERN...]
#   -d DIR   directory to test in (default $VFSD_SHARE)
#   -r       also run the EROFS tests (they remount the share read-only)
#   -k FILE  known failures of the host file system: one shell pattern per line
#            (# comments), e.g. "*::enametoolong_path"; a matching test that
#            fails is listed as KNOWN and not counted as failed
#   PATTERN  only tests whose names match (default: all)
# Prints "pjdfstest: N passed, M failed, K skipped of T" and the names of
# the failed tests; exits 1 if any test failed.  Failed tests are retried
# once on their own; one that passes then counts as passed and is listed as
# FLAKY.
DIR=${VFSD_SHARE:-}
REMOUNT=false
KNOWN=
while getopts d:rk: o; do
    case $o in
        d) DIR=$OPTARG ;;
        r) REMOUNT=true ;;
        k) KNOWN=$OPTARG ;;
        *) echo "usage: $0 [-d DIR] [-r] [-k FILE] [PATTERN...]"; exit 2 ;;
    esac
done
[ -z "$KNOWN" ] || [ -r "$KNOWN" ] || { echo "pjdfstest.sh: no known-failures file $KNOWN"; exit 2; }
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

run() {  # run OUTPUT ARGS... : one pjdfstest run, colours stripped into OUTPUT
    out=$1; shift
    ( cd "$T" && pjdfstest -c "$CONF" -p "$T" -s "$SECOND" "$@" ) > "$out.raw" 2>&1
    rc=$?
    # busybox sed has no \x escapes: the escape character itself.
    esc=$(printf '\033')
    sed "s/${esc}\[[0-9;]*m//g" "$out.raw" > "$out"
    return $rc
}
failed_names() { awk '/ FAILED$/ { print $1 }' "$1"; }
messages() {  # messages OUTPUT NAME: the indented lines after NAME's FAILED line
    awk -v n="$2" '
        $1 == n && / FAILED$/ { show = 1; next }
        /^[^\t]/ { show = 0 }
        show && /^\t/ { print "pjdfstest:     " substr($0, 2) }
    ' "$1" | head -n 20
}

start=$(date +%s)
run /tmp/pjdfstest.txt "$@"
rc=$?
summary=$(grep '^Summary:' /tmp/pjdfstest.txt | tail -n1)
if [ -z "$summary" ]; then
    echo "pjdfstest: ERROR: no summary line (exit status $rc); last output:"
    tail -n 30 /tmp/pjdfstest.txt
    rm -rf "$T"
    exit 1
fi
awk '
    / skipped$/ { skip = $1; next }
    skip != "" && /^\t/ { print "pjdfstest: skipped " skip ": " substr($0, 2) }
    { skip = "" }
' /tmp/pjdfstest.txt

known() {  # known NAME: whether NAME matches a pattern in the -k file
    [ -n "$KNOWN" ] || return 1
    while read -r pat || [ -n "$pat" ]; do
        case $pat in ''|'#'*) continue ;; esac
        # shellcheck disable=SC2254
        case $1 in $pat) return 0 ;; esac
    done < "$KNOWN"
    return 1
}

# Retry each failed test once, on its own: a test that passes then is
# reported as FLAKY (timing-dependent in this guest), not as failed. The
# retry names the test in full: pjdfstest matches -e against its full name
# (pjdfstest::tests::...) but prints it shortened, and a retry by the
# printed name ran nothing and "passed". It must run and pass exactly one.
failed_names /tmp/pjdfstest.txt > /tmp/pjdfstest.failed1
: > /tmp/pjdfstest.failed
flaky=0 known_failed=0
for name in $(cat /tmp/pjdfstest.failed1); do
    if known "$name"; then
        echo "pjdfstest: KNOWN $name (a known failure of this host file system, -k $KNOWN):"
        messages /tmp/pjdfstest.txt "$name"
        known_failed=$((known_failed + 1))
    elif run /tmp/pjdfstest.retry -e "pjdfstest::tests::$name" &&
        grep -q '^Summary: 0 failed, 0 skipped, 1 passed' /tmp/pjdfstest.retry; then
        echo "pjdfstest: FLAKY $name (failed, then passed on a retry); first failure:"
        messages /tmp/pjdfstest.txt "$name"
        flaky=$((flaky + 1))
    else
        echo "pjdfstest: FAILED $name"
        messages /tmp/pjdfstest.txt "$name"
        echo "$name" >> /tmp/pjdfstest.failed
    fi
done
secs=$(( $(date +%s) - start ))

# "Summary: 0 failed, 15 skipped, 383 passed, 0 expected failures, 398 total"
n() { echo "$summary" | sed -n "s/.* \([0-9][0-9]*\) $1.*/\1/p"; }
skipped=$(n skipped); passed=$(( $(n passed) + flaky )); total=$(n total)
failed=$(wc -l < /tmp/pjdfstest.failed | tr -d ' ')
echo "pjdfstest: first run: $summary (${secs}s)"
note=
[ "$flaky" -gt 0 ] && note=" ($flaky flaky: passed on a retry)"
[ "$known_failed" -gt 0 ] && note="$note ($known_failed known failures of the host file system)"
echo "pjdfstest: $passed passed, $failed failed, $skipped skipped of $total$note"
rm -rf "$T"
[ "$failed" = 0 ]
