#!/bin/sh
# The guest's part of the live migration tests (tests/guest/migration.rs).
#
# Usage (in the guest): /guest-tests/migrate.sh [AFTER] [LIMIT] [EXTRA...]
#   In $VFSD_SHARE/mig (the shell's cwd stays there throughout):
#   - opens data.log once and writes "line N" through that fd every ~100 ms,
#   - holds a flock (flock-file), a POSIX write lock (posix-file) and an OFD write
#     lock (ofd-file), each in a vfsd-lock process of its own,
#   - prints "migrate: ready", then "migrate: wrote N lines" every 10 lines;
#   - the host migrates the VM meanwhile and then creates mig/host.migrated; the
#     guest writes AFTER more lines (default 20) through the same fd, then checks:
#     every line present and in order, readdir, cwd, create/write/read/rename/unlink,
#     mkdir/rmdir, the locks still held (conflicting requests from this guest
#     refused), released (then granted); writes mig/guest.released and waits for
#     the host's mig/host.done (the host checks that the release reached it).
#   LIMIT: seconds to wait for host.migrated (default 900).
#   EXTRA (the host prepares its part, tests/guest/migration.rs):
#     many=N    N files in mig/many (looked up, so the daemon knows N more nodes)
#               read back after the migration, 16 of them held open across it
#     waiter    a flock and a POSIX lock requested (blocking) on mig/wait-flock and
#               mig/wait-posix, which the host holds across the migration and releases
#               after it: the waiting requests are in flight during the migration and
#               must be granted on the destination within 30 s (a wait that fails with
#               EINTR at the switch-over is asked again, as flock(1) does)
#     unlinked  a file open (read fd and write fd) and unlinked before the migration;
#               written and read through its fds after it.  Informational (INFO lines):
#               a find-paths daemon can't find it again (see --migration-on-error)
#     unlinked=ok, unlinked=error   the same, checked: the write and the read must work
#               (the read gives both lines), or must both fail
#     fio       fio runs in mig/fio from before "ready" until AFTER lines after
#               host.migrated (time_based, stopped by a trigger file in /tmp), all
#               jobs 4 KiB, crc32c verified, verify_fatal: direct-write-verify
#               (libaio iodepth 8, O_DIRECT random writes, each 32 read back,
#               verify_backlog), direct-read-verify (O_DIRECT random reads of ro.dat,
#               written once before), buffered-read-verify (page-cache random reads of
#               ro.dat; /proc/sys/vm/drop_caches every second meanwhile, so the daemon
#               keeps filling page-cache pages, and reads after the switch also hit
#               pages it filled on the source); then one buffered pass over all of
#               ro.dat without dropping the cache.  Checked: fio ran across the switch
#               (still running at host.migrated), exit status 0 and no verify error or
#               err= in any job, and I/O after host.migrated: writes for the first
#               job, reads for the other two (fio's 1 s IOPS logs)
#   Prints "migrate: FIGURE name value" lines, "migrate: N checks passed, M failed"
#   and "migrate: PASS" or "migrate: FAIL".  Exit status 0 on PASS.

AFTER=${1:-20}
LIMIT=${2:-900}
if [ $# -ge 2 ]; then shift 2; else shift $#; fi
MANY=0 WAITER=0 UNLINKED=0 FIO=0
for x in "$@"; do
    case $x in
        many=*) MANY=${x#many=} ;;
        waiter) WAITER=1 ;;
        unlinked) UNLINKED=1 ;;
        unlinked=ok) UNLINKED=ok ;;
        unlinked=error) UNLINKED=error ;;
        fio) FIO=1 ;;
        *) echo "migrate: unknown extra '$x'"; exit 2 ;;
    esac
done
D=${VFSD_SHARE:?VFSD_SHARE unset}
# The markers: the host's host.migrated and host.done, the guest's guest.released and
# guest.abort, in mig/ (tests/guest/migration.rs).
NAME=migrate MARKS=$D/mig
. /guest-tests/lib.sh
succeeds() {  # succeeds DESCRIPTION COMMAND...: the command must succeed
    desc=$1; shift
    if out=$("$@" 2>&1); then ok; else bad "$desc: $(echo "$out" | tr '\n' ' ')"; fi
}
finish() {
    counts
    if passed && [ "$PASS" -gt 0 ]; then say PASS; exit 0; fi
    say FAIL; exit 1
}

