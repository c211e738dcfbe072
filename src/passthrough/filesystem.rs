//! vfsd's `FileSystem` trait (`crate::filesystem`) for the host directory: each call
//! routed to the module that does the work (`dir`, `file`, `attr`, `xattr`, `filelocks`,
//! ...).

use std::ffi::CStr;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{CreateIn, FileLock};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, GetxattrReply, ListxattrReply, OpenOptions, SetattrValid,
    ZeroCopyWriter, ROOT_ID,
};

use super::filelocks::{self, Range, Wait};
use super::{nowait, sys, PassthroughFs};
use crate::filesystem::{Blocker, CreateExt, FileSystem, LockWait, OpenWait};
use crate::stats::Stats;

impl LockWait for Wait {
    fn block(self, blocker: &Blocker) -> io::Result<()> {
        Wait::block(self, blocker)
    }
}

fn file_lock(r: Range, pid: u32) -> FileLock {
    FileLock {
        start: r.start,
        end: r.end,
        type_: r.typ as u32,
        pid,
    }
}

impl FileSystem for PassthroughFs {
    type LockWait = Wait;

    fn negotiate(&self) -> u64 {
        PassthroughFs::negotiate(self)
    }

    fn start_session(&self, enabled: u64) {
        PassthroughFs::start_session(self, enabled)
    }

    fn enabled(&self, flag: u64) -> bool {
        PassthroughFs::enabled(self, flag)
    }

    fn destroy(&self) {
        self.reset();
    }

    fn syncfs(&self, node: u64) -> io::Result<()> {
        PassthroughFs::syncfs(self, node)
    }

    fn note_caller(&self, pid: u32) {
        PassthroughFs::note_caller(self, pid)
    }

    fn with_open_wait<R>(&self, wait: OpenWait, f: impl FnOnce() -> R) -> R {
        nowait::with_open_wait(wait, f)
    }

    fn is_would_wait(&self, e: &io::Error) -> bool {
        nowait::is_would_wait(e)
    }

    fn stats_snapshot(&self, stats: &Stats) -> serde_json::Value {
        stats.snapshot(self)
    }

    fn appends(&self, fh: u64, node: u64) -> bool {
        PassthroughFs::appends(self, fh, node)
    }

    fn has_handle(&self, fh: u64, node: u64) -> bool {
        PassthroughFs::has_handle(self, fh, node)
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        self.lookup_name(parent, name)
    }

    fn negative_timeout(&self) -> Duration {
        PassthroughFs::negative_timeout(self)
    }

    fn forget(&self, _ctx: &Context, node: u64, count: u64) {
        if node != ROOT_ID && self.inodes.forget(node, count) {
            self.node_handles.remove(node, None);
            self.locks.release_node(node);
        }
    }

    fn getattr(
        &self,
        _ctx: &Context,
        node: u64,
        fh: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        self.do_getattr(node, fh)
    }

    fn setattr(
        &self,
        ctx: &Context,
        node: u64,
        attr: libc::stat64,
        fh: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(libc::stat64, Duration)> {
        let kill = self.kill_privs(
            ctx.uid,
            ctx.gid,
            Some(valid.contains(SetattrValid::KILL_SUIDGID)),
        );
        self.do_setattr(node, attr, fh, valid, kill)
    }

    fn readlink(&self, _ctx: &Context, node: u64) -> io::Result<Vec<u8>> {
        self.do_readlink(node)
    }

    fn symlink(
        &self,
        ctx: &Context,
        target: &CStr,
        parent: u64,
        name: &CStr,
        ext: &CreateExt,
    ) -> io::Result<Entry> {
        PassthroughFs::symlink(self, ctx, target, parent, name, ext)
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
        ext: &CreateExt,
    ) -> io::Result<Entry> {
        PassthroughFs::mknod(self, ctx, parent, name, mode, rdev, umask, ext)
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        umask: u32,
        ext: &CreateExt,
    ) -> io::Result<Entry> {
        PassthroughFs::mkdir(self, ctx, parent, name, mode, umask, ext)
    }

    fn unlink(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.do_unlink(parent, name, 0)
    }

    fn rmdir(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.do_unlink(parent, name, libc::AT_REMOVEDIR)
    }

    fn rename(
        &self,
        _ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.do_rename(olddir, oldname, newdir, newname, flags)
    }

    fn link(&self, _ctx: &Context, node: u64, newparent: u64, name: &CStr) -> io::Result<Entry> {
        self.do_link(node, newparent, name)
    }

    fn statfs(&self, _ctx: &Context, node: u64) -> io::Result<libc::statvfs64> {
        self.do_statfs(node)
    }

    fn access(&self, ctx: &Context, node: u64, mask: u32) -> io::Result<()> {
        self.do_access(ctx, node, mask)
    }

    fn statx(
        &self,
        node: u64,
        fh: Option<u64>,
        sync: i32,
        mask: u32,
    ) -> io::Result<(libc::statx, Duration)> {
        PassthroughFs::statx(self, node, fh, sync, mask)
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
        ext: &CreateExt,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        PassthroughFs::create(self, ctx, parent, name, args, ext)
    }

    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        flags: u32,
        mode: u32,
        umask: u32,
        ext: &CreateExt,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        PassthroughFs::tmpfile(self, ctx, parent, flags, mode, umask, ext)
    }

