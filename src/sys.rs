//! Thin wrappers over the system calls the passthrough filesystem needs.
//!
//! Every path taken from the guest is resolved with an `*at()` call relative to a
//! directory fd, never from the daemon's working directory.

use std::ffi::{CStr, CString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Turns a libc return value into an `io::Result`, reading errno on -1.
pub fn cvt<T: PartialEq + From<i8>>(ret: T) -> io::Result<T> {
    if ret == T::from(-1) {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

pub const EMPTY: &CStr = c"";

/// `pipe2(2)` with O_CLOEXEC: the read end, then the write end.
/// Takes ownership of fds an SCM_RIGHTS message just installed, each made close-on-exec
/// (recvmsg without MSG_CMSG_CLOEXEC gives them without).
///
/// # Safety
/// Every fd in `fds` must be open and owned by nothing else.
pub unsafe fn adopt_received(fds: &[RawFd]) -> Vec<OwnedFd> {
    fds.iter()
        .map(|&f| {
            // SAFETY: the caller owns `f` and hands it over; fcntl on it only sets a flag.
            unsafe {
                libc::fcntl(f, libc::F_SETFD, libc::FD_CLOEXEC);
                OwnedFd::from_raw_fd(f)
            }
        })
        .collect()
}

pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new fds into the array, which we then own.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both fds are new and ours alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `openat(2)`; the returned fd is always close-on-exec.
pub fn openat(dir: RawFd, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string; the kernel validates `dir`.
    let fd = cvt(unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: a successful openat returns a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Takes O_NONBLOCK off an open file's status flags.
pub fn clear_nonblock(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL and F_SETFL read and set flags of an fd; no memory is passed.
    let fl = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK) })?;
    Ok(())
}

/// The decimal name of `fd` inside `/proc/self/fd`, used to reopen O_PATH fds.
pub fn fd_name(fd: RawFd) -> FdName {
    let mut buf = [0u8; 12];
    // Digits from the right, then the sign; the last byte stays the NUL.
    let (mut at, mut n) = (buf.len() - 1, fd.unsigned_abs());
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if fd < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    FdName { buf, start: at }
}

/// An fd's name in /proc/self/fd, on the stack: made for every request that names a node
/// there, so it costs no allocation. 12 bytes hold `-2147483648` and its NUL.
#[derive(Clone, Copy)]
pub struct FdName {
    buf: [u8; 12],
    start: usize,
}

impl std::ops::Deref for FdName {
    type Target = CStr;

    fn deref(&self) -> &CStr {
        // Digits (and a sign) from `start`, then the one NUL at the end.
        CStr::from_bytes_with_nul(&self.buf[self.start..]).expect("fd name")
    }
}

/// Attributes of a file plus the id of the mount it lives on.
#[derive(Clone, Copy)]
pub struct StatX {
    pub st: libc::stat64,
    pub mnt_id: u64,
    /// Birth time (seconds, nanoseconds), where the file system keeps one.
    pub btime: Option<(i64, u32)>,
}

/// `statx(2)` relative to `dir`, converted to the `stat64` FUSE wants.
pub fn statx(dir: RawFd, name: &CStr, flags: i32) -> io::Result<StatX> {
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    let mask = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID | libc::STATX_BTIME;
    // SAFETY: `stx` is a writable buffer of the right size and `name` is NUL-terminated.
    cvt(unsafe { libc::statx(dir, name.as_ptr(), flags, mask, stx.as_mut_ptr()) })?;
    // SAFETY: statx succeeded and filled the structure (it was zeroed before anyway).
    let stx = unsafe { stx.assume_init() };
    // SAFETY: stat64 is plain old data, all-zero is a valid value.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    st.st_dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    st.st_ino = stx.stx_ino;
    st.st_mode = stx.stx_mode as u32;
    st.st_nlink = stx.stx_nlink as _;
    st.st_uid = stx.stx_uid;
    st.st_gid = stx.stx_gid;
    st.st_rdev = libc::makedev(stx.stx_rdev_major, stx.stx_rdev_minor);
    st.st_size = stx.stx_size as i64;
    st.st_blksize = stx.stx_blksize as _;
    st.st_blocks = stx.stx_blocks as i64;
    st.st_atime = stx.stx_atime.tv_sec;
    st.st_atime_nsec = stx.stx_atime.tv_nsec as _;
    st.st_mtime = stx.stx_mtime.tv_sec;
    st.st_mtime_nsec = stx.stx_mtime.tv_nsec as _;
    st.st_ctime = stx.stx_ctime.tv_sec;
    st.st_ctime_nsec = stx.stx_ctime.tv_nsec as _;
    let mnt_id = if stx.stx_mask & libc::STATX_MNT_ID != 0 {
        stx.stx_mnt_id
    } else {
        0
    };
    let btime = (stx.stx_mask & libc::STATX_BTIME != 0)
        .then_some((stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec));
    Ok(StatX { st, mnt_id, btime })
}

/// Attributes of the file `fd` refers to (O_PATH fds included); symlinks are not followed.
pub fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat64> {
    Ok(statx(
        fd.as_raw_fd(),
        EMPTY,
        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
    )?
    .st)
}

/// The size of an open file, read from the host: `lseek(SEEK_END)` asks the kernel for
/// i_size without a full stat. (It moves the fd's position, which positional I/O ignores.)
pub fn file_size(fd: &impl AsRawFd) -> io::Result<u64> {
    // SAFETY: plain syscall on a caller-owned fd.
    let r = unsafe { libc::lseek64(fd.as_raw_fd(), 0, libc::SEEK_END) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u64)
}

/// Rejects names a guest must not be able to use as one path component.
pub fn check_name(name: &CStr) -> io::Result<()> {
    let b = name.to_bytes();
    if b.is_empty() || b.contains(&b'/') {
        return Err(errno(libc::EINVAL));
    }
    if b.len() > 255 {
        return Err(errno(libc::ENAMETOOLONG));
    }
    Ok(())
}

pub fn is_dot_or_dotdot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// Switches the calling thread's filesystem uid/gid for creating files as the guest caller,
/// restoring root's on drop. `setfsuid`/`setfsgid` act on the calling thread only, which is
/// what a worker serving one request at a time needs.
pub struct FsCred {
    /// The daemon runs as root, so it can take the caller's ids and groups.
    privileged: bool,
    /// The thread's filesystem ids are the caller's until drop.
    switched: bool,
    /// The thread's supplementary groups before `switch_with_groups` changed them.
    groups: Option<Vec<libc::gid_t>>,
}

impl FsCred {
    /// As `switch`, and with `groups` as the thread's supplementary groups, so the host
    /// kernel's group-membership checks (e.g. keeping S_ISGID on a new file) see them.
    pub fn switch_with_groups(uid: u32, gid: u32, groups: &[u32]) -> io::Result<FsCred> {
        let mut cred = Self::switch(uid, gid)?;
        // Even for a root caller: with CAP_FSETID dropped (`--modcaps`) the groups matter.
        if groups.is_empty() || !cred.privileged {
            return Ok(cred);
        }
        let mut old = vec![0 as libc::gid_t; 64];
        // The raw syscalls act on this thread alone; glibc's wrappers would change every
        // thread of the process.
        // SAFETY: the kernel writes at most old.len() ids into the buffer.
        let n = unsafe { libc::syscall(libc::SYS_getgroups, old.len() as i32, old.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        old.truncate(n as usize);
        // SAFETY: groups is a live slice of gid_t-sized ids of the given length.
        let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        cred.groups = Some(old);
        Ok(cred)
    }

    pub fn switch(uid: u32, gid: u32) -> io::Result<FsCred> {
        let mut cred = FsCred {
            privileged: false,
            switched: false,
            groups: None,
        };
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // An unprivileged daemon creates files as itself, as virtiofsd does.
            return Ok(cred);
        }
        cred.privileged = true;
        // SAFETY: getegid has no preconditions.
        if uid == 0 && gid == 0 && unsafe { libc::getegid() } == 0 {
            // The thread's ids are root's already (they follow euid and egid, and each
            // switch restores them on drop): a root caller's create costs no setfsuid
            // and setfsgid round. A daemon started with another group still switches.
            return Ok(cred);
        }
        // SAFETY: setfsgid/setfsuid only change this thread's credentials.
        unsafe {
            libc::setfsgid(gid);
            libc::setfsuid(uid);
            // setfsuid reports the previous id, so read back the current one to check.
            if libc::setfsuid(u32::MAX) as u32 != uid || libc::setfsgid(u32::MAX) as u32 != gid {
                libc::setfsuid(0);
                libc::setfsgid(0);
                return Err(errno(libc::EPERM));
            }
        }
        cred.switched = true;
        Ok(cred)
    }
}

impl Drop for FsCred {
    fn drop(&mut self) {
        if let Some(g) = self.groups.take() {
            // SAFETY: restores this thread's supplementary groups from a live slice.
            unsafe { libc::syscall(libc::SYS_setgroups, g.len(), g.as_ptr()) };
        }
        if self.switched {
            // SAFETY: restores this thread's filesystem ids to root's.
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(0);
            }
        }
    }
}

/// Borrows `fd` as a `std::fs::File` for APIs that want `&mut File`, without taking ownership.
pub fn with_file<R>(fd: &impl AsRawFd, f: impl FnOnce(&mut std::fs::File) -> R) -> R {
    // SAFETY: the caller keeps `fd` open for the whole call, and ManuallyDrop stops the
    // temporary File from closing it.
    let mut file =
        std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd.as_raw_fd()) });
    f(&mut file)
}

