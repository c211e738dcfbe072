#!/usr/bin/env bash
# vfsd under libvirt 11 (issue 22): libvirt starts the daemon itself from
# <filesystem><binary path=...>, and saves, restores and migrates the domain.
#
# Tests (--test, comma-separated; default save,locks):
#   save   A TCG domain (transient, kernel + busybox initramfs of scripts/run-vm.sh)
#          with one virtiofs share: the guest opens lv/data.log once and writes
#          "line N" through that fd every ~100 ms.  The host runs 'virsh save' to a
#          file (the domain and its daemon end), then 'virsh restore' (libvirt starts
#          a new daemon, which loads the device state), creates lv/host.restored; the
#          guest writes 20 more lines through the same fd and checks: the fd still
#          names lv/data.log, same inode, every line there once and in order.  The
#          host checks data.log too.  Figures: save and restore times, state file size.
#   managedsave  As 'save' with a persistent domain (virsh define, start): 'virsh
#          managedsave' (the domain stops, libvirt keeps its state), then 'virsh start'
#          (libvirt restores from it with a new daemon); the same checks as 'save'.
#          The domain is undefined (with its managed save) at the end.
#   locks  What libvirt 11 does with <binary><lock posix= flock=/>:
#          1. the binary's own capabilities (vfsd: separate-options): the domain
#             must fail to start with "locking options are not supported by this
#             virtiofsd";
#          2. a wrapper as <binary path> that hides separate-options from
#             --print-capabilities: libvirt passes the legacy -o form; with lock
#             'on' the guest's flock and POSIX lock must be seen on the host
#             (refused there), with 'off' not (granted there).
#   argv   The argv libvirt builds for a <binary> with the options it knows (cache,
#          xattr, thread_pool, openfiles and an idmap with the namespace sandbox;
#          then sandbox chroot), with and without separate-options; the daemon must
#          start and the guest mount the share.
#   config The <filesystem> of vmm-configs/libvirt-virtiofs.xml (binary path and
#          source dir replaced) in the test domain: validates, starts, mounts.
#   live   'virsh migrate --live' between two libvirtd on this host: a second
#          libvirtd in a mount + UTS namespace of its own (own /run/libvirt,
#          /var/lib/libvirt, /var/log/libvirt, /var/cache/libvirt, /etc/libvirt,
#          host name and host_uuid), reached on its own socket; the guest writes
#          as in 'save'.  Figures: virsh migrate time, domjobinfo downtime.
#
# Usage: scripts/libvirt-migrate.sh [options]
#   --test LIST     save,managedsave,locks,argv,config,live (default save,locks)
#   --daemon D      vfsd (default) or virtiofsd (for comparison)
#   --bin PATH      the daemon binary (vfsd: $VFSD_BIN, else target/release/vfsd;
#                   virtiofsd: PATH or ~/.cargo/bin). Copied into RESULTS first.
#   --caps LIST     'save'/'live': run the binary through a wrapper whose
#                   --print-capabilities advertises only these features
#                   (comma-separated, '' for none), e.g. migrate-precopy; without
#                   migrate-precopy 'save' expects libvirt to refuse the save
#   --sandbox M     <sandbox mode=M/> (namespace or chroot; default: none given)
#   --locks         'save'/'live': <lock posix='on' flock='on'/> (needs --caps without
#                   separate-options); the guest holds a flock and a POSIX lock across
#                   the save/restore or migration, which the host must see before and after
#   --results DIR   logs, share, state file, summary (default: new dir in $TMPDIR)
#   --mem MIB       guest memory in MiB (default 512)
#   --after N       lines the guest writes before the host saves (default 30)
#   --kernel PATH, --initrd PATH   (default: as scripts/run-vm.sh; initrd is the
#                   busybox-only image of scripts/build-initramfs.sh --no-tools)
#   --timeout SECS  per wait (default 300)
#   --setup         install libvirt 11 (bookworm-backports) if needed and start it
#                   (without systemd), then go on; --setup-only: just that
# Needs root, libvirt >= 11 running (see --setup), QEMU >= 10, a static-capable C
# compiler for the lock helper (guest-tests/src/vfsd-lock.c).
# Exit status: 0 all checks passed; 1 a check failed; 2 usage or set-up error.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${VFSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfsd}
TESTS=save,locks
DAEMON=vfsd
BIN=
CAPS=
CAPS_SET=0
LOCKS=0
SANDBOX=
RESULTS=
MEM=512
AFTER=30
KERNEL=${VFSD_KERNEL:-}
INITRD=${VFSD_INITRD:-}
TIMEOUT=300
SETUP=0
URI=qemu:///system

say() { printf 'libvirt-migrate: %s\n' "$*"; }
die() { printf 'libvirt-migrate: error: %s\n' "$*" >&2; exit 2; }

