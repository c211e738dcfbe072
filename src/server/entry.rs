//! Names and attributes: LOOKUP, FORGET, GETATTR, SETATTR, STATX, the creates (with the
//! request's extensions, `Call::ext`: a security context, the caller's supplementary
//! group), UNLINK, RMDIR, RENAME, LINK, STATFS and ACCESS.

use std::ffi::CStr;
use std::mem::size_of;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{
    AccessIn, AttrOut, BatchForgetIn, CreateIn, EntryOut, ForgetIn, ForgetOne, GetattrIn, Kstatfs,
    LinkIn, MkdirIn, MknodIn, Rename2In, RenameIn, SetattrIn, SetattrValid, FATTR_FH, GETATTR_FH,
};
use fuse_backend_rs::api::filesystem::{Entry, OpenOptions};
use vm_memory::ByteValued;

use super::wire::codec::{
    args, args_and_name, decode, inval, name, name_and_rest, split, two_names,
};
use super::wire::reply::opened;
use super::{Call, FuseServer, Reply};
use crate::filesystem::FileSystem;

fn none() -> Vec<u8> {
    Vec::new()
}

fn entry(e: Entry) -> Vec<u8> {
    EntryOut::from(e).as_slice().to_vec()
}

/// A LOOKUP's "no such name" that the guest may cache for `timeout` (node id 0; a bare
/// ENOENT is never cached, so every lookup of a missing name would come back).
fn negative_entry(timeout: Duration) -> Vec<u8> {
    EntryOut {
        entry_valid: timeout.as_secs(),
        entry_valid_nsec: timeout.subsec_nanos(),
        ..Default::default()
    }
    .as_slice()
    .to_vec()
}

fn attr((st, timeout): (libc::stat64, Duration)) -> Vec<u8> {
    AttrOut {
        attr_valid: timeout.as_secs(),
        attr_valid_nsec: timeout.subsec_nanos(),
        dummy: 0,
        attr: st.into(),
    }
    .as_slice()
    .to_vec()
}

/// CREATE's (and TMPFILE's) reply: the new node's entry and the open handle.
fn created((entry, fh, opts): (Entry, u64, OpenOptions)) -> Vec<u8> {
    let mut out = EntryOut::from(entry).as_slice().to_vec();
    out.extend_from_slice(&opened(fh, opts));
    out
}

/// `fuse_statx_in`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct StatxIn {
    getattr_flags: u32,
    reserved: u32,
    fh: u64,
    sx_flags: u32,
    sx_mask: u32,
}
// SAFETY: plain integers, no padding.
unsafe impl ByteValued for StatxIn {}

/// `fuse_sx_time`.
fn put_time(out: &mut Vec<u8>, t: libc::statx_timestamp) {
    out.extend_from_slice(&t.tv_sec.to_ne_bytes());
    out.extend_from_slice(&t.tv_nsec.to_ne_bytes());
    out.extend_from_slice(&0i32.to_ne_bytes());
}

