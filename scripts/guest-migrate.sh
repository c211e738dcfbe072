#!/usr/bin/env bash
# Live migration of a guest with a virtio-fs share between two QEMU processes on
# this host, each with its own daemon (vfsd, or virtiofsd for comparison) on the
# same shared directory.
#
# The guest runs guest-tests/migrate.sh: it writes numbered lines through one
# open fd every ~100 ms, with its cwd in the share, holding a flock, a POSIX
# lock and an OFD lock. Meanwhile:
#   --via unix (default): daemon B and a destination QEMU (-incoming unix:...)
#       are started, QMP "migrate" is issued to the source (with the return-path
#       capability, see --return-path), query-migrate polled until completed; once
#       the destination runs, the source QEMU is quit (daemon A then exits).
#   --via file / exec: the source migrates to file:STATE (or exec:cat > STATE)
#       and is quit; then daemon B and a fresh QEMU with -incoming file:STATE
#       (or exec:cat STATE) restore it.
# Then the host checks that the guest's locks are held on the host (flock -n and
# F_GETLK from here must be refused), creates mig/host.migrated, the guest writes
# more lines, checks everything, releases its locks; the host checks they are free
# now (mig/host.done), and the guest reports PASS/FAIL on the destination's console.
#
# Usage: scripts/guest-migrate.sh [options]
#   --daemon D        vfsd (default) or virtiofsd
#   --bin PATH        the daemon binary (default: vfsd: $VFSD_BIN, else
#                     target/release/vfsd; virtiofsd: PATH or ~/.cargo/bin). It is
#                     copied into the results directory first (rebuilds don't matter).
#   --daemon-args A   extra arguments for both daemons
#   --src-args A, --dst-args A   extra arguments for daemon A / the destinations' only
#   --via V           unix (default), file or exec
#   --rounds N        migrate N times, A -> B -> C ... (default 1): the state a daemon
#                     loaded must save again; logs are named by the letter
#   --extras LIST     comma-separated guest-tests/migrate.sh extras: many=N, waiter (the
#                     host holds a flock and a POSIX lock the guest waits for across
#                     the migration, released after it), unlinked (an open, unlinked
#                     file: checked as unlinked=ok, usable after the migration, with
#                     --expect-fail or --migration-mode file-handles in both --src-args
#                     and --dst-args; as unlinked=error with --migration-on-error
#                     guest-error in --dst-args; else informational; or give
#                     unlinked=ok / unlinked=error yourself), fio (fio with crc32c verify
#                     runs in the guest from before the migration until after it: O_DIRECT
#                     random writes read back, O_DIRECT and page-cache random reads of a
#                     file written before; passes only if it ran across the switch, did
#                     I/O after it and found no verify error; see guest-tests/migrate.sh;
#                     a guest not done 240 s after host.migrated fails, and the requests
#                     left unanswered in its ring go to RESULTS/ring-state.txt)
#   --share-a DIR, --share-b DIR  two hosts' views of one directory (two client mounts
#                     of a distributed file system): daemon A (and C, E ...) serves DIR A,
#                     daemon B (D, ...) DIR B; the host's files go in through DIR A and the
#                     host's lock checks are made through both (a guest lock must exclude
#                     the host through either mount). First the host checks that a file
#                     and a flock and a POSIX lock taken through A are seen through B.
#                     vfsd's same-host handover can't work across two mounts: its
#                     destination takes the guest's locks again once the source releases
#                     them. Needs --migration-mode find-paths (the default)
#   --gluster         --share-a/--share-b in a new directory vfsd-migrate/NAME (NAME: the
#                     results directory's name) of scripts/gluster.sh's client mounts A
#                     and B (brought up first, if they are not: scripts/gluster.sh up)
#   --probe-locks [strict]  third-party host processes (scripts/lock-probe.py), one
#                     per mount (A and B with --share-a/--share-b or --gluster; the one
#                     share otherwise), from just before the first migration until the
#                     host's lock check after the last one: non-blocking flock, F_SETLK
#                     and F_OFD_SETLK write attempts in a loop on the guest's three locked
#                     files, each success logged and released at once (that kind then
#                     rests 20 ms). FIGURE lines: attempts and successes, each source
#                     daemon's release (its disconnect log line), and per kind the window
#                     after it in which a probe got the lock, until the probes saw it busy
#                     again (the destination took it; for POSIX also when a new holder pid
#                     showed). Logs: RESULTS/probe-*.log. A success is a finding, not a
#                     failure, unless strict is given
#   --expect-fail     the (first) migration is expected to fail (e.g. --extras unlinked
#                     with --migration-on-error abort): check that the source goes on,
#                     and finish the guest's checks there
#   --return-path on|off  (unix only; default on) QMP migrate-set-capabilities return-path
#                     on both QEMUs: the source learns that the destination failed to
#                     load (a daemon refusing its state) and resumes by itself; the
#                     downtime then includes the destination's load. With off, the source
#                     reports "completed" before the destination has loaded anything, so
#                     the script waits for the destination before quitting the source and,
#                     if it failed, resumes the source with "cont" (as libvirt does)
#   --rename PATH[@WHEN]  in the first migration, the host renames PATH (in the share,
#                     e.g. mig/data.log, which the guest has open) to PATH.moved, and back
#                     once that migration has ended (so the guest's checks by name hold).
#                     WHEN: switch (default; unix only): between the source daemon's save
#                     and the destination daemon's load (the destination daemon is held
#                     with SIGSTOP until then), so a find-paths destination can't find it:
#                     with the default --migration-on-error abort, use --expect-fail.
#                     precopy: just after the migration starts (what
#                     --migration-confirm-paths on the source is for)
#   --results DIR     logs, share, state file, summary (default: new dir in $TMPDIR)
#   --after N         lines the guest writes before the host migrates (default 30)
#   --downtime-ms N   migrate-set-parameters downtime-limit (default: QEMU's, 300)
#   --mem SIZE        guest memory (default 1G), --cpus N (default 2)
#   --accel A         tcg (default) or kvm
#   --qemu PATH, --kernel PATH, --initrd PATH
#   --timeout SECS    overall limit (default 1200)
#
# Prints the figures (migration total time, downtime, setup time, RAM sent, the
# device state size from the daemons' logs, the guest's longest pause between two
# writes) and writes them to RESULTS/summary.txt.
# Exit status: 0 pass; 1 a check failed (migration failed, guest FAIL, a host lock
# check failed); 3 the guest did not come up (boot flake: worth one retry); 2 usage.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
QEMU=${VFSD_QEMU:-${QEMU:-qemu-system-x86_64}}
DAEMON=vfsd
BIN=
DAEMON_ARGS=
SRC_ARGS=
DST_ARGS=
VIA=unix
ROUNDS=1
EXTRAS=
EXPECT_FAIL=0
RETURN_PATH=on
RENAME=
RESULTS=
AFTER=30
DOWNTIME_MS=
MEM=1G
CPUS=2
ACCEL=tcg
KERNEL=
INITRD=
TIMEOUT=1200
SHARE_A=
SHARE_B=
GLUSTER=0
PROBE=

