#!/usr/bin/env bash
# Boot a QEMU guest whose file systems are served by a vhost-user-fs daemon
# (vfsd, or virtiofsd for comparison), run one command in it and exit with
# that command's exit status.
#
# Usage: scripts/run-vm.sh [options] [-- COMMAND...]
#   COMMAND runs in the guest with sh -c, in the first share (mounted at
#   /mnt/TAG, also $VFSD_SHARE); test scripts are in /guest-tests.
#   Without COMMAND (and without --shell) the guest just boots and reports 0.
#
# Options:
#   --share DIR[:TAG[:OPTS]]  export DIR with TAG (default share0, share1, ...).
#                   OPTS: guest mount options joined with '+' (e.g. ro), or
#                   'nomount' to leave mounting to the command.  Repeatable.
#                   Default: one fresh empty directory, removed afterwards.
#   --no-share      no daemon, no shares (just boot)
#   --daemon T      daemon preset 'vfsd' (default) or 'virtiofsd', or a command
#                   template with {socket} {dir} {tag} placeholders, e.g.
#                   'target/release/vfsd --socket-path={socket} --shared-dir={dir}'
#   --daemon-args A extra arguments appended to every daemon command
#   --share-args TAG A  extra arguments for the daemon of share TAG only (repeatable)
#   --queues N      num-request-queues per device (default 1)
#   --queue-size N  virtqueue size (default 1024)
#   --mem SIZE      guest memory, e.g. 2G (default 2G)
#   --cpus N        guest vCPUs (default 2)
#   --accel A       auto (default: KVM if a probe boot works, else TCG), kvm, tcg
#   --qemu PATH     the QEMU binary (default: $VFSD_QEMU, else qemu-system-x86_64
#                   from PATH, QEMU 10 after scripts/setup.sh). One outside /usr and
#                   /usr/local, e.g. bookworm's 7.2 from scripts/fetch-qemu.sh, gets
#                   -L for its own data directory and the host's firmware (seabios).
#   --kernel PATH   guest kernel (default: scripts/fetch-kernel.sh)
#   --initrd PATH   initramfs (default: scripts/build-initramfs.sh)
#   --append ARGS   extra kernel command line
#   --chroot TAG    run COMMAND chrooted into the share TAG (a full userland)
#   --timeout SECS  kill everything and fail after SECS (default 900; 0 = none)
#   --shell         interactive shell on the console instead of COMMAND
#   --log FILE      also keep the guest console log in FILE
#   --quiet         do not echo the guest console
#   --keep          keep the work directory (sockets, logs, default share)
#   --workdir DIR   use DIR as the work directory (default: new dir in $TMPDIR)
#
# Exit status: the guest command's status; 124 timeout; 120 guest setup
# failed (e.g. mount); 125 runner/daemon/QEMU error.  A guest kernel that
# crashes before /init runs is booted once more (VFSD_BOOT_ATTEMPTS=2).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${VFSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfsd}
QEMU=${VFSD_QEMU:-${QEMU:-qemu-system-x86_64}}

SHARES=()
declare -A SHARE_ARGS=()
NO_SHARE=0
DAEMON=${VFSD_DAEMON:-vfsd}
DAEMON_ARGS=${VFSD_DAEMON_ARGS:-}
QUEUES=1
QSIZE=1024
MEM=2G
CPUS=2
ACCEL=${VFSD_ACCEL:-auto}
KERNEL=${VFSD_KERNEL:-}
INITRD=${VFSD_INITRD:-}
APPEND=
CHROOT=
TIMEOUT=900
SHELL_MODE=0
LOGCOPY=
QUIET=0
KEEP=0
WORKDIR=
CMD=

say() { printf 'run-vm: %s\n' "$*" >&2; }
die() { printf 'run-vm: error: %s\n' "$*" >&2; exit 125; }

