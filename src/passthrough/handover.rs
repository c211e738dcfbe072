//! Lock and open-file handover between two daemons on one host: the source passes its own
//! open file descriptions (SCM_RIGHTS) to the destination, so the locks they carry (OFD
//! locks, flock) and open-but-unlinked files move without ever being released.
//!
//! At save the source listens on a unix socket (mode 0600, a random name) in its private
//! runtime directory (`RuntimeDir`: `$XDG_RUNTIME_DIR/vfsd`, or `/run/vfsd` for root),
//! opened before the sandbox, never in the share a guest can list; it puts the name and a
//! random token in the device state. At load the destination, started with the same
//! options and so holding the same directory, connects, sends the token and receives, in
//! batches, every handle's fd, every lock owner's fd and the O_PATH fd of every node no
//! name finds. The source accepts until its deadline, skipping any peer of another uid,
//! with a wrong token or that sends none. Either side then marks its descriptions shared:
//! a reset (disconnect, a new INIT) closes them without unlocking, since the other daemon's
//! copy carries the same locks. What the destination receives is checked against the
//! nodes it found itself (same inode), or taken only for files with no links left;
//! anything else is ignored and the file opened again as without a handover. Across hosts
//! (a distributed file system), or without a runtime directory, there is no handover, and
//! locks are taken again instead (docs/migration.md).

use std::collections::HashMap;
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::sys;

/// Fds per message (the kernel's SCM_MAX_FD is 253).
const BATCH: usize = 200;
/// How long the source waits for the destination to come for its fds.
const WAIT: Duration = Duration::from_secs(30);
/// How long a connected peer has to send the token before the next one gets its turn.
const TOKEN_WAIT: Duration = Duration::from_secs(2);
pub const TOKEN_LEN: usize = 16;
/// The socket names this vfsd makes and accepts: the prefix and 16 hex digits.
const PREFIX: &str = "handover-";
pub const NAME_LEN: usize = PREFIX.len() + 16;

/// Binding and connecting go by a name relative to the runtime directory: the calling
/// thread (a device-state thread of its own) detaches its cwd and umask (`sys::in_dir`)
/// and moves there.
fn in_dir<T>(dir: RawFd, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let mut out = None;
    sys::in_dir(dir, || {
        out = Some(f());
        0
    })?;
    out.unwrap()
}

/// The private directory the handover sockets live in, held open from start-up: a
/// sandboxed daemon can't name it by path.
#[derive(Debug)]
pub struct RuntimeDir(OwnedFd);