say() { printf 'guest-migrate: %s\n' "$*"; }
die() { printf 'guest-migrate: error: %s\n' "$*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
        --daemon) DAEMON=${2:?}; shift 2 ;;
        --bin) BIN=${2:?}; shift 2 ;;
        --daemon-args) DAEMON_ARGS=${2?}; shift 2 ;;
        --src-args) SRC_ARGS=${2?}; shift 2 ;;
        --dst-args) DST_ARGS=${2?}; shift 2 ;;
        --via) VIA=${2:?}; shift 2 ;;
        --rounds) ROUNDS=${2:?}; shift 2 ;;
        --extras) EXTRAS=${2?}; shift 2 ;;
        --expect-fail) EXPECT_FAIL=1; shift ;;
        --return-path) RETURN_PATH=${2:?}; shift 2 ;;
        --rename) RENAME=${2:?}; shift 2 ;;
        --results) RESULTS=${2:?}; shift 2 ;;
        --after) AFTER=${2:?}; shift 2 ;;
        --downtime-ms) DOWNTIME_MS=${2:?}; shift 2 ;;
        --mem) MEM=${2:?}; shift 2 ;;
        --cpus) CPUS=${2:?}; shift 2 ;;
        --accel) ACCEL=${2:?}; shift 2 ;;
        --qemu) QEMU=${2:?}; shift 2 ;;
        --kernel) KERNEL=${2:?}; shift 2 ;;
        --initrd) INITRD=${2:?}; shift 2 ;;
        --timeout) TIMEOUT=${2:?}; shift 2 ;;
        --share-a) SHARE_A=${2:?}; shift 2 ;;
        --share-b) SHARE_B=${2:?}; shift 2 ;;
        --gluster) GLUSTER=1; shift ;;
        --probe-locks) PROBE=report; case ${2:-} in strict|report) PROBE=$2; shift ;; esac; shift ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done