while [ $# -gt 0 ]; do
    case $1 in
        --share) SHARES+=("${2:?--share needs DIR[:TAG[:OPTS]]}"); shift 2 ;;
        --no-share) NO_SHARE=1; shift ;;
        --daemon) DAEMON=${2:?--daemon needs a preset or template}; shift 2 ;;
        --daemon-args) DAEMON_ARGS=${2?}; shift 2 ;;
        --share-args) SHARE_ARGS[${2:?--share-args needs TAG and ARGS}]=${3?--share-args needs TAG and ARGS}; shift 3 ;;
        --queues) QUEUES=${2:?}; shift 2 ;;
        --queue-size) QSIZE=${2:?}; shift 2 ;;
        --mem) MEM=${2:?}; shift 2 ;;
        --cpus) CPUS=${2:?}; shift 2 ;;
        --accel) ACCEL=${2:?}; shift 2 ;;
        --qemu) QEMU=${2:?--qemu needs the path of a QEMU binary}; shift 2 ;;
        --kernel) KERNEL=${2:?}; shift 2 ;;
        --initrd) INITRD=${2:?}; shift 2 ;;
        --append) APPEND=${2?}; shift 2 ;;
        --chroot) CHROOT=${2:?}; shift 2 ;;
        --timeout) TIMEOUT=${2:?}; shift 2 ;;
        --shell) SHELL_MODE=1; shift ;;
        --log) LOGCOPY=${2:?}; shift 2 ;;
        --quiet) QUIET=1; shift ;;
        --keep) KEEP=1; shift ;;
        --workdir) WORKDIR=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; CMD="$*"; break ;;
        *) die "unknown option '$1' (try --help; put the guest command after --)" ;;
    esac
done

case $ACCEL in auto|kvm|tcg) ;; *) die "--accel must be auto, kvm or tcg" ;; esac
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"
[[ $QUEUES =~ ^[0-9]+$ ]] && [ "$QUEUES" -ge 1 ] || die "--queues must be >= 1"
case $QEMU in
    */*) [ -f "$QEMU" ] && [ -x "$QEMU" ] || die "--qemu $QEMU: no such executable (bookworm's 7.2: scripts/fetch-qemu.sh prints its path)" ;;
    *) command -v "$QEMU" >/dev/null || die "$QEMU not found: apt-get install qemu-system-x86 (scripts/setup.sh installs QEMU 10)" ;;
esac
QEMU_VERSION=$("$QEMU" --version 2>/dev/null | sed -n '1s/^QEMU emulator version \([0-9][0-9.]*\).*/\1/p')
[ -n "$QEMU_VERSION" ] || die "'$QEMU --version' does not say which QEMU it is; is it a QEMU binary?"

# A QEMU unpacked outside /usr (scripts/fetch-qemu.sh) finds the data files of its own
# package (keymaps, option ROMs) relative to itself, but not the firmware of other
# packages: give it its data directory first, then the host's firmware directories that
# it has no copy of. The host's /usr/share/qemu is left out: it belongs to another version.
QEMU_DATA_ARGS=()
qemu_bin=$(readlink -f "$(command -v "$QEMU")")
qemu_prefix=$(dirname "$(dirname "$qemu_bin")")
case $qemu_prefix in
    /usr|/usr/local) ;;
    *)
        [ -d "$qemu_prefix/share/qemu" ] && QEMU_DATA_ARGS+=(-L "$qemu_prefix/share/qemu")
        for fw in share/seabios lib/ipxe/qemu; do
            if [ ! -d "$qemu_prefix/$fw" ] && [ -d "/usr/$fw" ]; then QEMU_DATA_ARGS+=(-L "/usr/$fw"); fi
        done
        bios_found=0
        for fw in "$qemu_prefix/share/qemu" "$qemu_prefix/share/seabios" /usr/share/seabios; do
            [ -f "$fw/bios-256k.bin" ] && bios_found=1
        done
        [ "$bios_found" = 1 ] || die "no bios-256k.bin for $qemu_bin (in $qemu_prefix/share or /usr/share/seabios): apt-get install seabios"
        ;;
esac

# Memory size in MiB for -m and the memfd backend (they must match).
case $MEM in
    *[Gg]) MEM_MB=$(( ${MEM%[Gg]} * 1024 )) ;;
    *[Mm]) MEM_MB=${MEM%[Mm]} ;;
    *[0-9]) MEM_MB=$MEM ;;
    *) die "--mem: use e.g. 2G or 1536M" ;;
esac

# --- Kernel and initramfs ----------------------------------------------------
if [ -z "$KERNEL" ]; then
    KERNEL=$("$HERE/fetch-kernel.sh") || die "could not get a guest kernel (see above); pass one with --kernel PATH"
fi
[ -r "$KERNEL" ] || die "kernel '$KERNEL' not readable"
if [ -z "$INITRD" ]; then
    INITRD=$("$HERE/build-initramfs.sh") || die "could not build the initramfs (see above); pass one with --initrd PATH"
