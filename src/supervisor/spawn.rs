//! Starting a serving process: a fresh `vfsd --serve-fd` of the binary now at vfsd's path,
//! its vhost-user connection queued on a listener only it holds.

use std::ffi::OsString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Duration;

use super::{open_pidfd, reap_within, Child, State, ANSWER_WAIT, PART_WAIT};

impl State {
    /// Starts a serving process from the binary now at `exe`, its vhost-user connection
    /// already queued on a listener only it holds.
    /// `recover`: the keeper of a serving process that died, whose guest the new one
    /// takes over.
    pub(super) fn spawn(&self, recover: Option<&UnixStream>) -> io::Result<Child> {
        let (listener, conn) = private_pair()?;
        conn.set_read_timeout(Some(PART_WAIT))?;
        conn.set_write_timeout(Some(ANSWER_WAIT))?;
        let (keeper, keeper_child) = crate::recovery::keeper::channel()?;
        crate::recovery::keeper::want_senders(&keeper)?;
        let mut cmd = std::process::Command::new(&self.sup.exe);
        cmd.args(&self.sup.args);
        cmd.arg(format!("--serve-fd={}", listener.as_raw_fd()));
        cmd.arg(format!("--keeper-fd={}", keeper_child.as_raw_fd()));
        let mut pass = vec![listener.as_raw_fd(), keeper_child.as_raw_fd()];
        if let Some(r) = recover {
            cmd.arg(format!("--recover-fd={}", r.as_raw_fd()));
            pass.push(r.as_raw_fd());
        }
        #[cfg(feature = "test-hooks")]
        pass_crash_hook(&mut cmd, recover.is_some() || !self.crashes.is_empty());
        for (opt, fd) in &self.sup.inherited {
            cmd.arg(format!("--{opt}={}", fd.as_raw_fd()));
            pass.push(fd.as_raw_fd());
        }
        // SAFETY: between fork and exec only async-signal-safe calls: fcntl on fds this
        // process holds, sigprocmask and prctl.
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &pass {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                // Only the termination signals stay blocked, across the exec, until the
                // new process's handlers exist (`daemon::run`): one relayed before would
                // kill it half started.
                let mut early: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut early);
                libc::sigaddset(&mut early, libc::SIGTERM);
                libc::sigaddset(&mut early, libc::SIGINT);
                libc::sigprocmask(libc::SIG_SETMASK, &early, std::ptr::null_mut());
                // SIGUSR2 is the supervisor's (`pkill -USR2 vfsd` reaches every vfsd
                // process); ignored from the start, and across exec.
                libc::signal(libc::SIGUSR2, libc::SIG_IGN);
                // The serving process never outlives its supervisor.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            })
        };
        // A file just written may be open for writing a moment longer (in a child of the
        // writer that has not exec'd yet): ETXTBSY, tried again for up to a second.
        let mut tries = 0;
        let child = loop {
            match cmd.spawn() {
                Err(e) if e.kind() == io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                r => break r?,
            }
        };
        let pid = child.id() as libc::pid_t;
        let pidfd = open_pidfd(pid).inspect_err(|_| {
            // SAFETY: kill and reap our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap_within(pid, ANSWER_WAIT);
        })?;
        drop(keeper_child);
        Ok(Child {
            pid,
            pidfd,
            conn,
            keeper: Some(keeper),
        })
    }
}

/// A listening socket for a serving process, and the supervisor's connection to it,
/// made in a directory only this user can enter, whose name is gone before the serving
/// process starts: nobody else can ever connect to it.
pub(super) fn private_pair() -> io::Result<(UnixListener, UnixStream)> {
    let template = std::env::temp_dir().join("vfsd-XXXXXX");
    let mut raw = std::ffi::CString::new(template.into_os_string().into_encoded_bytes())
        .map_err(io::Error::other)?
        .into_bytes_with_nul();
    // SAFETY: mkdtemp rewrites the XXXXXX of a NUL-terminated buffer we own.
    if unsafe { libc::mkdtemp(raw.as_mut_ptr().cast()) }.is_null() {
        return Err(io::Error::last_os_error());
    }
    raw.pop();
    // SAFETY: mkdtemp left valid path bytes (the template's, with letters for the Xs).
    let dir = PathBuf::from(unsafe { OsString::from_encoded_bytes_unchecked(raw) });
    let path = dir.join("s");
    let pair = UnixListener::bind(&path).and_then(|l| Ok((UnixStream::connect(&path)?, l)));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
    let (c, l) = pair?;
    Ok((l, c))
}

/// The crash test hook (`server`, test builds only): a replacement for a process that
/// died never inherits it, unless it is armed with `:every`, as a request that kills each
/// process serving it would.
#[cfg(feature = "test-hooks")]
fn pass_crash_hook(cmd: &mut std::process::Command, replacement: bool) {
    const CRASH_HOOK_VAR: &str = "VFSD_TEST_CRASH";
    let every = std::env::var(CRASH_HOOK_VAR).is_ok_and(|v| v.ends_with(":every"));
    if replacement && !every {
        cmd.env_remove(CRASH_HOOK_VAR);
    }
}
