//! The supervisor against a serving process a guest took over: whatever that process
//! sends on its socket, and however it treats signals, the supervisor stays responsive,
//! ends the session, and leaves no process of it behind.
//!
//! The hostile serving process is this test binary, run as `hostile_serving_process`: a
//! script put at vfsd's path, started by an upgrade before any frontend, execs it.

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{require_root, Daemon};
use crate::upgrade::{served_by, sigusr2, wait_for_handover, Binary};

const GET_FEATURES: u32 = 1;
const VERSION: u32 = 0x1;
const REPLY: u32 = 0x4;
const NEED_REPLY: u32 = 0x8;
const SET_OWNER: u32 = 3;
const SET_PROTOCOL_FEATURES: u32 = 16;
const PROTOCOL_REPLY_ACK: u64 = 1 << 3;

fn header(code: u32, flags: u32, size: u32) -> Vec<u8> {
    let mut h = code.to_le_bytes().to_vec();
    h.extend_from_slice(&flags.to_le_bytes());
    h.extend_from_slice(&size.to_le_bytes());
    h
}

/// What a serving process a guest took over does, by `VFSD_HOSTILE`:
/// - `half`: after the frontend's first message, half a message (a header promising a
///   body that never comes);
/// - `flood`: after the frontend's first message, replies nobody asked for, without end;
/// - `deaf`: ignores the termination signals;
/// - `orphan`: leaves a process behind (set to die with it, as the sandbox's is, but
///   blocking that signal), and exits once its connection closes.
///
/// Run without `VFSD_HOSTILE` (as in every test run) it does nothing.
#[test]
fn hostile_serving_process() {
    let Ok(mode) = std::env::var("VFSD_HOSTILE") else {
        return;
    };
    // As vfsd's own start-up does: the supervisor leaves the termination signals
    // blocked across the exec until a serving process's handlers exist.
    // SAFETY: sigset_t is plain data set up by sigemptyset; sigprocmask takes valid
    // pointers.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
    let fd: i32 = std::env::var("VFSD_HOSTILE_FD").unwrap().parse().unwrap();
    let out = PathBuf::from(std::env::var("VFSD_HOSTILE_OUT").unwrap());
    // SAFETY: the supervisor passed this listening socket for this process alone.
    let listener = unsafe { UnixListener::from_raw_fd(fd) };
    let (mut conn, _) = listener.accept().unwrap();
    let first_message = |conn: &mut UnixStream| {
        let mut h = [0u8; 12];
        conn.read_exact(&mut h).unwrap();
        let size = u32::from_le_bytes(h[8..12].try_into().unwrap());
        let mut body = vec![0u8; size as usize];
        conn.read_exact(&mut body).unwrap();
    };
    match mode.as_str() {
        "half" => {
            first_message(&mut conn);
            conn.write_all(&header(GET_FEATURES, VERSION | REPLY, 4096))
                .unwrap();
        }
        "flood" => {
            first_message(&mut conn);
            let mut m = header(GET_FEATURES, VERSION | REPLY, 4096);
            m.resize(12 + 4096, 0);
            while conn.write_all(&m).is_ok() {}
        }
        "deaf" => {
            for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                // SAFETY: setting a signal's disposition to ignored.
                unsafe { libc::signal(s, libc::SIG_IGN) };
            }
        }
        "orphan" => {
            // SAFETY: the child only makes async-signal-safe calls (prctl, sigprocmask,
            // pause) before it dies.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    let mut all: libc::sigset_t = std::mem::zeroed();
                    libc::sigfillset(&mut all);
                    libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
                    loop {
                        libc::pause();
                    }
                }
            }
            std::fs::write(out.with_extension("pid"), pid.to_string()).unwrap();
            // Until the connection closes.
            let _ = std::io::copy(&mut conn, &mut std::io::sink());
            std::process::exit(0);
        }
        other => panic!("no hostile mode {other}"),
    }
    std::fs::write(&out, b"done").unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// A vfsd whose serving process is `hostile_serving_process` in `mode`; `out` is where
/// that process writes what it did.
struct Hostile {
    d: Daemon,
    _bin: Binary,
    out: PathBuf,
}

impl Hostile {
    fn start(mode: &str) -> Hostile {
        let bin = Binary::new();
        let d = Daemon::start_from(&bin.path, &[]);
        let t = Instant::now();
        let old = loop {
            if let Some(p) = served_by(d.pid()) {
                break p;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "no serving process");
            std::thread::sleep(Duration::from_millis(10));
        };
        let out = d.dir.path().join("hostile");
        let script = format!(
            "#!/bin/sh\n\
             for a; do case \"$a\" in --serve-fd=*) VFSD_HOSTILE_FD=\"${{a#--serve-fd=}}\";; esac; done\n\
             [ -n \"$VFSD_HOSTILE_FD\" ] || exec {vfsd} \"$@\"\n\
             export VFSD_HOSTILE_FD VFSD_HOSTILE={mode} VFSD_HOSTILE_OUT={out}\n\
             exec {exe} --exact supervisor::hostile_serving_process --include-ignored --test-threads=1 -q\n",
            out = out.display(),
            exe = std::env::current_exe().unwrap().display(),
            vfsd = crate::common::vfsd_bin(),
        );
        bin.replace_with(script.as_bytes());
        sigusr2(d.pid());
        wait_for_handover(d.pid(), old);
        Hostile { d, _bin: bin, out }
    }