fi
[ -r "$INITRD" ] || die "initramfs '$INITRD' not readable"

# --- Work directory and cleanup ------------------------------------------------
if [ -n "$WORKDIR" ]; then
    mkdir -p "$WORKDIR" || die "cannot create --workdir $WORKDIR"
    WORK=$(cd "$WORKDIR" && pwd)
else
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/vfsd-run.XXXXXX")
fi
# vhost-user sockets: unix socket paths must stay short (108 bytes).
SOCKDIR=$WORK
if [ ${#WORK} -gt 80 ]; then SOCKDIR=$(mktemp -d /tmp/vfsd-sock.XXXXXX); fi
QEMU_PID=
TAIL_PID=
DAEMON_PIDS=()
STATUS=125
cleanup() {
    local p
    set +e
    [ -n "$TAIL_PID" ] && kill "$TAIL_PID" 2>/dev/null
    if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
        kill "$QEMU_PID" 2>/dev/null; sleep 1; kill -9 "$QEMU_PID" 2>/dev/null
    fi
    for p in "${DAEMON_PIDS[@]}"; do
        if kill -0 "$p" 2>/dev/null; then
            kill "$p" 2>/dev/null; sleep 0.5; kill -9 "$p" 2>/dev/null
        fi
    done
    wait 2>/dev/null
    [ "$SOCKDIR" != "$WORK" ] && rm -rf "$SOCKDIR"
    if [ "$KEEP" = 1 ] || { [ "$STATUS" != 0 ] && [ "$SHELL_MODE" = 0 ]; }; then
        say "work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

# --- Accelerator ---------------------------------------------------------------
kvm_usable() { [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ]; }
if [ "$ACCEL" = auto ]; then
    ACCEL=tcg
    if kvm_usable; then
        key="$(uname -r) $("$QEMU" --version | head -n1) $(stat -L -c '%n %Y' "$KERNEL")"
        probe=$CACHE/accel-probe
        if [ -f "$probe" ] && [ "$(head -n1 "$probe")" = "$key" ] &&
           [ $(( $(date +%s) - $(stat -c %Y "$probe") )) -lt 86400 ]; then
            ACCEL=$(sed -n 2p "$probe")
            say "accelerator: $ACCEL (cached probe result; delete $probe to re-probe)"
        else
            say "probing KVM with a short boot (up to 60 s) ..."
            mininit=$("$HERE/build-initramfs.sh" --no-tools 2>/dev/null) || mininit=$INITRD
            mkdir -p "$CACHE"
            if "$0" --no-share --accel kvm --qemu "$QEMU" --kernel "$KERNEL" --initrd "$mininit" --timeout 60 --quiet --mem 512M \
                    --workdir "$WORK/kvm-probe" > "$CACHE/accel-probe.log" 2>&1; then
                ACCEL=kvm
            else
                cat "$WORK/kvm-probe/qemu.log" >> "$CACHE/accel-probe.log" 2>/dev/null
                say "KVM probe boot failed; using TCG (details: $CACHE/accel-probe.log)"
            fi
            mkdir -p "$CACHE"; printf '%s\n%s\n' "$key" "$ACCEL" > "$probe"
            say "accelerator: $ACCEL"
        fi
    else
        say "accelerator: tcg (/dev/kvm not usable)"
    fi
elif [ "$ACCEL" = kvm ]; then
    kvm_usable || die "--accel kvm but /dev/kvm is missing or not accessible (load kvm modules or use --accel tcg)"
fi
if [ "$ACCEL" = kvm ]; then
    ACCEL_ARGS=(-accel kvm -cpu host)
else
    ACCEL_ARGS=(-accel tcg,thread=multi -cpu max)
fi

# --- Daemon command ------------------------------------------------------------
find_virtiofsd() {
    local p
    for p in "$(command -v virtiofsd 2>/dev/null)" "$HOME/.cargo/bin/virtiofsd" /usr/libexec/virtiofsd /usr/lib/qemu/virtiofsd; do
        [ -n "$p" ] && [ -x "$p" ] && { echo "$p"; return 0; }
    done
    return 1
}
case $DAEMON in
    vfsd)
        bin=${VFSD_BIN:-$REPO/target/release/vfsd}
        [ -x "$bin" ] || [ "$NO_SHARE" = 1 ] || die "$bin not found: build it with 'cargo build --release', or use --daemon virtiofsd"
        # No --tag: QEMU uses the device's tag= anyway, and some QEMU 7.1-8.0
        # builds crash when a backend offers the vhost-user CONFIG feature.
        # vfsd runs with its defaults: namespace sandbox and seccomp kill.
        TEMPLATE="$bin --socket-path={socket} --shared-dir={dir} --xattr"
        ;;
    virtiofsd)
        bin=$(find_virtiofsd) || [ "$NO_SHARE" = 1 ] || die "virtiofsd not found: cargo install virtiofsd --version 1.14.0 --locked"
        TEMPLATE="$bin --socket-path={socket} --shared-dir={dir} --sandbox none --xattr"
        ;;
    *)
        TEMPLATE=$DAEMON
        case $TEMPLATE in *'{socket}'*) ;; *) die "--daemon template must contain {socket} (and usually {dir})" ;; esac
        ;;