case $VIA in unix|file|exec) ;; *) die "--via must be unix, file or exec" ;; esac
case $RETURN_PATH in on|off) ;; *) die "--return-path must be on or off" ;; esac
[ "$VIA" = unix ] || RETURN_PATH=off   # file and exec have no way back
RENAME_AT=switch
case $RENAME in *@*) RENAME_AT=${RENAME##*@}; RENAME=${RENAME%@*} ;; esac
case $RENAME_AT in switch|precopy) ;; *) die "--rename PATH@WHEN: WHEN is switch or precopy" ;; esac
[ -n "$RENAME" ] && [ "$RENAME_AT" = switch ] && [ "$VIA" != unix ] && die "--rename PATH@switch needs --via unix"
case $RENAME in /*|*..*) die "--rename: a path inside the share, without '..'" ;; esac
case $ACCEL in tcg) ACCEL_ARGS=(-accel tcg,thread=multi -cpu max) ;; kvm) ACCEL_ARGS=(-accel kvm -cpu host) ;;
    *) die "--accel must be tcg or kvm" ;; esac
[[ $AFTER =~ ^[0-9]+$ ]] || die "--after must be a number"
[[ $ROUNDS =~ ^[1-9]$ ]] || die "--rounds must be 1-9"
case $MEM in
    *[Gg]) MEM_MB=$(( ${MEM%[Gg]} * 1024 )) ;;
    *[Mm]) MEM_MB=${MEM%[Mm]} ;;
    *[0-9]) MEM_MB=$MEM ;;
    *) die "--mem: use e.g. 1G or 1536M" ;;
esac
if [ -n "$SHARE_A$SHARE_B" ]; then
    [ -n "$SHARE_A" ] && [ -n "$SHARE_B" ] || die "--share-a and --share-b go together"
    [ "$GLUSTER" = 1 ] && die "--gluster chooses the shares itself; leave out --share-a/--share-b"
    for d in "$SHARE_A" "$SHARE_B"; do [ -d "$d" ] || die "no directory $d"; done
    SHARE_A=$(cd "$SHARE_A" && pwd) SHARE_B=$(cd "$SHARE_B" && pwd)
    [ "$SHARE_A" != "$SHARE_B" ] || die "--share-a and --share-b are one path; give two mounts' views of it"
fi
if [ "$GLUSTER" = 1 ] || [ -n "$SHARE_A" ]; then
    [[ " $DAEMON_ARGS $SRC_ARGS $DST_ARGS " =~ [[:space:]]--migration-mode[=[:space:]]file-handles[[:space:]] ]] &&
        die "two mounts have different file handles: --share-a/--share-b and --gluster need --migration-mode find-paths"
fi
command -v "$QEMU" >/dev/null || die "$QEMU not found"
command -v python3 >/dev/null || die "python3 is needed for the QMP client"
command -v flock >/dev/null || die "flock (util-linux) is needed for the host's lock checks"

case $DAEMON in
    vfsd) BIN=${BIN:-${VFSD_BIN:-$REPO/target/release/vfsd}} ;;
    virtiofsd)
        if [ -z "$BIN" ]; then
            BIN=$(command -v virtiofsd 2>/dev/null || true)
            [ -z "$BIN" ] && [ -x "$HOME/.cargo/bin/virtiofsd" ] && BIN=$HOME/.cargo/bin/virtiofsd
        fi ;;
    *) die "--daemon must be vfsd or virtiofsd" ;;
esac
[ -n "$BIN" ] && [ -x "$BIN" ] || die "daemon binary '${BIN:-virtiofsd}' not found (--bin PATH)"

RESULTS=${RESULTS:-$(mktemp -d "${TMPDIR:-/tmp}/vfsd-migrate.XXXXXX")}
mkdir -p "$RESULTS" || die "cannot create $RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
R=$RESULTS
rm -rf "$R/share" "$R"/*.log "$R"/*.sock "$R"/state-*.bin "$R"/qemu-*.cmdline "$R/summary.txt"
if [ "$GLUSTER" = 1 ]; then
    "$HERE/gluster.sh" up >> "$R/gluster.log" 2>&1 || { tail -n 5 "$R/gluster.log" >&2; die "scripts/gluster.sh up failed ($R/gluster.log)"; }
    eval "$("$HERE/gluster.sh" env)"
    [ -d "${GLUSTER_A:-}" ] && [ -d "${GLUSTER_B:-}" ] || die "scripts/gluster.sh env gave no client mounts"
    # Our own directory on the volume (a rerun with these results starts it afresh).
    gname=$(basename "$R")
    rm -rf "${GLUSTER_A:?}/vfsd-migrate/$gname"
    mkdir -p "$GLUSTER_A/vfsd-migrate/$gname" || die "cannot create $GLUSTER_A/vfsd-migrate/$gname"
    SHARE_A=$GLUSTER_A/vfsd-migrate/$gname SHARE_B=$GLUSTER_B/vfsd-migrate/$gname
    for _ in $(seq 1 50); do [ -d "$SHARE_B" ] && break; sleep 0.1; done
    [ -d "$SHARE_B" ] || die "$SHARE_B does not show through client mount B"
fi
if [ -n "$SHARE_A" ]; then
    SHARE=$SHARE_A       # the host's files (host.migrated, waiter, rename) go in through A
    LOCK_VIEWS=("$SHARE_A" "$SHARE_B"); VIEW_NAMES=(A B)
else
    mkdir -p "$R/share"
    SHARE=$R/share
    SHARE_A=$SHARE SHARE_B=$SHARE
    LOCK_VIEWS=("$SHARE"); VIEW_NAMES=(-)
fi
TWO_MOUNTS=$([ "$SHARE_A" != "$SHARE_B" ] && echo 1 || echo 0)
# share_of NAME: the directory daemon NAME serves (A, C, E ...: SHARE_A; B, D ...: SHARE_B)
share_of() { case $1 in A|C|E|G|I) echo "$SHARE_A" ;; *) echo "$SHARE_B" ;; esac; }
# Unix socket paths must stay short.
SOCK=$R
if [ ${#R} -gt 70 ]; then SOCK=$(mktemp -d /tmp/vfsd-mig-sock.XXXXXX); fi
cp "$BIN" "$R/daemon-bin" || die "cannot copy $BIN"
DBIN=$R/daemon-bin

if [ -z "$KERNEL" ]; then KERNEL=$("$HERE/fetch-kernel.sh") || die "could not get a guest kernel"; fi
if [ -z "$INITRD" ]; then INITRD=$("$HERE/build-initramfs.sh") || die "could not build the initramfs"; fi
# The host's lock tool (F_GETLK on the guest's POSIX and OFD locks).
HLOCK=$R/vfsd-lock-host
"${CC:-cc}" -O2 -Wall -o "$HLOCK" "$REPO/guest-tests/src/vfsd-lock.c" || die "compiling the host's vfsd-lock failed"

log() { say "$*"; printf '%s %s\n' "$(date +%T.%N | cut -c1-12)" "$*" >> "$R/events.log"; }

# --- Processes (only these are ever stopped) ------------------------------------
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 0.5
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    [ "$SOCK" != "$R" ] && rm -rf "$SOCK"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

daemon_cmd() {  # daemon_cmd SOCKET EXTRA SHARE -> the command line (words)
    case $DAEMON in
        vfsd) echo "$DBIN --socket-path=$1 --shared-dir=$3 --xattr $DAEMON_ARGS $2" ;;
        virtiofsd) echo "$DBIN --socket-path=$1 --shared-dir=$3 --sandbox none --xattr $DAEMON_ARGS $2" ;;
    esac
}

start_daemon() {  # start_daemon NAME SOCKET EXTRA: sets DPID_<NAME>
    local name=$1 sock=$2 cmd pid
    cmd=$(daemon_cmd "$sock" "$3" "$(share_of "$name")")
    rm -f "$sock"
    echo "\$ $cmd" >> "$R/daemon-$name.log"
    # shellcheck disable=SC2086
    $cmd </dev/null >>"$R/daemon-$name.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    eval "DPID_$name=$pid"
    for _ in $(seq 1 100); do
        [ -S "$sock" ] && { log "daemon $name (pid $pid): $cmd"; return 0; }
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$R/daemon-$name.log" >&2; fail_now "daemon $name exited before creating its socket ($R/daemon-$name.log)"; }
        sleep 0.1
    done
    fail_now "daemon $name did not create $sock within 10 s"
}

# What the guest should see of its unlinked file after the migration.
if [[ ",$EXTRAS," == *,unlinked,* ]]; then
    u=unlinked
    if [ "$EXPECT_FAIL" = 1 ] || { [[ " $DAEMON_ARGS $SRC_ARGS " =~ [[:space:]]--migration-mode[=[:space:]]file-handles[[:space:]] ]] &&
                                   [[ " $DAEMON_ARGS $DST_ARGS " =~ [[:space:]]--migration-mode[=[:space:]]file-handles[[:space:]] ]]; }; then
        u=unlinked=ok
    elif [[ " $DAEMON_ARGS $DST_ARGS " =~ [[:space:]]--migration-on-error[=[:space:]]guest-error[[:space:]] ]]; then
        u=unlinked=error
    fi
    EXTRAS=$(sed "s/\(^\|,\)unlinked\(,\|\$\)/\1$u\2/" <<<"$EXTRAS")
fi
KARGS="console=ttyS0 mitigations=off panic=-1 quiet loglevel=4 tsc=reliable vfsd.mounts=share0"
KARGS="$KARGS vfsd.cmd=$(printf '%s' "/guest-tests/migrate.sh 20 900 ${EXTRAS//,/ }" | base64 -w0)"

qemu_args() {  # qemu_args NAME SOCKET -> QARGS
    QARGS=(-nodefaults -no-user-config -nographic -no-reboot
        -machine q35 "${ACCEL_ARGS[@]}" -smp "$CPUS" -m "${MEM_MB}M"
        -object "memory-backend-memfd,id=mem,size=${MEM_MB}M,share=on" -numa node,memdev=mem
        -kernel "$KERNEL" -initrd "$INITRD" -append "$KARGS"
        -chardev "socket,id=fs0,path=$2"
        -device "vhost-user-fs-pci,chardev=fs0,tag=share0,num-request-queues=1,queue-size=1024"
        -monitor none -chardev "file,id=con,path=$R/console-$1.log" -serial chardev:con
        -qmp "unix:$SOCK/qmp-$1.sock,server=on,wait=off")
}

start_qemu() {  # start_qemu NAME SOCKET [EXTRA ARGS...]: sets QPID_<NAME>
    local name=$1 sock=$2 pid; shift 2
    qemu_args "$name" "$sock"
    : > "$R/console-$name.log"
    printf '%q ' "$QEMU" "${QARGS[@]}" "$@" > "$R/qemu-$name.cmdline"
    "$QEMU" "${QARGS[@]}" "$@" </dev/null >"$R/qemu-$name.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    eval "QPID_$name=$pid"
    for _ in $(seq 1 100); do
        [ -S "$SOCK/qmp-$name.sock" ] && { log "QEMU $name (pid $pid) started${*:+ with $*}"; return 0; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$R/qemu-$name.log" >&2
    fail_now "QEMU $name did not start (log: $R/qemu-$name.log)"
}

# qmp NAME JSON: one command on QEMU NAME's QMP socket; prints the reply (JSON)
qmp() {
    python3 - "$SOCK/qmp-$1.sock" "$2" <<'EOF'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
s.connect(sys.argv[1])
f = s.makefile('rw')
json.loads(f.readline())
def cmd(c):
    f.write(json.dumps(c) + "\n"); f.flush()
    while True:
        line = f.readline()
        if not line:
            raise SystemExit("QMP connection closed")
        r = json.loads(line)
        if 'event' not in r:
            return r
cmd({"execute": "qmp_capabilities"})
print(json.dumps(cmd(json.loads(sys.argv[2]))))
EOF
}
jget() {  # jget JSON PYEXPR: evaluate PYEXPR on the parsed JSON as r
    python3 -c 'import json,sys; r=json.loads(sys.argv[1]); v=eval(sys.argv[2]); print("" if v is None else v)' "$1" "$2" 2>/dev/null
}

# backend_state_size FILE: the size of the vhost-user-fs back-end's state in a QEMU
# migration stream: the "vhost-user-fs-backend" subsection holds it as chunks (be32
# length, data) ending with a zero length.
backend_state_size() {
    python3 - "$1" <<'PY' 2>&1
import mmap, struct, sys
with open(sys.argv[1], 'rb') as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    name = b'vhost-user-fs-backend'
    i = m.find(bytes([len(name)]) + name)
    if i < 0:
        print('no vhost-user-fs-backend subsection'); sys.exit()
    i += 1 + len(name) + 4          # the name, then its be32 version
    total = chunks = 0
    while True:
        (n,) = struct.unpack('>I', m[i:i + 4]); i += 4
        if n == 0:
            break
        total += n; chunks += 1; i += n
    print('%d bytes (%d chunks)' % (total, chunks))
PY
}

# ring_state NAME: the vhost-user-fs request queue (queue 1) of QEMU NAME as the guest's
# memory shows it (HMP xp through QMP): avail and used index, the event indexes, and
# each request made available and not answered yet (its FUSE opcode, unique, nodeid).
# For a guest that stalls: a request nobody serves.
ring_state() {
    python3 - "$SOCK/qmp-$1.sock" <<'PY' 2>&1
import json, re, socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
f = s.makefile('rw'); f.readline()
def cmd(c, **a):
    f.write(json.dumps({"execute": c, "arguments": a} if a else {"execute": c}) + "\n"); f.flush()
    while True:
        r = json.loads(f.readline())
        if 'event' not in r:
            return r
cmd("qmp_capabilities")
def mem(addr, n):
    out = cmd("human-monitor-command", **{"command-line": "xp /%dbx 0x%x" % (n, addr)})["return"]
    return bytes(int(x, 16) for l in out.splitlines() for x in l.split(':', 1)[1].split())
path = [d["path"] for d in cmd("x-query-virtio")["return"] if "fs" in d["name"]][0]
q = cmd("x-query-virtio-vhost-queue-status", path=path, queue=1)["return"]
num, av, us, de = q["num"], q["avail-phys"], q["used-phys"], q["desc-phys"]
uflags, uidx = struct.unpack('<HH', mem(us, 4)); aflags, aidx = struct.unpack('<HH', mem(av, 4))  # used first: a snapshot while it runs
used_event, = struct.unpack('<H', mem(av + 4 + 2 * num, 2)); avail_event, = struct.unpack('<H', mem(us + 4 + 8 * num, 2))
print("request queue: avail idx %d, used idx %d (%d not answered), avail_event %d, used_event %d, flags avail %#x used %#x"
      % (aidx, uidx, (aidx - uidx) & 0xffff, avail_event, used_event, aflags, uflags))
OPS = {1: "LOOKUP", 3: "GETATTR", 4: "SETATTR", 14: "OPEN", 15: "READ", 16: "WRITE", 18: "RELEASE", 20: "FSYNC", 22: "GETXATTR",
       25: "FLUSH", 31: "GETLK", 32: "SETLK", 33: "SETLKW", 35: "CREATE", 36: "INTERRUPT", 44: "READDIRPLUS", 2: "FORGET", 42: "BATCH_FORGET"}
i = uidx
while i != aidx and ((i - uidx) & 0xffff) < 8:
    head, = struct.unpack('<H', mem(av + 4 + 2 * (i % num), 2))
    addr, ln, fl, nx = struct.unpack('<QIHH', mem(de + 16 * head, 16))
    if fl & 4:  # indirect: its first descriptor
        addr, ln, fl, nx = struct.unpack('<QIHH', mem(addr, 16))
    h = mem(addr, 40)
    hl, op, uniq, node, uid, gid, pid = struct.unpack('<IIQQIII', h[:36])
    print("  avail[%d] head %d: FUSE %s (%d) unique %#x nodeid %d pid %d len %d" % (i, head, OPS.get(op, "?"), op, uniq, node, pid, hl))
    i = (i + 1) & 0xffff
PY
}

wait_gone() {  # wait_gone PID SECS: 0 if it exited in time
    local n
    for n in $(seq 1 $(( $2 * 10 ))); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
    return 1
}
reap() { wait "$1" 2>/dev/null; REAPED=$?; }  # REAPED: exit status of our child PID (no $(...): a subshell can't wait)

console() { tr -d '\r' < "$R/console-$1.log" 2>/dev/null; }

FAILS=()
failed() { FAILS+=("$*"); log "FAIL: $*"; }

# Print what is known so far and the logs' tails: for a failure that ends the test.
dump_logs() {
    local f
    for f in "$R"/daemon-*.log "$R"/qemu-*.log; do
        [ -s "$f" ] || continue
        say "--- $(basename "$f") (last 25 lines) ---"
        tail -n 25 "$f" | sed 's/^/  /'
    done
    for f in "$R"/console-*.log; do
        [ -s "$f" ] || continue
        say "--- $(basename "$f") (last 12 lines) ---"
        tr -d '\r' < "$f" | tail -n 12 | sed 's/^/  /'
    done
}
fail_now() { failed "$*"; dump_logs; summary; exit 1; }

FIG=()
figure() { FIG+=("$1: $2"); log "FIGURE $1: $2"; }

summary() {
    {
        echo "daemon: $DAEMON ($BIN), via $VIA, accel $ACCEL, ${MEM_MB} MiB, QEMU $("$QEMU" --version | sed -n '1s/^QEMU emulator version //p')"
        echo "daemon args: common '$DAEMON_ARGS', source '$SRC_ARGS', destinations '$DST_ARGS'; rounds $ROUNDS; extras '${EXTRAS:-none}'$([ "$EXPECT_FAIL" = 1 ] && echo ', expect-fail'); return-path $RETURN_PATH"
        [ "$TWO_MOUNTS" = 1 ] && echo "two mounts: daemon A serves $SHARE_A, daemon B $SHARE_B"
        for f in "${FIG[@]}"; do echo "  $f"; done
        if [ ${#FAILS[@]} -eq 0 ]; then echo "RESULT: PASS"; else
            echo "RESULT: FAIL"; for f in "${FAILS[@]}"; do echo "  - $f"; done; fi
        echo "logs: $R"
    } > "$R/summary.txt"
    sed 's/^/guest-migrate: /' "$R/summary.txt"
}

# host_lock_check WANT WHEN [try]: WANT busy|free; the guest's three locks seen from
# here. Records a failure for each mismatch, or with "try" just returns 1.
# With two mounts (--share-a/--share-b, --gluster) through each, "busy/free" = A/B.
host_lock_check() {
    local want=$1 when=$2 try=${3:-} rc got m bad=() i via fl= po= of=
    for i in "${!LOCK_VIEWS[@]}"; do
        m=${LOCK_VIEWS[$i]}/mig via=
        [ "$TWO_MOUNTS" = 1 ] && via=" via mount ${VIEW_NAMES[$i]}"
        # flock: -E 99 tells a conflict from an error
        flock -n -E 99 "$m/flock-file" true 2>>"$R/host-locks.log"; rc=$?
        case $rc in 99) got=busy ;; 0) got=free ;; *) got="error $rc" ;; esac
        fl=${fl:+$fl/}$got; [ "$got" = "$want" ] || bad+=("host flock -n on mig/flock-file$via $when: $got, expected $want")
        "$HLOCK" -g "$m/posix-file" wr:0:0 >> "$R/host-locks.log" 2>&1; rc=$?
        case $rc in 1) got=busy ;; 0) got=free ;; *) got="error $rc" ;; esac
        po=${po:+$po/}$got; [ "$got" = "$want" ] || bad+=("host F_GETLK (POSIX wr) on mig/posix-file$via $when: $got, expected $want")
        "$HLOCK" -g "$m/ofd-file" owr:0:0 >> "$R/host-locks.log" 2>&1; rc=$?
        case $rc in 1) got=busy ;; 0) got=free ;; *) got="error $rc" ;; esac
        of=${of:+$of/}$got; [ "$got" = "$want" ] || bad+=("host F_OFD_GETLK on mig/ofd-file$via $when: $got, expected $want")
    done
    HL_FLOCK=$fl HL_POSIX=$po HL_OFD=$of
    echo "$(date +%T) $when: flock $HL_FLOCK, POSIX $HL_POSIX, OFD $HL_OFD (expected $want)$([ "$TWO_MOUNTS" = 1 ] && echo ' (via mount A/B)')" >> "$R/host-locks.log"
    [ ${#bad[@]} -eq 0 ] && { log "host lock check $when: flock $HL_FLOCK, POSIX $HL_POSIX, OFD $HL_OFD, as expected"; return 0; }
    [ -n "$try" ] && return 1
    local b; for b in "${bad[@]}"; do failed "$b"; done
    return 1
}

START=$(date +%s)
deadline() { [ $(( $(date +%s) - START )) -ge "$TIMEOUT" ]; }

log "results in $R; daemon $DAEMON ($BIN); via $VIA"

# --- 0. Two mounts: one directory, and locks that exclude across them -------------------
# cross_mount_check: a file written through A shows through B; a flock and a POSIX lock
# a host process holds through A are refused through B (else the host's lock checks
# below prove nothing about the other host).
cross_mount_check() {
    local p=.vfsd-migrate-probe got rc hp
    echo "probe $$" > "$SHARE_A/$p" || fail_now "cannot write $SHARE_A/$p"
    for _ in $(seq 1 50); do [ "$(cat "$SHARE_B/$p" 2>/dev/null)" = "probe $$" ] && break; sleep 0.1; done
    [ "$(cat "$SHARE_B/$p" 2>/dev/null)" = "probe $$" ] ||
        fail_now "--share-a/--share-b: $p written through $SHARE_A does not show through $SHARE_B within 5 s: not one directory"
    rm -f "$R/probe-held" "$R/probe-release"
    flock "$SHARE_A/$p" bash -c ": > '$R/probe-held'; while [ ! -e '$R/probe-release' ]; do sleep 0.05; done" & hp=$!; PIDS+=("$hp")
    for _ in $(seq 1 100); do [ -e "$R/probe-held" ] && break; sleep 0.05; done
    flock -n -E 99 "$SHARE_B/$p" true 2>>"$R/host-locks.log"; rc=$?
    case $rc in 99) got=refused ;; 0) got=granted ;; *) got="error $rc" ;; esac
    : > "$R/probe-release"; wait "$hp" 2>/dev/null
    figure "cross-mount: flock held through A, flock -n through B" "$got"
    [ "$got" = refused ] || failed "cross-mount: a flock held through mount A does not exclude one through mount B ($got)"
    rm -f "$R/probe-held" "$R/probe-release"
    "$HLOCK" -q -m "$R/probe-held" -u "$R/probe-release" "$SHARE_A/$p" wr:0:0 & hp=$!; PIDS+=("$hp")
    for _ in $(seq 1 100); do [ -e "$R/probe-held" ] && break; sleep 0.05; done
    "$HLOCK" -g "$SHARE_B/$p" wr:0:0 >> "$R/host-locks.log" 2>&1; rc=$?
    case $rc in 1) got=refused ;; 0) got=granted ;; *) got="error $rc" ;; esac
    : > "$R/probe-release"; wait "$hp" 2>/dev/null
    figure "cross-mount: POSIX wr held through A, F_GETLK through B" "$got"
    [ "$got" = refused ] || failed "cross-mount: a POSIX lock held through mount A does not exclude one through mount B ($got)"
    rm -f "$SHARE_A/$p" "$R/probe-held" "$R/probe-release"
}
[ "$TWO_MOUNTS" = 1 ] && cross_mount_check

# --- 1. The source: daemon A, QEMU A, the guest writing -------------------------
WAITER_PIDS=()
if [[ ",$EXTRAS," == *,waiter,* ]]; then
    # The host's locks the guest will wait for, held until $R/release-waiter exists.
    mkdir -p "$SHARE/mig"; : > "$SHARE/mig/wait-flock"; : > "$SHARE/mig/wait-posix"
    rm -f "$R/release-waiter"
    flock "$SHARE/mig/wait-flock" bash -c "while [ ! -e '$R/release-waiter' ]; do sleep 0.1; done" &
    WAITER_PIDS+=($!); PIDS+=($!)
    "$HLOCK" -q -u "$R/release-waiter" "$SHARE/mig/wait-posix" wr:0:0 &
    WAITER_PIDS+=($!); PIDS+=($!)
    sleep 0.5
    log "waiter: the host holds flock on mig/wait-flock and POSIX wr on mig/wait-posix"
fi
boot_source() {
    start_daemon A "$SOCK/a.sock" "$SRC_ARGS"
    start_qemu A "$SOCK/a.sock"
}
boot_source
# The guest creates many=N's files before it is ready: allow 10 ms a file on top.
READY_LIMIT=400
MANY_N=$(tr ',' '\n' <<<"$EXTRAS" | sed -n 's/^many=\([0-9]*\)$/\1/p' | tail -n1)
[ -n "$MANY_N" ] && READY_LIMIT=$(( 400 + MANY_N / 100 ))
attempt=1
while :; do
    c=$(console A)
    if grep -q '^migrate: ready' <<<"$c" &&
       [ "$(sed -n 's/^migrate: wrote \([0-9]*\) lines.*/\1/p' <<<"$c" | tail -n1)" -ge "$AFTER" ] 2>/dev/null; then
        break
    fi
    if grep -qE '^migrate: (FAIL|SKIP)|^VFSD-RESULT:' <<<"$c"; then
        fail_now "the guest failed before the migration: $(grep -E '^migrate: |^vfsd-init: ERROR' <<<"$c" | tail -n 5 | tr '\n' ' ')"
    fi
    if ! kill -0 "$QPID_A" 2>/dev/null || { grep -qE 'Kernel panic|Oops|BUG:' <<<"$c" && ! grep -q 'vfsd-init:' <<<"$c"; }; then
        if [ "$attempt" -lt 2 ] && ! grep -q 'vfsd-init:' <<<"$c"; then
            log "the source guest did not come up (kernel crash or QEMU exit before /init); booting again"
            cp "$R/console-A.log" "$R/console-A-boot$attempt.log"
            kill "$QPID_A" 2>/dev/null; wait_gone "$QPID_A" 5; kill -9 "$QPID_A" 2>/dev/null; reap "$QPID_A"
            wait_gone "$DPID_A" 5 || kill "$DPID_A" 2>/dev/null; reap "$DPID_A"
            rm -f "$SOCK/qmp-A.sock"
            attempt=$((attempt + 1))
            boot_source
            continue
        fi
        failed "the source guest did not come up"; dump_logs; summary; exit 3
    fi
    if [ $(( $(date +%s) - START )) -ge "$READY_LIMIT" ]; then
        failed "the source guest did not start writing within $READY_LIMIT s"; dump_logs; summary; exit 3
    fi
    sleep 1
