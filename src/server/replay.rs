//! Requests a serving process that died had popped and not answered (`device::recover`):
//! served again where running them twice comes to the same as once, answered EIO where
//! the first run may have acted and a second would differ.

use std::ops::Deref;
use std::sync::atomic::Ordering;

use log::warn;

use super::waiters::Deferred;
use super::wire::codec::decode;
use super::wire::guest::GuestMem;
use super::wire::reply::{answer_errno, reply_into};
use super::wire::request::HDR_LEN;
use super::{FuseServer, Opcode, Popped};
use crate::filesystem::FileSystem;

/// What becomes of a request a dead serving process held (`FuseServer::again`).
enum Again {
    /// Served again as if new.
    Run,
    /// Answered EIO.
    Eio,
    /// Answered with success and no payload (a release of a handle already gone).
    Done,
    /// Not served; no reply.
    Nothing,
}

impl<F: FileSystem> FuseServer<F> {
    /// Serves a request a serving process that died had popped and not answered
    /// (`device::recover`): again where running it twice comes to the same as once,
    /// answered EIO where it may have acted already and a second run would differ (the
    /// table in docs/design.md). A FORGET, BATCH_FORGET or INTERRUPT is not run again (it
    /// has no reply): a count it lowered is at worst left higher, never lower. `twice`:
    /// a serving process already died serving it again, so it is answered EIO: a request
    /// that kills every process that serves it must not kill them all.
    pub fn serve_again<M>(
        &self,
        mem: &GuestMem,
        mut popped: Popped<M>,
        twice: bool,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
    ) -> Option<u32>
    where
        M: Deref<Target = GuestMem> + Clone,
    {
        let verdict = {
            let (descs, copy) = popped.parts(mem);
            match copy {
                Ok(req) if !descs.overlong() => {
                    let args = &req.bytes[HDR_LEN.min(req.bytes.len())..];
                    let v = match self.again(req.hdr.opcode, req.hdr.nodeid, args) {
                        Again::Nothing => Again::Nothing,
                        _ if twice => {
                            warn!(
                                "request {} (opcode {}) was in flight at two deaths in a row; answered EIO",
                                req.hdr.unique, req.hdr.opcode
                            );
                            Again::Eio
                        }
                        v => v,
                    };
                    match v {
                        Again::Run => None,
                        Again::Eio => Some(answer_errno(
                            mem,
                            &descs.writable_bufs(),
                            &req.hdr,
                            libc::EIO,
                        )),
                        Again::Done => Some(reply_into(
                            mem,
                            &descs.writable_bufs(),
                            &req.hdr,
                            Ok(Vec::new()),
                        )),
                        Again::Nothing => Some(0),
                    }
                }
                // Malformed: served as before (an errno, or dropped).
                _ => None,
            }
        };
        self.stats
            .requests_after_crash
            .fetch_add(1, Ordering::Relaxed);
        match verdict {
            Some(len) => Some(len),
            None => self.handle(mem, popped, defer),
        }
    }

    /// What `serve_again` does with a request of `opcode` on `nodeid` with arguments
    /// `args`.
    fn again(&self, opcode: u32, nodeid: u64, args: &[u8]) -> Again {
        use fuse_backend_rs::abi::fuse_abi::{
            CreateIn, FallocateIn, ReleaseIn, SetxattrIn, WriteIn,
        };
        use Opcode::*;
        let Some(op) = Opcode::of(opcode) else {
            return Again::Eio;
        };
        match op {
            Lookup | Getattr | Readlink | Open | Opendir | Read | Readdir | Readdirplus
            | Statfs | Statx | Access | Getxattr | Listxattr | Flush | Fsync | Fsyncdir
            | Syncfs | Getlk | Setlk | Setlkw | Lseek | Bmap | Setattr | CopyFileRange | Init
            | Destroy => Again::Run,
            Forget | BatchForget | Interrupt | NotifyReply => Again::Nothing,
            Write => match decode::<WriteIn>(args) {
                Some(w) if self.fs.appends(w.fh, nodeid) => Again::Eio,
                _ => Again::Run,
            },
            Create => match decode::<CreateIn>(args) {
                Some(c) if c.flags as i32 & libc::O_EXCL != 0 => Again::Eio,
                _ => Again::Run,
            },
            Setxattr => match decode::<SetxattrIn>(args) {
                Some(x) if x.flags as i32 & libc::XATTR_CREATE != 0 => Again::Eio,
                _ => Again::Run,
            },
            Fallocate => {
                const SAME_TWICE: [i32; 5] = [
                    0,
                    libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_ZERO_RANGE,
                    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                ];
                match decode::<FallocateIn>(args) {
                    Some(f) if SAME_TWICE.contains(&(f.mode as i32)) => Again::Run,
                    _ => Again::Eio,
                }
            }
            Release | Releasedir => match decode::<ReleaseIn>(args) {
                // Released before the death: the guest only waits for the answer.
                Some(r) if !self.fs.has_handle(r.fh, nodeid) => Again::Done,
                _ => Again::Run,
            },
            Mknod | Mkdir | Symlink | Link | Unlink | Rmdir | Rename | Rename2 | Tmpfile
            | Removexattr | Ioctl | Poll | Setupmapping | Removemapping => Again::Eio,
        }
    }
}