impl RuntimeDir {
    /// `$XDG_RUNTIME_DIR/vfsd`, or for root without one `/run/vfsd` (where libvirt and
    /// systemd keep runtime state); none for another user without `$XDG_RUNTIME_DIR`.
    pub fn path() -> Option<std::path::PathBuf> {
        if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
            return Some(std::path::Path::new(&d).join("vfsd"));
        }
        // SAFETY: geteuid has no preconditions.
        (unsafe { libc::geteuid() } == 0).then(|| "/run/vfsd".into())
    }

    /// Creates `path` (0700) if it is missing and checks that it is a directory of this
    /// user's that nobody else may enter or write: another user who controls it could take
    /// the socket's name.
    pub fn prepare(path: &std::path::Path) -> io::Result<()> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
        // SAFETY: mkdir with a NUL-terminated path.
        if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e);
            }
        }
        let fd = sys::openat(
            libc::AT_FDCWD,
            &c,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        Self::check(&fd)
    }

    fn check(fd: &OwnedFd) -> io::Result<()> {
        let st = sys::statx(
            fd.as_raw_fd(),
            sys::EMPTY,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if st.st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(io::Error::other("not a directory"));
        }
        if st.st.st_uid != me || st.st.st_mode & 0o077 != 0 {
            return Err(io::Error::other(format!(
                "owned by uid {} with mode {:o}: not private to uid {me}",
                st.st.st_uid,
                st.st.st_mode & 0o7777
            )));
        }
        Ok(())
    }

    /// Opens the directory `prepare` checked. `confined`: the process is about to enter
    /// a sandbox, so the fd is a detached copy of just that directory's mount
    /// (open_tree OPEN_TREE_CLONE), whose `..` leads nowhere: the sandboxed daemon holds
    /// no way out of the share. Needs CAP_SYS_ADMIN in the current mount namespace's
    /// user namespace, so in the namespace sandbox it runs after the unshare.
    pub fn open(path: &std::path::Path, confined: bool) -> io::Result<RuntimeDir> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
        let fd = if confined {
            // SAFETY: open_tree with a NUL-terminated path; it returns a new fd or -1.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint
                        | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
                )
            };
            let fd = sys::cvt(r as i32)?;
            // SAFETY: open_tree gave us this fd; nothing else owns it.
            unsafe { OwnedFd::from_raw_fd(fd) }
        } else {
            sys::openat(
                libc::AT_FDCWD,
                &c,
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            )?
        };
        Self::check(&fd)?;
        Ok(RuntimeDir(fd))
    }

    /// For tests and tools: a directory already open (and checked).
    pub fn from_fd(fd: OwnedFd) -> io::Result<RuntimeDir> {
        Self::check(&fd)?;
        Ok(RuntimeDir(fd))
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// The uid a connection's peer runs as (SO_PEERCRED): the two daemons run as the same
/// user, so a peer of another uid (a host user who can write the share) is refused.
fn peer_is_us(s: &UnixStream) -> io::Result<()> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    sys::cvt(unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    // SAFETY: geteuid has no preconditions.
    if cred.uid != unsafe { libc::geteuid() } {
        return Err(io::Error::other(format!(
            "the peer runs as uid {}, not this daemon's",
            cred.uid
        )));
    }
    Ok(())
}

fn random<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    // SAFETY: getrandom writes at most `b.len()` bytes into it.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != N as isize {
        return Err(io::Error::other("getrandom"));
    }
    Ok(b)
}

/// What the state says about the handover.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Offer {
    pub name: Vec<u8>,
    pub token: [u8; TOKEN_LEN],
}

impl Offer {
    /// An offer of the size every real one has.
    pub fn sized() -> Offer {
        Offer {
            name: vec![b'0'; NAME_LEN],
            token: [0; TOKEN_LEN],
        }
    }
}

/// What one passed fd is.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Item {
    Handle(u64),
    Owner(u64, u64),
    Node(u64),
}

/// The source's side: a listening socket, until the destination took the fds or `WAIT`.
pub struct Listener {
    sock: UnixListener,
    name: CString,
    token: [u8; TOKEN_LEN],
}

impl Listener {
    pub fn bind(dir: RawFd) -> io::Result<Listener> {
        let token = random::<TOKEN_LEN>()?;
        // The name says nothing about the token.
        let hex: String = random::<8>()?.iter().map(|b| format!("{b:02x}")).collect();
        let name = CString::new(format!("{PREFIX}{hex}")).unwrap();
        let sock = in_dir(dir, || {
            sweep();
            // Mode 0600 (this thread's umask, private since `in_dir`; the daemon's is 0).
            // SAFETY: umask has no preconditions.
            let old = unsafe { libc::umask(0o177) };
            let r = UnixListener::bind(std::ffi::OsStr::new(name.to_str().unwrap()));
            // SAFETY: as above.
            unsafe { libc::umask(old) };
            r
        })?;
        sock.set_nonblocking(true)?;
        Ok(Listener { sock, name, token })
    }

    pub fn offer(&self) -> Offer {
        Offer {
            name: self.name.as_bytes().to_vec(),
            token: self.token,
        }
    }

    /// Waits (on its own thread) for the destination and hands it `items`; gives whether
    /// it took them. The socket's name is removed either way.
    pub fn serve(self, dir: OwnedFd, items: Vec<(Item, OwnedFd)>) -> bool {
        let r = self.serve_all(&items);
        // SAFETY: unlinkat with a NUL-terminated name relative to the directory's fd.
        unsafe { libc::unlinkat(dir.as_raw_fd(), self.name.as_ptr(), 0) };
        match r {
            Ok(()) => true,
            Err(e) => {
                log::warn!("migration: no lock handover: {e}");
                false
            }
        }
    }