    fn open(
        &self,
        ctx: &Context,
        node: u64,
        flags: u32,
        fuse_flags: u32,
        wait: OpenWait,
    ) -> io::Result<(u64, OpenOptions)> {
        self.open_file(ctx, node, flags, fuse_flags, wait)
    }

    fn read(
        &self,
        _ctx: &Context,
        node: u64,
        fh: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        self.do_read(node, fh, w, size, offset)
    }

    unsafe fn read_nowait(
        &self,
        node: u64,
        fh: u64,
        offset: u64,
        iov: &[libc::iovec],
    ) -> Option<usize> {
        // SAFETY: the caller's promise, passed on.
        unsafe { PassthroughFs::read_nowait(self, node, fh, offset, iov) }
    }

    fn kill_privs(&self, uid: u32, gid: u32, asked: Option<bool>) -> Option<u32> {
        PassthroughFs::kill_privs(self, uid, gid, asked)
    }

    unsafe fn write_iov(
        &self,
        node: u64,
        fh: u64,
        offset: u64,
        iov: &[libc::iovec],
        kill: Option<u32>,
        flags: u32,
    ) -> io::Result<usize> {
        // SAFETY: the caller's promise, passed on.
        unsafe { PassthroughFs::write_iov(self, node, fh, offset, iov, kill, flags) }
    }

    fn flush(&self, _ctx: &Context, node: u64, fh: u64, lock_owner: u64) -> io::Result<()> {
        // The guest's close(): its POSIX locks on the file go, as on a local filesystem.
        self.locks.release_owner(node, lock_owner);
        if fh == 0 && self.cfg.no_open {
            // No lock of the guest's reaches the host under --no-open: a FLUSH carries only
            // the close, which a local host file system does nothing with. ENOSYS tells
            // the guest kernel to send none.
            if self.close_silent_root {
                return Err(sys::errno(libc::ENOSYS));
            }
            return match self.node_handles.get(node) {
                Some(h) => Self::close_dup(&h),
                None => Ok(()),
            };
        }
        self.do_flush(node, fh)
    }

    fn release(
        &self,
        _ctx: &Context,
        node: u64,
        _flags: u32,
        fh: u64,
        _flush: bool,
        flock_release: bool,
        lock_owner: Option<u64>,
    ) -> io::Result<()> {
        if fh == 0 && self.cfg.no_open {
            // A CREATE's before the guest kernel learnt of --no-open: nothing to close.
            return Ok(());
        }
        let h = self.handles.remove(fh, node)?;
        // A migrated flock still being taken again on it ends with the handle.
        let retake = h.flock_pending.lock().unwrap().take();
        if let Some(b) = retake {
            b.cancel();
        }
        if flock_release {
            // In-flight requests may still hold the handle (and its fd) a moment longer.
            let _ = filelocks::flock(h.fd.as_raw_fd(), libc::F_UNLCK, false);
        }
        if let Some(owner) = lock_owner {
            self.locks.release_owner(node, owner);
        }
        // The open file's own owners (OFD locks) end with it.
        self.locks.release_handle(node, fh);
        Ok(())
    }

    fn fsync(&self, _ctx: &Context, node: u64, datasync: bool, fh: u64) -> io::Result<()> {
        self.do_fsync(node, datasync, fh)
    }

    fn fallocate(
        &self,
        ctx: &Context,
        node: u64,
        fh: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        let kill = self.kill_privs(ctx.uid, ctx.gid, None);
        self.do_fallocate(node, fh, mode, offset, length, kill)
    }

