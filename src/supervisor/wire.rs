//! vhost-user messages as the supervisor sees them: a header, a body of bytes and the fds
//! that came with them. It relays them unchanged and reads only the few fields it records
//! (`record`); the serving process parses and checks everything else.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub const HDR_LEN: usize = 12;
/// vhost-user's largest message body (the vhost crate's `MAX_MSG_SIZE`).
pub const MAX_BODY: usize = 0x1000;
/// vhost-user's most fds on one message (`MAX_ATTACHED_FD_ENTRIES`).
pub const MAX_FDS: usize = 32;

const VERSION: u32 = 0x1;
const REPLY: u32 = 0x4;
const NEED_REPLY: u32 = 0x8;

/// Request codes the supervisor acts on (the vhost-user spec's numbers).
pub mod code {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const RESET_OWNER: u32 = 4;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_LOG_BASE: u32 = 6;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const SET_VRING_ERR: u32 = 14;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;
    pub const SET_BACKEND_REQ_FD: u32 = 21;
    pub const GET_CONFIG: u32 = 24;
    pub const GET_INFLIGHT_FD: u32 = 31;
    pub const RESET_DEVICE: u32 = 34;
    pub const GET_MAX_MEM_SLOTS: u32 = 36;
    pub const ADD_MEM_REG: u32 = 37;
    pub const REM_MEM_REG: u32 = 38;
    pub const SET_DEVICE_STATE_FD: u32 = 42;
    pub const CHECK_DEVICE_STATE: u32 = 43;
}

/// The REPLY_ACK protocol feature: a request flagged NEED_REPLY gets an ack.
pub const PROTOCOL_REPLY_ACK: u64 = 1 << 3;

pub struct Msg {
    pub code: u32,
    pub flags: u32,
    pub body: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

/// A message as the supervisor's state carries it across its own exec: its fds by number,
/// kept open through the exec (`inheritable`).
#[derive(serde::Serialize, serde::Deserialize)]
struct MsgImage {
    code: u32,
    flags: u32,
    body: Vec<u8>,
    fds: Vec<RawFd>,
}

/// Lets `fd` survive the supervisor's exec of itself.
pub fn inheritable(fd: RawFd) -> RawFd {
    // SAFETY: plain fcntl on an fd the caller holds.
    unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    fd
}

/// Takes over an fd that came across the exec, closed on the next one.
///
/// # Safety
/// `fd` must be open and owned by nothing else in this process.
pub unsafe fn adopt(fd: RawFd) -> OwnedFd {
    // SAFETY: the caller vouches that `fd` is open and ours alone; the fcntl only sets
    // its close-on-exec flag.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        OwnedFd::from_raw_fd(fd)
    }
}

impl serde::Serialize for Msg {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        MsgImage {
            code: self.code,
            flags: self.flags,
            body: self.body.clone(),
            fds: self
                .fds
                .iter()
                .map(|f| inheritable(f.as_raw_fd()))
                .collect(),
        }
        .serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Msg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let i = MsgImage::deserialize(d)?;
        Ok(Msg {
            code: i.code,
            flags: i.flags,
            body: i.body,
            // SAFETY: the state comes from this supervisor's image of itself before its
            // exec, which kept these fds open for it and holds them nowhere else.
            fds: i.fds.into_iter().map(|f| unsafe { adopt(f) }).collect(),
        })
    }
}

impl Msg {
    /// A request of the supervisor's own, with no ack asked for.
    pub fn request(code: u32, body: Vec<u8>, fds: Vec<OwnedFd>) -> Msg {
        Msg {
            code,
            flags: VERSION,
            body,
            fds,
        }
    }

    pub fn is_reply(&self) -> bool {
        self.flags & REPLY != 0
    }

    /// Whether the serving process answers this request, as vhost-user-backend does:
    /// every GET, the device-state pair and SET_LOG_BASE always; the others only when
    /// the frontend asked for an ack and REPLY_ACK was negotiated.
    pub fn expects_reply(&self, reply_ack: bool) -> bool {
        use code::*;
        match self.code {
            GET_FEATURES
            | GET_PROTOCOL_FEATURES
            | GET_QUEUE_NUM
            | GET_VRING_BASE
            | GET_CONFIG
            | GET_INFLIGHT_FD
            | GET_MAX_MEM_SLOTS
            | SET_DEVICE_STATE_FD
            | CHECK_DEVICE_STATE
            | SET_LOG_BASE => true,
            _ => reply_ack && self.flags & NEED_REPLY != 0,
        }
    }