esac
[ -n "$DAEMON_ARGS" ] && TEMPLATE="$TEMPLATE $DAEMON_ARGS"

# --- Shares ---------------------------------------------------------------------
if [ "$NO_SHARE" = 0 ] && [ ${#SHARES[@]} -eq 0 ]; then
    mkdir -p "$WORK/share0"
    SHARES=("$WORK/share0:share0")
fi
[ "$NO_SHARE" = 1 ] && SHARES=()

FS_ARGS=()
MOUNTS=
SH_SOCK=()
SH_CMD=()
i=0
for spec in "${SHARES[@]}"; do
    IFS=: read -r dir tag opts <<<"$spec"
    tag=${tag:-share$i}
    [ -d "$dir" ] || die "share directory '$dir' does not exist"
    [[ $tag =~ ^[A-Za-z0-9_.-]{1,36}$ ]] || die "tag '$tag': use 1-36 letters, digits, '_', '.', '-'"
    dir=$(cd "$dir" && pwd)
    sock=$SOCKDIR/fs$i.sock
    cmd=${TEMPLATE//\{socket\}/$(printf '%q' "$sock")}
    cmd=${cmd//\{dir\}/$(printf '%q' "$dir")}
    cmd=${cmd//\{tag\}/$(printf '%q' "$tag")}
    [ -n "${SHARE_ARGS[$tag]:-}" ] && cmd="$cmd ${SHARE_ARGS[$tag]}"
    SH_SOCK+=("$sock")
    SH_CMD+=("$cmd")
    FS_ARGS+=(-chardev "socket,id=fs$i,path=$sock"
              -device "vhost-user-fs-pci,chardev=fs$i,tag=$tag,num-request-queues=$QUEUES,queue-size=$QSIZE")
    if [ "$opts" != nomount ]; then
        MOUNTS=$MOUNTS${MOUNTS:+,}$tag${opts:+:$opts}
    fi
    say "share $i: $dir as tag '$tag'${opts:+ ($opts)}"
    say "daemon $i: $cmd"
    i=$((i + 1))
done

stop_pid() {  # TERM, then KILL after 2 s
    local n
    kill "$1" 2>/dev/null || return 0
    for n in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$1" 2>/dev/null || return 0; sleep 0.2; done
    kill -9 "$1" 2>/dev/null || true
}

start_daemons() {  # one daemon per share; waits for each socket
    local i
    DAEMON_PIDS=()
    for i in "${!SH_SOCK[@]}"; do
        rm -f "${SH_SOCK[$i]}"
        bash -c "exec ${SH_CMD[$i]}" </dev/null >>"$WORK/daemon$i.log" 2>&1 &
        DAEMON_PIDS+=($!)
        for _ in $(seq 1 100); do
            [ -S "${SH_SOCK[$i]}" ] && break
            if ! kill -0 "${DAEMON_PIDS[$i]}" 2>/dev/null; then
                tail -n 20 "$WORK/daemon$i.log" >&2
                die "daemon $i exited before creating its socket (log above: $WORK/daemon$i.log)"
            fi
            sleep 0.1
        done
        [ -S "${SH_SOCK[$i]}" ] || die "daemon $i did not create ${SH_SOCK[$i]} within 10 s (log: $WORK/daemon$i.log)"
    done
}

collect_daemons() {  # daemons should exit by themselves once QEMU disconnects
    local i p drc
    daemon_fail=0
    for i in "${!DAEMON_PIDS[@]}"; do
        p=${DAEMON_PIDS[$i]}
        for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$p" 2>/dev/null; then
            say "daemon $i still running 5 s after QEMU exited; stopping it"
            stop_pid "$p"
            wait "$p" 2>/dev/null || true
        else
            set +e; wait "$p"; drc=$?; set -e
            if [ "$drc" -ge 128 ]; then
                say "daemon $i died from signal $((drc - 128)) (log: $WORK/daemon$i.log)"
                tail -n 20 "$WORK/daemon$i.log" >&2
                daemon_fail=1
            elif [ "$drc" -ne 0 ]; then
                say "daemon $i exited with status $drc (log: $WORK/daemon$i.log)"
                tail -n 10 "$WORK/daemon$i.log" >&2
            fi
        fi
    done
    DAEMON_PIDS=()
}

# --- Guest command line ----------------------------------------------------------
KARGS="console=ttyS0 mitigations=off panic=-1 quiet loglevel=4 tsc=reliable"
[ -n "$MOUNTS" ] && KARGS="$KARGS vfsd.mounts=$MOUNTS"
if [ "$SHELL_MODE" = 1 ]; then
    KARGS="$KARGS vfsd.shell=1"
elif [ -n "$CMD" ]; then
    KARGS="$KARGS vfsd.cmd=$(printf '%s' "$CMD" | base64 -w0)"
fi
[ -n "$CHROOT" ] && KARGS="$KARGS vfsd.chroot=$CHROOT"
[ -n "$APPEND" ] && KARGS="$KARGS $APPEND"
[ ${#KARGS} -lt 2000 ] || die "kernel command line too long (${#KARGS} chars); shorten the guest command (put it in a script under guest-tests/)"

QEMU_ARGS=(
    "${QEMU_DATA_ARGS[@]}" -nodefaults -no-user-config -nographic -no-reboot
    -machine q35 "${ACCEL_ARGS[@]}" -smp "$CPUS" -m "${MEM_MB}M"
    -object "memory-backend-memfd,id=mem,size=${MEM_MB}M,share=on" -numa node,memdev=mem
    -kernel "$KERNEL" -initrd "$INITRD" -append "$KARGS"
    "${FS_ARGS[@]}"
)

LOG=$WORK/console.log
start=$(date +%s)
say "booting: $QEMU (QEMU $QEMU_VERSION${QEMU_DATA_ARGS[*]:+, ${QEMU_DATA_ARGS[*]}}, accel=$ACCEL, ${CPUS} vCPU, ${MEM_MB} MiB, ${#SHARES[@]} share(s), timeout ${TIMEOUT}s)"
if [ "$SHELL_MODE" = 1 ]; then
    start_daemons
    say "interactive shell: Ctrl-A x quits QEMU, 'poweroff -f' powers off"
    set +e
    "$QEMU" "${QEMU_ARGS[@]}" -serial mon:stdio
    STATUS=$?
    set -e
    exit "$STATUS"
fi

run_guest() {  # one boot; sets qemu_rc, timed_out, daemon_died, elapsed
    local idx result_seen=
    : > "$LOG"
    "$QEMU" "${QEMU_ARGS[@]}" -monitor none -chardev "file,id=con,path=$LOG" -serial chardev:con \
        </dev/null >"$WORK/qemu.log" 2>&1 &
    QEMU_PID=$!
    if [ "$QUIET" = 0 ]; then
        tail -n +1 -f --pid="$QEMU_PID" "$LOG" 2>/dev/null &
        TAIL_PID=$!
    fi
    timed_out=0
    daemon_died=
    while kill -0 "$QEMU_PID" 2>/dev/null; do
        # A daemon that goes away while the guest still runs leaves the guest
        # hanging on its requests: stop early instead of waiting for the timeout.
        if [ -z "$daemon_died" ] && ! grep -q 'VFSD-RESULT:' "$LOG" 2>/dev/null; then
            for idx in "${!DAEMON_PIDS[@]}"; do
                if ! kill -0 "${DAEMON_PIDS[$idx]}" 2>/dev/null; then
                    # QEMU may have exited first (a guest crash): an exited, unreaped
                    # QEMU still passes kill -0, and the daemon then leaves on the
                    # disconnect. That is no daemon death.
                    sleep 0.2
                    qstate=$(awk '{print $3}' "/proc/$QEMU_PID/stat" 2>/dev/null || echo gone)
                    case $qstate in Z|X|gone) break 2 ;; esac
                    daemon_died=$idx
                    say "daemon $idx exited while the guest was running; stopping QEMU"
                    stop_pid "$QEMU_PID"
                    break
                fi
            done
            [ -n "$daemon_died" ] && break
        fi
        if [ "$TIMEOUT" -gt 0 ] && [ $(( $(date +%s) - start )) -ge "$TIMEOUT" ]; then
            timed_out=1
            say "TIMEOUT: guest still running after ${TIMEOUT}s; killing QEMU"
            stop_pid "$QEMU_PID"
            break
        fi
        # A hung daemon is not a reason to wait for the full timeout if the
        # guest already reported (e.g. stuck in poweroff): give it 30 s.
        if grep -q 'VFSD-RESULT:' "$LOG" 2>/dev/null; then
            [ -z "$result_seen" ] && result_seen=$(date +%s)
            if [ $(( $(date +%s) - result_seen )) -ge 30 ]; then
                say "guest reported a result but did not power off within 30 s; killing QEMU"
                stop_pid "$QEMU_PID"
                break
            fi
        fi
        sleep 0.5
    done
    set +e
    wait "$QEMU_PID"; qemu_rc=$?
    set -e
    QEMU_PID=
    if [ -n "$TAIL_PID" ]; then
        sleep 0.3; kill "$TAIL_PID" 2>/dev/null || true; wait "$TAIL_PID" 2>/dev/null || true; TAIL_PID=
    fi
    elapsed=$(( $(date +%s) - start ))
}

# The guest kernel occasionally crashes while booting under multi-threaded
# TCG (e.g. "Oops: int3" while it patches its own code), before /init runs.
# That says nothing about the daemon, so boot once more in that case.
BOOT_ATTEMPTS=${VFSD_BOOT_ATTEMPTS:-2}
attempt=1
while :; do
    start_daemons
    run_guest
    collect_daemons
    result=$(tr -d '\r' < "$LOG" | sed -n 's/^VFSD-RESULT: \([0-9][0-9]*\)$/\1/p' | tail -n1)
    if [ -z "$result" ] && [ "$timed_out" = 0 ] && [ -z "$daemon_died" ] && [ "$attempt" -lt "$BOOT_ATTEMPTS" ] &&
       ! grep -q 'vfsd-init:' "$LOG" && grep -qE 'Kernel panic|Oops|BUG:' "$LOG"; then
        cp "$LOG" "$WORK/console-boot$attempt.log"
        say "the guest kernel crashed before /init ran ($(grep -m1 -oE 'Oops: [^[]*|Kernel panic[^\r]*|BUG: [^\r]*' "$LOG")); booting again (log of the crash: $WORK/console-boot$attempt.log)"
        attempt=$((attempt + 1))
        continue
    fi
    break
done
if [ -n "$LOGCOPY" ]; then cp "$LOG" "$LOGCOPY"; fi

if [ "$timed_out" = 1 ]; then
    STATUS=124
    say "FAILED: timed out after ${TIMEOUT}s (console log: $LOG)"
elif [ -n "$daemon_died" ]; then
    STATUS=125
    say "FAILED: daemon $daemon_died died while the guest was running (log: $WORK/daemon$daemon_died.log)"
    say "last console lines:"; tail -n 15 "$LOG" | tr -d '\r' >&2
elif [ -z "$result" ]; then
    STATUS=125
    say "FAILED: the guest did not report a result (QEMU exit status $qemu_rc after ${elapsed}s)"
    if [ -s "$WORK/qemu.log" ]; then say "QEMU said:"; tail -n 20 "$WORK/qemu.log" >&2; fi
    say "last console lines:"; tail -n 15 "$LOG" | tr -d '\r' >&2
else
    STATUS=$result
    if [ "$STATUS" = 0 ] && [ "$daemon_fail" = 1 ]; then
        STATUS=125
        say "FAILED: guest command passed but the daemon crashed"
    elif [ "$STATUS" = 120 ]; then
        say "FAILED: guest setup failed (see the console output above)"
    elif [ "$STATUS" = 0 ]; then
        say "guest command succeeded (${elapsed}s)"
    else
        say "FAILED: guest command exited with status $STATUS (${elapsed}s)"
    fi
fi
exit "$STATUS"
