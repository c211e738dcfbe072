//! Extended attributes: SETXATTR (in its extended form too, FUSE_SETXATTR_EXT, negotiated
//! with `--posix-acl`), GETXATTR, LISTXATTR and REMOVEXATTR.

use std::io;

use fuse_backend_rs::abi::fuse_abi::{GetxattrIn, GetxattrOut, SetxattrIn};
use fuse_backend_rs::api::filesystem::{GetxattrReply, ListxattrReply};
use vm_memory::ByteValued;

use super::wire::codec::{args, inval, name, name_and_rest, split};
use super::wire::request::HDR_LEN;
use super::{Call, FuseServer, Reply};
use crate::filesystem::FileSystem;

/// The guest found the caller entitled to neither the file's group nor CAP_FSETID: an
/// ACL change must clear S_ISGID, as the host kernel would for such a caller.
const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;

/// `fuse_setxattr_in` with FUSE_SETXATTR_EXT: grown by `setxattr_flags` and padding,
/// which fuse-backend-rs 0.14 doesn't know.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SetxattrInExt {
    size: u32,
    flags: u32,
    setxattr_flags: u32,
    padding: u32,
}
// SAFETY: plain integers, no padding.
unsafe impl ByteValued for SetxattrInExt {}

fn xattr_count(size: u32) -> Vec<u8> {
    GetxattrOut { size, padding: 0 }.as_slice().to_vec()
}

impl<F: FileSystem> FuseServer<F> {
    pub(super) fn setxattr(&self, c: &Call) -> Reply {
        if self.fs.enabled(crate::abi::flags::SETXATTR_EXT) {
            return Reply::Payload(self.setxattr_ext(c).map(|()| Vec::new()));
        }
        c.reply(|b| {
            let (a, rest): (SetxattrIn, _) = split(b)?;
            let (n, value) = name_and_rest(rest)?;
            if a.size as usize != value.len() {
                return Err(inval());
            }
            self.fs.setxattr(&c.ctx, c.hdr.nodeid, n, value, a.flags)?;
            Ok(Vec::new())
        })
    }

    /// One extended SETXATTR.
    fn setxattr_ext(&self, c: &Call) -> io::Result<()> {
        // Only what the header claims belongs to the request.
        let body_len = (c.hdr.len as usize)
            .checked_sub(HDR_LEN)
            .ok_or_else(inval)?;
        let body = c.args.get(..body_len).ok_or_else(inval)?;
        let (a, rest): (SetxattrInExt, _) = split(body)?;
        let (n, value) = name_and_rest(rest)?;
        if value.len() != a.size as usize {
            return Err(inval());
        }
        self.fs.setxattr(&c.ctx, c.hdr.nodeid, n, value, a.flags)?;
        if a.setxattr_flags & SETXATTR_ACL_KILL_SGID != 0 {
            self.fs.acl_kill_sgid(c.hdr.nodeid)?;
        }
        Ok(())
    }

    pub(super) fn getxattr(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let (a, n): (GetxattrIn, _) = split(b)?;
            Ok(
                match self.fs.getxattr(&c.ctx, c.hdr.nodeid, name(n)?, a.size)? {
                    GetxattrReply::Value(v) => v,
                    GetxattrReply::Count(n) => xattr_count(n),
                },
            )
        })
    }

    pub(super) fn listxattr(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: GetxattrIn = args(b)?;
            Ok(match self.fs.listxattr(&c.ctx, c.hdr.nodeid, a.size)? {
                ListxattrReply::Names(v) => v,
                ListxattrReply::Count(n) => xattr_count(n),
            })
        })
    }

    pub(super) fn removexattr(&self, c: &Call) -> Reply {
        c.reply(|b| {
            self.fs.removexattr(&c.ctx, c.hdr.nodeid, name(b)?)?;
            Ok(Vec::new())
        })
    }
}