    /// The body's `n`th little-endian u64 (bodies of fixed layout: feature words, vring
    /// addresses, memory regions).
    pub fn u64_at(&self, n: usize) -> Option<u64> {
        let b = self.body.get(n * 8..n * 8 + 8)?;
        Some(u64::from_le_bytes(b.try_into().unwrap()))
    }

    pub fn u32_at(&self, n: usize) -> Option<u32> {
        let b = self.body.get(n * 4..n * 4 + 4)?;
        Some(u32::from_le_bytes(b.try_into().unwrap()))
    }

    /// A copy holding its own duplicates of the fds.
    pub fn try_clone(&self) -> io::Result<Msg> {
        Ok(Msg {
            code: self.code,
            flags: self.flags,
            body: self.body.clone(),
            fds: self
                .fds
                .iter()
                .map(|f| f.try_clone())
                .collect::<io::Result<_>>()?,
        })
    }
}

/// Reads one message. `None`: the peer closed the connection between messages.
pub fn recv(s: &UnixStream) -> io::Result<Option<Msg>> {
    let mut hdr = [0u8; HDR_LEN];
    let mut raw = [-1 as RawFd; MAX_FDS];
    let mut iov = [libc::iovec {
        iov_base: hdr.as_mut_ptr().cast(),
        iov_len: HDR_LEN,
    }];
    // SAFETY: `iov` points at `hdr`, which outlives the call; `raw` has room for MAX_FDS.
    let (n, nfds) = unsafe { s.recv_with_fds(&mut iov, &mut raw) }.map_err(io::Error::other)?;
    // SAFETY: recvmsg installed these `nfds` fds for us; nothing else owns them.
    let fds = unsafe { crate::sys::adopt_received(&raw[..nfds]) };
    if n == 0 {
        return Ok(None);
    }
    let mut s_read = s;
    // The socket's read timeout ends a wait for the rest of a message.
    let cut = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            io::Error::new(io::ErrorKind::TimedOut, "a message stopped half-way")
        }
        _ => e,
    };
    if n < HDR_LEN {
        s_read.read_exact(&mut hdr[n..]).map_err(cut)?;
    }
    let word = |i: usize| u32::from_le_bytes(hdr[i * 4..i * 4 + 4].try_into().unwrap());
    let (code, flags, size) = (word(0), word(1), word(2) as usize);
    if size > MAX_BODY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a vhost-user message of {size} bytes (at most {MAX_BODY})"),
        ));
    }
    let mut body = vec![0u8; size];
    s_read.read_exact(&mut body).map_err(cut)?;
    Ok(Some(Msg {
        code,
        flags,
        body,
        fds,
    }))
}

pub fn send(s: &UnixStream, m: &Msg) -> io::Result<()> {
    let mut buf = Vec::with_capacity(HDR_LEN + m.body.len());
    buf.extend_from_slice(&m.code.to_le_bytes());
    buf.extend_from_slice(&m.flags.to_le_bytes());
    buf.extend_from_slice(&(m.body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&m.body);
    let raw: Vec<RawFd> = m.fds.iter().map(|f| f.as_raw_fd()).collect();
    let n = loop {
        match s.send_with_fds(&[&buf[..]], &raw) {
            Ok(n) => break n,
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) => return Err(io::Error::other(e)),
        }
    };
    // The fds went with the first bytes; a stream socket may take the rest later.
    let mut w = s;
    w.write_all(&buf[n..])
}

/// A request's vring index (the first u32 of SET_VRING_NUM, _ADDR, _BASE, _ENABLE and
/// GET_VRING_BASE; the low byte of the u64 of SET_VRING_KICK, _CALL, _ERR).
pub fn vring_index(m: &Msg) -> Option<usize> {
    use code::*;
    match m.code {
        SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR => m.u64_at(0).map(|v| (v & 0xff) as usize),
        _ => m.u32_at(0).map(|v| v as usize),
    }
}

/// The VhostUserVringState body {index, num}.
pub fn vring_state(index: u32, num: u32) -> Vec<u8> {
    let mut b = index.to_le_bytes().to_vec();
    b.extend_from_slice(&num.to_le_bytes());
    b
}
