//! A FUSE client over the frontend's virtqueues: sends requests as the guest kernel's
//! virtio-fs driver does and collects the replies; `wire` lays them out and decodes them.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::*;
use vm_memory::ByteValued;

use super::{Frontend, Layout};

pub mod wire;
// Named, not a glob: they shadow `fuse_abi`'s items of the same names.
pub use wire::{
    check_head, decode, name_bytes, parse_reply, request_bytes, request_bytes_as, Caller, DirEnt,
    FResult, FuseError, Lock, Reply, FATTR_ATIME, FATTR_ATIME_NOW, FATTR_FH, FATTR_GID,
    FATTR_KILL_SUIDGID, FATTR_MODE, FATTR_MTIME, FATTR_MTIME_NOW, FATTR_SIZE, FATTR_UID,
    FOPEN_DIRECT_IO, FOPEN_PARALLEL_DIRECT_WRITES, FUSE_ACCESS, FUSE_BATCH_FORGET,
    FUSE_COPY_FILE_RANGE, FUSE_CREATE, FUSE_DESTROY, FUSE_FALLOCATE, FUSE_FLUSH, FUSE_FORGET,
    FUSE_FSYNC, FUSE_FSYNCDIR, FUSE_GETATTR, FUSE_GETLK, FUSE_GETXATTR, FUSE_INIT, FUSE_INTERRUPT,
    FUSE_IOCTL, FUSE_IOCTL_32BIT, FUSE_IOCTL_DIR, FUSE_LINK, FUSE_LISTXATTR, FUSE_LOOKUP,
    FUSE_LSEEK, FUSE_MKDIR, FUSE_MKNOD, FUSE_OPEN, FUSE_OPENDIR, FUSE_OPEN_KILL_SUIDGID, FUSE_READ,
    FUSE_READDIR, FUSE_READDIRPLUS, FUSE_READLINK, FUSE_RELEASE, FUSE_RELEASEDIR, FUSE_REMOVEXATTR,
    FUSE_RENAME, FUSE_RENAME2, FUSE_RMDIR, FUSE_SETATTR, FUSE_SETLK, FUSE_SETLKW, FUSE_SETXATTR,
    FUSE_STATFS, FUSE_SYMLINK, FUSE_SYNCFS, FUSE_UNLINK, FUSE_WRITE, FUSE_WRITE_KILL_SUIDGID,
    INIT_ASYNC_DIO, INIT_BIG_WRITES, INIT_DO_READDIRPLUS, INIT_FLOCK_LOCKS, INIT_MAX_PAGES,
    INIT_PARALLEL_DIROPS, INIT_POSIX_LOCKS, INIT_WRITEBACK_CACHE,
};
use wire::{cstr, exact, parse_dirents};

pub struct FuseClient {
    pub fe: Frontend,
    unique: AtomicU64,
    /// Who the requests are sent for; root unless `set_caller` changed it.
    caller: std::sync::Mutex<Caller>,
    pub layout: Layout,
    pub timeout: Duration,
}

/// A request placed on a queue and not yet collected.
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    pub queue: usize,
    pub slot: usize,
    pub unique: u64,
}

impl FuseClient {
    pub fn new(fe: Frontend) -> Self {
        FuseClient {
            fe,
            unique: AtomicU64::new(1),
            caller: std::sync::Mutex::new(Caller::ROOT),
            layout: Layout::default(),
            timeout: Duration::from_secs(20),
        }
    }

    /// Builds a request with a fresh `unique`: header (length filled in) followed by `parts`.
    pub fn build(&self, op: u32, nodeid: u64, parts: &[&[u8]]) -> (u64, Vec<u8>) {
        let unique = self.unique.fetch_add(1, Ordering::Relaxed);
        let caller = *self.caller.lock().unwrap();
        (unique, request_bytes_as(caller, op, nodeid, unique, parts))
    }