# --- libvirt 11 without systemd (for scripts/setup.sh) -----------------------------
# lv_install: libvirt 11 from bookworm-backports (trixie and later: their own), only
# the daemon, its QEMU driver and virsh; never another QEMU (apt is asked first what
# it would do, and refused if that touches a qemu-system package).  Idempotent.
lv_install() {
    local v pkgs sim
    v=$(libvirtd --version 2>/dev/null | sed -n 's/.* \([0-9][0-9]*\)\..*/\1/p')
    if [ -n "$v" ] && [ "$v" -ge 11 ] && command -v virsh >/dev/null &&
        ls /usr/lib/*/libvirt/connection-driver/libvirt_driver_qemu.so >/dev/null 2>&1; then
        return 0
    fi
    pkgs="libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients"
    if grep -qs '^VERSION_CODENAME=bookworm' /etc/os-release; then
        # pkg/bookworm-backports takes only these from backports; their
        # dependencies come from bookworm where they can (systemd-container: 252).
        pkgs="libvirt-daemon/bookworm-backports libvirt-daemon-driver-qemu/bookworm-backports libvirt-clients/bookworm-backports"
    fi
    apt-get update -qq || return 1
    # shellcheck disable=SC2086
    sim=$(apt-get install -s --no-install-recommends $pkgs 2>&1) || { echo "$sim" >&2; return 1; }
    if echo "$sim" | grep -E '^(Inst|Remv) qemu-system' >&2; then
        echo "libvirt-migrate: apt would change QEMU (above); not installing libvirt" >&2
        return 1
    fi
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null || return 1
    v=$(libvirtd --version 2>/dev/null | sed -n 's/.* \([0-9][0-9]*\)\..*/\1/p')
    [ -n "$v" ] && [ "$v" -ge 11 ] || { echo "libvirt-migrate: libvirtd is $(libvirtd --version 2>&1), not 11" >&2; return 1; }
}

# lv_start: virtlogd and libvirtd as daemons (no systemd, no socket activation);
# nothing is started when virsh already reaches them.  Idempotent.
# Without udev /dev/kvm stays root:root 0600; libvirt probes QEMU as libvirt-qemu,
# finds KVM "not available now" and probes QEMU again at every domain start (3-13 s
# here, in each virsh create and restore).  udev's rule would make it root:kvm 0660.
lv_start() {
    local i
    if [ -c /dev/kvm ] && [ "$(stat -c %G:%a /dev/kvm)" = root:600 ] && getent group kvm >/dev/null; then
        chgrp kvm /dev/kvm && chmod 660 /dev/kvm
    fi
    virsh -c qemu:///system version >/dev/null 2>&1 && return 0
    # virtlogd first: libvirtd hands it the QEMU and virtiofsd logs.
    if ! { [ -S /run/libvirt/virtlogd-sock ] && [ -s /run/virtlogd.pid ] &&
           kill -0 "$(cat /run/virtlogd.pid)" 2>/dev/null; }; then
        virtlogd -d || return 1
    fi
    if ! { [ -s /run/libvirtd.pid ] && kill -0 "$(cat /run/libvirtd.pid)" 2>/dev/null; }; then
        libvirtd -d || return 1
    fi
    for i in $(seq 1 30); do
        virsh -c qemu:///system version >/dev/null 2>&1 && return 0
        sleep 1
    done
    echo "libvirt-migrate: libvirtd started but virsh cannot reach qemu:///system" >&2
    return 1
}

while [ $# -gt 0 ]; do
    case $1 in
        --test) TESTS=${2:?}; shift 2 ;;
        --daemon) DAEMON=${2:?}; shift 2 ;;
        --bin) BIN=${2:?}; shift 2 ;;
        --caps) CAPS=${2?}; CAPS_SET=1; shift 2 ;;
        --sandbox) SANDBOX=${2:?}; shift 2 ;;
        --locks) LOCKS=1; shift ;;
        --results) RESULTS=${2:?}; shift 2 ;;
        --mem) MEM=${2:?}; shift 2 ;;
        --after) AFTER=${2:?}; shift 2 ;;
        --kernel) KERNEL=${2:?}; shift 2 ;;
        --initrd) INITRD=${2:?}; shift 2 ;;
        --timeout) TIMEOUT=${2:?}; shift 2 ;;
        --setup) SETUP=1; shift ;;
        --setup-only) SETUP=2; shift ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done

[ "$(id -u)" = 0 ] || die "needs root (libvirt's system instance runs the daemon as root)"
if [ "$SETUP" != 0 ]; then
    lv_install || die "installing libvirt 11 failed"
    lv_start || die "starting virtlogd/libvirtd failed"
    say "libvirt $(libvirtd --version | awk '{print $NF}') running (libvirtd pid $(cat /run/libvirtd.pid 2>/dev/null))"
    [ "$SETUP" = 2 ] && exit 0
fi
command -v virsh >/dev/null || die "virsh not found: run with --setup (libvirt 11 from bookworm-backports)"
virsh -c "$URI" version >/dev/null 2>&1 || die "libvirtd not reachable at $URI: run with --setup, or 'virtlogd -d; libvirtd -d'"
LV_VERSION=$(virsh -c "$URI" version | sed -n 's/^Using library: libvirt //p')
case $LV_VERSION in 1[1-9].*|[2-9][0-9].*) ;; *) die "libvirt is $LV_VERSION; this test is for libvirt >= 11 (--setup)" ;; esac
QEMU=$(command -v qemu-system-x86_64) || die "qemu-system-x86_64 not found (scripts/setup.sh)"
QEMU_VERSION=$("$QEMU" --version | sed -n '1s/^QEMU emulator version \([0-9.]*\).*/\1/p')