/// Largest file handle the kernel produces (MAX_HANDLE_SZ).
const MAX_HANDLE_SZ: usize = 128;

/// A `struct file_handle` from name_to_handle_at: names a file without holding it open.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileHandle {
    /// handle_bytes (u32), handle_type (i32), then f_handle: the kernel's layout.
    raw: Box<[u8]>,
}

impl FileHandle {
    /// The kernel's `struct file_handle` bytes (for the migration state).
    pub fn as_bytes(&self) -> &[u8] {
        &self.raw
    }

    /// A handle from bytes `as_bytes` gave, possibly from another host: its length field
    /// must match and stay within MAX_HANDLE_SZ, so the kernel reads nothing past it.
    pub fn from_bytes(b: &[u8]) -> io::Result<FileHandle> {
        if b.len() < 8 || b.len() > 8 + MAX_HANDLE_SZ {
            return Err(errno(libc::EINVAL));
        }
        let len = u32::from_ne_bytes(b[..4].try_into().unwrap()) as usize;
        if len != b.len() - 8 {
            return Err(errno(libc::EINVAL));
        }
        Ok(FileHandle { raw: b.into() })
    }
}

/// `readlinkat(dir, name)` into a PATH_MAX buffer: the link's bytes (a result of PATH_MAX
/// bytes may have been cut short).
pub fn readlinkat(dir: RawFd, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: the kernel writes at most buf.len() bytes; `name` is NUL-terminated.
    let n =
        cvt(unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    buf.truncate(n as usize);
    Ok(buf)
}

/// A new fd (close-on-exec) for the open file description `fd` refers to.
pub fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl F_DUPFD_CLOEXEC on a caller's fd; the kernel checks it.
    let n = cvt(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: a fresh fd nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// `name_to_handle_at(fd, "", AT_EMPTY_PATH)`: a handle and the mount id of `fd`'s file.
pub fn name_to_handle(fd: RawFd) -> io::Result<(FileHandle, u64)> {
    let mut buf = vec![0u8; 8 + MAX_HANDLE_SZ];
    buf[..4].copy_from_slice(&(MAX_HANDLE_SZ as u32).to_ne_bytes());
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `buf` holds a struct file_handle with room for MAX_HANDLE_SZ bytes, as its
    // handle_bytes field says; `mount_id` is a valid out pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd,
            EMPTY.as_ptr(),
            buf.as_mut_ptr(),
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let len = u32::from_ne_bytes(buf[..4].try_into().unwrap()) as usize;
    buf.truncate(8 + len.min(MAX_HANDLE_SZ));
    Ok((
        FileHandle {
            raw: buf.into_boxed_slice(),
        },
        mount_id as u64,
    ))
}

/// Whether file handles of `fd`'s file system still open after the host kernel has
/// evicted the inode. Not on FUSE (fuse, fuseblk): that needs FUSE_EXPORT_SUPPORT from
/// the server, which userspace can't see and GlusterFS's client goes without
/// (open_by_handle_at then fails with ESTALE). Not on FAT either, whose handles only
/// find inodes still in the cache.
pub fn handles_outlive_eviction(fd: RawFd) -> io::Result<bool> {
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    const MSDOS_SUPER_MAGIC: i64 = 0x4d44;
    Ok(!matches!(
        fs_type(fd)?,
        FUSE_SUPER_MAGIC | MSDOS_SUPER_MAGIC
    ))
}

/// The `f_type` of the file system `fd` is on.
fn fs_type(fd: RawFd) -> io::Result<i64> {
    // SAFETY: fstatfs writes one struct statfs into `st`, which is large enough for it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

/// Whether closing a file on `fd`'s file system does nothing a process could see: a local
/// disk or memory file system. Network and cluster file systems, FUSE and stacking file
/// systems (which may sit on one of those) write data back and report errors on close();
/// so does anything not named here, and a type that can't be read.
pub fn close_is_silent(fd: &OwnedFd) -> bool {
    const LOCAL: [i64; 11] = [
        0xef53,      // ext2, ext3, ext4
        0x5846_5342, // XFS
        0x9123_683e, // Btrfs
        0x0102_1994, // tmpfs
        0x8584_58f6, // ramfs
        0xf2f5_2010, // F2FS
        0xca45_1a4e, // bcachefs
        0x2fc1_2fc1, // ZFS
        0x5265_4973, // ReiserFS
        0x3153_464a, // JFS
        0x4d44,      // FAT
    ];
    matches!(fs_type(fd.as_raw_fd()), Ok(t) if LOCAL.contains(&t))
}

/// `open_by_handle_at(mount_fd, handle, flags)`; needs CAP_DAC_READ_SEARCH.
pub fn open_by_handle(mount_fd: RawFd, h: &FileHandle, flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: `h.raw` is a complete struct file_handle as name_to_handle_at wrote it; the
    // kernel only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd,
            h.raw.as_ptr(),
            flags | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The gid of group `name` from the host's group database, or None if there is none.
pub fn group_id(name: &str) -> io::Result<Option<libc::gid_t>> {
    let cname = CString::new(name).map_err(|_| errno(libc::EINVAL))?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: all-zero is a valid `struct group`; getgrnam_r fills it.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call and `buf` is as long as we say.
        let r = unsafe {
            libc::getgrnam_r(
                cname.as_ptr(),
                &mut grp,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut out,
            )
        };
        match r {
            0 if out.is_null() => return Ok(None),
            0 => return Ok(Some(grp.gr_gid)),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            e => return Err(errno(e)),
        }
    }
}

/// The `*xattrat` calls (Linux 6.13), numbered alike on every architecture; the libc crate
/// does not define them for x86_64 yet.
pub const SYS_SETXATTRAT: libc::c_long = 463;
pub const SYS_GETXATTRAT: libc::c_long = 464;
pub const SYS_LISTXATTRAT: libc::c_long = 465;
pub const SYS_REMOVEXATTRAT: libc::c_long = 466;

/// `struct xattr_args` of the `*xattrat` calls.
#[repr(C)]
struct XattrArgs {
    value: u64,
    size: u32,
    flags: u32,
}

/// Set once the kernel answers ENOSYS to an `*xattrat` call, or `probe_xattrat` finds them
/// refused.
static NO_XATTRAT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Tries `getxattrat` once on `path` (a directory's name) inside `dir`, before any request:
/// a seccomp profile vfsd runs under that predates the `*xattrat` calls (Linux 6.13) may
/// answer EPERM rather than ENOSYS, and reading a `user.*` name of a directory fails with
/// neither otherwise. Either one sends every xattr call to the path form instead. Says
/// which way xattrs go.
pub fn probe_xattrat(dir: RawFd, path: &CStr) -> &'static str {
    let args = XattrArgs {
        value: 0,
        size: 0,
        flags: 0,
    };
    // SAFETY: NUL-terminated strings; a size of 0 lets the kernel write nothing.
    let r = unsafe {
        libc::syscall(
            SYS_GETXATTRAT,
            dir,
            path.as_ptr(),
            0,
            c"user.vfsd.probe".as_ptr(),
            &args as *const XattrArgs,
            std::mem::size_of::<XattrArgs>(),
        )
    };
    // What a kernel without the call, or a profile refusing it, answers.
    let refused = |r: io::Result<i64>| {
        matches!(
            r.map_err(|e| e.raw_os_error()),
            Err(Some(libc::ENOSYS | libc::EPERM))
        )
    };
    if !refused(cvt(r)) {
        return "the *xattrat calls";
    }
    NO_XATTRAT.store(true, std::sync::atomic::Ordering::Relaxed);
    // The path calls need a working directory of the thread's own (unshare CLONE_FS),
    // which a container's profile may refuse without CAP_SYS_ADMIN: tried on a thread
    // of its own, so this one keeps the process's working directory.
    let cwd_refused = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: NUL-terminated strings; a size of 0 lets the kernel write nothing.
            refused(
                in_dir(dir, || unsafe {
                    libc::getxattr(
                        path.as_ptr(),
                        c"user.vfsd.probe".as_ptr(),
                        std::ptr::null_mut(),
                        0,
                    ) as i64
                })
                .map(|n| n as i64),
            )
        })
        .join()
        .unwrap_or(true)
    });
    if cwd_refused {
        NO_PATH_FORM.store(true, std::sync::atomic::Ordering::Relaxed);
        return "f*xattr calls on regular files and directories opened for them (the \
                *xattrat calls and unshare are refused)";
    }
    "the path calls from a thread's own working directory (the *xattrat calls are missing \
     or refused)"
}

