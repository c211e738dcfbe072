//! SETXATTR in its extended form (FUSE_SETXATTR_EXT, negotiated with `--posix-acl`):
//! `fuse_setxattr_in` grows by `setxattr_flags` and padding, which fuse-backend-rs 0.14
//! doesn't know, so vfsd decodes it and calls the filesystem.

use std::ffi::CStr;
use std::io;

use fuse_backend_rs::abi::fuse_abi::InHeader;
use fuse_backend_rs::api::filesystem::{Context, FileSystem};
use vm_memory::ByteValued;

use super::request::{decode, HDR_LEN};
use crate::passthrough::PassthroughFs;

/// The guest found the caller entitled to neither the file's group nor CAP_FSETID: an
/// ACL change must clear S_ISGID, as the host kernel would for such a caller.
const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;

/// `fuse_setxattr_in` with FUSE_SETXATTR_EXT.
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

/// Serves one extended SETXATTR whose arguments (after the header) are `args`.
pub fn setxattr_ext(fs: &PassthroughFs, hdr: &InHeader, args: &[u8]) -> io::Result<()> {
    let inval = || io::Error::from_raw_os_error(libc::EINVAL);
    // Only what the header claims belongs to the request.
    let body_len = (hdr.len as usize).checked_sub(HDR_LEN).ok_or_else(inval)?;
    let args = args.get(..body_len).ok_or_else(inval)?;
    let a: SetxattrInExt = decode(args).ok_or_else(inval)?;
    let rest = &args[std::mem::size_of::<SetxattrInExt>()..];
    let name = CStr::from_bytes_until_nul(rest).map_err(|_| inval())?;
    let value = &rest[name.to_bytes_with_nul().len()..];
    if value.len() != a.size as usize {
        return Err(inval());
    }
    fs.setxattr(&Context::from(hdr), hdr.nodeid, name, value, a.flags)?;
    if a.setxattr_flags & SETXATTR_ACL_KILL_SGID != 0 {
        fs.acl_kill_sgid(hdr.nodeid)?;
    }
    Ok(())
}