case $DAEMON in
    vfsd) [ -n "$BIN" ] || BIN=${VFSD_BIN:-$REPO/target/release/vfsd} ;;
    virtiofsd)
        [ -n "$BIN" ] || BIN=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")
        ;;
    *) die "--daemon: vfsd or virtiofsd" ;;
esac
[ -x "$BIN" ] || die "daemon binary '$BIN' not found (cargo build --release, or --bin)"
[ -n "$KERNEL" ] || KERNEL=$("$HERE/fetch-kernel.sh") || die "no guest kernel (scripts/fetch-kernel.sh)"
[ -n "$INITRD" ] || INITRD=$("$HERE/build-initramfs.sh" --no-tools) || die "no initramfs (scripts/build-initramfs.sh --no-tools)"
[ -r "$KERNEL" ] && [ -r "$INITRD" ] || die "kernel '$KERNEL' or initrd '$INITRD' not readable"
command -v cc >/dev/null || die "no C compiler for guest-tests/src/vfsd-lock.c (apt-get install gcc)"

[ -n "$RESULTS" ] || RESULTS=$(mktemp -d "${TMPDIR:-/tmp}/vfsd-libvirt.XXXXXX")
mkdir -p "$RESULTS" || die "cannot create $RESULTS"
R=$(cd "$RESULTS" && pwd)
rm -rf "$R/share" "$R"/*.log "$R"/*.xml "$R"/state-* "$R/summary.txt" "$R"/wrap-*.sh
mkdir -p "$R/share/lv"
chmod 755 "$R"
DBIN=$R/$DAEMON
cp "$BIN" "$DBIN" || die "cannot copy $BIN"
SUMMARY=$R/summary.txt
FAILS=0
DOMS=()

figure() { printf '%-46s %s\n' "$1" "$2" | tee -a "$SUMMARY"; }
failed() { FAILS=$((FAILS + 1)); say "FAIL: $*"; echo "FAIL: $*" >> "$SUMMARY"; }
passed() { say "ok: $*"; echo "ok: $*" >> "$SUMMARY"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

cleanup() {
    local d
    for d in "${DOMS[@]}"; do
        virsh -c "$URI" destroy "$d" >/dev/null 2>&1
        virsh -c "$URI" undefine --managed-save "$d" >/dev/null 2>&1
        [ -n "${LIVE_URI:-}" ] && virsh -c "$LIVE_URI" destroy "$d" >/dev/null 2>&1
    done
    [ -n "${LIVE_PID:-}" ] && live_stop
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The lock helper, static: the guest runs it from the share, the host uses the same.
cc -O2 -Wall -static -o "$R/share/lv/vfsd-lock" "$REPO/guest-tests/src/vfsd-lock.c" 2>"$R/cc.log" ||
    die "cannot build a static vfsd-lock for the guest (libc.a missing? apt-get install libc6-dev); see $R/cc.log"
HOSTLOCK=$R/share/lv/vfsd-lock

# The guest's part is guest-tests/libvirt.sh (in the initramfs).

wait_file() {  # wait_file PATH SECS [DOMAIN]: 0 once PATH exists
    local i=0
    while [ ! -e "$1" ]; do
        i=$((i + 1)); [ "$i" -gt $(($2 * 5)) ] && return 1
        if [ -n "${3:-}" ] && [ $((i % 25)) = 0 ]; then
            case $(virsh -c "${4:-$URI}" domstate "$3" 2>/dev/null) in running*) ;; *) return 1 ;; esac
        fi
        sleep 0.2
    done
}

# The <binary path>: the copied daemon, or a wrapper that logs argv and, with CAPS
# set, answers --print-capabilities with only those features.
make_binary() {  # make_binary NAME [CAPS] -> path
    local w=$R/wrap-$1.sh feats=
    if [ $# -lt 2 ]; then echo "$DBIN"; return; fi
    if [ -n "$2" ]; then feats=$(echo "$2" | sed 's/[^,][^,]*/"&"/g; s/,/, /g'); fi
    cat > "$w" <<EOF
#!/bin/sh
# libvirt-migrate.sh: log argv; --print-capabilities with features [$feats]
echo "\$*" >> "$R/argv-$1.log"
if [ "\$1" = --print-capabilities ]; then
    echo '{"type": "fs", "features": [$feats]}'
    exit 0
fi
exec "$DBIN" "\$@"
EOF
    chmod 755 "$w"
    echo "$w"
}

domain_xml() {  # domain_xml NAME BINARY MODE [BINARY-EXTRA] [FS-EXTRA]
    local cmd
    cmd=$(printf '/guest-tests/libvirt.sh %s %s %s' "$3" "$AFTER" $((TIMEOUT * 10)) | base64 -w0)
    cat <<EOF
<domain type='qemu'>
  <name>$1</name>
  <memory unit='MiB'>$MEM</memory>
  <vcpu>1</vcpu>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>$KERNEL</kernel>
    <initrd>$INITRD</initrd>
    <cmdline>console=ttyS0 panic=-1 quiet loglevel=4 tsc=reliable vfsd.mounts=share0 vfsd.cmd=$cmd</cmdline>
  </os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <!-- QEMU as root, nothing relabelled: the kernel is under root's home -->
  <seclabel type='static' model='dac' relabel='no'><label>+0:+0</label></seclabel>
  <devices>
    <emulator>$QEMU</emulator>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
$(if [ -n "${FS_XML:-}" ]; then echo "$FS_XML"; else cat <<FS
    <filesystem type='mount' accessmode='passthrough'>
      <driver type='virtiofs' queue='1024'/>
      <binary path='$2' xattr='on'>${SANDBOX:+<sandbox mode='$SANDBOX'/>}${4:-}</binary>
      <source dir='$R/share'/>
      <target dir='share0'/>${5:-}
    </filesystem>
FS
fi)
    <serial type='file'><source path='$R/console-$1.log' append='on'/><target port='0'/></serial>
  </devices>
</domain>
EOF
}