done
log "guest writing on the source: $(console A | grep '^migrate: wrote' | tail -n1)"

# --- 2. Migrate (ROUNDS times: A -> B -> C ...) -----------------------------------------
# The --rename step. tree_signal SIG PID: PID and its descendants (a daemon forks into
# its sandbox), all started by this script.
tree_signal() {
    local c
    kill "-$1" "$2" 2>/dev/null
    for c in $(pgrep -P "$2"); do tree_signal "$1" "$c"; done
}
RENAMED=0
rename_away() {
    if mv "$SHARE/$RENAME" "$SHARE/$RENAME.moved"; then
        RENAMED=1; log "renamed $RENAME to $RENAME.moved ($1)"
    else
        failed "--rename: could not rename $RENAME"
    fi
}
rename_back() {
    [ "$RENAMED" = 1 ] || return 0
    RENAMED=2
    mv "$SHARE/$RENAME.moved" "$SHARE/$RENAME" && log "renamed $RENAME.moved back to $RENAME" ||
        failed "--rename: could not rename $RENAME.moved back"
}

# wait_running NAME PID: until QEMU NAME runs (or is gone, or neither inmigrate nor
# running); sets dst to its status ("" when gone).
wait_running() {
    local _
    for _ in $(seq 1 600); do
        dst=$(jget "$(qmp "$1" '{"execute":"query-status"}' 2>/dev/null)" 'r["return"]["status"]')
        [ "$dst" = running ] && return 0
        kill -0 "$2" 2>/dev/null || { dst=; return 1; }
        case $dst in inmigrate|"") sleep 0.5 ;; *) return 1 ;; esac
    done
    return 1
}