    /// Accepts until `WAIT` is over; a peer of another uid, with the wrong token or none
    /// is dropped and the next one taken, so nobody can end the handover for the real
    /// destination.
    fn serve_all(&self, items: &[(Item, OwnedFd)]) -> io::Result<()> {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::Error::other("the destination did not come for the fds"));
            }
            let mut p = libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one pollfd we own.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as i32) };
            if n <= 0 {
                continue;
            }
            let s = match self.sock.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            };
            match self.admit(&s) {
                Ok(()) => return self.hand_over(s, items),
                Err(e) => log::info!("migration: handover: a peer refused ({e})"),
            }
        }
    }

    /// A peer of this daemon's uid that sends the token within `TOKEN_WAIT`.
    fn admit(&self, s: &UnixStream) -> io::Result<()> {
        s.set_nonblocking(false)?;
        peer_is_us(s)?;
        s.set_read_timeout(Some(TOKEN_WAIT))?;
        let mut token = [0u8; TOKEN_LEN];
        (&*s).read_exact(&mut token)?;
        if token != self.token {
            return Err(io::Error::other("a connection without the token"));
        }
        Ok(())
    }

    fn hand_over(&self, s: UnixStream, items: &[(Item, OwnedFd)]) -> io::Result<()> {
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        for chunk in items.chunks(BATCH) {
            let ids: Vec<Item> = chunk.iter().map(|(i, _)| *i).collect();
            let fds: Vec<RawFd> = chunk.iter().map(|(_, f)| f.as_raw_fd()).collect();
            send_batch(&s, &ids, &fds)?;
        }
        send_batch(&s, &[], &[])?;
        // The destination's "got them all".
        let mut ack = [0u8; 1];
        (&s).read_exact(&mut ack)?;
        Ok(())
    }
}

/// Removes the sockets of daemons that ended before their handover did (killed, say):
/// any older than twice `WAIT` is served by nobody. In the runtime directory (the cwd).
fn sweep() {
    let Ok(entries) = std::fs::read_dir(".") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.as_encoded_bytes().starts_with(PREFIX.as_bytes()) {
            continue;
        }
        let old = std::fs::symlink_metadata(&name)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > 2 * WAIT));
        if let (true, Ok(c)) = (old, CString::new(name.as_encoded_bytes())) {
            // SAFETY: unlinkat with a NUL-terminated name (std's remove_file is unlink,
            // which the seccomp filter does not allow).
            unsafe { libc::unlinkat(libc::AT_FDCWD, c.as_ptr(), 0) };
        }
    }
}

fn send_batch(s: &UnixStream, ids: &[Item], fds: &[RawFd]) -> io::Result<()> {
    let body = postcard::to_stdvec(ids).map_err(io::Error::other)?;
    let len = (body.len() as u32).to_le_bytes();
    // The fds ride on the length's bytes, which the receiver reads with room for them.
    s.send_with_fds(&[&len[..]], fds)
        .map_err(io::Error::other)?;
    (&*s).write_all(&body)
}