start_domain() {  # start_domain NAME XMLFILE -> 0 started; the error in $R/start-NAME.err
    DOMS+=("$1")
    virsh -c "$URI" create --validate "$2" > "$R/start-$1.out" 2> "$R/start-$1.err"
}

collect_logs() {  # collect_logs NAME
    cp /var/log/libvirt/qemu/"$1".log "$R/libvirt-$1.log" 2>/dev/null
    cp /var/log/libvirt/qemu/"$1"-fs0-virtiofsd.log "$R/daemon-$1.log" 2>/dev/null
}

daemon_argv() {  # daemon_argv NAME [N]: the Nth (default last) daemon command libvirt logged
    grep -A1 'Starting external device: virtiofsd' "/var/log/libvirt/qemu/$1.log" 2>/dev/null |
        grep -v -e 'Starting external device' -e '^--$' | sed -n "${2:-\$}p"
}

host_sees_locks() {  # 0 if the guest's flock and POSIX lock both conflict on the host
    local fl px
    "$HOSTLOCK" -q "$R/share/lv/flockf" ex; fl=$?
    "$HOSTLOCK" -q -g "$R/share/lv/posixf" wr:0:0 >/dev/null; px=$?
    HOST_LOCKS="host flock -> $fl, F_GETLK -> $px (1 refused, 0 granted)"
    [ "$fl" = 1 ] && [ "$px" = 1 ]
}

state_lines() {  # state_lines LOG: the daemon's migration lines (info and up), joined
    local l
    l=$(grep -ihE 'device state|migrat' "$1" 2>/dev/null | grep -v DEBUG | sed 's/^\[[^]]*\] //' | tail -n 3 | tr '\n' '|')
    echo "${l:-(no migration lines at info level)}"
}

check_lines() {  # check_lines FILE: lines "line 1".."line N" -> prints N, 1 if not
    awk '$0 != "line " NR { e = 1 } END { print NR; exit e }' "$1"
}

# --- save / restore ----------------------------------------------------------------
write_prep() {  # write_prep: fresh markers; with --locks the guest holds locks too
    rm -f "$R/share/lv/guest.ready" "$R/share/lv/guest.result" "$R/share/lv/host.restored" \
        "$R/share/lv/release" "$R/share/lv/hold-locks"
    LOCKXML=
    if [ "$LOCKS" = 1 ]; then
        LOCKXML="<lock posix='on' flock='on'/>"
        : > "$R/share/lv/hold-locks"
    fi
}
locks_before() {  # locks_before TAG: with --locks, the host must see the guest's locks
    [ "$LOCKS" = 1 ] || return 0
    if host_sees_locks; then passed "$1: the guest's flock and POSIX lock are held on the host"
    else failed "$1: the guest's locks are not seen on the host: $HOST_LOCKS"; fi
}
locks_after() {  # locks_after TAG: the same after the restore/migration, then release them
    [ "$LOCKS" = 1 ] || return 0
    if host_sees_locks; then passed "$1: the guest's locks are held on the host again"
    else failed "$1: the guest's locks are gone on the host: $HOST_LOCKS"; fi
    : > "$R/share/lv/release"
}

# check_resumed TEST WHEN NAME INO0 N0: after a restore (WHEN says which), the guest's
# locks again, its own result, and data.log as the host sees it: lines 1..N in order, more
# than the N0 written before, in the same inode INO0; then the logs and figures.
check_resumed() {
    local t=$1 after=$2 name=$3 ino0=$4 n0=$5 res ino1 n1 inorder
    locks_after "$t"
    : > "$R/share/lv/host.restored"
    if ! wait_file "$R/share/lv/guest.result" "$TIMEOUT" "$name"; then
        failed "$t: no guest result $after (console: $R/console-$name.log)"
    else
        res=$(cat "$R/share/lv/guest.result")
        figure "[$t $DAEMON] guest" "$res"
        case $res in PASS*) passed "$t: guest resumed with its open fd, every line there ($DAEMON)" ;;
            *) failed "$t: guest: $res; $(grep 'lv: FAIL' "$R/console-$name.log" | tr -d '\r' | tr '\n' ' ')" ;; esac
    fi
    ino1=$(stat -c %i "$R/share/lv/data.log" 2>/dev/null)
    if n1=$(check_lines "$R/share/lv/data.log"); then inorder=yes; else inorder=no; fi
    if [ "$inorder" = yes ] && [ "$ino0" = "$ino1" ] && [ "$n1" -gt "$n0" ]; then
        passed "$t: host sees data.log line 1..$n1 in order, same inode ($n0 lines before)"
    else
        failed "$t: host: data.log has $n1 lines (line 1..N in order: $inorder), inode $ino0 -> $ino1"
    fi
    collect_logs "$name"
    figure "[$t $DAEMON] daemon log" "$(state_lines "$R/daemon-$name.log")"
}