# migrate_round SRC DST: SRC runs the guest; afterwards DST does and SRC is gone.
migrate_round() {
    local S=$1 D=$2 qd_pending= dd_pending= URI INCOMING q reply status err dst rc qs qd ds dd tag="$1->$2"
    case $VIA in
        unix) URI="unix:$SOCK/mig-$D.sock"; INCOMING=$URI ;;
        file) URI="file:$R/state-$D.bin"; INCOMING=$URI ;;
        exec) URI="exec:cat > $R/state-$D.bin"; INCOMING="exec:cat $R/state-$D.bin" ;;
    esac
    eval "qs=\$QPID_$S ds=\$DPID_$S"
    [ -n "$PROBE" ] && echo "$S $ds" >> "$R/probe-watch"
    if [ "$VIA" = unix ]; then
        start_daemon "$D" "$SOCK/$D.sock" "$DST_ARGS"
        start_qemu "$D" "$SOCK/$D.sock" -incoming "$INCOMING"
        eval "qd_pending=\$QPID_$D dd_pending=\$DPID_$D"
        for _ in $(seq 1 100); do [ -S "$SOCK/mig-$D.sock" ] && break; sleep 0.1; done
        [ -S "$SOCK/mig-$D.sock" ] || fail_now "destination QEMU $D is not listening on $SOCK/mig-$D.sock"
        log "destination $D status: $(jget "$(qmp "$D" '{"execute":"query-status"}')" 'r["return"]["status"]')"
        if [ "$RETURN_PATH" = on ]; then
            local n
            for n in "$S" "$D"; do
                reply=$(qmp "$n" '{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"return-path","state":true}]}}')
                echo "[$tag] $n return-path -> $reply" >> "$R/qmp.log"
                [ -n "$(jget "$reply" 'r.get("error",{}).get("desc")')" ] && fail_now "[$tag] QEMU $n refused the return-path capability: $(jget "$reply" 'r["error"]["desc"]')"
            done
        fi
    fi
    local held_dst=
    if [ -n "$RENAME" ] && [ "$RENAMED" = 0 ] && [ "$RENAME_AT" = switch ]; then
        eval "held_dst=\$DPID_$D"
        tree_signal STOP "$held_dst"
        log "[$tag] daemon $D (and its children) held with SIGSTOP until the source has saved its state"
    fi
    if [ -n "$DOWNTIME_MS" ]; then
        qmp "$S" "{\"execute\":\"migrate-set-parameters\",\"arguments\":{\"downtime-limit\":$DOWNTIME_MS}}" >> "$R/qmp.log"
    fi
    log "[$tag] migrate: $URI (guest at $(console "$S" | grep '^migrate: wrote' | tail -n1 | sed 's/^migrate: //'))"
    local MSTART=$(date +%s.%N) MEND
    reply=$(qmp "$S" "$(python3 -c 'import json,sys; print(json.dumps({"execute":"migrate","arguments":{"uri":sys.argv[1]}}))' "$URI")")
    echo "[$tag] migrate -> $reply" >> "$R/qmp.log"
    [ -n "$(jget "$reply" 'r.get("error",{}).get("desc")')" ] && fail_now "[$tag] QMP migrate refused: $(jget "$reply" 'r["error"]["desc"]')"
    [ -n "$RENAME" ] && [ "$RENAMED" = 0 ] && [ "$RENAME_AT" = precopy ] && rename_away "[$tag] precopy"
    local saved0
    saved0=$(grep -c 'device state saved' "$R/daemon-$S.log")
    status=
    while :; do
        if [ -n "$held_dst" ] && [ "$(grep -c 'device state saved' "$R/daemon-$S.log")" -gt "$saved0" ]; then
            rename_away "[$tag] the source has saved its state, daemon $D not yet loaded it"
            tree_signal CONT "$held_dst"; held_dst=
            log "[$tag] daemon $D continued"
        fi
        q=$(qmp "$S" '{"execute":"query-migrate"}') || { q=; }
        echo "$(date +%T) [$tag] $q" >> "$R/query-migrate.log"
        status=$(jget "$q" 'r["return"].get("status")')
        case $status in completed|failed|cancelled) break ;; esac
        kill -0 "$qs" 2>/dev/null || { status="source QEMU exited"; break; }
        deadline && { status="timeout"; break; }
        sleep 0.5
    done
    MEND=$(date +%s.%N)
    if [ -n "$held_dst" ]; then
        tree_signal CONT "$held_dst"; held_dst=
        failed "[$tag] --rename: the source never logged 'device state saved'; daemon $D continued"
    fi
    log "[$tag] migration: $status after $(awk -v a="$MSTART" -v b="$MEND" 'BEGIN { printf "%.1f", b - a }') s (wall clock)"
    err=
    if [ "$status" = completed ] && [ "$VIA" = unix ]; then
        # The destination may still be loading (and fail): know before quitting the source.
        wait_running "$D" "$qd_pending"
        log "[$tag] destination status: ${dst:-unknown}"
        if [ "$dst" != running ]; then
            kill -0 "$qd_pending" 2>/dev/null || { reap "$qd_pending"; log "[$tag] destination QEMU exited with status $REAPED"; qd_pending=; }
            err="destination ${dst:-QEMU gone}: $(grep -h 'qemu-system' "$R/qemu-$D.log" | tail -n 2 | tr '\n' ' ')"
            [ "$RETURN_PATH" = on ] && fail_now "[$tag] the source reports completed despite the return path, but the $err"
            log "[$tag] the source completed but the $err; resuming the source with cont (no return path: what libvirt does)"
            reply=$(qmp "$S" '{"execute":"cont"}')
            echo "[$tag] cont -> $reply" >> "$R/qmp.log"
            [ -n "$(jget "$reply" 'r.get("error",{}).get("desc")')" ] && failed "[$tag] cont on the source refused: $(jget "$reply" 'r["error"]["desc"]')"
            status=failed
        fi
    fi
    if [ "$status" != completed ]; then
        [ -n "$err" ] || err=$(jget "$q" 'r["return"].get("error-desc")')
        log "[$tag] query-migrate: $q"
        # Does the source guest go on after a failed migration?
        local srcst=gone w1 w2
        if kill -0 "$qs" 2>/dev/null; then
            w1=$(console "$S" | grep -c '^migrate: wrote')
            sleep 5
            srcst=$(jget "$(qmp "$S" '{"execute":"query-status"}')" 'r["return"]["status"]')
            w2=$(console "$S" | grep -c '^migrate: wrote')
            log "[$tag] source after the failure: $srcst; guest progress lines $w1 -> $w2 in 5 s ($(console "$S" | grep '^migrate: wrote' | tail -n1))"
        fi
        if [ "$EXPECT_FAIL" = 1 ] && [ "$status" = failed ]; then
            figure "[$tag] migration failed as expected" "${err:-no error-desc}"
            [ "$srcst" = running ] && [ "$w2" -gt "$w1" ] || failed "[$tag] the source does not go on after the failed migration (status $srcst)"
            # The destination gave up: its QEMU should have exited.
            if [ -n "$qd_pending" ]; then
                wait_gone "$qd_pending" 10 || { log "[$tag] destination QEMU still runs after the failure; stopping it"; kill "$qd_pending" 2>/dev/null; }
                reap "$qd_pending"; log "[$tag] destination QEMU exited with status $REAPED"
            fi
            wait_gone "$dd_pending" 10 || kill "$dd_pending" 2>/dev/null
            reap "$dd_pending"; log "[$tag] daemon $D exited with status $REAPED"
            return 1
        fi
        fail_now "[$tag] migration $status${err:+: $err}"
    fi
    figure "[$tag] migration total-time" "$(jget "$q" 'r["return"].get("total-time")') ms"
    figure "[$tag] migration downtime" "$(jget "$q" 'r["return"].get("downtime")') ms"
    figure "[$tag] migration setup-time" "$(jget "$q" 'r["return"].get("setup-time")') ms"
    figure "[$tag] RAM transferred" "$(jget "$q" '"%.1f MiB (%s dirty-sync passes, %s pages/s dirtied at the end)" % (r["return"]["ram"]["transferred"]/1048576, r["return"]["ram"].get("dirty-sync-count"), r["return"]["ram"].get("dirty-pages-rate"))')"
    if [ "$VIA" != unix ]; then
        figure "[$tag] state file" "$(stat -c %s "$R/state-$D.bin" 2>/dev/null) bytes"
        # The daemon's own part of the stream (any daemon; virtiofsd logs no size).
        figure "[$tag] back-end state in the state file" "$(backend_state_size "$R/state-$D.bin")"
    fi

    # The source goes away.
    log "[$tag] source status: $(jget "$(qmp "$S" '{"execute":"query-status"}')" 'r["return"]["status"]'); quitting it"
    qmp "$S" '{"execute":"quit"}' >> "$R/qmp.log" 2>&1
    wait_gone "$qs" 20 || { failed "[$tag] source QEMU did not quit within 20 s"; kill -9 "$qs" 2>/dev/null; }
    reap "$qs"; log "[$tag] source QEMU exited with status $REAPED"
    if wait_gone "$ds" 10; then
        reap "$ds"; rc=$REAPED
        log "[$tag] daemon $S exited with status $rc"
        [ "$rc" -ge 128 ] && failed "[$tag] daemon $S died from signal $((rc - 128))"
    else
        failed "[$tag] daemon $S still runs 10 s after its QEMU quit"
    fi

    local RSTART=
    if [ "$VIA" != unix ]; then
        host_lock_check free "[$tag] with the source gone and no destination yet"
        RSTART=$(date +%s.%N)
        start_daemon "$D" "$SOCK/$D.sock" "$DST_ARGS"
        start_qemu "$D" "$SOCK/$D.sock" -incoming "$INCOMING"
    fi
    eval "qd=\$QPID_$D dd=\$DPID_$D"
    # The destination runs the guest once the incoming migration is through.
    wait_running "$D" "$qd"
    [ "$VIA" = unix ] || log "[$tag] destination status: ${dst:-unknown}"
    if [ "$dst" != running ]; then
        kill -0 "$qd" 2>/dev/null || { reap "$qd"; log "[$tag] destination QEMU exited with status $REAPED"; }
        fail_now "[$tag] the destination is not running (status '${dst:-QEMU gone}')"
    fi
    [ -n "$RSTART" ] && figure "[$tag] restore (daemon $D + QEMU start to running, wall clock)" "$(awk -v a="$RSTART" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
    local loaded saved
    loaded=$(grep -h 'device state loaded' "$R/daemon-$D.log" | tail -n1 | sed 's/^\[[^]]*\] //')
    saved=$(grep -h 'device state saved' "$R/daemon-$S.log" | tail -n1 | sed 's/^\[[^]]*\] //')
    if [ "$DAEMON" = vfsd ]; then
        figure "[$tag] device state (vfsd $S)" "${saved:-no 'device state saved' line in daemon-$S.log}"
        figure "[$tag] device state (vfsd $D)" "${loaded:-no 'device state loaded' line in daemon-$D.log}"
        [ -n "$loaded" ] || failed "[$tag] daemon $D logged no 'device state loaded'"
    else
        figure "[$tag] daemon $S migration log" "$(grep -ihE 'migrat|state' "$R/daemon-$S.log" | tail -n 3 | tr '\n' '|')"
        figure "[$tag] daemon $D migration log" "$(grep -ihE 'migrat|state' "$R/daemon-$D.log" | tail -n 3 | tr '\n' '|')"
    fi
    # The destination's daemon may wait for locks the source's released: give it 5 s.
    local held=0 n
    for n in 1 2 3 4 5 6 7 8 9; do
        host_lock_check "$LOCKS_BEFORE" "[$tag] after the migration (try $n)" try && { held=1; break; }
        sleep 0.5
    done
    [ "$held" = 1 ] || host_lock_check "$LOCKS_BEFORE" "[$tag] after the migration (5 s on)"
    local st=$?
    if [ "$TWO_MOUNTS" = 1 ]; then
        figure "[$tag] host lock check after the switch (via mount A/B)" "flock $HL_FLOCK, POSIX $HL_POSIX, OFD $HL_OFD (expected $LOCKS_BEFORE; $([ "$held" = 1 ] && echo "at try $n of 9, 0.5 s apart" || echo "not within 5 s"))"
        if [ "$DAEMON" = vfsd ]; then
            figure "[$tag] daemon $D on the handover" "$(grep -ihE 'handover' "$R/daemon-$D.log" | tail -n 2 | sed 's/^\[[^]]*\] //' | tr '\n' '|')"
        fi
    fi
    return $st
}

