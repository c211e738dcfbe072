//! FUSE_IOCTL: the file attribute ioctls behind `chattr`/`lsattr` and xfs_io's
//! `chattr`/`lsproj`/`chproj`, applied to the host file. Nothing else is served (ENOTTY).
//!
//! The guest kernel sends these from `fuse_fileattr_get`/`fuse_fileattr_set`: it opens the
//! file or directory read-only (FUSE_OPEN/OPENDIR), sends the ioctl on that handle with the
//! flags as a 4-byte int (whatever the command's `long` says) or a 28-byte `struct
//! fsxattr`, and releases the handle.
//!
//! Changes run with the caller's fsuid/fsgid: the host kernel then refuses a non-owner
//! (EPERM) and, since setfsuid to a non-root id drops CAP_LINUX_IMMUTABLE, a non-root
//! caller touching the immutable or append-only flag (EPERM), exactly as a local ext4
//! does. A root caller gets the daemon's capabilities: vfsd's default set keeps
//! CAP_LINUX_IMMUTABLE (virtiofsd's lacks it), so guest root's +i/+a work as on a local
//! filesystem; `--modcaps=-linux_immutable` takes that away.
//!
//! A file's project id and project inheritance are the host's: they decide which project
//! quota a file counts against, and hosts cap a VM's share that way. Changing them is
//! refused (EINVAL) unless `--allow-project-id` is given.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use fuse_backend_rs::api::filesystem::Context;

use super::PassthroughFs;
use crate::sys::{self, errno};

// The commands as the guest encodes them (asm-generic `_IOR`/`_IOW`, as on x86-64 and
// aarch64). A 64-bit guest says `long` in the flags commands and a 32-bit one `int`; the
// argument is an int either way.
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
pub const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
pub const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
pub const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;

/// The requests vfsd itself makes on the host (the seccomp filter allows exactly these).
pub const HOST_REQUESTS: [u32; 4] = [
    FS_IOC_GETFLAGS,
    FS_IOC_SETFLAGS,
    FS_IOC_FSGETXATTR,
    FS_IOC_FSSETXATTR,
];

/// Size of the flags argument (an int) and of `struct fsxattr`.
const FLAGS_SIZE: usize = 4;
const FSXATTR_SIZE: usize = 28;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmd {
    GetFlags,
    SetFlags,
    GetXattr,
    SetXattr,
}

impl Cmd {
    fn parse(cmd: u32) -> Option<Cmd> {
        Some(match cmd {
            FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => Cmd::GetFlags,
            FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => Cmd::SetFlags,
            FS_IOC_FSGETXATTR => Cmd::GetXattr,
            FS_IOC_FSSETXATTR => Cmd::SetXattr,
            _ => return None,
        })
    }

    fn host_request(self) -> u32 {
        match self {
            Cmd::GetFlags => FS_IOC_GETFLAGS,
            Cmd::SetFlags => FS_IOC_SETFLAGS,
            Cmd::GetXattr => FS_IOC_FSGETXATTR,
            Cmd::SetXattr => FS_IOC_FSSETXATTR,
        }
    }

    fn size(self) -> usize {
        match self {
            Cmd::GetFlags | Cmd::SetFlags => FLAGS_SIZE,
            Cmd::GetXattr | Cmd::SetXattr => FSXATTR_SIZE,
        }
    }

    fn is_set(self) -> bool {
        matches!(self, Cmd::SetFlags | Cmd::SetXattr)
    }
}

/// The argument of every served request: large enough for the largest (`struct fsxattr`),
/// and int-aligned.
type Arg = [u32; FSXATTR_SIZE / 4];