/// The destination's side: connects to the source's socket and takes its fds, at most
/// `max` of them and only items in `expected`.
pub fn receive(
    dir: RawFd,
    offer: &Offer,
    expected: &std::collections::HashSet<Item>,
) -> io::Result<HashMap<Item, OwnedFd>> {
    let ok_name = offer.name.starts_with(PREFIX.as_bytes())
        && offer.name.len() == NAME_LEN
        && offer.name[PREFIX.len()..].iter().all(u8::is_ascii_hexdigit);
    if !ok_name {
        return Err(io::Error::other("bad handover socket name"));
    }
    let name = String::from_utf8(offer.name.clone()).map_err(io::Error::other)?;
    let cname = CString::new(name.clone()).map_err(io::Error::other)?;
    // A socket, not a symlink to one elsewhere (connect follows symlinks).
    let st = sys::statx(dir, &cname, libc::AT_SYMLINK_NOFOLLOW)?;
    if st.st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::other("the handover name is not a socket"));
    }
    let s = in_dir(dir, || UnixStream::connect(&name))?;
    // Its listener runs as this daemon's user: a host user who took the name is refused
    // before it sees the token.
    peer_is_us(&s)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    (&s).write_all(&offer.token)?;
    let mut got = HashMap::new();
    loop {
        let mut len = [0u8; 4];
        let mut fds = [-1 as RawFd; BATCH];
        let mut iov = [libc::iovec {
            iov_base: len.as_mut_ptr().cast(),
            iov_len: len.len(),
        }];
        // SAFETY: `iov` points at `len`, which outlives the call; `fds` has room for BATCH.
        let (n, nfds) = unsafe { s.recv_with_fds(&mut iov, &mut fds) }.map_err(io::Error::other)?;
        // SAFETY: recvmsg gave us these `nfds` fds; nothing else owns them.
        let owned = unsafe { sys::adopt_received(&fds[..nfds]) };
        if std::time::Instant::now() > deadline {
            return Err(io::Error::other("the handover took too long"));
        }
        if n != len.len() {
            return Err(io::Error::other("short handover message"));
        }
        let blen = u32::from_le_bytes(len) as usize;
        if blen > 64 * 1024 {
            return Err(io::Error::other("handover message too long"));
        }
        let mut body = vec![0u8; blen];
        (&s).read_exact(&mut body)?;
        let ids: Vec<Item> = postcard::from_bytes(&body).map_err(io::Error::other)?;
        if ids.len() != owned.len() {
            return Err(io::Error::other(
                "handover message with the wrong number of fds",
            ));
        }
        if ids.is_empty() {
            break;
        }
        for (id, fd) in ids.into_iter().zip(owned) {
            if !expected.contains(&id) || got.insert(id, fd).is_some() {
                return Err(io::Error::other("an fd the state does not name, or twice"));
            }
        }
    }
    (&s).write_all(&[1])?;
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_runtime_directory_others_may_enter_or_that_another_user_owns_is_refused() {
        let top = tempfile::tempdir().unwrap();
        let fresh = top.path().join("vfsd");
        RuntimeDir::prepare(&fresh).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o700);
        RuntimeDir::open(&fresh, false).unwrap();

        let open = top.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(RuntimeDir::prepare(&open).is_err());
        assert!(RuntimeDir::open(&open, false).is_err());

        let link = top.path().join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        assert!(
            RuntimeDir::prepare(&link).is_err(),
            "a symlink was followed"
        );

        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = top.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            assert!(RuntimeDir::prepare(&theirs).is_err());
            // The sandbox's copy: `..` leads nowhere out of it.
            let d = RuntimeDir::open(&fresh, true).unwrap();
            let up = sys::openat(d.fd(), c"..", libc::O_PATH, 0).unwrap();
            let flags = libc::AT_EMPTY_PATH;
            let ino = |fd: RawFd| sys::statx(fd, sys::EMPTY, flags).unwrap().st.st_ino;
            assert_eq!(ino(up.as_raw_fd()), ino(d.fd()));
        }
    }
}

#[cfg(test)]
mod sweep_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn binding_removes_sockets_older_than_any_live_handover_and_keeps_the_rest() {
        let top = tempfile::tempdir().unwrap();
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let dead = top.path().join(format!("{PREFIX}00000000000000aa"));
        let live = top.path().join(format!("{PREFIX}00000000000000bb"));
        let other = top.path().join("other");
        for p in [&dead, &live, &other] {
            std::fs::write(p, b"").unwrap();
        }
        let old = std::time::SystemTime::now() - 3 * WAIT;
        for p in [&dead, &other] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        let c = CString::new(top.path().as_os_str().as_encoded_bytes()).unwrap();
        let dir = sys::openat(libc::AT_FDCWD, &c, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap();
        let l = Listener::bind(dir.as_raw_fd()).unwrap();
        assert!(!dead.exists(), "a dead daemon's socket stayed");
        assert!(live.exists() && other.exists());
        let mode = std::fs::symlink_metadata(top.path().join(l.name.to_str().unwrap()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