    fn lseek(
        &self,
        _ctx: &Context,
        node: u64,
        fh: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        self.do_lseek(node, fh, offset, whence)
    }

    fn copy_file_range(
        &self,
        kill: Option<u32>,
        node_in: u64,
        fh_in: u64,
        off_in: u64,
        node_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        PassthroughFs::copy_file_range(
            self, kill, node_in, fh_in, off_in, node_out, fh_out, off_out, len, flags,
        )
    }

    fn ioctl(
        &self,
        ctx: &Context,
        node: u64,
        fh: u64,
        cmd: u32,
        data: Option<&[u8]>,
        out_size: u32,
    ) -> io::Result<(i32, Vec<u8>)> {
        PassthroughFs::ioctl(self, ctx, node, fh, cmd, data, out_size)
    }

    fn opendir(&self, _ctx: &Context, node: u64, flags: u32) -> io::Result<(u64, OpenOptions)> {
        self.do_opendir(node, flags)
    }

    fn readdir(
        &self,
        _ctx: &Context,
        node: u64,
        fh: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.do_readdir(node, fh, size, offset, &mut |d, _| add_entry(d), false)
    }

    fn readdirplus(
        &self,
        _ctx: &Context,
        node: u64,
        fh: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.do_readdir(
            node,
            fh,
            size,
            offset,
            &mut |d, e| add_entry(d, e.unwrap_or_default()),
            true,
        )
    }

    fn releasedir(&self, _ctx: &Context, node: u64, _flags: u32, fh: u64) -> io::Result<()> {
        self.handles.remove(fh, node).map(drop)
    }

    fn fsyncdir(&self, _ctx: &Context, node: u64, datasync: bool, fh: u64) -> io::Result<()> {
        self.do_fsync(node, datasync, fh)
    }

    fn setxattr(
        &self,
        _ctx: &Context,
        node: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.do_setxattr(node, name, value, flags)
    }

    fn getxattr(
        &self,
        _ctx: &Context,
        node: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        self.do_getxattr(node, name, size)
    }

    fn listxattr(&self, _ctx: &Context, node: u64, size: u32) -> io::Result<ListxattrReply> {
        self.do_listxattr(node, size)
    }

    fn removexattr(&self, _ctx: &Context, node: u64, name: &CStr) -> io::Result<()> {
        self.do_removexattr(node, name)
    }

    fn acl_kill_sgid(&self, node: u64) -> io::Result<()> {
        PassthroughFs::acl_kill_sgid(self, node)
    }

    fn getlk(
        &self,
        node: u64,
        fh: u64,
        owner: u64,
        lock: FileLock,
        flock: bool,
    ) -> io::Result<FileLock> {
        let r = Range::new(lock.start, lock.end, lock.type_)?;
        let (found, pid) = PassthroughFs::getlk(self, node, fh, owner, r, flock)?;
        Ok(file_lock(found, pid))
    }

    fn setlk(
        &self,
        node: u64,
        fh: u64,
        owner: u64,
        lock: FileLock,
        flock: bool,
        wait: bool,
    ) -> io::Result<Option<Wait>> {
        let r = Range::new(lock.start, lock.end, lock.type_)?;
        PassthroughFs::setlk(self, node, fh, owner, lock.pid, r, flock, wait)
    }

    fn count_lock_refusal(&self) {
        PassthroughFs::count_lock_refusal(self)
    }
}

/// The server over the host directory: what its replies look like in guest memory.
#[cfg(test)]
mod tests {
    use std::mem::size_of;
    use std::sync::Arc;

    use fuse_backend_rs::abi::fuse_abi::{InHeader, OutHeader};
    use vm_memory::{ByteValued, Bytes, GuestAddress};

    use super::super::Config;
    use super::*;
    use crate::server::wire::codec::decode;
    use crate::server::wire::descs::mock_chain;
    use crate::server::{Deferred, FuseServer, GuestMem, Opcode, Popped};

    const MEM: u64 = 0x10000;
    const HDR: usize = size_of::<OutHeader>();
    const W: bool = true;
    const R: bool = false;

    fn bytes_at(mem: &GuestMem, at: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        mem.read_slice(&mut b, GuestAddress(at)).unwrap();
        b
    }

    fn out_header(mem: &GuestMem, at: u64) -> OutHeader {
        mem.read_obj(GuestAddress(at)).unwrap()
    }