fn arg_bytes(arg: &Arg) -> [u8; FSXATTR_SIZE] {
    let mut b = [0u8; FSXATTR_SIZE];
    for (chunk, v) in b.chunks_exact_mut(4).zip(arg) {
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
    b
}

fn arg_from(bytes: &[u8]) -> Arg {
    let mut arg: Arg = [0; FSXATTR_SIZE / 4];
    for (v, chunk) in arg.iter_mut().zip(bytes.chunks(4)) {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        *v = u32::from_ne_bytes(w);
    }
    arg
}

/// Runs a served request on a host fd (never O_PATH: the fd comes from an open or reopen).
fn host_ioctl(fd: &impl AsRawFd, cmd: Cmd, arg: &mut Arg) -> io::Result<()> {
    // SAFETY: each served request reads or writes at most FSXATTR_SIZE bytes at its
    // argument (an int for the flags, a struct fsxattr), and `arg` is that large, aligned
    // and live for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), cmd.host_request() as _, arg.as_mut_ptr()) };
    sys::cvt(r).map(drop)
}

/// Open flags for a node reopened for an ioctl: O_NONBLOCK so that a lease held on the host
/// can't stall the worker.
const REOPEN_FLAGS: i32 = libc::O_RDONLY | libc::O_NONBLOCK;

enum Target {
    Handle(std::sync::Arc<super::handle::Handle>),
    Reopened(OwnedFd),
}

impl AsRawFd for Target {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Target::Handle(h) => h.fd.as_raw_fd(),
            Target::Reopened(fd) => fd.as_raw_fd(),
        }
    }
}

/// FS_PROJINHERIT_FL in the flags, and FS_XFLAG_PROJINHERIT in `fsx_xflags`.
const PROJINHERIT_FL: u32 = 0x2000_0000;
const XFLAG_PROJINHERIT: u32 = 0x200;
/// `fsx_projid`'s place in `struct fsxattr` (xflags, extsize, nextents, projid, ...).
const FSX_PROJID: usize = 3;

impl PassthroughFs {
    /// Without `--allow-project-id`, a set request must leave the file's project id and
    /// project inheritance as they are: EINVAL, as the host kernel answers the same change
    /// made from a user namespace (a project id is a host-side quota boundary).
    fn check_project_kept(&self, fd: &Target, cmd: Cmd, arg: &Arg) -> io::Result<()> {
        let (get, inherit, changed) = match cmd {
            Cmd::SetFlags => (Cmd::GetFlags, PROJINHERIT_FL, None),
            Cmd::SetXattr => (Cmd::GetXattr, XFLAG_PROJINHERIT, Some(FSX_PROJID)),
            _ => return Ok(()),
        };
        let mut now: Arg = [0; FSXATTR_SIZE / 4];
        host_ioctl(fd, get, &mut now)?;
        if (now[0] ^ arg[0]) & inherit != 0 || changed.is_some_and(|i| now[i] != arg[i]) {
            return Err(errno(libc::EINVAL));
        }
        Ok(())
    }

