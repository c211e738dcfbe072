//! The supervisor's state across its exec of a new binary: after an upgrade every vfsd
//! process runs the new binary, and the VMM's pid stays. The image is written to a memfd
//! the new image of the process reads (`resume`); an image an older supervisor wrote is
//! read too.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Instant;

use log::{error, info};

use super::record::Record;
use super::signals::signal_fd;
use super::{open_pidfd, wire, Child, ImageError, State, Supervisor, SupervisorError, ANSWER_WAIT};
use crate::sandbox::SocketName;

/// Goes on as the supervisor whose state `fd` holds (`State::reexec`); returns only if
/// that state can't be read.
pub fn resume(fd: RawFd) -> SupervisorError {
    // SAFETY: the fd is the memfd the previous image of this process left open for it.
    let file = std::fs::File::from(unsafe { wire::adopt(fd) });
    let (image, record): (Image, Record) = match read_image(file) {
        Ok(i) => i,
        Err(e) => return SupervisorError::ReadImage(e),
    };
    if image.version != IMAGE_VERSION {
        return SupervisorError::ImageVersion {
            found: image.version,
            reads: IMAGE_VERSION,
        };
    }
    let sigfd = match signal_fd() {
        Ok(f) => f,
        Err(e) => return e,
    };
    // SAFETY (each adopt and import below): the previous image of this process left these
    // fds open for it and holds them nowhere else.
    let known = |n: &str| -> Option<&'static str> {
        ["metrics-fd", "stats-fd"].into_iter().find(|k| *k == n)
    };
    let sup = Supervisor {
        exe: PathBuf::from(OsString::from_vec(image.exe)),
        args: image.args.into_iter().map(OsString::from_vec).collect(),
        listener: UnixListener::from(unsafe { wire::adopt(image.listener) }),
        inherited: (image.inherited.into_iter())
            .filter_map(|(n, fd)| Some((known(&n)?, unsafe { wire::adopt(fd) })))
            .collect(),
        socket: (!image.socket.is_empty()).then(|| unsafe { SocketName::import(image.socket) }),
        keep_listening: image.keep_listening,
    };
    let frontend = image
        .frontend
        .map(|fd| UnixStream::from(unsafe { wire::adopt(fd) }));
    let conn = UnixStream::from(unsafe { wire::adopt(image.child_conn) });
    let pidfd = match open_pidfd(image.child) {
        Ok(p) => p,
        Err(source) => {
            return SupervisorError::ServingProcess {
                pid: image.child,
                source,
            }
        }
    };
    let st = State {
        sup,
        sigfd,
        record,
        acked_reply_ack: image.acked_reply_ack,
        asked_features: image.asked_features,
        awaited_msgs: image.awaited.iter().map(|_| None).collect(),
        awaited: image.awaited.into(),
        dropped: false,
        terminating: image.terminating,
        // A termination signal relayed before the exec: the serving process has as long
        // again to exit.
        kill_at: image.terminating.then(|| Instant::now() + ANSWER_WAIT),
        crashes: Default::default(),
    };
    // As in `run` (exec keeps it; set again in case an older image did not).
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    info!("supervisor: now running {}", st.sup.exe.display());
    let keeper = image
        .child_keeper
        .map(|fd| UnixStream::from(unsafe { wire::adopt(fd) }));
    let child = Child {
        pid: image.child,
        pidfd,
        conn,
        keeper,
    };
    st.main_loop(child, frontend)
}

/// The supervisor's state across its exec of a new binary.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Image {
    version: u32,
    exe: Vec<u8>,
    args: Vec<Vec<u8>>,
    listener: RawFd,
    inherited: Vec<(String, RawFd)>,
    socket: Vec<(RawFd, Vec<u8>, (u64, u64))>,
    keep_listening: bool,
    frontend: Option<RawFd>,
    child: libc::pid_t,
    child_conn: RawFd,
    child_keeper: Option<RawFd>,
    acked_reply_ack: bool,
    asked_features: bool,
    awaited: Vec<(u32, u32)>,
    terminating: bool,
}