test_save() {
    local name=vfsd-lv-save-$DAEMON-$$ bin xml t0 t1 t2 t3 st ino0 n0
    if [ "$CAPS_SET" = 1 ]; then bin=$(make_binary "$name" "$CAPS"); else bin=$(make_binary "$name"); fi
    xml=$R/$name.xml
    write_prep
    domain_xml "$name" "$bin" write "$LOCKXML" > "$xml"
    say "save: starting $name ($DAEMON$([ "$CAPS_SET" = 1 ] && echo ", capabilities [$CAPS]"))"
    start_domain "$name" "$xml" || { failed "save: virsh create: $(cat "$R/start-$name.err")"; collect_logs "$name"; return; }
    figure "[save $DAEMON] daemon argv (start)" "$(daemon_argv "$name" 1)"
    if ! wait_file "$R/share/lv/guest.ready" "$TIMEOUT" "$name"; then
        failed "save: the guest did not come up (console: $R/console-$name.log)"; collect_logs "$name"; return
    fi
    ino0=$(stat -c %i "$R/share/lv/data.log")
    locks_before "save"
    st=$R/state-$name.sav
    t0=$(now)
    if ! virsh -c "$URI" save "$name" "$st" > "$R/save.out" 2> "$R/save.err"; then
        collect_logs "$name"
        if [ "$CAPS_SET" = 1 ] && ! echo ",$CAPS," | grep -q ',migrate-precopy,'; then
            figure "[save $DAEMON] virsh save" "$(grep -v '^$' "$R/save.err" | tr '\n' ' ')"
            case $(cat "$R/save.err") in *"migration with this virtiofs device is not supported"*)
                passed "save: without migrate-precopy libvirt refuses to save the domain" ;;
                *) failed "save: virsh save failed otherwise: $(tr '\n' ' ' < "$R/save.err")" ;; esac
        else
            failed "save: virsh save: $(tr '\n' ' ' < "$R/save.err")"
        fi
        return
    fi
    if [ "$CAPS_SET" = 1 ] && ! echo ",$CAPS," | grep -q ',migrate-precopy,'; then
        failed "save: libvirt saved a domain whose daemon does not advertise migrate-precopy"
    fi
    t1=$(now)
    n0=$(wc -l < "$R/share/lv/data.log")
    figure "[save $DAEMON] virsh save" "$(elapsed "$t0" "$t1") s, state file $(du -m "$st" | cut -f1) MiB, $n0 lines written before"
    virsh -c "$URI" domstate "$name" >/dev/null 2>&1 && failed "save: the domain is still there after virsh save"
    sleep 2
    t2=$(now)
    if ! virsh -c "$URI" restore "$st" > "$R/restore.out" 2> "$R/restore.err"; then
        failed "save: virsh restore: $(tr '\n' ' ' < "$R/restore.err")"; collect_logs "$name"; return
    fi
    t3=$(now)
    figure "[save $DAEMON] virsh restore" "$(elapsed "$t2" "$t3") s"
    figure "[save $DAEMON] daemon argv (restore)" "$(daemon_argv "$name")"
    check_resumed save "after the restore" "$name" "$ino0" "$n0"
    virsh -c "$URI" destroy "$name" >/dev/null 2>&1
    rm -f "$st"
}

test_managedsave() {
    local name=vfsd-lv-msave-$DAEMON-$$ bin xml t0 t1 t2 t3 ino0 n0 info
    bin=$(make_binary "$name")
    xml=$R/$name.xml
    write_prep
    domain_xml "$name" "$bin" write "$LOCKXML" > "$xml"
    say "managedsave: defining and starting $name ($DAEMON)"
    DOMS+=("$name")
    if ! virsh -c "$URI" define --validate "$xml" > "$R/define-$name.out" 2> "$R/define-$name.err" ||
        ! virsh -c "$URI" start "$name" > "$R/start-$name.out" 2> "$R/start-$name.err"; then
        failed "managedsave: define/start: $(cat "$R/define-$name.err" "$R/start-$name.err" 2>/dev/null | tr '\n' ' ')"
        collect_logs "$name"; return
    fi
    if ! wait_file "$R/share/lv/guest.ready" "$TIMEOUT" "$name"; then
        failed "managedsave: the guest did not come up (console: $R/console-$name.log)"; collect_logs "$name"; return
    fi
    ino0=$(stat -c %i "$R/share/lv/data.log")
    locks_before "managedsave"
    t0=$(now)
    if ! virsh -c "$URI" managedsave "$name" > "$R/msave.out" 2> "$R/msave.err"; then
        failed "managedsave: virsh managedsave: $(tr '\n' ' ' < "$R/msave.err")"; collect_logs "$name"; return
    fi
    t1=$(now)
    n0=$(wc -l < "$R/share/lv/data.log")
    info=$(virsh -c "$URI" dominfo "$name" 2>&1)
    figure "[managedsave $DAEMON] virsh managedsave" "$(elapsed "$t0" "$t1") s, $n0 lines written before"
    case $info in *"Managed save:"*yes*) passed "managedsave: the domain is shut off with a managed save" ;;
        *) failed "managedsave: dominfo after managedsave: $(echo "$info" | grep -E 'State|Managed' | tr '\n' ' ')" ;; esac
    sleep 2
    t2=$(now)
    if ! virsh -c "$URI" start "$name" > "$R/mstart.out" 2> "$R/mstart.err"; then
        failed "managedsave: virsh start: $(tr '\n' ' ' < "$R/mstart.err")"; collect_logs "$name"; return
    fi
    t3=$(now)
    figure "[managedsave $DAEMON] virsh start (from the managed save)" "$(elapsed "$t2" "$t3") s"
    check_resumed managedsave "after the start" "$name" "$ino0" "$n0"
    virsh -c "$URI" destroy "$name" >/dev/null 2>&1
    virsh -c "$URI" undefine --managed-save "$name" >/dev/null 2>&1
}

