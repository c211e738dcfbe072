//! Opcodes newer than fuse-backend-rs 0.14 (FUSE 7.33) that vfsd serves itself:
//! FUSE_TMPFILE (the Linux guest sends it for O_TMPFILE whatever minor was negotiated)
//! and FUSE_STATX (7.39; the guest sends it for fields beyond the basic stats, such as
//! the birth time).

use std::ffi::CStr;
use std::io;

use fuse_backend_rs::abi::fuse_abi::{CreateIn, InHeader};
use fuse_backend_rs::api::filesystem::Context;
use vm_memory::ByteValued;

use super::create::inval;
use super::request::decode;
use crate::passthrough::{CreateExt, PassthroughFs};

/// TMPFILE: CREATE's arguments (the name is the kernel's placeholder and unused) and
/// CREATE's reply. `ext` is the request's extensions (security context, group).
pub fn tmpfile(
    fs: &PassthroughFs,
    hdr: &InHeader,
    args: &[u8],
    ext: CreateExt,
) -> io::Result<Vec<u8>> {
    let a: CreateIn = decode(args).ok_or_else(inval)?;
    let name = &args[std::mem::size_of::<CreateIn>()..];
    CStr::from_bytes_until_nul(name).map_err(|_| inval())?;
    let (entry, fh, opts) = fs.tmpfile(
        &Context::from(hdr),
        hdr.nodeid,
        a.flags,
        a.mode,
        a.umask,
        &ext,
    )?;
    Ok(super::create::created_reply(entry, fh, opts))
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

/// FUSE_GETATTR_FH: `fh` names an open handle.
const GETATTR_FH: u32 = 1;

/// `fuse_sx_time`.
fn put_time(out: &mut Vec<u8>, t: libc::statx_timestamp) {
    out.extend_from_slice(&t.tv_sec.to_ne_bytes());
    out.extend_from_slice(&t.tv_nsec.to_ne_bytes());
    out.extend_from_slice(&0i32.to_ne_bytes());
}

/// STATX: `fuse_statx_out` (valid time, flags, spare) then the 256-byte `fuse_statx`.
pub fn statx(fs: &PassthroughFs, hdr: &InHeader, args: &[u8]) -> io::Result<Vec<u8>> {
    let a: StatxIn = decode(args).ok_or_else(inval)?;
    let fh = (a.getattr_flags & GETATTR_FH != 0).then_some(a.fh);
    let (s, valid) = fs.statx(hdr.nodeid, fh, a.sx_flags as i32, a.sx_mask)?;
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
    Ok(out)
}