mkdir -p "$D/mig" && cd "$D/mig" || { bad "cannot enter $D/mig"; finish; }
rm -f data.log host.migrated host.done guest.released guest.abort
exec 3>data.log || { bad "cannot open data.log"; finish; }

# The locks, each held by a process until /tmp/release exists (guest-local, so
# the polling adds no requests).
LOCKPIDS=
if command -v vfsd-lock >/dev/null; then
    : > flock-file; : > posix-file; : > ofd-file
    rm -f /tmp/release /tmp/*.held
    vfsd-lock -q -m /tmp/flock.held -u /tmp/release flock-file ex & LOCKPIDS="$LOCKPIDS $!"
    vfsd-lock -q -m /tmp/posix.held -u /tmp/release posix-file wr:0:0 & LOCKPIDS="$LOCKPIDS $!"
    vfsd-lock -q -m /tmp/ofd.held -u /tmp/release ofd-file owr:0:0 & LOCKPIDS="$LOCKPIDS $!"
    n=0
    while [ ! -e /tmp/flock.held ] || [ ! -e /tmp/posix.held ] || [ ! -e /tmp/ofd.held ]; do
        n=$((n + 1)); [ $n -gt 300 ] && { bad "the locks were not granted within 30 s"; marker guest.abort; finish; }
        usleep 100000
    done
    say "locks held: flock ex on flock-file, POSIX wr 0-EOF on posix-file, OFD wr 0-EOF on ofd-file"
    LOCKS=1
else
    say "SKIP locks: no vfsd-lock in this initramfs"
    LOCKS=0
fi

HOLDPIDS= WAITPIDS=
# waitlock NAME FILE SPEC: a blocking vfsd-lock -w, retried while it fails with
# EINTR, as flock(1) does; each interruption is appended to /tmp/NAME.eintr;
# /tmp/NAME.granted once granted (held until /tmp/release), /tmp/NAME.rc at the end.
# Errno 512 (ERESTARTSYS) is retried too, but is a failure (checked below): the
# guest's FUSE turns a daemon's EINTR reply to SETLKW into ERESTARTSYS ("locking is
# restartable"), which reaches user space when no signal is pending, and programs
# such as flock(1) give up on it.
waitlock() {
    wl=$1; shift
    while :; do
        vfsd-lock -q -w -m "/tmp/$wl.granted" -u /tmp/release "$@" 2>"/tmp/$wl.err" & echo $! > "/tmp/$wl.pid"
        wait $!; wrc=$?
        if [ "$wrc" = 2 ] && grep -qE 'Interrupted system call|Unknown error 512' "/tmp/$wl.err"; then
            echo "$(centis) $(cat "/tmp/$wl.err")" >> "/tmp/$wl.eintr"
            continue
        fi
        echo "$wrc" > "/tmp/$wl.rc"
        [ -s "/tmp/$wl.err" ] && say "waiter: $wl: $(cat "/tmp/$wl.err")"
        return "$wrc"
    done
}
if [ "$MANY" -gt 0 ]; then
    mkdir -p many
    j=0; while [ $j -lt "$MANY" ]; do echo "file $j" > many/f$j; j=$((j + 1)); done
    ls -l many > /dev/null
    # 16 held open by sleepers (ash redirections stop at fd 9)
    j=0; while [ $j -lt 16 ]; do sleep 100000 < many/f$j & HOLDPIDS="$HOLDPIDS $!"; j=$((j + 1)); done
    say "many: $MANY files in mig/many, 16 held open"
fi
if [ "$WAITER" = 1 ]; then
    if [ -e wait-flock ] && [ -e wait-posix ]; then
        rm -f /tmp/wflock.* /tmp/wposix.*
        waitlock wflock wait-flock ex & WAITPIDS="$! "
        waitlock wposix wait-posix wr:0:0 & WAITPIDS="$WAITPIDS $!"
        sleep 1
        if [ -e /tmp/wflock.granted ] || [ -e /tmp/wposix.granted ]; then
            bad "waiter: a lock the host holds was granted before the migration"
        fi
        say "waiter: blocking flock on wait-flock and POSIX wr on wait-posix requested"
    else
        bad "waiter: the host did not prepare mig/wait-flock and mig/wait-posix"; WAITER=0
    fi
fi
if [ "$UNLINKED" != 0 ]; then
    echo before > unlinked-file && exec 6>>unlinked-file && exec 7<unlinked-file && rm unlinked-file &&
        say "unlinked: unlinked-file open on fds 6 (append) and 7 (read), and unlinked" ||
        { bad "unlinked: setting up failed"; UNLINKED=0; }
fi

FIOPID= DROPPID=
if [ "$FIO" = 1 ]; then
    FIO_MB=16
    rm -rf fio /tmp/fio.*; mkdir -p fio
    if ! command -v fio >/dev/null; then
        bad "fio: no fio in this initramfs"; FIO=0
    elif ! fio --eta=never --aux-path=/tmp --output=/tmp/fio.prep.out --name=prep --filename=fio/ro.dat \
            --size=${FIO_MB}m --bs=64k --verify_interval=4k --rw=write --direct=1 --verify=crc32c --do_verify=0; then
        bad "fio: writing fio/ro.dat failed: $(tail -n 5 /tmp/fio.prep.out | tr '\n' ' ')"; FIO=0
    else
        cat > /tmp/fio.job <<EOF
[global]
directory=$D/mig/fio
bs=4k
size=${FIO_MB}m
verify=crc32c
verify_fatal=1
time_based=1
runtime=$((LIMIT + 300))
log_avg_msec=1000
write_iops_log=/tmp/fio.log

[direct-write-verify]
filename=rw.dat
rw=randwrite
ioengine=libaio
iodepth=8
direct=1
verify_backlog=32

[direct-read-verify]
filename=ro.dat
rw=randread
ioengine=psync
direct=1

[buffered-read-verify]
filename=ro.dat
rw=randread
ioengine=psync
direct=0
EOF
        # (a read job verifies on libaio only once through the file: psync keeps going)
        fio_t0=$(centis)
        fio --eta=never --trigger-file=/tmp/fio.stop --aux-path=/tmp --output=/tmp/fio.out /tmp/fio.job \
            2>/tmp/fio.err & FIOPID=$!
        # (fio deletes its trigger file when it acts on it: the loop has its own)
        ( n=0; while [ ! -e /tmp/fio.dropstop ]; do
              echo 1 > /proc/sys/vm/drop_caches; n=$((n + 1)); echo $n > /tmp/fio.drops; sleep 1
          done ) & DROPPID=$!
        # Until fio has laid out rw.dat and every job runs.
        n=0
        while [ $n -lt 300 ] && kill -0 $FIOPID 2>/dev/null; do
            [ -s fio/rw.dat ] && break
            n=$((n + 1)); usleep 100000
        done
        sleep 2
        if kill -0 $FIOPID 2>/dev/null; then
            say "fio: running (pid $FIOPID) on mig/fio: direct-write-verify, direct-read-verify, buffered-read-verify (4 KiB, crc32c, ${FIO_MB} MiB files; page cache dropped every second)"
        else
            wait $FIOPID; bad "fio ended before the migration (status $?): $(grep -iE 'verify|err=|error' /tmp/fio.out /tmp/fio.err | head -n 5 | tr '\n' ' ')"
            : > /tmp/fio.dropstop; FIOPID=; FIO=0
        fi
    fi
fi

say "ready (cwd $(pwd))"
i=0 after=-1 maxgap=0 maxgap_at=0
t0=$(centis); prev=$t0
while :; do
    i=$((i + 1))
    if ! echo "line $i" >&3; then bad "write of line $i through the open fd failed"; break; fi
    now=$(centis)
    gap=$((now - prev)); prev=$now
    [ "$gap" -gt "$maxgap" ] && { maxgap=$gap; maxgap_at=$i; }
    [ $((i % 10)) = 0 ] && say "wrote $i lines ($(( (now - t0) / 100 ))s)"
    if [ "$after" -lt 0 ]; then
        if has_marker host.migrated; then
            say "host says the migration is done (at line $i); writing $AFTER more lines"
            after=$AFTER
            mig_line=$i
            if [ -n "$FIOPID" ]; then
                fio_tmig=$(centis)
                if kill -0 "$FIOPID" 2>/dev/null; then fio_at_switch=running; else fio_at_switch=ended; fi
                say "fio: $fio_at_switch at host.migrated ($(( (fio_tmig - fio_t0) / 100 )) s after it started)"
            fi
        elif [ $(( (now - t0) / 100 )) -ge "$LIMIT" ]; then
            bad "no host.migrated after ${LIMIT}s"; marker guest.abort; break
        fi
    else
        after=$((after - 1))
        [ "$after" -le 0 ] && break
    fi
    usleep 100000
done
exec 3>&-
say "FIGURE lines_written $i"
say "FIGURE max_write_gap_ms $((maxgap * 10)) (before line $maxgap_at)"

# fio stops first: the checks below run without it.
if [ "$FIO" = 1 ] && [ -n "$FIOPID" ]; then
    : > /tmp/fio.stop
    # fio ends within a second or two of the trigger; one that does not is stuck in
    # I/O: show where its processes wait, then end it.
    n=0
    while kill -0 "$FIOPID" 2>/dev/null && [ $n -lt 600 ]; do n=$((n + 1)); usleep 100000; done
    if kill -0 "$FIOPID" 2>/dev/null; then
        bad "fio: did not end within 60 s of the stop (stuck I/O?)"
        for t in /proc/[0-9]*; do
            case $(cat "$t/comm" 2>/dev/null) in
                fio*) say "fio: stuck: pid ${t#/proc/} $(cat "$t/comm") state $(sed -n 's/^State:[[:space:]]*//p' "$t/status") wchan $(cat "$t/wchan" 2>/dev/null)"
                      cat "$t/stack" 2>/dev/null | head -n 12 | sed 's/^/migrate: fio:   | /'
                      kill -9 "${t#/proc/}" 2>/dev/null ;;
            esac
        done
    fi
    wait "$FIOPID"; frc=$?
    : > /tmp/fio.dropstop
    n=0
    while kill -0 "$DROPPID" 2>/dev/null && [ $n -lt 100 ]; do n=$((n + 1)); usleep 100000; done
    if kill -0 "$DROPPID" 2>/dev/null; then
        bad "fio: the drop_caches loop (pid $DROPPID) did not end within 10 s: $(for t in /proc/[0-9]*; do [ "$(sed -n 's/^PPid:[[:space:]]*//p' "$t/status" 2>/dev/null)" = "$DROPPID" ] && echo "child ${t#/proc/} $(cat "$t/comm") $(sed -n 's/^State:[[:space:]]*//p' "$t/status") $(head -n 3 "$t/stack" 2>/dev/null | awk '{print $2}' | tr '\n' ' ')"; done)"
    else
        wait "$DROPPID" 2>/dev/null
    fi
    fio_t1=$(centis)
    [ "$fio_at_switch" = running ] && ok || bad "fio: not running when host.migrated appeared (${fio_at_switch:-never saw host.migrated})"
    [ "$frc" = 0 ] && ok || bad "fio: exit status $frc"
    # One line per job: its name, err=, read/write totals.
    awk '/: \(groupid=/ { name = $1; sub(/:$/, "", name); e = $0; sub(/^.*err= */, "", e); sub(/[:(].*$/, "", e); printf "migrate: fio: %s err=%s\n", name, e }
         /^ *(read|write): IOPS=/ { l = $0; sub(/^ */, "", l); sub(/; 0 zone resets/, "", l); printf "migrate: fio:   %s\n", l }' /tmp/fio.out
    if grep -qiE 'verify fail|bad magic|bad header|verify:.*bad|err= *[1-9]' /tmp/fio.out /tmp/fio.err; then
        bad "fio: verify errors: $(grep -hiE 'verify|err= *[1-9]|expected|received' /tmp/fio.out /tmp/fio.err | head -n 8 | tr '\n' ' ')"
    else ok; fi
    # I/O after host.migrated: the jobs' 1 s IOPS logs (ms since the job's start,
    # IOPS, direction 0 read / 1 write), counted from host.migrated on.
    from_ms=$(( (fio_tmig - fio_t0) * 10 ))
    j=0
    for job in direct-write-verify direct-read-verify buffered-read-verify; do
        j=$((j + 1))
        set -- $(awk -F', *' -v from="$from_ms" '$1 > from { n[$3] += $2 } END { printf "%d %d\n", n[0], n[1] }' /tmp/fio.log_iops.$j.log 2>/dev/null)
        r=${1:-0} w=${2:-0}
        say "FIGURE fio_${job}_after_switch reads=$r writes=$w"
        case $job in
            direct-write-verify) [ "$w" -gt 0 ] && ok || bad "fio: $job did no writes after host.migrated" ;;
            *) [ "$r" -gt 0 ] && ok || bad "fio: $job did no reads after host.migrated" ;;
        esac
    done
    say "FIGURE fio_runtime_s $(( (fio_t1 - fio_t0) / 100 )) (host.migrated at $(( (fio_tmig - fio_t0) / 100 )) s; page cache dropped $(cat /tmp/fio.drops 2>/dev/null || echo 0) times)"
    # One pass over ro.dat through the page cache as the jobs left it (some pages
    # filled on the source), the rest from the daemon.
    if fio --eta=never --aux-path=/tmp --output=/tmp/fio.pass.out --name=cache-pass --filename=fio/ro.dat \
            --size=${FIO_MB}m --bs=4k --rw=read --ioengine=psync --direct=0 --invalidate=0 --verify=crc32c --verify_fatal=1 2>>/tmp/fio.err &&
       ! grep -qiE 'verify fail|err= *[1-9]' /tmp/fio.pass.out; then
        ok; say "fio: cache-pass: all of ro.dat read back through the page cache, verified"
    else
        bad "fio: cache-pass over ro.dat: $(grep -hiE 'verify|err=|expected|received' /tmp/fio.pass.out /tmp/fio.err | head -n 6 | tr '\n' ' ')"
    fi
    rm -rf fio