    /// Sends the following requests for `caller` (a non-root guest user, say).
    pub fn set_caller(&self, caller: Caller) {
        *self.caller.lock().unwrap() = caller;
    }

    /// Runs `f` with requests sent for `caller`, then goes back to the previous caller.
    pub fn as_caller<R>(&self, caller: Caller, f: impl FnOnce(&Self) -> R) -> R {
        let old = std::mem::replace(&mut *self.caller.lock().unwrap(), caller);
        let r = f(self);
        *self.caller.lock().unwrap() = old;
        r
    }

    /// Places raw request bytes on `queue` and kicks; waits for a free slot if needed.
    pub fn submit_bytes(
        &self,
        queue: usize,
        req: &[u8],
        resp_len: usize,
        unique: u64,
    ) -> FResult<Ticket> {
        let deadline = Instant::now() + self.timeout;
        loop {
            {
                let mut q = self.fe.queues[queue].lock().unwrap();
                q.reap(&self.fe.mem)?;
                if let Some(slot) = q.free_slot() {
                    q.submit(&self.fe.mem, slot, req, resp_len, self.layout)?;
                    q.kick(&self.fe.mem)?;
                    return Ok(Ticket {
                        queue,
                        slot,
                        unique,
                    });
                }
            }
            if Instant::now() > deadline {
                return Err(FuseError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no free slot on the queue",
                )));
            }
            self.fe.wait_call(queue, Duration::from_millis(1));
        }
    }

    /// Places several requests (opcode, node id, argument parts) on `queue` and kicks once,
    /// so the device pops them together. Fails if the queue lacks free slots for all.
    pub fn submit_together(
        &self,
        queue: usize,
        reqs: &[(u32, u64, &[&[u8]])],
        resp_len: usize,
    ) -> FResult<Vec<Ticket>> {
        let mut q = self.fe.queues[queue].lock().unwrap();
        q.reap(&self.fe.mem)?;
        let mut tickets = Vec::new();
        for (op, nodeid, parts) in reqs {
            let (unique, req) = self.build(*op, *nodeid, parts);
            let slot = q.free_slot().ok_or_else(|| {
                FuseError::Io(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "too few free slots",
                ))
            })?;
            q.submit(&self.fe.mem, slot, &req, resp_len, self.layout)?;
            tickets.push(Ticket {
                queue,
                slot,
                unique,
            });
        }
        q.kick(&self.fe.mem)?;
        Ok(tickets)
    }

    pub fn submit(
        &self,
        queue: usize,
        op: u32,
        nodeid: u64,
        parts: &[&[u8]],
        resp_len: usize,
    ) -> FResult<Ticket> {
        let (unique, req) = self.build(op, nodeid, parts);
        self.submit_bytes(queue, &req, resp_len, unique)
    }

    /// Waits for `t` and returns the raw bytes the device wrote. The queue lock is dropped
    /// while waiting, so other threads keep submitting on the same queue.
    fn wait_raw(&self, t: Ticket) -> FResult<Vec<u8>> {
        let deadline = Instant::now() + self.timeout;
        loop {
            {
                let mut q = self.fe.queues[t.queue].lock().unwrap();
                q.reap(&self.fe.mem)?;
                if q.is_done(t.slot) {
                    return Ok(q.take(&self.fe.mem, t.slot)?);
                }
            }
            if Instant::now() > deadline {
                return Err(FuseError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no reply from the device",
                )));
            }
            self.fe.wait_call(t.queue, Duration::from_millis(1));
        }
    }

    /// Collects every finished request on `queue` without blocking: (slot, raw reply).
    pub fn poll_done(&self, queue: usize) -> FResult<Vec<(usize, Vec<u8>)>> {
        let mut q = self.fe.queues[queue].lock().unwrap();
        q.reap(&self.fe.mem)?;
        let done: Vec<usize> = (0..q.slots()).filter(|&s| q.is_done(s)).collect();
        let mut out = Vec::with_capacity(done.len());
        for s in done {
            out.push((s, q.take(&self.fe.mem, s)?));
        }
        Ok(out)
    }

    /// Collects every finished request on `queue` without blocking, copying no more of
    /// each reply than `head` bytes: (slot, used length, the reply's first bytes). A READ's
    /// data stays where the device wrote it; `check_head` checks the header.
    pub fn poll_heads(&self, queue: usize, head: usize) -> FResult<Vec<(usize, usize, Vec<u8>)>> {
        let mut q = self.fe.queues[queue].lock().unwrap();
        q.reap(&self.fe.mem)?;
        let mut out = Vec::new();
        for s in 0..q.slots() {
            if q.is_done(s) {
                let mut buf = vec![0u8; head];
                let len = q.take_head(&self.fe.mem, s, &mut buf)?;
                buf.truncate(len);
                out.push((s, len, buf));
            }
        }
        Ok(out)
    }

    /// Waits for `t` and decodes its reply, checking the header against the used length.
    pub fn wait(&self, t: Ticket) -> FResult<Reply> {
        let raw = self.wait_raw(t)?;
        parse_reply(&raw, t.unique)
    }

    /// Waits for a request that gets no reply (FORGET): the device still returns the
    /// descriptors, with nothing written.
    pub fn wait_no_reply(&self, t: Ticket) -> FResult<usize> {
        Ok(self.wait_raw(t)?.len())
    }

    pub fn call(&self, op: u32, nodeid: u64, parts: &[&[u8]], resp_len: usize) -> FResult<Vec<u8>> {
        self.call_on(1, op, nodeid, parts, resp_len)
    }

    pub fn call_on(
        &self,
        queue: usize,
        op: u32,
        nodeid: u64,
        parts: &[&[u8]],
        resp_len: usize,
    ) -> FResult<Vec<u8>> {
        let t = self.submit(queue, op, nodeid, parts, resp_len)?;
        self.wait(t)?.ok()
    }

    // ---- typed requests ----

    pub fn init(&self) -> FResult<InitOut> {
        self.init_with(
            INIT_BIG_WRITES
                | INIT_MAX_PAGES
                | INIT_DO_READDIRPLUS
                | INIT_PARALLEL_DIROPS
                | INIT_ASYNC_DIO,
        )
    }

    pub fn init_with(&self, flags: u32) -> FResult<InitOut> {
        let i = InitIn {
            major: 7,
            minor: 38,
            max_readahead: 128 * 1024,
            flags,
        };
        let b = self.call(FUSE_INIT, 0, &[i.as_slice()], 4096)?;
        decode(&b)
    }

    /// INIT as a 7.`minor` guest offering the 64-bit `flags`: with any of the high 32 bits
    /// set, INIT_EXT and the second half of fuse_init_in (7.36) are sent too.
    pub fn init_ext(&self, minor: u32, flags: u64) -> FResult<InitOut> {
        const INIT_EXT: u64 = 1 << 30;
        let ext = flags >> 32 != 0 || flags & INIT_EXT != 0;
        let i = InitIn {
            major: 7,
            minor,
            max_readahead: 128 * 1024,
            flags: flags as u32 | if ext { INIT_EXT as u32 } else { 0 },
        };
        let mut second = [0u32; 12];
        second[0] = (flags >> 32) as u32;
        let second: Vec<u8> = second.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let parts: Vec<&[u8]> = if ext {
            vec![i.as_slice(), &second]
        } else {
            vec![i.as_slice()]
        };
        let b = self.call(FUSE_INIT, 0, &parts, 4096)?;
        decode(&b)
    }

    /// LOOKUP; a negative entry (node id 0) is ENOENT, as the kernel takes it.
    pub fn lookup(&self, parent: u64, name: &str) -> FResult<EntryOut> {
        self.lookup_raw(parent, cstr(name).as_slice())
    }

    pub fn lookup_raw(&self, parent: u64, name: &[u8]) -> FResult<EntryOut> {
        match self.lookup_reply(parent, name)? {
            e if e.nodeid == 0 => Err(FuseError::Errno(libc::ENOENT)),
            e => Ok(e),
        }
    }

    /// LOOKUP's reply as it came: a negative entry is an entry with node id 0.
    pub fn lookup_reply(&self, parent: u64, name: &[u8]) -> FResult<EntryOut> {
        exact(self.call(FUSE_LOOKUP, parent, &[name], 4096)?)
    }

    pub fn forget(&self, nodeid: u64, nlookup: u64) -> FResult<()> {
        let f = ForgetIn { nlookup };
        let t = self.submit(0, FUSE_FORGET, nodeid, &[f.as_slice()], 64)?;
        let n = self.wait_no_reply(t)?;
        if n != 0 {
            return Err(FuseError::Proto(format!("FORGET got a {n}-byte reply")));
        }
        Ok(())
    }

    /// FUSE_INTERRUPT for the request sent under `unique` (no reply), on the hiprio queue.
    pub fn interrupt(&self, unique: u64) -> FResult<()> {
        let i = InterruptIn { unique };
        let t = self.submit(0, FUSE_INTERRUPT, 0, &[i.as_slice()], 64)?;
        let n = self.wait_no_reply(t)?;
        if n != 0 {
            return Err(FuseError::Proto(format!("INTERRUPT got a {n}-byte reply")));
        }
        Ok(())
    }

    pub fn batch_forget(&self, items: &[(u64, u64)]) -> FResult<()> {
        let h = BatchForgetIn {
            count: items.len() as u32,
            dummy: 0,
        };
        let mut body = h.as_slice().to_vec();
        for &(nodeid, nlookup) in items {
            body.extend_from_slice(ForgetOne { nodeid, nlookup }.as_slice());
        }
        let t = self.submit(0, FUSE_BATCH_FORGET, 0, &[&body], 64)?;
        self.wait_no_reply(t)?;
        Ok(())
    }

    pub fn getattr(&self, nodeid: u64) -> FResult<AttrOut> {
        exact(self.call(
            FUSE_GETATTR,
            nodeid,
            &[GetattrIn::default().as_slice()],
            4096,
        )?)
    }

    pub fn setattr(&self, nodeid: u64, s: &SetattrIn) -> FResult<AttrOut> {
        exact(self.call(FUSE_SETATTR, nodeid, &[s.as_slice()], 4096)?)
    }

    pub fn readlink(&self, nodeid: u64) -> FResult<Vec<u8>> {
        self.call(FUSE_READLINK, nodeid, &[], 8192)
    }

    pub fn symlink(&self, parent: u64, name: &str, target: &str) -> FResult<EntryOut> {
        exact(self.call(FUSE_SYMLINK, parent, &[&cstr(name), &cstr(target)], 4096)?)
    }

    pub fn mknod(&self, parent: u64, name: &str, mode: u32, rdev: u32) -> FResult<EntryOut> {
        let m = MknodIn {
            mode,
            rdev,
            umask: 0,
            padding: 0,
        };
        exact(self.call(FUSE_MKNOD, parent, &[m.as_slice(), &cstr(name)], 4096)?)
    }

    pub fn mkdir(&self, parent: u64, name: &str, mode: u32) -> FResult<EntryOut> {
        let m = MkdirIn { mode, umask: 0 };
        exact(self.call(FUSE_MKDIR, parent, &[m.as_slice(), &cstr(name)], 4096)?)
    }

    pub fn unlink(&self, parent: u64, name: &str) -> FResult<()> {
        self.call(FUSE_UNLINK, parent, &[&cstr(name)], 64).map(drop)
    }

    pub fn rmdir(&self, parent: u64, name: &str) -> FResult<()> {
        self.call(FUSE_RMDIR, parent, &[&cstr(name)], 64).map(drop)
    }

    pub fn rename(&self, olddir: u64, old: &str, newdir: u64, new: &str) -> FResult<()> {
        let r = RenameIn { newdir };
        self.call(
            FUSE_RENAME,
            olddir,
            &[r.as_slice(), &cstr(old), &cstr(new)],
            64,
        )
        .map(drop)
    }

    pub fn rename2(
        &self,
        olddir: u64,
        old: &str,
        newdir: u64,
        new: &str,
        flags: u32,
    ) -> FResult<()> {
        let r = Rename2In {
            newdir,
            flags,
            padding: 0,
        };
        self.call(
            FUSE_RENAME2,
            olddir,
            &[r.as_slice(), &cstr(old), &cstr(new)],
            64,
        )
        .map(drop)
    }

    pub fn link(&self, nodeid: u64, newparent: u64, name: &str) -> FResult<EntryOut> {
        let l = LinkIn { oldnodeid: nodeid };
        exact(self.call(FUSE_LINK, newparent, &[l.as_slice(), &cstr(name)], 4096)?)
    }

    pub fn open(&self, nodeid: u64, flags: u32) -> FResult<OpenOut> {
        self.open_with(nodeid, flags, 0)
    }

    /// OPEN with the FUSE `open_flags` (FUSE_OPEN_KILL_SUIDGID, ...).
    /// Submits an OPEN of `nodeid` with `flags` on queue 1 without waiting for its reply
    /// (an open that waits on a host lease, say).
    pub fn submit_open(&self, nodeid: u64, flags: u32) -> FResult<Ticket> {
        let o = OpenIn {
            flags,
            fuse_flags: 0,
        };
        self.submit(1, FUSE_OPEN, nodeid, &[o.as_slice()], 4096)
    }

    pub fn open_with(&self, nodeid: u64, flags: u32, open_flags: u32) -> FResult<OpenOut> {
        let o = OpenIn {
            flags,
            fuse_flags: open_flags,
        };
        exact(self.call(FUSE_OPEN, nodeid, &[o.as_slice()], 4096)?)
    }

    pub fn create(
        &self,
        parent: u64,
        name: &str,
        flags: u32,
        mode: u32,
    ) -> FResult<(EntryOut, OpenOut)> {
        self.create_with(parent, name, flags, mode, 0)
    }

    /// CREATE with the FUSE `open_flags` (FUSE_OPEN_KILL_SUIDGID, ...).
    pub fn create_with(
        &self,
        parent: u64,
        name: &str,
        flags: u32,
        mode: u32,
        open_flags: u32,
    ) -> FResult<(EntryOut, OpenOut)> {
        let c = CreateIn {
            flags,
            mode,
            umask: 0,
            fuse_flags: open_flags,
        };
        let b = self.call(FUSE_CREATE, parent, &[c.as_slice(), &cstr(name)], 4096)?;
        let e = std::mem::size_of::<EntryOut>();
        if b.len() != e + std::mem::size_of::<OpenOut>() {
            return Err(FuseError::Proto(format!(
                "CREATE reply of {} bytes",
                b.len()
            )));
        }
        Ok((decode(&b)?, decode(&b[e..])?))
    }

    pub fn read_req(&self, nodeid: u64, fh: u64, offset: u64, size: u32) -> (u64, Vec<u8>) {
        let r = ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        };
        self.build(FUSE_READ, nodeid, &[r.as_slice()])
    }

    pub fn read(&self, nodeid: u64, fh: u64, offset: u64, size: u32) -> FResult<Vec<u8>> {
        let (u, req) = self.read_req(nodeid, fh, offset, size);
        let t = self.submit_bytes(1, &req, 16 + size as usize, u)?;
        self.wait(t)?.ok()
    }

    pub fn write_req(&self, nodeid: u64, fh: u64, offset: u64, data: &[u8]) -> (u64, Vec<u8>) {
        let w = WriteIn {
            fh,
            offset,
            size: data.len() as u32,
            ..Default::default()
        };
        self.build(FUSE_WRITE, nodeid, &[w.as_slice(), data])
    }

    pub fn write(&self, nodeid: u64, fh: u64, offset: u64, data: &[u8]) -> FResult<u32> {
        self.write_on(1, nodeid, fh, offset, data)
    }

    /// WRITE with the FUSE `write_flags` (FUSE_WRITE_KILL_SUIDGID, ...).
    pub fn write_with(
        &self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        write_flags: u32,
    ) -> FResult<u32> {
        let w = WriteIn {
            fh,
            offset,
            size: data.len() as u32,
            fuse_flags: write_flags,
            ..Default::default()
        };
        let o: WriteOut = exact(self.call(FUSE_WRITE, nodeid, &[w.as_slice(), data], 64)?)?;
        Ok(o.size)
    }

    pub fn write_on(
        &self,
        queue: usize,
        nodeid: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
    ) -> FResult<u32> {
        let (u, req) = self.write_req(nodeid, fh, offset, data);
        let t = self.submit_bytes(queue, &req, 64, u)?;
        let w: WriteOut = exact(self.wait(t)?.ok()?)?;
        Ok(w.size)
    }

    pub fn statfs(&self, nodeid: u64) -> FResult<Kstatfs> {
        exact(self.call(FUSE_STATFS, nodeid, &[], 4096)?)
    }

    pub fn release(&self, nodeid: u64, fh: u64) -> FResult<()> {
        self.release_op(FUSE_RELEASE, nodeid, fh)
    }

    pub fn releasedir(&self, nodeid: u64, fh: u64) -> FResult<()> {
        self.release_op(FUSE_RELEASEDIR, nodeid, fh)
    }

    fn release_op(&self, op: u32, nodeid: u64, fh: u64) -> FResult<()> {
        let r = ReleaseIn {
            fh,
            ..Default::default()
        };
        self.call(op, nodeid, &[r.as_slice()], 64).map(drop)
    }

    pub fn fsync(&self, nodeid: u64, fh: u64, dir: bool) -> FResult<()> {
        self.fsync_with(nodeid, fh, dir, false)
    }

    /// FSYNC or FSYNCDIR; `datasync` sets FUSE_FSYNC_FDATASYNC as the guest's fdatasync() does.
    pub fn fsync_with(&self, nodeid: u64, fh: u64, dir: bool, datasync: bool) -> FResult<()> {
        let f = FsyncIn {
            fh,
            fsync_flags: datasync as u32,
            padding: 0,
        };
        let op = if dir { FUSE_FSYNCDIR } else { FUSE_FSYNC };
        self.call(op, nodeid, &[f.as_slice()], 64).map(drop)
    }

    pub fn flush(&self, nodeid: u64, fh: u64) -> FResult<()> {
        self.flush_owner(nodeid, fh, 0)
    }

    /// FLUSH by lock owner `owner` (the guest's close()).
    pub fn flush_owner(&self, nodeid: u64, fh: u64, owner: u64) -> FResult<()> {
        let f = FlushIn {
            fh,
            lock_owner: owner,
            ..Default::default()
        };
        self.call(FUSE_FLUSH, nodeid, &[f.as_slice()], 64).map(drop)
    }

    /// RELEASE with FUSE_RELEASE_FLOCK_UNLOCK and the owner, as the guest's last close of
    /// a file that held a flock.
    pub fn release_flock(&self, nodeid: u64, fh: u64, owner: u64) -> FResult<()> {
        let r = ReleaseIn {
            fh,
            release_flags: RELEASE_FLOCK_UNLOCK,
            lock_owner: owner,
            ..Default::default()
        };
        self.call(FUSE_RELEASE, nodeid, &[r.as_slice()], 64)
            .map(drop)
    }

    /// The request bytes of a GETLK, SETLK or SETLKW.
    #[allow(clippy::too_many_arguments)]
    pub fn lk_req(&self, op: u32, nodeid: u64, fh: u64, owner: u64, lock: Lock) -> (u64, Vec<u8>) {
        let l = LkIn {
            fh,
            owner,
            lk: FileLock {
                start: lock.start,
                end: lock.end,
                type_: lock.typ as u32,
                pid: lock.pid,
            },
            lk_flags: if lock.flock { 1 } else { 0 },
            padding: 0,
        };
        self.build(op, nodeid, &[l.as_slice()])
    }

    /// SETLK (no wait): Ok, or the errno (EAGAIN when someone else holds it).
    pub fn setlk(&self, nodeid: u64, fh: u64, owner: u64, lock: Lock) -> FResult<()> {
        let (u, req) = self.lk_req(FUSE_SETLK, nodeid, fh, owner, lock);
        let t = self.submit_bytes(1, &req, 64, u)?;
        self.wait(t)?.ok().map(drop)
    }

    /// SETLKW, submitted on `queue`; the ticket completes when the lock is granted.
    pub fn setlkw(
        &self,
        queue: usize,
        nodeid: u64,
        fh: u64,
        owner: u64,
        lock: Lock,
    ) -> FResult<Ticket> {
        let (u, req) = self.lk_req(FUSE_SETLKW, nodeid, fh, owner, lock);
        self.submit_bytes(queue, &req, 64, u)
    }

    /// GETLK: the conflicting lock, or the range with type F_UNLCK.
    pub fn getlk(&self, nodeid: u64, fh: u64, owner: u64, lock: Lock) -> FResult<FileLock> {
        let (u, req) = self.lk_req(FUSE_GETLK, nodeid, fh, owner, lock);
        let t = self.submit_bytes(1, &req, 64, u)?;
        let o: LkOut = exact(self.wait(t)?.ok()?)?;
        Ok(o.lk)
    }

    pub fn setxattr(&self, nodeid: u64, name: &str, value: &[u8], flags: u32) -> FResult<()> {
        let s = SetxattrIn {
            size: value.len() as u32,
            flags,
        };
        self.call(
            FUSE_SETXATTR,
            nodeid,
            &[s.as_slice(), &cstr(name), value],
            64,
        )
        .map(drop)
    }

    /// GETXATTR with `size` 0 returns the value's length as 4 bytes (GetxattrOut.size).
    pub fn getxattr(&self, nodeid: u64, name: &str, size: u32) -> FResult<Vec<u8>> {
        let g = GetxattrIn { size, padding: 0 };
        self.call(
            FUSE_GETXATTR,
            nodeid,
            &[g.as_slice(), &cstr(name)],
            16 + size.max(8) as usize,
        )
    }

    pub fn listxattr(&self, nodeid: u64, size: u32) -> FResult<Vec<u8>> {
        let g = GetxattrIn { size, padding: 0 };
        self.call(
            FUSE_LISTXATTR,
            nodeid,
            &[g.as_slice()],
            16 + size.max(8) as usize,
        )
    }

    pub fn removexattr(&self, nodeid: u64, name: &str) -> FResult<()> {
        self.call(FUSE_REMOVEXATTR, nodeid, &[&cstr(name)], 64)
            .map(drop)
    }

    pub fn opendir(&self, nodeid: u64) -> FResult<OpenOut> {
        let o = OpenIn {
            flags: libc::O_RDONLY as u32,
            fuse_flags: 0,
        };
        exact(self.call(FUSE_OPENDIR, nodeid, &[o.as_slice()], 4096)?)
    }

    /// One READDIR(PLUS) call from `offset`, with a buffer of `size` bytes.
    pub fn readdir(
        &self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
        plus: bool,
    ) -> FResult<Vec<DirEnt>> {
        let r = ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        };
        let op = if plus { FUSE_READDIRPLUS } else { FUSE_READDIR };
        let b = self.call(op, nodeid, &[r.as_slice()], 16 + size as usize)?;
        parse_dirents(&b, plus)
    }

    /// Reads a whole directory through repeated READDIR(PLUS) calls.
    pub fn readdir_all(&self, nodeid: u64, plus: bool) -> FResult<Vec<DirEnt>> {
        let o = self.opendir(nodeid)?;
        let mut all = Vec::new();
        let mut off = 0;
        loop {
            let batch = self.readdir(nodeid, o.fh, off, 4096, plus)?;
            let Some(last) = batch.last() else { break };
            off = last.off;
            all.extend(batch);
        }
        self.releasedir(nodeid, o.fh)?;
        Ok(all)
    }

    pub fn access(&self, nodeid: u64, mask: u32) -> FResult<()> {
        let a = AccessIn { mask, padding: 0 };
        self.call(FUSE_ACCESS, nodeid, &[a.as_slice()], 64)
            .map(drop)
    }

    pub fn fallocate(
        &self,
        nodeid: u64,
        fh: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> FResult<()> {
        let f = FallocateIn {
            fh,
            offset,
            length,
            mode,
            padding: 0,
        };
        self.call(FUSE_FALLOCATE, nodeid, &[f.as_slice()], 64)
            .map(drop)
    }

    pub fn lseek(&self, nodeid: u64, fh: u64, offset: u64, whence: u32) -> FResult<u64> {
        let l = LseekIn {
            fh,
            offset,
            whence,
            padding: 0,
        };
        let o: LseekOut = exact(self.call(FUSE_LSEEK, nodeid, &[l.as_slice()], 64)?)?;
        Ok(o.offset)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        nodeid_in: u64,
        fh_in: u64,
        offset_in: u64,
        nodeid_out: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> FResult<u32> {
        let c = CopyFileRangeIn {
            fh_in,
            offset_in,
            nodeid_out,
            fh_out,
            offset_out,
            len,
            flags: 0,
        };
        let w: WriteOut =
            exact(self.call(FUSE_COPY_FILE_RANGE, nodeid_in, &[c.as_slice()], 64)?)?;
        Ok(w.size)
    }

    pub fn syncfs(&self) -> FResult<()> {
        self.call(FUSE_SYNCFS, 1, &[&0u64.to_ne_bytes()], 64)
            .map(drop)
    }

    pub fn destroy(&self) -> FResult<()> {
        self.call(FUSE_DESTROY, 0, &[], 64).map(drop)
    }
}

impl FuseClient {
    /// FUSE_IOCTL as the guest kernel's `fuse_priv_ioctl` sends it (chattr, lsattr, xfs_io):
    /// `cmd` on handle `fh`, with `input` as the in data. Returns the reply's `result` and
    /// out data.
    pub fn ioctl(
        &self,
        nodeid: u64,
        fh: u64,
        flags: u32,
        cmd: u32,
        input: &[u8],
        out_size: u32,
    ) -> FResult<(i32, Vec<u8>)> {
        self.ioctl_sized(nodeid, fh, flags, cmd, input.len() as u32, input, out_size)
    }

    /// FUSE_IOCTL with `in_size` stated independently of the bytes sent (malformed requests).
    #[allow(clippy::too_many_arguments)]
    pub fn ioctl_sized(
        &self,
        nodeid: u64,
        fh: u64,
        flags: u32,
        cmd: u32,
        in_size: u32,
        input: &[u8],
        out_size: u32,
    ) -> FResult<(i32, Vec<u8>)> {
        let i = IoctlIn {
            fh,
            flags,
            cmd,
            arg: 0,
            in_size,
            out_size,
        };
        // Room for any reply vfsd gives (header included), whatever `out_size` claims.
        let resp = 64 + std::mem::size_of::<IoctlOut>() + (out_size as usize).min(4096);
        let b = self.call(FUSE_IOCTL, nodeid, &[i.as_slice(), input], resp)?;
        let o: IoctlOut = decode(&b)?;
        Ok((o.result, b[std::mem::size_of::<IoctlOut>()..].to_vec()))
    }
}