    /// FUSE_IOCTL (vfsd's server decodes it): the result and the out data. `data` is the
    /// request's input (`in_size` bytes, None when 0).
    pub fn ioctl(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        cmd: u32,
        data: Option<&[u8]>,
        out_size: u32,
    ) -> io::Result<(i32, Vec<u8>)> {
        let cmd = Cmd::parse(cmd).ok_or_else(|| errno(libc::ENOTTY))?;
        let input = data.unwrap_or(&[]);
        let (want_in, want_out) = if cmd.is_set() {
            (cmd.size(), 0)
        } else {
            (0, cmd.size())
        };
        if input.len() != want_in || out_size as usize != want_out {
            return Err(errno(libc::EINVAL));
        }
        if cmd.is_set() {
            self.check_writable()?;
        }
        let i = self.inode(inode)?;
        if !i.is_reg() && !i.is_dir() {
            // Never opened: a FIFO could block, a device reach hardware.
            return Err(errno(libc::ENOTTY));
        }
        // 0 is no handle (vfsd's start at 1): the node is reopened, as by the guest's open.
        let fd = if handle != 0 {
            Target::Handle(self.handle(handle, inode)?)
        } else {
            Target::Reopened(self.reopen(&i, REOPEN_FLAGS)?)
        };
        let mut arg = arg_from(input);
        if cmd.is_set() {
            if !self.cfg.allow_project_id {
                self.check_project_kept(&fd, cmd, &arg)?;
            }
            // With FUSE_ALLOW_IDMAP the guest names no caller here (its kernel checked the
            // owner and CAP_LINUX_IMMUTABLE): act as the most it could be, the guest's root
            // through the id translation. Without the flag, u32::MAX is an id like any
            // other, which no thread can take (EPERM).
            let unnamed = ctx.uid == crate::abi::FUSE_INVALID_UIDGID
                && self.enabled(crate::abi::flags::ALLOW_IDMAP);
            let root = Context {
                uid: 0,
                gid: 0,
                pid: ctx.pid,
            };
            let _cred = self.creator(if unnamed { &root } else { ctx }, &[])?;
            host_ioctl(&fd, cmd, &mut arg)?;
            return Ok((0, Vec::new()));
        }
        host_ioctl(&fd, cmd, &mut arg)?;
        Ok((0, arg_bytes(&arg)[..cmd.size()].to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_match_the_kernel_encoding() {
        // _IOC(dir, type, nr, size): dir << 30 | size << 16 | type << 8 | nr.
        let ioc =
            |dir: u32, ty: u8, nr: u32, size: u32| dir << 30 | size << 16 | (ty as u32) << 8 | nr;
        assert_eq!(FS_IOC_GETFLAGS, ioc(2, b'f', 1, 8));
        assert_eq!(FS_IOC_SETFLAGS, ioc(1, b'f', 2, 8));
        assert_eq!(FS_IOC32_GETFLAGS, ioc(2, b'f', 1, 4));
        assert_eq!(FS_IOC32_SETFLAGS, ioc(1, b'f', 2, 4));
        assert_eq!(FS_IOC_FSGETXATTR, ioc(2, b'X', 31, FSXATTR_SIZE as u32));
        assert_eq!(FS_IOC_FSSETXATTR, ioc(1, b'X', 32, FSXATTR_SIZE as u32));
        #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
        {
            assert_eq!(FS_IOC_GETFLAGS, libc::FS_IOC_GETFLAGS as u32);
            assert_eq!(FS_IOC_SETFLAGS, libc::FS_IOC_SETFLAGS as u32);
        }
        assert_eq!(Cmd::parse(FS_IOC32_GETFLAGS), Some(Cmd::GetFlags));
        assert_eq!(Cmd::parse(libc::FIONBIO as u32), None);
    }

    #[test]
    fn arg_round_trips_and_short_input_is_zero_padded() {
        let b: Vec<u8> = (1..=28).collect();
        assert_eq!(arg_bytes(&arg_from(&b)).to_vec(), b);
        let a = arg_from(&[1, 2, 3, 4, 5]);
        assert_eq!(a[0], u32::from_ne_bytes([1, 2, 3, 4]));
        assert_eq!(a[1], u32::from_ne_bytes([5, 0, 0, 0]));
        assert!(a[2..].iter().all(|&v| v == 0));
    }

    #[test]
    fn host_ioctl_reads_and_sets_flags_on_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("f")).unwrap();
        let mut arg = [0u32; 7];
        match host_ioctl(&f, Cmd::GetFlags, &mut arg) {
            Ok(()) => {}
            Err(e) => {
                eprintln!("skipped: the host filesystem has no file flags ({e})");
                return;
            }
        }
        let nodump = 0x40; // FS_NODUMP_FL
        arg[0] |= nodump;
        host_ioctl(&f, Cmd::SetFlags, &mut arg).unwrap();
        let mut back = [0u32; 7];
        host_ioctl(&f, Cmd::GetFlags, &mut back).unwrap();
        assert_ne!(back[0] & nodump, 0);
        let mut x = [0u32; 7];
        host_ioctl(&f, Cmd::GetXattr, &mut x).unwrap();
        assert_ne!(x[0] & 0x80, 0, "FS_XFLAG_NODUMP");
    }
}