fi

# Every line there, in order, nothing else.
res=$(awk -v n="$i" '$0 != "line " NR { print "line " NR " is \"" $0 "\""; bad = 1; exit }
    END { if (!bad && NR != n) print NR " lines, expected " n }' data.log 2>&1)
if [ -z "$res" ]; then ok; else bad "data.log: $res"; fi
succeeds "data.log size" test "$(wc -l < data.log)" -eq "$i"

# The cwd (a node the destination had to find again) and readdir.
succeeds "pwd" test "$(pwd)" = "$D/mig"
succeeds "ls . lists data.log" sh -c 'ls . | grep -qx data.log'
succeeds "ls of the share lists mig" sh -c "ls '$D' | grep -qx mig"
succeeds "readdir sees every file" sh -c 'for f in data.log flock-file posix-file ofd-file host.migrated; do ls -a | grep -qx "$f" || { echo "missing $f"; exit 1; }; done'
# New work on the destination.
succeeds "create+write" sh -c 'echo after-migration > new-file'
succeeds "read back" test "$(cat new-file)" = after-migration
succeeds "append through a new fd" sh -c 'echo "line $(( $(wc -l < data.log) + 1 ))" >> data.log'
succeeds "rename" mv new-file new-file2
succeeds "read renamed" test "$(cat new-file2)" = after-migration
succeeds "unlink" rm new-file2
succeeds "mkdir" mkdir newdir
succeeds "create in new dir" sh -c 'echo x > newdir/f && test "$(cat newdir/f)" = x'
succeeds "rmdir" sh -c 'rm newdir/f && rmdir newdir'
succeeds "stat data.log" stat data.log

if [ "$MANY" -gt 0 ]; then
    res=$(j=0; while [ $j -lt "$MANY" ]; do
        c=$(cat many/f$j 2>&1); [ "$c" = "file $j" ] || { echo "many/f$j: '$c'"; exit 1; }; j=$((j + 1)); done 2>&1)
    [ -z "$res" ] && ok || bad "many: $res"
    for p in $HOLDPIDS; do succeeds "many: holder $p alive" kill -0 "$p"; done
    succeeds "many: readdir count" test "$(ls many | wc -l)" -eq "$MANY"
    for p in $HOLDPIDS; do kill "$p" 2>/dev/null; done
fi
if [ "$UNLINKED" != 0 ]; then
    if echo after >&6 2>/tmp/unl.err; then wok=1; say "INFO unlinked: write through fd 6 after the migration: ok"
    else wok=0; say "INFO unlinked: write through fd 6 after the migration failed: $(cat /tmp/unl.err)"; fi
    got=$(cat <&7 2>/tmp/unl.err | tr '\n' ' '); rerr=$(cat /tmp/unl.err)
    say "INFO unlinked: read through fd 7: '$got' $rerr"
    case $UNLINKED in
        ok) [ "$wok" = 1 ] && ok || bad "unlinked: the write through fd 6 failed: $(cat /tmp/unl.err)"
            [ "$got" = "before after " ] && [ -z "$rerr" ] && ok || bad "unlinked: read '$got' through fd 7, expected 'before after ' $rerr" ;;
        error) [ "$wok" = 0 ] && ok || bad "unlinked: the write through fd 6 worked; expected an error"
            [ -n "$rerr" ] && ok || bad "unlinked: the read through fd 7 gave '$got'; expected an error" ;;
    esac
    exec 6>&- 7<&-
