# Sourced by the benchmark scripts (bench.sh, bench-device.sh), after they define die():
# the reference daemon, the tools every run needs, and starting a daemon under test.

VIRTIOFSD=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")
[ -x "$VIRTIOFSD" ] || die "virtiofsd not found: cargo install virtiofsd --version 1.14.0 --locked"
command -v fio >/dev/null || die "fio not found: apt-get install fio"

# start_daemon DAEMON ARGS SHARE SOCK: vfsd or virtiofsd in the background with ARGS
# (word-split) on SHARE, serving SOCK; its pid in DPID once the socket exists.
start_daemon() {
    local d=$1 args=$2 share=$3 sock=$4
    rm -f "$sock"
    case $d in
        vfsd) target/release/vfsd --socket-path "$sock" --shared-dir "$share" --log-level error $args & ;;
        virtiofsd) "$VIRTIOFSD" --socket-path "$sock" --shared-dir "$share" --log-level error --sandbox none $args 2>/dev/null & ;;
    esac
    DPID=$!
    for _ in $(seq 200); do [ -S "$sock" ] && return 0; sleep 0.05; done
    die "$d did not create its socket"
}
