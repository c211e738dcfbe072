# Sourced by the guest scripts: check counts, the lines the host reads on the console,
# and the marker files guests and host meet by.
#
# The caller sets NAME, the prefix of its lines ("smoke", "crash[root]"), and may set
# LABEL, which names the run in its FAIL lines ("FAIL [LABEL]: ...").
#
# Console lines (the host's tests read them; see assert_checks_ran and record in
# tests/guest/main.rs):
#   NAME: FAIL: WHAT                       one per failed check
#   NAME: FIGURE KEY VALUE                 a measurement
#   NAME: N checks passed, M failed[ (X)]  the summary, once at the end
#
# Markers: a file in the directory MARKS (on a share) that one side creates and the
# other polls for; the host's side is fixture::Markers (tests/guest/fixture/markers.rs).
# A marker's content, if any, is one line for the log.

PASS=0
FAIL=0

say() { echo "$NAME: $*"; }
ok() { PASS=$((PASS + 1)); }
bad() { FAIL=$((FAIL + 1)); say "FAIL${LABEL:+ [$LABEL]}: $*"; }
# check DESCRIPTION EXPECTED ACTUAL
check() {
    if [ "$2" = "$3" ]; then ok; else bad "$1: expected '$2', got '$3'"; fi
}
# counts [NOTE]: the summary line, with " (NOTE)" when given.
counts() { say "$PASS checks passed, $FAIL failed${1:+ ($1)}"; }
# passed: whether no check failed (the status scripts end with).
passed() { [ "$FAIL" -eq 0 ]; }

# Runs a shell command as nobody (uid and gid 65534, no capabilities).
nobody() { su -s /bin/sh nobody -c "$1"; }
# The uptime in 1/100 s.
centis() { read -r u _ < /proc/uptime; echo "${u%.*}${u#*.}"; }

# marker NAME [TEXT]: creates MARKS/NAME (with TEXT).
marker() {
    if [ -n "${2:-}" ]; then echo "$2" > "$MARKS/$1"; else : > "$MARKS/$1"; fi
}
# has_marker NAME: whether MARKS/NAME is there.
has_marker() { [ -e "$MARKS/$1" ]; }
# await_marker NAME SECS: waits up to SECS for MARKS/NAME (polling every 0.1 s);
# fails at the limit.
await_marker() {
    _n=0
    while [ ! -e "$MARKS/$1" ]; do
        _n=$((_n + 1))
        [ "$_n" -gt $(($2 * 10)) ] && return 1
        usleep 100000
    done
}