# The guest's locks as the host sees them before any migration: vfsd passes guest
# locks on to the host; a daemon that lets the guest kernel keep them shows them free.
if host_lock_check busy "before the migration" try; then LOCKS_BEFORE=busy; else
    LOCKS_BEFORE=free
    [ "$DAEMON" = vfsd ] && failed "the guest's locks are not visible on the host before the migration: flock $HL_FLOCK, POSIX $HL_POSIX, OFD $HL_OFD"
    log "the guest's locks are not held on the host (daemon $DAEMON; flock $HL_FLOCK, POSIX $HL_POSIX, OFD $HL_OFD): the lock checks below expect free"
fi
# --probe-locks: third parties on each mount try the guest's locks through the switch.
PROBE_PIDS=()
probe_start() {
    local i pid
    rm -f "$R"/probe-*.log "$R/probe-stop"
    echo "A $DPID_A" > "$R/probe-watch"
    for i in "${!LOCK_VIEWS[@]}"; do
        python3 "$HERE/lock-probe.py" probe --name "${VIEW_NAMES[$i]/-/share}" --dir "${LOCK_VIEWS[$i]}/mig" \
            --stop "$R/probe-stop" --out "$R/probe-${VIEW_NAMES[$i]/-/share}.log" --watch "$R/probe-watch" \
            2>>"$R/probe-errors.log" &
        pid=$!; PIDS+=("$pid"); PROBE_PIDS+=("$pid")
    done
    for i in "${!LOCK_VIEWS[@]}"; do
        for _ in $(seq 1 50); do grep -q ' start ' "$R/probe-${VIEW_NAMES[$i]/-/share}.log" 2>/dev/null && break; sleep 0.1; done
    done
    log "lock probes running (pids ${PROBE_PIDS[*]}) on ${LOCK_VIEWS[*]}"
}
probe_stop() {  # probe_stop SOURCES...: the daemons that released locks to a destination
    local p n args=() l total
    : > "$R/probe-stop"
    for p in "${PROBE_PIDS[@]}"; do wait_gone "$p" 10 || { failed "lock probe $p did not stop"; kill "$p" 2>/dev/null; }; done
    [ -s "$R/probe-errors.log" ] && failed "lock probe errors: $(head -n 3 "$R/probe-errors.log" | tr '\n' ' ')"
    for p in "$R"/probe-*.log; do case $p in *probe-errors.log) ;; *) args+=(--log "$p") ;; esac; done
    for n in "$@"; do args+=(--release "$n=$R/daemon-$n.log"); done
    while IFS= read -r l; do
        case $l in "lock probe successes-total: "*) total=${l##*: } ;; esac
        figure "${l%%: *}" "${l#*: }"
    done < <(python3 "$HERE/lock-probe.py" report "${args[@]}" 2>&1)
    log "lock probes stopped: ${total:-?} lock(s) granted to the third parties"
    [ "$PROBE" = strict ] && [ "${total:-1}" != 0 ] && failed "--probe-locks strict: the third-party probes got the guest's locks ${total:-?} time(s)"
}
[ -n "$PROBE" ] && probe_start
NAMES=(A B C D E F G H I J)
[ "$ROUNDS" -lt ${#NAMES[@]} ] || die "--rounds: at most $(( ${#NAMES[@]} - 1 ))"
L=${NAMES[$ROUNDS]}
for ((r = 0; r < ROUNDS; r++)); do
    migrate_round "${NAMES[$r]}" "${NAMES[$((r + 1))]}" || { L=${NAMES[$r]}; rename_back; break; }
    rename_back
done
[ -n "$PROBE" ] && probe_stop "${NAMES[@]:0:$ROUNDS}"
[ "$EXPECT_FAIL" = 1 ] && [ "$L" != A ] && failed "--expect-fail: the migration did not fail"
eval "QPID_L=\$QPID_$L DPID_L=\$DPID_$L"
if [ ${#WAITER_PIDS[@]} -gt 0 ]; then
    : > "$R/release-waiter"
    for p in "${WAITER_PIDS[@]}"; do wait_gone "$p" 10 || failed "waiter: the host's lock holder $p did not end"; done
    log "waiter: the host released its locks on mig/wait-flock and mig/wait-posix"
fi

# --- 4. Locks on the host, the guest on the destination ---------------------------------
echo "migrated by the host at $(date +%T)" > "$SHARE/mig/host.migrated"
log "created mig/host.migrated"
MIGRATED_AT=$(date +%s)
while [ ! -e "$SHARE/mig/guest.released" ] && [ ! -e "$SHARE/mig/guest.abort" ]; do
    if ! kill -0 "$QPID_L" 2>/dev/null || deadline; then break; fi
    # --extras fio: the guest's checks take a minute at most (its fio stop waits 60 s);
    # a guest still busy after 4 minutes waits for a request: show the ring.
    if [[ ",$EXTRAS," == *,fio,* ]] && [ $(( $(date +%s) - MIGRATED_AT )) -ge 240 ]; then
        failed "the guest did not finish its checks within 240 s of mig/host.migrated ($(console "$L" | grep '^migrate: ' | grep -v '^migrate: wrote' | tail -n 1))"
        ring_state "$L" > "$R/ring-state.txt"
        while read -r l; do log "ring: $l"; done < "$R/ring-state.txt"
        break
    fi
    sleep 0.5
done
if [ -e "$SHARE/mig/guest.released" ]; then
    host_lock_check free "after the guest released its locks"
    echo "host lock checks done at $(date +%T)" > "$SHARE/mig/host.done"
else
    failed "the guest never wrote mig/guest.released"
fi
while kill -0 "$QPID_L" 2>/dev/null; do
    deadline && { failed "timeout: the destination guest still runs after ${TIMEOUT}s"; break; }
    grep -q '^VFSD-RESULT:' <(console "$L") && { wait_gone "$QPID_L" 30 || break; }
    sleep 1
done
cb=$(console "$L")
result=$(sed -n 's/^VFSD-RESULT: \([0-9]*\)$/\1/p' <<<"$cb" | tail -n1)
say "--- the guest at the end (on $L) ---"
sed -n '/^migrate: /p' <<<"$cb" | grep -v '^migrate: wrote' | sed 's/^/  | /'
while read -r l; do figure "guest ${l%% *}" "${l#* }"; done < <(sed -n 's/^migrate: FIGURE //p' <<<"$cb")
if [ "$result" != 0 ]; then
    failed "the guest on the destination reported ${result:-nothing} ($(grep -E '^migrate: FAIL' <<<"$cb" | head -n 5 | tr '\n' ' '))"
    grep -qE 'Kernel panic|Oops|BUG:|blocked for more than' <<<"$cb" && failed "destination kernel: $(grep -m1 -E 'Kernel panic|Oops|BUG:|blocked for more than' <<<"$cb")"
fi
kill -0 "$QPID_L" 2>/dev/null && { kill "$QPID_L"; wait_gone "$QPID_L" 5; }
if wait_gone "$DPID_L" 10; then
    reap "$DPID_L"; rc=$REAPED; log "daemon $L exited with status $rc"
    [ "$rc" -ge 128 ] && failed "daemon $L died from signal $((rc - 128))"
else
    failed "daemon $L still runs 10 s after its QEMU exited"
fi
grep -hiE 'error|panic|warn' "$R"/daemon-*.log | head -n 20 | sed 's/^/guest-migrate: daemon log: /'
[ ${#FAILS[@]} -gt 0 ] && dump_logs
summary
[ ${#FAILS[@]} -eq 0 ]
