//! The create opcodes (CREATE, MKDIR, MKNOD, SYMLINK), decoded by vfsd so that what their
//! requests carry beside the arguments (a security context, the caller's supplementary
//! group: `ext`) reaches the filesystem as a parameter. TMPFILE is in `newer`. IOCTL is
//! here too: its reply data is made per request.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{
    CreateIn, EntryOut, InHeader, IoctlIn, IoctlOut, MkdirIn, MknodIn, OpenOut,
};
use fuse_backend_rs::api::filesystem::{Context, Entry, OpenOptions};
use vm_memory::ByteValued;

use super::request::decode;
use crate::passthrough::{CreateExt, PassthroughFs};

pub(super) fn inval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// A NUL-terminated name at the start of `b`, and what follows it.
fn name(b: &[u8]) -> io::Result<(&CStr, &[u8])> {
    let n = CStr::from_bytes_until_nul(b).map_err(|_| inval())?;
    Ok((n, &b[n.to_bytes_with_nul().len()..]))
}

/// The arguments `T` and the name after them.
fn args_and_name<T: ByteValued + Default>(args: &[u8]) -> io::Result<(T, &CStr)> {
    let a: T = decode(args).ok_or_else(inval)?;
    let (n, _) = name(&args[size_of::<T>()..])?;
    Ok((a, n))
}

fn entry_reply(e: Entry) -> Vec<u8> {
    EntryOut::from(e).as_slice().to_vec()
}

pub fn create(
    fs: &PassthroughFs,
    hdr: &InHeader,
    args: &[u8],
    ext: &CreateExt,
) -> io::Result<Vec<u8>> {
    let (a, n) = args_and_name::<CreateIn>(args)?;
    let (entry, fh, opts) = fs.create(&Context::from(hdr), hdr.nodeid, n, a, ext)?;
    Ok(created_reply(entry, fh, opts))
}

/// CREATE's (and TMPFILE's) reply: the new node's entry and the open handle.
pub(super) fn created_reply(entry: Entry, fh: u64, opts: OpenOptions) -> Vec<u8> {
    let mut out = entry_reply(entry);
    let open = OpenOut {
        fh,
        open_flags: opts.bits(),
        passthrough: 0,
    };
    out.extend_from_slice(open.as_slice());
    out
}

pub fn mkdir(
    fs: &PassthroughFs,
    hdr: &InHeader,
    args: &[u8],
    ext: &CreateExt,
) -> io::Result<Vec<u8>> {
    let (a, n) = args_and_name::<MkdirIn>(args)?;
    let e = fs.mkdir(&Context::from(hdr), hdr.nodeid, n, a.mode, a.umask, ext)?;
    Ok(entry_reply(e))
}

pub fn mknod(
    fs: &PassthroughFs,
    hdr: &InHeader,
    args: &[u8],
    ext: &CreateExt,
) -> io::Result<Vec<u8>> {
    let (a, n) = args_and_name::<MknodIn>(args)?;
    let e = fs.mknod(
        &Context::from(hdr),
        hdr.nodeid,
        n,
        a.mode,
        a.rdev,
        a.umask,
        ext,
    )?;
    Ok(entry_reply(e))
}

/// SYMLINK: the new name, then the link's target, each NUL-terminated.
pub fn symlink(
    fs: &PassthroughFs,
    hdr: &InHeader,
    args: &[u8],
    ext: &CreateExt,
) -> io::Result<Vec<u8>> {
    let (n, rest) = name(args)?;
    let (target, _) = name(rest)?;
    let e = fs.symlink(&Context::from(hdr), target, hdr.nodeid, n, ext)?;
    Ok(entry_reply(e))
}

/// IOCTL: `IoctlIn`, then `in_size` bytes of input; the reply is `IoctlOut` and the out
/// data. Input shorter than `in_size` says is ENOTTY, as the crate answered it.
pub fn ioctl(fs: &PassthroughFs, hdr: &InHeader, args: &[u8]) -> io::Result<Vec<u8>> {
    let a: IoctlIn = decode(args).ok_or_else(inval)?;
    let input = &args[size_of::<IoctlIn>()..];
    let n = a.in_size as usize;
    if n > input.len() {
        return Err(io::Error::from_raw_os_error(libc::ENOTTY));
    }
    let data = (n > 0).then(|| &input[..n]);
    let (result, out) = fs.ioctl(
        &Context::from(hdr),
        hdr.nodeid,
        a.fh,
        a.cmd,
        data,
        a.out_size,
    )?;
    let mut reply = IoctlOut {
        result,
        ..Default::default()
    }
    .as_slice()
    .to_vec();
    reply.extend_from_slice(&out);
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_nul_terminated() {
        assert_eq!(name(b"a\0b\0").unwrap().0.to_bytes(), b"a");
        assert_eq!(name(b"a\0b\0").unwrap().1, b"b\0");
        assert!(name(b"no terminator").is_err());
        assert!(
            args_and_name::<MkdirIn>(&[0u8; 4]).is_err(),
            "short arguments"
        );
    }
}