# --- lock options --------------------------------------------------------------------
# lock_run TAG CAPS ON|OFF: a domain with <lock posix=X flock=X/> through a wrapper
# advertising CAPS; checks the argv and what the host sees of the guest's locks.
lock_run() {
    local tag=$1 caps=$2 sw=$3 name=vfsd-lv-lock-$1-$$ bin xml argv res fl want
    bin=$(make_binary "$name" "$caps")
    xml=$R/$name.xml
    domain_xml "$name" "$bin" locks "<lock posix='$sw' flock='$sw'/>" > "$xml"
    rm -f "$R/share/lv/flock.held" "$R/share/lv/posix.held" "$R/share/lv/release" "$R/share/lv/guest.result"
    if ! start_domain "$name" "$xml"; then
        collect_logs "$name"
        figure "[locks $tag] argv" "$(daemon_argv "$name")"
        figure "[locks $tag] daemon" "$(grep -v '^$' "$R/daemon-$name.log" 2>/dev/null | head -n 1)"
        if [ "$DAEMON" = virtiofsd ] && [ "$sw" = on ]; then
            # virtiofsd 1.14 forwards no locks: '-o flock' / '-o posix_lock' are errors
            passed "locks [$tag]: virtiofsd refuses to start with lock forwarding asked for (it has none)"
        else
            failed "locks [$tag]: virsh create failed: $(grep -v '^$' "$R/start-$name.err" | tr '\n' ' ')"
        fi
        return
    fi
    argv=$(daemon_argv "$name")
    figure "[locks $tag] argv" "$argv"
    if [ "$sw" = on ]; then want='flock,posix_lock'; else want='no_flock,no_posix_lock'; fi
    case $argv in *"-o source=$R/share,"*"$want"*) passed "locks [$tag]: libvirt passed -o ...,$want" ;;
        *) failed "locks [$tag]: argv has no '-o source=...,$want'" ;; esac
    if ! wait_file "$R/share/lv/posix.held" "$TIMEOUT" "$name" || ! wait_file "$R/share/lv/flock.held" 30 "$name"; then
        failed "locks [$tag]: the guest did not take its locks (console: $R/console-$name.log)"
        collect_logs "$name"; virsh -c "$URI" destroy "$name" >/dev/null 2>&1; return
    fi
    # on: the host must be refused; off: granted, the guest's locks stay in the guest
    if host_sees_locks; then fl=on; else fl=off; fi
    : > "$R/share/lv/release"
    if [ "$fl" = "$sw" ]; then
        passed "locks [$tag]: lock $sw: the host's flock/F_GETLK $([ "$sw" = on ] && echo 'conflict with' || echo 'do not see') the guest's locks"
    else
        failed "locks [$tag]: lock $sw: $HOST_LOCKS"
    fi
    if wait_file "$R/share/lv/guest.result" 60 "$name"; then
        res=$(cat "$R/share/lv/guest.result"); case $res in PASS*) ;; *) failed "locks [$tag]: guest: $res" ;; esac
    else
        failed "locks [$tag]: no guest result"
    fi
    collect_logs "$name"
    virsh -c "$URI" destroy "$name" >/dev/null 2>&1
}

test_locks() {
    local name=vfsd-lv-lock-native-$$ xml err real
    real=$("$DBIN" --print-capabilities | tr -d '\n ' )
    figure "[locks] $DAEMON --print-capabilities" "$real"
    # 1. the binary as it is
    xml=$R/$name.xml
    domain_xml "$name" "$DBIN" locks "<lock posix='on' flock='on'/>" > "$xml"
    if start_domain "$name" "$xml"; then
        case $real in
            *separate-options*) failed "locks [native]: libvirt started a domain with <lock> for a separate-options binary (argv: $(daemon_argv "$name"))" ;;
            *) passed "locks [native]: started (no separate-options): $(daemon_argv "$name")" ;;
        esac
        virsh -c "$URI" destroy "$name" >/dev/null 2>&1
    else
        err=$(grep -v '^$' "$R/start-$name.err" | tr '\n' ' ')
        figure "[locks native] virsh create" "$err"
        case $err in *"locking options are not supported by this virtiofsd"*)
            passed "locks [native]: libvirt refuses <lock> with separate-options" ;;
            *) failed "locks [native]: unexpected error" ;; esac
    fi
    # 2. without separate-options: the legacy -o form, on and off
    lock_run legacy-on migrate-precopy on
    lock_run legacy-off migrate-precopy off
}