    /// A frontend connection that has sent GET_FEATURES.
    fn frontend(&self) -> UnixStream {
        let mut f = UnixStream::connect(&self.d.sock).unwrap();
        f.write_all(&header(GET_FEATURES, VERSION, 0)).unwrap();
        f
    }

    fn wait_for(&self, what: &Path) {
        let t = Instant::now();
        while !what.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the hostile process did not act"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM to the supervisor: whether it exited within `limit`.
    fn terminated_within(&mut self, limit: Duration) -> bool {
        // SAFETY: kill with a valid signal number.
        unsafe { libc::kill(self.d.pid(), libc::SIGTERM) };
        self.d.wait_exit(limit).is_some()
    }
}

#[test]
fn half_a_message_from_the_serving_process_does_not_stop_the_supervisor() {
    let mut h = Hostile::start("half");
    let _f = h.frontend();
    h.wait_for(&h.out.clone());
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        h.terminated_within(Duration::from_secs(8)),
        "the supervisor still waits for the rest of the message"
    );
}

#[test]
fn unrequested_replies_from_the_serving_process_do_not_stop_the_supervisor() {
    let mut h = Hostile::start("flood");
    // The frontend asks once and reads nothing.
    let _f = h.frontend();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        h.terminated_within(Duration::from_secs(5)),
        "the supervisor is stuck relaying replies the frontend never asked for"
    );
}

#[test]
fn a_serving_process_that_ignores_sigterm_is_killed() {
    let mut h = Hostile::start("deaf");
    h.wait_for(&h.out.clone());
    let t = Instant::now();
    assert!(
        h.terminated_within(Duration::from_secs(20)),
        "SIGTERM never ended vfsd: its serving process ignores it"
    );
    eprintln!("exited {} ms after SIGTERM", t.elapsed().as_millis());
}

#[test]
fn a_process_the_serving_process_left_behind_does_not_outlive_its_session() {
    let mut h = Hostile::start("orphan");
    let f = h.frontend();
    let pid_file = h.out.with_extension("pid");
    h.wait_for(&pid_file);
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().parse().unwrap();
    struct Reap(i32);
    impl Drop for Reap {
        fn drop(&mut self) {
            // SAFETY: kill with a valid signal number (the test's own stray, if left).
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _reap = Reap(pid);
    // The frontend goes: the session ends, and vfsd with it.
    drop(f);
    assert!(h.d.wait_exit(Duration::from_secs(15)).is_some());
    let t = Instant::now();
    let alive = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    while alive(pid) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(pid), "process {pid} of the ended session still runs");
}

#[test]
fn half_a_message_from_the_frontend_does_not_stop_the_supervisor() {
    let mut d = Daemon::start(&[]);
    let mut f = UnixStream::connect(&d.sock).unwrap();
    // A header promising 8 bytes of body, which never come.
    f.write_all(&header(GET_FEATURES, VERSION, 8)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill with a valid signal number.
    unsafe { libc::kill(d.pid(), libc::SIGTERM) };
    assert!(
        d.wait_exit(Duration::from_secs(8)).is_some(),
        "the supervisor still waits for the rest of the frontend's message"
    );
}

#[test]
#[ignore = "needs root"]
fn an_ack_the_serving_process_does_not_owe_does_not_hold_up_an_upgrade() {
    require_root("the lock handover's runtime directory is /run/vfsd");
    let bin = Binary::new();
    let d = Daemon::start_from(&bin.path, &[]);
    let mut f = UnixStream::connect(&d.sock).unwrap();
    // REPLY_ACK acked before any GET_FEATURES: vhost-user-backend acks nothing yet, so
    // the frontend waits for no answer to SET_OWNER.
    let mut m = header(SET_PROTOCOL_FEATURES, VERSION, 8);
    m.extend_from_slice(&PROTOCOL_REPLY_ACK.to_le_bytes());
    m.extend(header(SET_OWNER, VERSION | NEED_REPLY, 0));
    f.write_all(&m).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let old = served_by(d.pid()).unwrap();
    bin.upgrade_to_a_rebuilt_vfsd();
    let t = Instant::now();
    sigusr2(d.pid());
    wait_for_handover(d.pid(), old);
    // Waiting for the ack that never comes takes 10 s, and then refuses the upgrade.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}
