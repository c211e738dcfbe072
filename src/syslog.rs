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
pub struct SyslogWriter {
    sock: UnixDatagram,
}

impl SyslogWriter {
    pub fn connect() -> Result<SyslogWriter, String> {
        let path = socket_path();
        let sock = UnixDatagram::unbound()
            .and_then(|s| s.connect(&path).map(|_| s))
            .map_err(|e| format!("--syslog: cannot connect to '{}': {e}", path.display()))?;
        Ok(SyslogWriter { sock })
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl Write for SyslogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // syslog messages carry no trailing newline.
        let msg = buf.strip_suffix(b"\n").unwrap_or(buf);
        self.sock.send(msg)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
