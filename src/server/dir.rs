//! Directories: OPENDIR, READDIR and READDIRPLUS (their entries written straight into
//! the chain), RELEASEDIR and FSYNCDIR.

use std::io::{self, Write};
use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{
    Dirent, EntryOut, FsyncIn, OpenIn, OutHeader, ReadIn, ReleaseIn,
};
use fuse_backend_rs::api::filesystem::{DirEntry, Entry};
use vm_memory::ByteValued;

use super::wire::codec::{args, errno};
use super::wire::reply::{finish, opened, ReplyData};
use super::{Call, FuseServer, Reply};
use crate::filesystem::FileSystem;

/// One directory entry (with its node's entry for READDIRPLUS) into the reply, padded to
/// 8 bytes; 0 when it doesn't fit in `max` (the filesystem stops there).
fn add_dirent(
    w: &mut ReplyData<'_>,
    max: usize,
    d: DirEntry,
    e: Option<Entry>,
) -> io::Result<usize> {
    let overflow = || errno(libc::EOVERFLOW);
    let namelen = u32::try_from(d.name.len()).map_err(|_| overflow())?;
    let len = size_of::<Dirent>() + d.name.len();
    let padded = len.checked_next_multiple_of(8).ok_or_else(overflow)?;
    let total = padded + e.map_or(0, |_| size_of::<EntryOut>());
    if max.saturating_sub(w.bytes_written()) < total {
        return Ok(0);
    }
    if let Some(e) = e {
        w.write_all(EntryOut::from(e).as_slice())?;
    }
    let dirent = Dirent {
        ino: d.ino,
        off: d.offset,
        namelen,
        type_: d.type_,
    };
    w.write_all(dirent.as_slice())?;
    w.write_all(d.name)?;
    w.write_all(&[0u8; 8][..padded - len])?;
    Ok(total)
}

impl<F: FileSystem> FuseServer<F> {
    pub(super) fn opendir(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: OpenIn = args(b)?;
            let (fh, opts) = self.fs.opendir(&c.ctx, c.hdr.nodeid, a.flags)?;
            Ok(opened(fh, opts))
        })
    }

    pub(super) fn readdir(&self, c: &Call) -> Reply {
        self.read_dir(c, false)
    }

    pub(super) fn readdirplus(&self, c: &Call) -> Reply {
        self.read_dir(c, true)
    }

    /// READDIR and READDIRPLUS: the entries, then the header, written into the chain.
    fn read_dir(&self, c: &Call, plus: bool) -> Reply {
        let b = match c.body() {
            Ok(b) => b,
            Err(e) => return Reply::Malformed(e),
        };
        Reply::written(args::<ReadIn>(b).and_then(|a| {
            let mut data = ReplyData::new(c.mem, c.bufs)?;
            // As the crate's writer counted it: the header's room too.
            let room = size_of::<OutHeader>() + data.available_bytes();
            if room < a.size as usize {
                return Err(errno(libc::ENOMEM));
            }
            // Never an entry cut off by the end of the buffers.
            let max = (a.size as usize).min(data.available_bytes());
            let node = c.hdr.nodeid;
            if plus {
                self.fs
                    .readdirplus(&c.ctx, node, a.fh, a.size, a.offset, &mut |d, e| {
                        add_dirent(&mut data, max, d, Some(e))
                    })?;
            } else {
                self.fs
                    .readdir(&c.ctx, node, a.fh, a.size, a.offset, &mut |d| {
                        add_dirent(&mut data, max, d, None)
                    })?;
            }
            let n = data.bytes_written();
            finish(c.mem, c.bufs, &c.hdr, n)
        }))
    }

    pub(super) fn releasedir(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: ReleaseIn = args(b)?;
            self.fs.releasedir(&c.ctx, c.hdr.nodeid, a.flags, a.fh)?;
            Ok(Vec::new())
        })
    }

    pub(super) fn fsyncdir(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: FsyncIn = args(b)?;
            let datasync = a.fsync_flags & 1 != 0;
            self.fs.fsyncdir(&c.ctx, c.hdr.nodeid, datasync, a.fh)?;
            Ok(Vec::new())
        })
    }
}
