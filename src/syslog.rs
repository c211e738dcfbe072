//! `--syslog`: log records go to the local syslog socket instead of stderr.
//!
//! The socket is connected once at start-up, before the sandbox hides /dev/log, and its fd
//! is kept through the close-stray-fds step. Each record is one datagram in the classic
//! BSD format, `<PRI>vfsd[PID]: message`, with facility "daemon".

use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

/// LOG_DAEMON.
const FACILITY: u8 = 3;

/// Where the local syslog daemon listens. `VFSD_SYSLOG_SOCKET` overrides it (hosts whose
/// syslog listens elsewhere, and the tests).
fn socket_path() -> PathBuf {
    std::env::var_os("VFSD_SYSLOG_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/log"))
}

/// The syslog severity of a log level.
pub fn severity(level: log::Level) -> u8 {
    match level {
        log::Level::Error => 3,
        log::Level::Warn => 4,
        log::Level::Info => 6,
        log::Level::Debug | log::Level::Trace => 7,
    }
}

/// The `<PRI>` prefix of a record at `level`.
pub fn priority(level: log::Level) -> u8 {
    FACILITY * 8 + severity(level)
}

/// A connected syslog socket; each `write` is sent as one datagram (one record).
///
/// The socket is non-blocking: a stalled syslog daemon must not stall the threads serving
/// the guest, so a record that does not fit its queue is dropped (and counted). If the
/// syslog daemon goes away (restarted: the sandbox can't reconnect), records go to stderr.
pub struct SyslogWriter {
    sock: UnixDatagram,
    dropped: u64,
    lost_syslog: bool,
}

impl SyslogWriter {
    pub fn connect() -> Result<SyslogWriter, crate::error::IoContext> {
        use crate::error::Context;
        let path = socket_path();
        let sock = UnixDatagram::unbound()
            .and_then(|s| s.connect(&path).map(|_| s))
            .and_then(|s| s.set_nonblocking(true).map(|_| s))
            .context(|| format!("--syslog: cannot connect to '{}'", path.display()))?;
        Ok(SyslogWriter {
            sock,
            dropped: 0,
            lost_syslog: false,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl Write for SyslogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // syslog messages carry no trailing newline.
        let msg = buf.strip_suffix(b"\n").unwrap_or(buf);
        if !self.lost_syslog {
            match self.sock.send(msg) {
                Ok(_) => return Ok(buf.len()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.dropped += 1;
                    return Ok(buf.len());
                }
                Err(_) => {
                    self.lost_syslog = true;
                    let _ = writeln!(
                        io::stderr(),
                        "vfsd: syslog went away ({} records dropped before); logging to stderr",
                        self.dropped
                    );
                }
            }
        }
        io::stderr().write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer_to(path: &std::path::Path) -> SyslogWriter {
        let sock = UnixDatagram::unbound().unwrap();
        sock.connect(path).unwrap();
        sock.set_nonblocking(true).unwrap();
        SyslogWriter {
            sock,
            dropped: 0,
            lost_syslog: false,
        }
    }

    #[test]
    fn a_full_syslog_queue_drops_records_instead_of_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let _syslogd = UnixDatagram::bind(&path).unwrap(); // never reads
        let mut w = writer_to(&path);
        for _ in 0..10_000 {
            assert_eq!(w.write(b"<30>vfsd[1]: x\n").unwrap(), 15);
        }
        assert!(w.dropped > 0 && !w.lost_syslog);
    }

    #[test]
    fn a_vanished_syslog_daemon_sends_records_to_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let syslogd = UnixDatagram::bind(&path).unwrap();
        let mut w = writer_to(&path);
        w.write_all(b"<30>vfsd[1]: first\n").unwrap();
        let mut buf = [0u8; 64];
        let n = syslogd.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"<30>vfsd[1]: first", "no newline in a record");
        drop(syslogd);
        w.write_all(b"<30>vfsd[1]: second\n").unwrap();
        assert!(w.lost_syslog);
    }

    #[test]
    fn priorities_use_the_daemon_facility() {
        assert_eq!(priority(log::Level::Error), 27);
        assert_eq!(priority(log::Level::Info), 30);
        assert_eq!(priority(log::Level::Trace), 31);
    }
}