/// Bumped when `Image` changes: a binary refuses an image it can't read before it acts.
pub(super) const IMAGE_VERSION: u32 = 2;

/// The most a supervisor's image can take: far over what the record's bounds allow.
pub(super) const MAX_IMAGE: u64 = 64 << 20;

fn read_image(file: std::fs::File) -> Result<(Image, Record), ImageError> {
    use std::io::{Read, Seek};
    let mut file = file;
    file.rewind()?;
    let mut buf = Vec::new();
    (&mut file).take(MAX_IMAGE).read_to_end(&mut buf)?;
    let (version, _) = postcard::take_from_bytes::<u32>(&buf)?;
    if version == 1 {
        let (old, record): (ImageV1, Record) = postcard::from_bytes(&buf)?;
        return Ok((old.into(), record));
    }
    Ok(postcard::from_bytes(&buf)?)
}

/// `Image` as version 1 wrote it: its serving process has no keeper.
#[derive(serde::Deserialize)]
struct ImageV1 {
    _version: u32,
    exe: Vec<u8>,
    args: Vec<Vec<u8>>,
    listener: RawFd,
    inherited: Vec<(String, RawFd)>,
    socket: Vec<(RawFd, Vec<u8>, (u64, u64))>,
    keep_listening: bool,
    frontend: Option<RawFd>,
    child: libc::pid_t,
    child_conn: RawFd,
    acked_reply_ack: bool,
    asked_features: bool,
    awaited: Vec<(u32, u32)>,
    terminating: bool,
}

impl From<ImageV1> for Image {
    fn from(o: ImageV1) -> Image {
        Image {
            // Read: it is this version's image now.
            version: IMAGE_VERSION,
            exe: o.exe,
            args: o.args,
            listener: o.listener,
            inherited: o.inherited,
            socket: o.socket,
            keep_listening: o.keep_listening,
            frontend: o.frontend,
            child: o.child,
            child_conn: o.child_conn,
            child_keeper: None,
            acked_reply_ack: o.acked_reply_ack,
            asked_features: o.asked_features,
            awaited: o.awaited,
            terminating: o.terminating,
        }
    }
}

/// execv of `cmd`'s program and arguments, keeping the signal mask (and so the pending
/// signals) as it is. Returns only on failure.
pub(super) fn exec_keeping_signals(cmd: &std::process::Command) -> io::Error {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |s: &std::ffi::OsStr| CString::new(s.as_bytes()).map_err(io::Error::other);
    let prog = match c(cmd.get_program()) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let mut argv = vec![prog.clone()];
    for a in cmd.get_args() {
        match c(a) {
            Ok(a) => argv.push(a),
            Err(e) => return e,
        }
    }
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: NUL-terminated strings that outlive the call, in a NULL-terminated array.
    unsafe { libc::execv(prog.as_ptr(), ptrs.as_ptr()) };
    io::Error::last_os_error()
}