/// STATX's reply: `fuse_statx_out` (valid time, flags, spare) then the 256-byte
/// `fuse_statx`.
fn statx_out((s, valid): (libc::statx, Duration)) -> Vec<u8> {
    let mut out = Vec::with_capacity(288);
    out.extend_from_slice(&valid.as_secs().to_ne_bytes());
    out.extend_from_slice(&valid.subsec_nanos().to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // flags
    out.extend_from_slice(&[0u8; 16]); // spare
    let start = out.len();
    out.extend_from_slice(&s.stx_mask.to_ne_bytes());
    out.extend_from_slice(&s.stx_blksize.to_ne_bytes());
    out.extend_from_slice(&s.stx_attributes.to_ne_bytes());
    out.extend_from_slice(&s.stx_nlink.to_ne_bytes());
    out.extend_from_slice(&s.stx_uid.to_ne_bytes());
    out.extend_from_slice(&s.stx_gid.to_ne_bytes());
    out.extend_from_slice(&s.stx_mode.to_ne_bytes());
    out.extend_from_slice(&0u16.to_ne_bytes());
    out.extend_from_slice(&s.stx_ino.to_ne_bytes());
    out.extend_from_slice(&s.stx_size.to_ne_bytes());
    out.extend_from_slice(&s.stx_blocks.to_ne_bytes());
    out.extend_from_slice(&s.stx_attributes_mask.to_ne_bytes());
    put_time(&mut out, s.stx_atime);
    put_time(&mut out, s.stx_btime);
    put_time(&mut out, s.stx_ctime);
    put_time(&mut out, s.stx_mtime);
    out.extend_from_slice(&s.stx_rdev_major.to_ne_bytes());
    out.extend_from_slice(&s.stx_rdev_minor.to_ne_bytes());
    out.extend_from_slice(&s.stx_dev_major.to_ne_bytes());
    out.extend_from_slice(&s.stx_dev_minor.to_ne_bytes());
    out.resize(start + 256, 0);
    out
}

impl<F: FileSystem> FuseServer<F> {
    pub(super) fn lookup(&self, c: &Call) -> Reply {
        c.reply(|b| {
            Ok(match self.fs.lookup(&c.ctx, c.hdr.nodeid, name(b)?) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    match self.fs.negative_timeout() {
                        t if t.is_zero() => return Err(e),
                        t => negative_entry(t),
                    }
                }
                r => entry(r?),
            })
        })
    }

    pub(super) fn forget(&self, c: &Call) -> Reply {
        c.no_reply("FORGET", |b| {
            if let Some(a) = decode::<ForgetIn>(b) {
                self.fs.forget(&c.ctx, c.hdr.nodeid, a.nlookup);
            }
        })
    }

    pub(super) fn batch_forget(&self, c: &Call) -> Reply {
        c.no_reply("BATCH_FORGET", |b| {
            if let Ok((a, items)) = split::<BatchForgetIn>(b) {
                // Only as many as the body holds: a count past it is a malformed request.
                let n = a.count as usize;
                if items.len() / size_of::<ForgetOne>() >= n {
                    let forgets = items
                        .chunks_exact(size_of::<ForgetOne>())
                        .take(n)
                        .filter_map(decode::<ForgetOne>)
                        .map(|f| (f.nodeid, f.nlookup))
                        .collect();
                    self.fs.batch_forget(&c.ctx, forgets);
                }
            }
        })
    }

    pub(super) fn getattr(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: GetattrIn = args(b)?;
            let fh = (a.flags & GETATTR_FH != 0).then_some(a.fh);
            Ok(attr(self.fs.getattr(&c.ctx, c.hdr.nodeid, fh)?))
        })
    }

    pub(super) fn setattr(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: SetattrIn = args(b)?;
            let fh = (a.valid & FATTR_FH != 0).then_some(a.fh);
            let valid = SetattrValid::from_bits_truncate(a.valid);
            Ok(attr(self.fs.setattr(
                &c.ctx,
                c.hdr.nodeid,
                a.into(),
                fh,
                valid,
            )?))
        })
    }

    /// STATX (7.39; the guest sends it for fields beyond the basic stats, such as the
    /// birth time).
    pub(super) fn statx(&self, c: &Call) -> Reply {
        /// FUSE_GETATTR_FH: `fh` names an open handle.
        const GETATTR_FH: u32 = 1;
        let r = args::<StatxIn>(c.args).and_then(|a| {
            let fh = (a.getattr_flags & GETATTR_FH != 0).then_some(a.fh);
            let s = self
                .fs
                .statx(c.hdr.nodeid, fh, a.sx_flags as i32, a.sx_mask)?;
            Ok(statx_out(s))
        });
        Reply::Payload(r)
    }

    pub(super) fn readlink(&self, c: &Call) -> Reply {
        c.reply(|_| self.fs.readlink(&c.ctx, c.hdr.nodeid))
    }

    /// SYMLINK: the new name, then the link's target, each NUL-terminated.
    pub(super) fn symlink(&self, c: &Call) -> Reply {
        let r = name_and_rest(c.args).and_then(|(n, rest)| {
            let (target, _) = name_and_rest(rest)?;
            let e = self.fs.symlink(&c.ctx, target, c.hdr.nodeid, n, &c.ext)?;
            Ok(entry(e))
        });
        Reply::Payload(r)
    }

    pub(super) fn mknod(&self, c: &Call) -> Reply {
        let r = args_and_name::<MknodIn>(c.args).and_then(|(a, n)| {
            let (node, ext) = (c.hdr.nodeid, &c.ext);
            let e = self
                .fs
                .mknod(&c.ctx, node, n, a.mode, a.rdev, a.umask, ext)?;
            Ok(entry(e))
        });
        Reply::Payload(r)
    }

    pub(super) fn mkdir(&self, c: &Call) -> Reply {
        let r = args_and_name::<MkdirIn>(c.args).and_then(|(a, n)| {
            let e = self
                .fs
                .mkdir(&c.ctx, c.hdr.nodeid, n, a.mode, a.umask, &c.ext)?;
            Ok(entry(e))
        });
        Reply::Payload(r)
    }

    pub(super) fn create(&self, c: &Call) -> Reply {
        let r = args_and_name::<CreateIn>(c.args)
            .and_then(|(a, n)| self.fs.create(&c.ctx, c.hdr.nodeid, n, a, &c.ext))
            .map(created);
        Reply::Payload(r)
    }

    /// TMPFILE (the Linux guest sends it for O_TMPFILE whatever minor was negotiated):
    /// CREATE's arguments (the name is the kernel's placeholder and unused) and CREATE's
    /// reply.
    pub(super) fn tmpfile(&self, c: &Call) -> Reply {
        let r = split::<CreateIn>(c.args).and_then(|(a, n)| {
            CStr::from_bytes_until_nul(n).map_err(|_| inval())?;
            let (node, ext) = (c.hdr.nodeid, &c.ext);
            self.fs
                .tmpfile(&c.ctx, node, a.flags, a.mode, a.umask, ext)
                .map(created)
        });
        Reply::Payload(r)
    }

    pub(super) fn unlink(&self, c: &Call) -> Reply {
        c.reply(|b| {
            self.fs.unlink(&c.ctx, c.hdr.nodeid, name(b)?)?;
            Ok(none())
        })
    }

    pub(super) fn rmdir(&self, c: &Call) -> Reply {
        c.reply(|b| {
            self.fs.rmdir(&c.ctx, c.hdr.nodeid, name(b)?)?;
            Ok(none())
        })
    }

    pub(super) fn rename(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let (a, names): (RenameIn, _) = split(b)?;
            let (old, new) = two_names(names)?;
            self.fs
                .rename(&c.ctx, c.hdr.nodeid, old, a.newdir, new, 0)?;
            Ok(none())
        })
    }

    pub(super) fn rename2(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let (a, names): (Rename2In, _) = split(b)?;
            let (old, new) = two_names(names)?;
            let flags =
                a.flags & (libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE | libc::RENAME_WHITEOUT);
            self.fs
                .rename(&c.ctx, c.hdr.nodeid, old, a.newdir, new, flags)?;
            Ok(none())
        })
    }

    pub(super) fn link(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let (a, n): (LinkIn, _) = split(b)?;
            let e = self.fs.link(&c.ctx, a.oldnodeid, c.hdr.nodeid, name(n)?)?;
            Ok(entry(e))
        })
    }

    pub(super) fn statfs(&self, c: &Call) -> Reply {
        c.reply(|_| {
            let st = self.fs.statfs(&c.ctx, c.hdr.nodeid)?;
            Ok(Kstatfs::from(st).as_slice().to_vec())
        })
    }

    pub(super) fn access(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: AccessIn = args(b)?;
            self.fs.access(&c.ctx, c.hdr.nodeid, a.mask)?;
            Ok(none())
        })
    }
}