# --- argv survey ------------------------------------------------------------------------
test_argv() {
    local caps tag name bin xml res v extra fsextra
    for v in idmap chroot; do
        if [ $v = idmap ]; then
            # the namespace sandbox (the default) with an id map, as unprivileged libvirt
            # does by itself
            extra="<cache mode='none'/><thread_pool size='3'/><openfiles max='4096'/>"
            fsextra="
      <idmap><uid start='0' target='100000' count='65536'/><gid start='0' target='100000' count='65536'/></idmap>"
        else
            extra="<cache mode='always'/><sandbox mode='chroot'/>"
            fsextra=
        fi
        for caps in "migrate-precopy,separate-options" "migrate-precopy"; do
            tag=$v+$(echo "$caps" | sed 's/migrate-precopy,separate-options/separate-options/; s/^migrate-precopy$/legacy/')
            name=vfsd-lv-argv-$(echo "$tag" | tr '+' '-')-$$
            bin=$(make_binary "$name" "$caps")
            xml=$R/$name.xml
            SANDBOX='' domain_xml "$name" "$bin" mount "$extra" "$fsextra" > "$xml"
            rm -f "$R/share/lv/guest.result" "$R/share/lv/mounted.txt"
            # idmap: the guest's root is host uid/gid 100000, which must own lv/
            if [ $v = idmap ]; then chown 100000:100000 "$R/share/lv"; else chown 0:0 "$R/share/lv"; fi
            if ! start_domain "$name" "$xml"; then
                figure "[argv $tag]" "$(daemon_argv "$name")"
                collect_logs "$name"
                failed "argv [$tag]: virsh create: $(grep -v '^$' "$R/start-$name.err" | tr '\n' ' '); daemon: $(tail -n 2 "$R/daemon-$name.log" 2>/dev/null | tr '\n' ' ')"
                continue
            fi
            figure "[argv $tag]" "$(daemon_argv "$name")"
            if wait_file "$R/share/lv/guest.result" "$TIMEOUT" "$name" && res=$(cat "$R/share/lv/guest.result") &&
                case $res in PASS*) true ;; *) false ;; esac; then
                passed "argv [$tag]: the daemon took every option and the guest mounted the share ($res; on the host: lv $(stat -c %u:%g "$R/share/lv"), mounted.txt $(stat -c %u:%g "$R/share/lv/mounted.txt"))"
            else
                failed "argv [$tag]: the guest did not mount the share (daemon log: $R/daemon-$name.log)"
            fi
            collect_logs "$name"
            virsh -c "$URI" destroy "$name" >/dev/null 2>&1
        done
    done
    chown -R 0:0 "$R/share/lv"
}

# --- vmm-configs/libvirt-virtiofs.xml ---------------------------------------------------
# Its <filesystem>, with the binary path and the source directory replaced, in the
# test domain: it must validate, start and mount.
test_config() {
    local cfg=$REPO/vmm-configs/libvirt-virtiofs.xml name=vfsd-lv-config-$$ xml res FS_XML
    command -v xmllint >/dev/null || { failed "config: xmllint not found (apt-get install libxml2-utils)"; return; }
    FS_XML=$(xmllint --xpath '//devices/filesystem' "$cfg" 2>"$R/xmllint.err") ||
        { failed "config: no <filesystem> in $cfg: $(cat "$R/xmllint.err")"; return; }
    FS_XML=$(echo "$FS_XML" | sed "s|<binary path='[^']*'|<binary path='$DBIN'|; s|<binary path=\"[^\"]*\"|<binary path=\"$DBIN\"|; s|<source dir='[^']*'|<source dir='$R/share'|; s|<source dir=\"[^\"]*\"|<source dir=\"$R/share\"|")
    xml=$R/$name.xml
    domain_xml "$name" "$DBIN" mount > "$xml"
    rm -f "$R/share/lv/guest.result"
    if ! start_domain "$name" "$xml"; then
        collect_logs "$name"
        failed "config: $cfg does not start: $(grep -v '^$' "$R/start-$name.err" | tr '\n' ' ')"; return
    fi
    figure "[config] daemon argv" "$(daemon_argv "$name")"
    if wait_file "$R/share/lv/guest.result" "$TIMEOUT" "$name" && res=$(cat "$R/share/lv/guest.result") &&
        case $res in PASS*) true ;; *) false ;; esac; then
        passed "config: the <filesystem> of vmm-configs/libvirt-virtiofs.xml validates, starts and mounts"
    else
        failed "config: the guest did not mount the share (console: $R/console-$name.log)"
    fi
    collect_logs "$name"
    virsh -c "$URI" destroy "$name" >/dev/null 2>&1
}

