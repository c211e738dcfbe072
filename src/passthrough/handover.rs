//! Lock and open-file handover between two daemons on one host: the source passes its own
//! open file descriptions (SCM_RIGHTS) to the destination, so the locks they carry (OFD
//! locks, flock) and open-but-unlinked files move without ever being released.
//!
//! At save the source listens on a unix socket with a random hidden name in the share's
//! root (both daemons see the share, whatever their sandboxes) and puts the name and a
//! random token in the device state. At load the destination connects, sends the token
//! and receives, in batches, every handle's fd, every lock owner's fd and the O_PATH fd of
//! every node no name finds. Either side then marks its descriptions shared: a reset
//! (disconnect, a new INIT) closes them without unlocking, since the other daemon's copy
//! carries the same locks. What the destination receives is checked against the nodes it
//! found itself (same inode), or taken only for files with no links left; anything else is
//! ignored and the file opened again as without a handover. Across hosts (a distributed
//! file system) the connect fails, and locks are taken again instead (docs/migration.md).

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
pub const TOKEN_LEN: usize = 16;

/// Binding and connecting go by a name relative to the share's root: the calling thread
/// (a device-state thread of its own) detaches its cwd (`sys::in_dir`) and moves it there.
fn in_root<T>(root: RawFd, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let mut out = None;
    sys::in_dir(root, || {
        out = Some(f());
        0
    })?;
    out.unwrap()
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
    pub fn bind(root: RawFd) -> io::Result<Listener> {
        let token = random::<TOKEN_LEN>()?;
        // The name says nothing about the token.
        let hex: String = random::<8>()?.iter().map(|b| format!("{b:02x}")).collect();
        let name = CString::new(format!(".vfsd-handover-{hex}")).unwrap();
        let sock = in_root(root, || {
            UnixListener::bind(std::ffi::OsStr::new(name.to_str().unwrap()))
        })?;
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
    pub fn serve(self, root: OwnedFd, items: Vec<(Item, OwnedFd)>) -> bool {
        let r = self.serve_one(&items);
        // SAFETY: unlinkat with a NUL-terminated name relative to the root's fd.
        unsafe { libc::unlinkat(root.as_raw_fd(), self.name.as_ptr(), 0) };
        match r {
            Ok(()) => true,
            Err(e) => {
                log::warn!("migration: no lock handover: {e}");
                false
            }
        }
    }

    fn serve_one(&self, items: &[(Item, OwnedFd)]) -> io::Result<()> {
        let fd = self.sock.as_raw_fd();
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one pollfd we own.
        let n = unsafe { libc::poll(&mut p, 1, WAIT.as_millis() as i32) };
        if n <= 0 {
            return Err(io::Error::other("the destination did not come for the fds"));
        }
        let (mut s, _) = self.sock.accept()?;
        peer_is_us(&s)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        let mut token = [0u8; TOKEN_LEN];
        s.read_exact(&mut token)?;
        if token != self.token {
            return Err(io::Error::other("a connection without the token"));
        }
        for chunk in items.chunks(BATCH) {
            let ids: Vec<Item> = chunk.iter().map(|(i, _)| *i).collect();
            let fds: Vec<RawFd> = chunk.iter().map(|(_, f)| f.as_raw_fd()).collect();
            send_batch(&s, &ids, &fds)?;
        }
        send_batch(&s, &[], &[])?;
        // The destination's "got them all".
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack)?;
        Ok(())
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
    root: RawFd,
    offer: &Offer,
    expected: &std::collections::HashSet<Item>,
) -> io::Result<HashMap<Item, OwnedFd>> {
    let ok_name = offer.name.starts_with(b".vfsd-handover-")
        && offer.name.len() <= 64
        && !offer.name.contains(&b'/');
    if !ok_name {
        return Err(io::Error::other("bad handover socket name"));
    }
    let name = String::from_utf8(offer.name.clone()).map_err(io::Error::other)?;
    let cname = CString::new(name.clone()).map_err(io::Error::other)?;
    // A socket, not a symlink to one elsewhere (connect follows symlinks).
    let st = sys::statx(root, &cname, libc::AT_SYMLINK_NOFOLLOW)?;
    if st.st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::other("the handover name is not a socket"));
    }
    let s = in_root(root, || UnixStream::connect(&name))?;
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
        let owned: Vec<OwnedFd> = fds[..nfds]
            .iter()
            .map(|&f| unsafe { OwnedFd::from_raw_fd(f) })
            .collect();
        for f in &owned {
            // SAFETY: plain fcntl on an fd we own (recvmsg gave it without CLOEXEC).
            unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        }
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