/// Set by `probe_xattrat` where neither the `*xattrat` calls nor the path calls from a
/// thread's own working directory may run.
static NO_PATH_FORM: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a file's xattrs can be reached by its /proc/self/fd name (`probe_xattrat`);
/// if not, only regular files and directories have them, through an fd opened for them.
pub fn xattr_path_form() -> bool {
    !NO_PATH_FORM.load(std::sync::atomic::Ordering::Relaxed)
}

/// Runs an xattr call on `path` relative to `dir`, following a final (magic) link: `at`
/// is the `*xattrat` form; `cwd` the older path form, run with this thread's working
/// directory at `dir` where the kernel lacks `*xattrat`.
fn xattr_on_path(
    dir: RawFd,
    at: impl FnOnce() -> i64,
    cwd: impl FnOnce() -> i64,
) -> io::Result<usize> {
    use std::sync::atomic::Ordering;
    if !NO_XATTRAT.load(Ordering::Relaxed) {
        match cvt(at()) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                NO_XATTRAT.store(true, Ordering::Relaxed)
            }
            r => return r.map(|n| n as usize),
        }
    }
    in_dir(dir, cwd)
}

/// Runs `f` with this thread's working directory at `dir`. The thread first gets a
/// working directory of its own (unshare CLONE_FS), so the other threads' stays put.
pub fn in_dir(dir: RawFd, f: impl FnOnce() -> i64) -> io::Result<usize> {
    thread_local!(static OWN_CWD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if !OWN_CWD.get() {
        // SAFETY: plain syscall; it only detaches this thread's fs information.
        cvt(unsafe { libc::unshare(libc::CLONE_FS) })?;
        OWN_CWD.set(true);
    }
    // SAFETY: plain syscall on an fd the caller holds.
    cvt(unsafe { libc::fchdir(dir) })?;
    cvt(f()).map(|n| n as usize)
}

/// getxattr of the file `path` names relative to `dir` (following it); `buf` empty asks
/// for the size.
pub fn getxattr_path(dir: RawFd, path: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let (ptr, len) = (buf.as_mut_ptr(), buf.len());
    let args = XattrArgs {
        value: ptr as u64,
        size: len as u32,
        flags: 0,
    };
    xattr_on_path(
        dir,
        // SAFETY: NUL-terminated strings; the kernel writes at most `len` bytes at `ptr`.
        || unsafe {
            libc::syscall(
                SYS_GETXATTRAT,
                dir,
                path.as_ptr(),
                0,
                name.as_ptr(),
                &args as *const XattrArgs,
                std::mem::size_of::<XattrArgs>(),
            )
        },
        // SAFETY: as above.
        || unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), ptr.cast(), len) as i64 },
    )
}