    /// READ's data goes where its descriptors said when it was popped: a guest that
    /// rewrites its descriptor table meanwhile (another vCPU) gets nothing written where
    /// it points now. Writing through the crate's writer walked the chain again, without
    /// the descriptor cap (`MAX_DESCS`) the pop applied.
    #[test]
    fn a_read_writes_where_its_descriptors_pointed_when_it_was_popped() {
        use fuse_backend_rs::abi::fuse_abi::ReadIn;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"the file's data").unwrap();
        let fs = Arc::new(PassthroughFs::new(Config::new(dir.path())).unwrap());
        let ctx = Context::default();
        let node = fs
            .lookup(&ctx, ROOT_ID, &std::ffi::CString::new("f").unwrap())
            .unwrap()
            .inode;
        let (fh, _) = fs
            .open(&ctx, node, libc::O_RDONLY as u32, 0, OpenWait::Allowed)
            .unwrap();
        let server = FuseServer::new(fs.clone());
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let args = ReadIn {
            fh,
            size: 15,
            ..Default::default()
        };
        let hdr = InHeader {
            len: (size_of::<InHeader>() + size_of::<ReadIn>()) as u32,
            opcode: Opcode::Read as u32,
            unique: 9,
            nodeid: node,
            ..Default::default()
        };
        let mut req = hdr.as_slice().to_vec();
        req.extend_from_slice(args.as_slice());
        mem.write_slice(&req, GuestAddress(0x4000)).unwrap();
        let chain = mock_chain(&mem, &[(0x4000, req.len() as u32, R), (0x8000, 4096, W)]);
        let popped = Popped::new(&mem, chain);
        // The mock queue's table is at 0; the reply's descriptor is its second.
        mem.write_obj(0x9000u64, GuestAddress(16)).unwrap();
        let mut later =
            || -> Option<Box<dyn Deferred>> { unreachable!("a READ is answered at once") };
        let len = server.handle(&mem, popped, &mut later).unwrap();
        assert_eq!(len as usize, HDR + 15);
        assert_eq!(out_header(&mem, 0x8000).unique, 9);
        assert_eq!(bytes_at(&mem, 0x8000 + HDR as u64, 15), b"the file's data");
        assert_eq!(bytes_at(&mem, 0x9000, HDR + 15), vec![0; HDR + 15]);
    }

    /// A SETLKW whose first writable buffer has no room for the header its wait would
    /// write there (a zero-length descriptor in front, or a short one) is answered EINVAL
    /// in the room after it, not left without a reply.
    #[test]
    fn a_setlkw_whose_first_writable_buffer_is_too_small_gets_einval() {
        use fuse_backend_rs::abi::fuse_abi::{FileLock, LkIn};
        let dir = tempfile::tempdir().unwrap();
        let fs = Arc::new(PassthroughFs::new(Config::new(dir.path())).unwrap());
        let server = FuseServer::new(fs);
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let args = LkIn {
            fh: 1,
            owner: 1,
            lk: FileLock {
                start: 0,
                end: u64::MAX,
                type_: libc::F_WRLCK as u32,
                pid: 1,
            },
            ..Default::default()
        };
        let hdr = InHeader {
            len: (size_of::<InHeader>() + size_of::<LkIn>()) as u32,
            opcode: Opcode::Setlkw as u32,
            unique: 9,
            nodeid: 1,
            ..Default::default()
        };
        let mut req = hdr.as_slice().to_vec();
        req.extend_from_slice(args.as_slice());
        mem.write_slice(&req, GuestAddress(0x4000)).unwrap();
        for first in [0, HDR as u32 - 1] {
            mem.write_slice(&[0; 64], GuestAddress(0x8000)).unwrap();
            mem.write_slice(&[0; 64], GuestAddress(0x9000)).unwrap();
            let descs = [
                (0x4000, req.len() as u32, R),
                (0x8000, first, W),
                (0x9000, 64, W),
            ];
            let popped = Popped::new(&mem, mock_chain(&mem, &descs));
            let mut defer = || -> Option<Box<dyn Deferred>> { None };
            let len = server.handle(&mem, popped, &mut defer);
            assert_eq!(
                len,
                Some(HDR as u32),
                "first writable buffer of {first} bytes"
            );
            let mut got = bytes_at(&mem, 0x8000, first as usize);
            got.extend(bytes_at(&mem, 0x9000, HDR - first as usize));
            let h: OutHeader = decode(&got).unwrap();
            assert_eq!((h.len as usize, h.error, h.unique), (HDR, -libc::EINVAL, 9));
        }
    }
}