# --- live migration between two libvirtd on this host -------------------------------
# The second libvirtd runs in new mount and UTS namespaces with its own state dirs and
# host name, so that libvirt does not see a migration to the same host.
LIVE_PID=
LIVE_URI=
live_start() {
    local L=$R/lv2 i
    rm -rf "$L"; mkdir -p "$L"/{run,lib,log,etc,cache}
    cp -a /etc/libvirt/. "$L/etc/"
    printf 'host_uuid = "%s"\nunix_sock_dir = "%s"\n' "$(cat /proc/sys/kernel/random/uuid)" "$L/sock" >> "$L/etc/libvirtd.conf"
    mkdir -p "$L/sock"
    # QEMU's and the daemon's logs to files: no second virtlogd needed
    # virtiofsd_debug: to see the debug option libvirt adds (--log-level debug, or -d
    # without separate-options) on the destination's daemon
    printf 'stdio_handler = "file"\nvirtiofsd_debug = 1\n' >> "$L/etc/qemu.conf"
    unshare -m -u --propagation private sh -c "
        hostname vfsd-lv-second
        mount --bind '$L/run' /run/libvirt
        mount --bind '$L/lib' /var/lib/libvirt
        mount --bind '$L/log' /var/log/libvirt
        mount --bind '$L/cache' /var/cache/libvirt
        mount --bind '$L/etc' /etc/libvirt
        mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu
        exec libvirtd -f /etc/libvirt/libvirtd.conf -p '$L/libvirtd.pid'
    " > "$L/libvirtd.out" 2>&1 &
    LIVE_PID=$!
    LIVE_URI="qemu+unix:///system?socket=$L/sock/libvirt-sock"
    for i in $(seq 1 30); do
        virsh -c "$LIVE_URI" version >/dev/null 2>&1 && return 0
        kill -0 "$LIVE_PID" 2>/dev/null || break
        sleep 1
    done
    cat "$L/libvirtd.out" >&2
    return 1
}
live_stop() {
    local p
    p=$(cat "$R/lv2/libvirtd.pid" 2>/dev/null)
    [ -n "$p" ] && kill "$p" 2>/dev/null
    [ -n "$LIVE_PID" ] && kill "$LIVE_PID" 2>/dev/null
    LIVE_PID=
}

test_live() {
    local name=vfsd-lv-live-$DAEMON-$$ bin xml t0 t1 res n0 n1 info
    if ! live_start; then failed "live: could not start the second libvirtd"; return; fi
    figure "[live] second libvirtd" "$LIVE_URI ($(virsh -c "$LIVE_URI" hostname 2>&1))"
    if [ "$CAPS_SET" = 1 ]; then bin=$(make_binary "$name" "$CAPS"); else bin=$(make_binary "$name"); fi
    xml=$R/$name.xml
    write_prep
    domain_xml "$name" "$bin" write "$LOCKXML" > "$xml"
    start_domain "$name" "$xml" || { failed "live: virsh create: $(cat "$R/start-$name.err")"; return; }
    if ! wait_file "$R/share/lv/guest.ready" "$TIMEOUT" "$name"; then
        failed "live: the guest did not come up (console: $R/console-$name.log)"; collect_logs "$name"; return
    fi
    locks_before "live"
    t0=$(now)
    if ! virsh -c "$URI" migrate --live --verbose "$name" "$LIVE_URI" --migrateuri tcp://127.0.0.1 \
            > "$R/migrate.out" 2> "$R/migrate.err"; then
        failed "live: virsh migrate: $(grep -v '^$' "$R/migrate.err" | tr '\n' ' ')"; collect_logs "$name"; return
    fi
    t1=$(now)
    figure "[live $DAEMON] virsh migrate --live" "$(elapsed "$t0" "$t1") s"
    info=$(virsh -c "$LIVE_URI" domjobinfo "$name" --completed 2>/dev/null | grep -E 'Time elapsed:|Total downtime:|Memory processed:' | tr -s ' ' | tr '\n' ';')
    figure "[live $DAEMON] job" "$info"
    figure "[live $DAEMON] destination daemon argv" "$(grep -A1 'Starting external device: virtiofsd' "$R/lv2/log/qemu/$name.log" 2>/dev/null | tail -n1)"
    locks_after "live"
    : > "$R/share/lv/host.restored"
    if ! wait_file "$R/share/lv/guest.result" "$TIMEOUT" "$name" "$LIVE_URI"; then
        failed "live: no guest result on the destination (console: $R/console-$name.log)"
    else
        res=$(cat "$R/share/lv/guest.result")
        figure "[live $DAEMON] guest" "$res"
        case $res in PASS*) passed "live: guest migrated with its open fd, every line there ($DAEMON)" ;;
            *) failed "live: guest: $res" ;; esac
    fi
    collect_logs "$name"
    cp "$R/lv2/log/qemu/$name-fs0-virtiofsd.log" "$R/daemon-$name-dst.log" 2>/dev/null
    figure "[live $DAEMON] source daemon log" "$(state_lines "$R/daemon-$name.log")"
    figure "[live $DAEMON] destination daemon log" "$(state_lines "$R/daemon-$name-dst.log")"
    virsh -c "$LIVE_URI" destroy "$name" >/dev/null 2>&1
    live_stop
}

{
    echo "libvirt-migrate: $(date -u '+%F %T') UTC, $DAEMON ($("$DBIN" --version 2>&1 | head -n1)), libvirt $LV_VERSION, QEMU $QEMU_VERSION, TCG, ${MEM} MiB"
} | tee "$SUMMARY"
for t in $(echo "$TESTS" | tr ',' ' '); do
    case $t in
        save) test_save ;;
        managedsave) test_managedsave ;;
        locks) test_locks ;;
        argv) test_argv ;;
        config) test_config ;;
        live) test_live ;;
        *) die "unknown test '$t' (save, managedsave, locks, argv, config, live)" ;;
    esac
done

if [ "$FAILS" = 0 ]; then
    say "PASS (results: $R)"
    exit 0
fi
say "FAILED: $FAILS check(s) (results and logs: $R)"
exit 1
