//! The daemon process both test binaries run (tests/it's `common::Daemon` and the guest
//! fixture's `fixture::Daemon` wrap it with their own command lines): spawned, waited
//! for until its socket is there, stopped with SIGTERM and then SIGKILL, and its
//! `--stats` file read.

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// A spawned daemon; stopped (`stop`) when dropped.
pub struct DaemonProcess {
    child: Child,
    /// How long a SIGTERM gets before SIGKILL.
    grace: Duration,
}

/// Why `wait_for_socket` gave up.
#[derive(Debug)]
pub enum NoSocket {
    /// The daemon exited first.
    Exited(ExitStatus),
    /// The limit passed.
    TimedOut,
}

impl DaemonProcess {
    /// Spawns `cmd`, to be given `grace` between SIGTERM and SIGKILL when stopped. A copy
    /// of the binary another test thread just wrote may still be open for writing in a
    /// child that thread forked and has not exec'd yet (ETXTBSY): that is tried again for
    /// two seconds.
    pub fn spawn(cmd: &mut Command, grace: Duration) -> std::io::Result<DaemonProcess> {
        let mut tries = 0;
        let child = loop {
            match cmd.spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                r => break r?,
            }
        };
        Ok(Self::adopt(child, grace))
    }

    /// A daemon a test spawned itself.
    pub fn adopt(child: Child, grace: Duration) -> DaemonProcess {
        DaemonProcess { child, grace }
    }

    /// Waits up to `limit` for the daemon to make `socket`.
    pub fn wait_for_socket(&mut self, socket: &Path, limit: Duration) -> Result<(), NoSocket> {
        let t = Instant::now();
        while !socket.exists() {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Err(NoSocket::Exited(st));
            }
            if t.elapsed() >= limit {
                return Err(NoSocket::TimedOut);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    /// Waits up to `limit` for it to exit by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st);
            }
            if t.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM (a sandboxed daemon's serving child exits with it), then SIGKILL if
    /// it is still there after its grace.
    pub fn stop(&mut self) {
        stop(&mut self.child, self.grace);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends SIGTERM to `child`, then SIGKILL if it is still there after `grace`, and reaps
/// it.
pub fn stop(child: &mut Child, grace: Duration) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    // SAFETY: kill on a child we spawned and have not reaped, so the pid is still ours.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let t = Instant::now();
    while t.elapsed() < grace {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The JSON of a `--stats` file, if it is there and whole.
#[allow(dead_code)] // tests/it's alone
pub fn read_stats(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}
