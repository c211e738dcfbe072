//! An interactive guest, or one command in one, on the guest-test fixture: what
//! `scripts/run-vm.sh` runs (`cargo run --release --example run-vm -- --help`).

#[path = "fixture/mod.rs"]
#[allow(dead_code, unused_imports)] // the part of the fixture it needs
mod fixture;

use std::path::PathBuf;
use std::time::Duration;

use fixture::{DaemonKind, Guest, Share, Status, TestDir};

const USAGE: &str = "\
usage: scripts/run-vm.sh [options] [-- COMMAND...]

Boots a guest whose shares are served by vfsd (or virtiofsd), runs COMMAND in it with
sh -c in the first share (mounted at /mnt/TAG, also $VFSD_SHARE; test scripts are in
/guest-tests) and exits with its status. With --shell, a shell on this terminal instead
(`poweroff -f` leaves; Ctrl-A x quits QEMU).

  --share DIR[:TAG[:OPTS]]  share DIR as TAG (default share0, share1, ...), mounted with
                   the guest mount options OPTS joined by '+' (ro). Repeatable.
                   Default: one fresh directory under target/guest-tests/run-vm.
  --daemon D       vfsd (default) or virtiofsd
  --daemon-args A  more arguments for every daemon (one string)
  --queues N       request queues per device (default 1)
  --cpus N         vCPUs (default 2)
  --mem SIZE       guest memory, e.g. 2G or 512M (default 2G)
  --qemu PATH      the QEMU binary (default: $VFSD_QEMU, else qemu-system-x86_64)
  --append ARGS    more kernel command line
  --timeout SECS   stop the guest after SECS (default 900)
  --shell          an interactive shell instead of COMMAND

Environment: VFSD_KERNEL, VFSD_INITRD (another kernel or initramfs), VFSD_ACCEL=kvm,
VFSD_BIN (another vfsd). Exit status: COMMAND's; 120 the guest's set-up failed (a
mount); 124 timeout; 125 a daemon or QEMU failed.";

fn die(msg: &str) -> ! {
    eprintln!("run-vm: error: {msg} (try --help)");
    std::process::exit(125)
}

fn main() {
    let mut shares: Vec<(PathBuf, Option<String>, Option<String>)> = Vec::new();
    let (mut daemon, mut daemon_args) = (DaemonKind::Vfsd, String::new());
    let (mut queues, mut cpus, mut mem_mb, mut timeout) = (1u32, 2u32, 2048u64, 900u64);
    let (mut qemu, mut append, mut shell) = (None, String::new(), false);
    let mut cmd = String::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{a} needs a value")))
        };
        let num = |v: String| -> u64 {
            v.parse()
                .unwrap_or_else(|_| die(&format!("{a}: not a number: {v}")))
        };
        match a.as_str() {
            "--share" => {
                let v = val();
                let mut p = v.splitn(3, ':');
                let dir = PathBuf::from(p.next().unwrap());
                if !dir.is_dir() {
                    die(&format!("--share: {} is not a directory", dir.display()));
                }
                shares.push((dir, p.next().map(String::from), p.next().map(String::from)));
            }
            "--daemon" => {
                daemon = match val().as_str() {
                    "vfsd" => DaemonKind::Vfsd,
                    "virtiofsd" => DaemonKind::Virtiofsd,
                    d => die(&format!("--daemon: vfsd or virtiofsd, not {d}")),
                }
            }
            "--daemon-args" => daemon_args = val(),
            "--queues" => queues = num(val()) as u32,
            "--cpus" => cpus = num(val()) as u32,
            "--mem" => {
                let v = val();
                mem_mb = match v.to_ascii_uppercase().strip_suffix('G') {
                    Some(g) => num(g.into()) * 1024,
                    None => num(v.trim_end_matches(['M', 'm']).into()),
                }
            }
            "--qemu" => qemu = Some(PathBuf::from(val())),
            "--append" => append = val(),
            "--timeout" => timeout = num(val()),
            "--shell" => shell = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            "--" => {
                cmd = args.by_ref().collect::<Vec<_>>().join(" ");
                break;
            }
            _ => die(&format!("unknown option {a}")),
        }
    }
    if shell && !cmd.is_empty() {
        die("--shell or a COMMAND, not both");
    }
    let dir = TestDir::new("run-vm");
    if shares.is_empty() {
        shares.push((dir.dir("share"), None, None));
    }
    let extra: Vec<&str> = daemon_args.split_whitespace().collect();
    let mut guest = Guest::new(&dir)
        .cpus(cpus)
        .queues(queues)
        .mem_mb(mem_mb)
        .timeout(Duration::from_secs(timeout))
        .append(&append);
    if let Some(q) = qemu {
        guest = guest.qemu(q);
    }
    for (i, (d, tag, opts)) in shares.iter().enumerate() {
        let tag = tag.clone().unwrap_or(format!("share{i}"));
        let s = Share::new(d, &tag, daemon.clone(), &extra);
        guest = guest.share(s.mount_options(opts.as_deref().unwrap_or("")));
    }
    if shell {
        let st = guest.attach();
        std::process::exit(if st.success() { 0 } else { 125 });
    }
    let run = guest.run(&cmd);
    print!("{}", run.console.replace('\r', ""));
    let code = match run.status {
        Status::Exited(rc) => rc,
        Status::Timeout => {
            eprintln!("run-vm: the guest did not finish within {timeout} s");
            124
        }
        Status::DaemonDied(i) => {
            eprintln!(
                "run-vm: the daemon of share {i} died; its log:\n{}",
                std::fs::read_to_string(&run.daemon_logs[i]).unwrap_or_default()
            );
            125
        }
        Status::NoResult => {
            eprintln!(
                "run-vm: QEMU ended without a result from the guest; its log:\n{}",
                std::fs::read_to_string(&run.qemu_log).unwrap_or_default()
            );
            125
        }
    };
    std::process::exit(code);
}