/// setxattr of the file `path` names relative to `dir` (following it).
pub fn setxattr_path(
    dir: RawFd,
    path: &CStr,
    name: &CStr,
    value: &[u8],
    flags: i32,
) -> io::Result<()> {
    let args = XattrArgs {
        value: value.as_ptr() as u64,
        size: value.len() as u32,
        flags: flags as u32,
    };
    xattr_on_path(
        dir,
        // SAFETY: NUL-terminated strings; the kernel only reads `value`.
        || unsafe {
            libc::syscall(
                SYS_SETXATTRAT,
                dir,
                path.as_ptr(),
                0,
                name.as_ptr(),
                &args as *const XattrArgs,
                std::mem::size_of::<XattrArgs>(),
            )
        },
        // SAFETY: as above.
        || unsafe {
            libc::setxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            ) as i64
        },
    )
    .map(drop)
}

/// listxattr of the file `path` names relative to `dir` (following it).
pub fn listxattr_path(dir: RawFd, path: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let (ptr, len) = (buf.as_mut_ptr(), buf.len());
    xattr_on_path(
        dir,
        // SAFETY: NUL-terminated path; the kernel writes at most `len` bytes at `ptr`.
        || unsafe { libc::syscall(SYS_LISTXATTRAT, dir, path.as_ptr(), 0, ptr, len) },
        // SAFETY: as above.
        || unsafe { libc::listxattr(path.as_ptr(), ptr.cast(), len) as i64 },
    )
}

