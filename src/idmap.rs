//! `--uid-map` / `--gid-map`: the user namespace of the namespace sandbox with id ranges of
//! the caller's choosing, as virtiofsd does (libvirt passes them when it runs unprivileged).
//!
//! A process can't give itself a map with more than its own id, so the maps are written
//! from outside: before unsharing, the daemon forks a helper that stays in the parent user
//! namespace. Once the daemon has unshared, the helper writes the daemon's maps (directly
//! when root or when a map is just the caller's own id, else through the setuid
//! `newuidmap`/`newgidmap` from the shadow "uidmap" package, which check /etc/subuid and
//! /etc/subgid) and exits with the result.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use crate::sys::cvt;

/// Why the id maps could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum IdMapError {
    /// The helper could not be started.
    #[error("id maps: {step}")]
    Start {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The helper failed, and said why on stderr.
    #[error("could not set up --uid-map/--gid-map (see the line above)")]
    Helper,
    /// (In the helper.) The daemon closed its end before saying its pid.
    #[error("id maps: the daemon went away")]
    DaemonGone,
    #[error("id maps: writing {file} ({text})")]
    Write {
        file: &'static str,
        text: String,
        #[source]
        source: std::io::Error,
    },
    #[error("id maps: {tool} failed ({status}); are the ranges in /etc/sub{}id?", if *.tool == "newuidmap" { "u" } else { "g" })]
    ToolFailed {
        tool: &'static str,
        status: std::process::ExitStatus,
    },
    #[error("id maps: cannot run {tool} (package uidmap)")]
    ToolMissing {
        tool: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// One map line: `count` ids from `inside` (in the namespace) onto `outside` (on the host).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// virtiofsd's spelling, `:inside:outside:count:`; the first character is the separator.
pub fn parse(spec: &str) -> Result<IdRange, String> {
    let bad = || format!("'{spec}': expected :namespace_id:host_id:count:");
    let mut chars = spec.chars();
    let sep = chars.next().ok_or_else(bad)?;
    if sep.is_ascii_digit() {
        return Err(bad());
    }
    let rest = chars.as_str();
    let rest = rest.strip_suffix(sep).unwrap_or(rest);
    let f: Vec<u32> = rest
        .split(sep)
        .map(|x| x.parse::<u32>().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    match f[..] {
        [inside, outside, count] if count > 0 => Ok(IdRange {
            inside,
            outside,
            count,
        }),
        _ => Err(bad()),
    }
}

/// The text of /proc/PID/uid_map (or gid_map) for `maps`.
fn map_text(maps: &[IdRange]) -> String {
    maps.iter()
        .map(|m| format!("{} {} {}\n", m.inside, m.outside, m.count))
        .collect()
}

/// Whether `maps` is the caller's own id alone, which an unprivileged process may map.
fn only_own(maps: &[IdRange], own: u32) -> bool {
    matches!(maps, [m] if m.outside == own && m.count == 1)
}

/// The forked helper, waiting for the daemon to unshare.
pub struct MapHelper {
    pid: libc::pid_t,
    sock: UnixStream,
}

impl MapHelper {
    /// Forks the helper. Must run while the process has one thread.
    pub fn fork(uid_maps: Vec<IdRange>, gid_maps: Vec<IdRange>) -> Result<MapHelper, IdMapError> {
        let start = |step| move |source| IdMapError::Start { step, source };
        let (ours, theirs) = UnixStream::pair().map_err(start("socketpair"))?;
        // SAFETY: the process is single-threaded here (start-up, before any thread), so the
        // child's copy of it is consistent; the child only runs `helper` and then _exit.
        let pid = cvt(unsafe { libc::fork() }).map_err(start("fork"))?;
        if pid == 0 {
            drop(ours);
            let code = match helper(theirs, &uid_maps, &gid_maps) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("vfsd: {}", crate::error::Chain(&e));
                    1
                }
            };
            // SAFETY: ends the helper without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        Ok(MapHelper { pid, sock: ours })
    }

    /// After unshare(CLONE_NEWUSER): has the helper write our maps, and waits for it.
    pub fn map(mut self) -> Result<(), IdMapError> {
        let pid = std::process::id();
        let sent = self.sock.write_all(&pid.to_le_bytes());
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
        if sent.is_err()
            || r != self.pid
            || !libc::WIFEXITED(status)
            || libc::WEXITSTATUS(status) != 0
        {
            return Err(IdMapError::Helper);
        }
        Ok(())
    }
}

fn helper(
    mut sock: UnixStream,
    uid_maps: &[IdRange],
    gid_maps: &[IdRange],
) -> Result<(), IdMapError> {
    let mut b = [0u8; 4];
    sock.read_exact(&mut b)
        .map_err(|_| IdMapError::DaemonGone)?;
    let pid = u32::from_le_bytes(b);
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let write = |file: &'static str, text: &str| {
        std::fs::write(format!("/proc/{pid}/{file}"), text).map_err(|source| IdMapError::Write {
            file,
            text: text.trim().to_string(),
            source,
        })
    };
    let tool = |tool: &'static str, maps: &[IdRange]| -> Result<(), IdMapError> {
        let mut c = std::process::Command::new(tool);
        c.arg(pid.to_string());
        for m in maps {
            c.args([m.inside, m.outside, m.count].map(|x| x.to_string()));
        }
        match c.status() {
            Ok(s) if s.success() => Ok(()),
            Ok(status) => Err(IdMapError::ToolFailed { tool, status }),
            Err(source) => Err(IdMapError::ToolMissing { tool, source }),
        }
    };
    if !gid_maps.is_empty() {
        if uid == 0 {
            write("gid_map", &map_text(gid_maps))?;
        } else if only_own(gid_maps, gid) {
            // Unprivileged: a gid map of one's own gid needs setgroups denied first.
            write("setgroups", "deny")?;
            write("gid_map", &map_text(gid_maps))?;
        } else {
            tool("newgidmap", gid_maps)?;
        }
    }
    if !uid_maps.is_empty() {
        if uid == 0 || only_own(uid_maps, uid) {
            write("uid_map", &map_text(uid_maps))?;
        } else {
            tool("newuidmap", uid_maps)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtiofsd_spellings_parse() {
        let m = IdRange {
            inside: 0,
            outside: 1000,
            count: 1,
        };
        assert_eq!(parse(":0:1000:1:"), Ok(m));
        assert_eq!(parse(":0:1000:1"), Ok(m));
        assert_eq!(parse("/0/1000/1/"), Ok(m));
        for bad in [
            "",
            "0:1000:1",
            ":0:1000:",
            ":0:1000:0:",
            ":a:1:1:",
            ":0:1:1:1:",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            map_text(&[
                m,
                IdRange {
                    inside: 1,
                    outside: 100000,
                    count: 65536
                }
            ]),
            "0 1000 1\n1 100000 65536\n"
        );
    }
}