fi
if [ "$WAITER" = 1 ]; then
    n=0
    while [ ! -e /tmp/wflock.granted ] || [ ! -e /tmp/wposix.granted ]; do
        n=$((n + 1)); [ $n -gt 300 ] && break
        usleep 100000
    done
    [ -e /tmp/wflock.granted ] && { ok; say "waiter: flock granted on the destination"; } ||
        bad "waiter: the blocking flock was not granted within 30 s of the host's release$(cat /tmp/wflock.rc /tmp/wflock.err 2>/dev/null | tr '\n' ' ')"
    [ -e /tmp/wposix.granted ] && { ok; say "waiter: POSIX lock granted on the destination"; } ||
        bad "waiter: the blocking POSIX lock was not granted within 30 s of the host's release$(cat /tmp/wposix.rc /tmp/wposix.err 2>/dev/null | tr '\n' ' ')"
    for wl in wflock wposix; do
        ni=0; [ -s "/tmp/$wl.eintr" ] && ni=$(wc -l < "/tmp/$wl.eintr")
        say "FIGURE waiter_${wl}_interrupted $ni"
        [ "$ni" -gt 0 ] && say "INFO waiter: $wl interrupted $ni time(s), retried: $(tr '\n' ' ' < "/tmp/$wl.eintr")"
        if grep -q 'Unknown error 512' "/tmp/$wl.eintr" 2>/dev/null; then
            bad "waiter: $wl: the blocking lock failed with errno 512 (ERESTARTSYS leaked to user space, not EINTR; flock(1) would fail) $(grep -c 'Unknown error 512' "/tmp/$wl.eintr") time(s)"
        else ok; fi
    done