/// removexattr of the file `path` names relative to `dir` (following it).
pub fn removexattr_path(dir: RawFd, path: &CStr, name: &CStr) -> io::Result<()> {
    xattr_on_path(
        dir,
        // SAFETY: NUL-terminated strings.
        || unsafe { libc::syscall(SYS_REMOVEXATTRAT, dir, path.as_ptr(), 0, name.as_ptr()) },
        // SAFETY: as above.
        || unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) as i64 },
    )
    .map(drop)
}

/// The soft RLIMIT_NOFILE now (1024 if it can't be read).
pub fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the live struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    lim.rlim_cur
}

/// The open fds of the process whose /proc/PID/fd directory `proc_fd` is (an O_PATH fd):
/// the directory's size, where Linux (6.2 and later) gives the count, read from the fd
/// table's bitmap; before that, its entries counted one by one, up to `limit` (None past
/// it: that walk takes time in proportion to the fds, up to RLIMIT_NOFILE's million).
pub fn open_fds(proc_fd: RawFd, limit: usize) -> io::Result<Option<usize>> {
    let st = statx(proc_fd, EMPTY, libc::AT_EMPTY_PATH)?;
    if st.st.st_size > 0 {
        return Ok(Some(st.st.st_size as usize));
    }
    // The count includes the fd it reads the directory through.
    let n = count_entries(proc_fd, limit.saturating_add(1))?;
    Ok((n <= limit).then(|| n.saturating_sub(1)))
}