impl State {
    /// Runs the binary at `exe` as this supervisor, with its state: after an upgrade
    /// every vfsd process runs the new binary, and the VMM's pid stays. Returns only if
    /// the exec failed; this supervisor then goes on.
    pub(super) fn reexec(&self, frontend: Option<&UnixStream>, child: &Child) {
        let image = Image {
            version: IMAGE_VERSION,
            exe: self.sup.exe.clone().into_os_string().into_vec(),
            args: self.sup.args.iter().map(|a| a.clone().into_vec()).collect(),
            listener: wire::inheritable(self.sup.listener.as_raw_fd()),
            inherited: (self.sup.inherited.iter())
                .map(|(n, fd)| (n.to_string(), wire::inheritable(fd.as_raw_fd())))
                .collect(),
            socket: (self.sup.socket.iter())
                .flat_map(|s| s.export())
                .map(|(fd, n, id)| (wire::inheritable(fd), n, id))
                .collect(),
            keep_listening: self.sup.keep_listening,
            frontend: frontend.map(|f| wire::inheritable(f.as_raw_fd())),
            child: child.pid,
            child_conn: wire::inheritable(child.conn.as_raw_fd()),
            child_keeper: child
                .keeper
                .as_ref()
                .map(|k| wire::inheritable(k.as_raw_fd())),
            acked_reply_ack: self.acked_reply_ack,
            asked_features: self.asked_features,
            awaited: self.awaited.iter().copied().collect(),
            terminating: self.terminating,
        };
        // The record's fds are made inheritable as it is written.
        let r = postcard::to_stdvec(&(&image, &self.record))
            .map_err(io::Error::other)
            .and_then(|bytes| {
                // SAFETY: memfd_create with a NUL-terminated name; the fd is ours.
                let fd = unsafe { libc::memfd_create(c"vfsd-supervisor".as_ptr(), 0) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: memfd_create returned a new fd nothing else owns.
                let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                std::io::Write::write_all(&mut f, &bytes)?;
                Ok(f)
            });
        let e = match r {
            Ok(f) => {
                let mut cmd = std::process::Command::new(&self.sup.exe);
                cmd.args(&self.sup.args)
                    .arg(format!("--supervisor-state-fd={}", f.as_raw_fd()));
                // Not Command::exec, which would unblock the signals the signalfd takes:
                // one sent during the exec must wait for the new image.
                exec_keeping_signals(&cmd)
            }
            Err(e) => e,
        };
        error!(
            "supervisor: cannot run {}: {e}; this one goes on",
            self.sup.exe.display()
        );
        for fd in self.inheritable_fds(frontend, child) {
            // SAFETY: plain fcntl on fds this process holds.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }

    /// Every fd `reexec` made inheritable, to close on exec again.
    pub(super) fn inheritable_fds(
        &self,
        frontend: Option<&UnixStream>,
        child: &Child,
    ) -> Vec<RawFd> {
        let mut v = vec![self.sup.listener.as_raw_fd(), child.conn.as_raw_fd()];
        v.extend(child.keeper.as_ref().map(|k| k.as_raw_fd()));
        v.extend(frontend.map(|f| f.as_raw_fd()));
        v.extend(self.sup.inherited.iter().map(|(_, f)| f.as_raw_fd()));
        v.extend(self.sup.socket.iter().flat_map(|s| s.dir_fds()));
        v.extend(self.record.fds());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct WrittenV1 {
        version: u32,
        exe: Vec<u8>,
        args: Vec<Vec<u8>>,
        listener: RawFd,
        inherited: Vec<(String, RawFd)>,
        socket: Vec<(RawFd, Vec<u8>, (u64, u64))>,
        keep_listening: bool,
        frontend: Option<RawFd>,
        child: libc::pid_t,
        child_conn: RawFd,
        acked_reply_ack: bool,
        asked_features: bool,
        awaited: Vec<(u32, u32)>,
        terminating: bool,
    }

    #[test]
    fn an_image_an_older_supervisor_wrote_is_read_without_a_keeper() {
        let old = WrittenV1 {
            version: 1,
            exe: b"/usr/bin/vfsd".to_vec(),
            args: vec![b"--shared-dir".to_vec(), b"/srv".to_vec()],
            listener: 3,
            inherited: vec![],
            socket: vec![],
            keep_listening: true,
            frontend: Some(4),
            child: 77,
            child_conn: 5,
            acked_reply_ack: true,
            asked_features: true,
            awaited: vec![],
            terminating: false,
        };
        let bytes = postcard::to_stdvec(&(&old, &Record::default())).unwrap();
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &bytes).unwrap();
        let (image, _) = read_image(f).unwrap();
        assert_eq!(image.version, IMAGE_VERSION);
        assert_eq!(
            (image.child, image.child_conn, image.child_keeper),
            (77, 5, None)
        );
        assert_eq!(image.frontend, Some(4));
        assert!(image.keep_listening);
    }
}