fi

if [ "$LOCKS" = 1 ]; then
    # The lock holders still run and their locks still conflict for this guest's others.
    for p in $LOCKPIDS; do succeeds "lock holder $p alive" kill -0 "$p"; done
    # vfsd-lock: 1 = busy (refused), 0 = granted, 2 = error.
    vfsd-lock -q flock-file ex; rc=$?
    [ "$rc" = 1 ] && ok || bad "flock ex on flock-file by another open file: expected busy (1), got $rc"
    vfsd-lock -q posix-file wr:0:0; rc=$?
    [ "$rc" = 1 ] && ok || bad "POSIX wr on posix-file by another process: expected busy (1), got $rc"
    vfsd-lock -q ofd-file owr:0:0; rc=$?
    [ "$rc" = 1 ] && ok || bad "OFD wr on ofd-file by another open file: expected busy (1), got $rc"
    : > /tmp/release
    for p in $LOCKPIDS; do wait "$p"; rc=$?; [ "$rc" = 0 ] || bad "lock holder $p exited with $rc"; done
    for p in $WAITPIDS; do  # granted ones end on the release; the others are stuck
        n=0; while kill -0 "$p" 2>/dev/null && [ $n -lt 50 ]; do usleep 100000; n=$((n + 1)); done
        kill "$p" 2>/dev/null
    done
    for wl in wflock wposix; do [ -s "/tmp/$wl.pid" ] && kill "$(cat "/tmp/$wl.pid")" 2>/dev/null; done
    vfsd-lock -q flock-file ex; rc=$?
    [ "$rc" = 0 ] && ok || bad "flock ex on flock-file after the release: expected granted (0), got $rc"
    vfsd-lock -q posix-file wr:0:0; rc=$?
    [ "$rc" = 0 ] && ok || bad "POSIX wr on posix-file after the release: expected granted (0), got $rc"
    vfsd-lock -q ofd-file owr:0:0; rc=$?
    [ "$rc" = 0 ] && ok || bad "OFD wr on ofd-file after the release: expected granted (0), got $rc"
fi

marker guest.released
await_marker host.done 120 || bad "no host.done within 120 s"
has_marker host.done && say "host.done: $(cat host.done)"
finish