/// The number of entries in the directory `dir` (an O_PATH fd will do), "." and ".."
/// left out, counted up to `limit` (a larger number stops the count there).
pub fn count_entries(dir: RawFd, limit: usize) -> io::Result<usize> {
    let d = openat(
        dir,
        c".",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )?;
    let mut buf = [0u8; 4096];
    let mut n = 0;
    loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
        let got = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                d.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        let got = cvt(got)? as usize;
        if got == 0 {
            return Ok(n);
        }
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; name }
        let mut at = 0;
        while at + 19 < got {
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            if reclen < 19 {
                return Err(io::Error::other(
                    "getdents64: a record shorter than its header",
                ));
            }
            let name = &buf[at + 19..(at + reclen).min(got)];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if name != b"." && name != b".." {
                n += 1;
                if n >= limit {
                    return Ok(n);
                }
            }
            at += reclen;
        }
    }
}

/// The resident set size in bytes, from `statm` in the /proc/PID directory that `fd_dir`
/// (its `fd` subdirectory) sits in.
pub fn resident_bytes(fd_dir: RawFd) -> io::Result<u64> {
    let f = openat(fd_dir, c"../statm", libc::O_RDONLY | libc::O_CLOEXEC, 0)?;
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(f), &mut s)?;
    let pages: u64 = (s.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| io::Error::other("statm: no resident field"))?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    Ok(pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_entries_leaves_out_dot_and_dotdot() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..300 {
            std::fs::write(d.path().join(format!("a-long-enough-name-{i}")), b"").unwrap();
        }
        let fd = std::fs::File::open(d.path()).unwrap();
        assert_eq!(count_entries(fd.as_raw_fd(), usize::MAX).unwrap(), 300);
        assert_eq!(count_entries(fd.as_raw_fd(), 100).unwrap(), 100);
    }

    #[test]
    fn open_fds_counts_this_processs_fds() {
        let dir = openat(libc::AT_FDCWD, c"/proc/self/fd", libc::O_PATH, 0).unwrap();
        let before = open_fds(dir.as_raw_fd(), usize::MAX).unwrap().unwrap();
        let more: Vec<_> = (0..50)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        // Other test threads open and close fds too: a margin.
        let after = open_fds(dir.as_raw_fd(), usize::MAX).unwrap().unwrap();
        assert!(
            after >= before + 40 && after <= before + 60,
            "{before} then {after}"
        );
        drop(more);
    }

    #[test]
    fn resident_bytes_reads_this_process() {
        let fd = openat(libc::AT_FDCWD, c"/proc/self/fd", libc::O_PATH, 0).unwrap();
        let rss = resident_bytes(fd.as_raw_fd()).unwrap();
        assert!(rss > 100_000 && rss < 100 << 30, "{rss}");
    }

    #[test]
    fn fd_names_are_the_decimal_numbers() {
        for fd in [0, 7, 10, 99, 1234, RawFd::MAX, -1, RawFd::MIN] {
            assert_eq!(fd_name(fd).to_str().unwrap(), fd.to_string());
        }
    }

    /// The thread's filesystem uid, read without changing it.
    fn fsuid() -> u32 {
        // SAFETY: setfsuid(-1) changes nothing and reports the current fsuid.
        unsafe { libc::setfsuid(u32::MAX) as u32 }
    }

    /// A caller's ids last until drop, a root caller's leave root's in place, and a file
    /// created meanwhile belongs to the caller (when the test runs as root).
    #[test]
    fn fs_cred_switches_to_the_caller_and_back() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let root = FsCred::switch(0, 0).unwrap();
        // SAFETY: getegid has no preconditions.
        assert_eq!(root.switched, unsafe { libc::getegid() } != 0);
        assert_eq!(fsuid(), 0);
        drop(root);
        let user = FsCred::switch(4321, 4322).unwrap();
        assert!(user.privileged && user.switched);
        assert_eq!(fsuid(), 4321);
        std::fs::write(dir.path().join("f"), b"").unwrap();
        drop(user);
        assert_eq!(fsuid(), 0);
        let st = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!(
            (
                std::os::unix::fs::MetadataExt::uid(&st),
                std::os::unix::fs::MetadataExt::gid(&st)
            ),
            (4321, 4322)
        );
    }

    /// The fallback for kernels without `*xattrat`: path calls on a /proc/self/fd name
    /// from a thread's own working directory, leaving the other threads' alone.
    #[test]
    fn xattrs_through_a_thread_cwd_at_proc_self_fd() {
        let dir = tempfile::tempdir().unwrap();
        let file =
            CString::new(dir.path().join("f").into_os_string().into_encoded_bytes()).unwrap();
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let before = std::env::current_dir().unwrap();
        let pfd = openat(libc::AT_FDCWD, &file, libc::O_PATH, 0).unwrap();
        let proc_fd = openat(
            libc::AT_FDCWD,
            c"/proc/self/fd",
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .unwrap();
        let (dirfd, name) = (proc_fd.as_raw_fd(), fd_name(pfd.as_raw_fd()));
        let n = name;
        std::thread::spawn(move || {
            in_dir(dirfd, || {
                // SAFETY: NUL-terminated strings and a live value.
                let r = unsafe {
                    libc::setxattr(n.as_ptr(), c"user.t".as_ptr(), c"v".as_ptr().cast(), 1, 0)
                };
                r as i64
            })
            .unwrap();
            let cwd = std::fs::read_link("/proc/thread-self/cwd").unwrap();
            assert!(cwd.ends_with("fd"), "{cwd:?}");
        })
        .join()
        .unwrap();
        assert_eq!(
            std::env::current_dir().unwrap(),
            before,
            "other threads keep theirs"
        );
        let mut buf = [0u8; 8];
        assert_eq!(getxattr_path(dirfd, &name, c"user.t", &mut buf).unwrap(), 1);
        assert_eq!(&buf[..1], b"v");
    }
}
