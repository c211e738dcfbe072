//! Test harness: runs the real `vfsd` binary on a temporary share and connects the
//! vhost-user test frontend to its socket.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use vfsd::frontend::fuse::{Caller, FuseClient};
use vfsd::frontend::{Frontend, FrontendConfig};

#[path = "../support/daemon.rs"]
mod support;
use support::read_stats;
pub use support::DaemonProcess;

/// How long a daemon gets between SIGTERM and SIGKILL when a test drops it.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A vfsd a test spawned itself, to be stopped as `Daemon`s are.
impl From<std::process::Child> for DaemonProcess {
    fn from(child: std::process::Child) -> DaemonProcess {
        DaemonProcess::adopt(child, STOP_GRACE)
    }
}

/// The share's root: FUSE's node id 1.
pub const ROOT: u64 = 1;

/// An unprivileged guest user.
pub const USER: Caller = Caller {
    uid: 1234,
    gid: 2345,
    pid: 77,
};

/// The guest's nobody.
pub const NOBODY: Caller = Caller {
    uid: 65534,
    gid: 65534,
    pid: 4242,
};

/// FUSE_SECURITY_CTX, an INIT flag of the high word (flags2).
pub const SECURITY_CTX: u64 = 1 << 32;

/// vfsd on a share in a temporary directory, with `--stats` there; stopped (SIGTERM, then
/// SIGKILL after 5 s) when dropped, before the directory goes.
pub struct Daemon {
    pub process: DaemonProcess,
    pub dir: tempfile::TempDir,
    pub share: PathBuf,
    pub sock: PathBuf,
    pub stats: PathBuf,
}

pub fn vfsd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_vfsd")
}

impl Daemon {
    /// Starts vfsd on a fresh share with `extra` options and waits for its socket.
    pub fn start(extra: &[&str]) -> Daemon {
        Self::start_in(None, extra)
    }

    /// Starts vfsd sharing an existing directory.
    pub fn start_on(share: &Path, extra: &[&str]) -> Daemon {
        Self::start_in(Some(share.to_path_buf()), extra)
    }

    /// Starts vfsd under a seccomp filter of its parent's that answers EPERM to
    /// `syscalls`, as a container runtime's profile that predates them may.
    pub fn start_denied(syscalls: &[i64], extra: &[&str]) -> Daemon {
        Self::start_denied_under_umask(syscalls, None, extra)
    }

    /// `start_denied`, and with the launcher's umask set to `umask` if given.
    pub fn start_denied_under_umask(
        syscalls: &[i64],
        umask: Option<libc::mode_t>,
        extra: &[&str],
    ) -> Daemon {
        use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
        let rules = syscalls.iter().map(|&n| (n, vec![])).collect();
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            TargetArch::try_from(std::env::consts::ARCH).unwrap(),
        )
        .unwrap();
        let prog: BpfProgram = filter.try_into().unwrap();
        Self::spawn(Path::new(vfsd_bin()), None, extra, move |cmd| {
            use std::os::unix::process::CommandExt;
            // SAFETY: the hook only makes three syscalls (umask, prctl, seccomp) on memory
            // built before the fork; it allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    if let Some(m) = umask {
                        libc::umask(m);
                    }
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    seccompiler::apply_filter(&prog).map_err(std::io::Error::other)
                });
            }
        })
    }

    /// Starts vfsd with `env` added to its environment (a test hook's variable, say).
    pub fn start_with_env(env: &[(&str, &str)], extra: &[&str]) -> Daemon {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::spawn(Path::new(vfsd_bin()), None, extra, move |cmd| {
            cmd.envs(env);
        })
    }

    fn start_in(share: Option<PathBuf>, extra: &[&str]) -> Daemon {
        Self::spawn(Path::new(vfsd_bin()), share, extra, |_| {})
    }

    /// A daemon started from the binary at `bin` (a copy an upgrade can replace).
    pub fn start_from(bin: &Path, extra: &[&str]) -> Daemon {
        Self::spawn(bin, None, extra, |_| {})
    }

    fn spawn(
        bin: &Path,
        share: Option<PathBuf>,
        extra: &[&str],
        hook: impl FnOnce(&mut Command),
    ) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let share = share.unwrap_or_else(|| {
            let s = dir.path().join("share");
            std::fs::create_dir(&s).unwrap();
            s
        });
        let sock = dir.path().join("vfsd.sock");
        let stats = dir.path().join("stats.json");
        // VFSD_TEST_WRAPPER (e.g. "strace -f -o /tmp/trace") runs the daemon under a tool.
        let wrapper = std::env::var("VFSD_TEST_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut cmd = match words.next() {
            Some(tool) => {
                let mut c = Command::new(tool);
                c.args(words).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        hook(&mut cmd);
        cmd.arg("--socket-path")
            .arg(&sock)
            .arg("--shared-dir")
            .arg(&share)
            .arg("--stats")
            .arg(&stats)
            .args(["--stats-interval", "0.05"])
            .args([
                "--log-level",
                &std::env::var("VFSD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            ])
            .args(extra)
            // VFSD_TEST_ARGS adds options to every daemon (e.g. "--inode-file-handles prefer").
            .args(
                std::env::var("VFSD_TEST_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .stdin(Stdio::null());
        let process = DaemonProcess::spawn(&mut cmd, STOP_GRACE).expect("spawn vfsd");
        let mut d = Daemon {
            process,
            dir,
            share,
            sock,
            stats,
        };
        if let Err(e) = d.process.wait_for_socket(&d.sock, Duration::from_secs(20)) {
            panic!("vfsd did not create its socket: {e:?}");
        }
        d
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.share.join(rel)
    }

    pub fn frontend(&self, cfg: FrontendConfig) -> Frontend {
        Frontend::connect(&self.sock, cfg).expect("vhost-user handshake")
    }

    /// A client that has done FUSE INIT.
    pub fn client(&self) -> FuseClient {
        self.client_with(FrontendConfig::default())
    }

    pub fn client_with(&self, cfg: FrontendConfig) -> FuseClient {
        let c = FuseClient::new(self.frontend(cfg));
        c.init().expect("FUSE INIT");
        c
    }

    /// The daemon's statistics, fresh (written after `since`).
    pub fn stats(&self) -> serde_json::Value {
        let start = std::time::SystemTime::now();
        let t = Instant::now();
        loop {
            if let Ok(m) = std::fs::metadata(&self.stats) {
                if m.modified().unwrap() > start {
                    if let Some(v) = read_stats(&self.stats) {
                        return v;
                    }
                }
            }
            assert!(t.elapsed() < Duration::from_secs(10), "no fresh statistics");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the daemon to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.process.wait_exit(timeout)
    }

    pub fn pid(&self) -> i32 {
        self.process.pid() as i32
    }
}

pub fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The names READDIR lists in `dir`, in order.
pub fn dir_names(c: &FuseClient, dir: u64) -> Vec<Vec<u8>> {
    c.readdir_all(dir, false)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect()
}

/// The errno of a reply that must be an error.
pub fn errno<T: std::fmt::Debug>(r: vfsd::frontend::fuse::FResult<T>) -> i32 {
    match r {
        Err(vfsd::frontend::fuse::FuseError::Errno(e)) => e,
        other => panic!("expected an errno reply, got {other:?}"),
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The first line of a test marked `#[ignore = "needs root"]` (scripts/test.sh runs those
/// as root, with `--include-ignored`): run by another user, it fails saying `why`.
pub fn require_root(why: &str) {
    assert!(is_root(), "not root: {why}");
}

/// A small ext4 filesystem on a loop device, for faults a directory can't give: EIO after
/// a shutdown, and what reached the "disk" (the image file) at a simulated power cut.
pub struct LoopFs {
    pub dir: tempfile::TempDir,
    pub image: PathBuf,
    pub mnt: PathBuf,
    mounted: bool,
}

/// ext4's shutdown flags (EXT4_GOING_FLAGS_*).
pub const SHUTDOWN_LOGFLUSH: u32 = 1;
/// Stop at once without committing the journal: what a power cut leaves.
pub const SHUTDOWN_NOLOGFLUSH: u32 = 2;

impl LoopFs {
    /// A fresh `size_mib` ext4 image, mounted (root only).
    pub fn new(size_mib: u64) -> LoopFs {
        require_root("a loop mount needs root");
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size_mib << 20)
            .unwrap();
        let ok = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096"])
            .arg(&image)
            .status()
            .expect("mkfs.ext4 (e2fsprogs)");
        assert!(ok.success(), "mkfs.ext4 failed");
        Self::mount_image(dir, image)
    }

    /// Mounts an existing image (journal recovery runs, as after a crash).
    pub fn mount_image(dir: tempfile::TempDir, image: PathBuf) -> LoopFs {
        let mnt = dir.path().join(format!(
            "mnt-{}",
            image.file_name().unwrap().to_string_lossy()
        ));
        std::fs::create_dir_all(&mnt).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(&image)
            .arg(&mnt)
            .status()
            .unwrap();
        assert!(ok.success(), "mount -o loop {} failed", image.display());
        LoopFs {
            dir,
            image,
            mnt,
            mounted: true,
        }
    }

    /// EXT4_IOC_SHUTDOWN: every later data or metadata change on the mount fails with EIO.
    pub fn shutdown(&self, flags: u32) {
        let root = std::fs::File::open(&self.mnt).unwrap();
        // _IOR('X', 125, __u32)
        let req: libc::c_ulong = (2 << 30) | (4 << 16) | ((b'X' as libc::c_ulong) << 8) | 125;
        // SAFETY: the ioctl reads one u32 from a live local.
        let r = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&root),
                req as _,
                &flags as *const u32,
            )
        };
        assert_eq!(
            r,
            0,
            "EXT4_IOC_SHUTDOWN: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Whether the image file holds `data`'s first block at a (4 KiB) block boundary: what the
    /// filesystem has written to its device, whatever sits in its page cache.
    pub fn image_holds(&self, data: &[u8]) -> bool {
        let img = std::fs::read(&self.image).unwrap();
        let needle = &data[..4096];
        img.chunks_exact(4096).any(|b| b == needle)
    }

    pub fn unmount(&mut self) {
        if std::mem::take(&mut self.mounted) {
            let ok = Command::new("umount").arg(&self.mnt).status();
            if !ok.is_ok_and(|s| s.success()) {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            // Lazy: a sandboxed daemon's mount namespace may still hold the mount.
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// Waits (up to 20 s) for a daemon to create its socket at `sock`.
pub fn wait_for_socket(sock: &Path) {
    let t = Instant::now();
    while !sock.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "vfsd did not create its socket"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs vfsd with `args` to completion: its exit code and its stderr, trimmed.
///
/// Every caller expects vfsd to exit: one still running after `RUN_VFSD_LIMIT` has taken
/// a start it should have refused (a socket in use, a share it can't serve), so it is
/// killed and the test fails, rather than wait for it forever.
pub fn run_vfsd(args: &[&str]) -> (Option<i32>, String) {
    const RUN_VFSD_LIMIT: Duration = Duration::from_secs(10);
    let mut child = Command::new(vfsd_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    // Read as it comes: a full pipe would stop vfsd before it exits.
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > RUN_VFSD_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vfsd {args:?} still ran after {RUN_VFSD_LIMIT:?}: it took a start it should have refused");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), reader.join().unwrap().trim().to_string())
}

/// A tmpfs mounted at `at` for the life of the value (lazily unmounted on drop).
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `options` go to `mount -o` (e.g. "size=1m"); the caller checked for root.
    pub fn mount(at: &Path, options: Option<&str>) -> Tmpfs {
        let mut c = Command::new("mount");
        c.args(["-t", "tmpfs"]);
        if let Some(o) = options {
            c.args(["-o", o]);
        }
        assert!(
            c.arg("vfsd-test").arg(at).status().unwrap().success(),
            "mount -t tmpfs {}",
            at.display()
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A read lease a host process holds on a file: a daemon's open of it for writing then
/// blocks until the lease is dropped (or the kernel's lease-break-time passes). Tests use
/// it to hold a request inside the host kernel for as long as they like.
pub struct HostLease(std::fs::File);

impl HostLease {
    pub fn take(path: &Path) -> HostLease {
        use std::os::fd::AsRawFd;
        // The lease break is announced with SIGIO, whose default action ends the process.
        // SAFETY: installing SIG_IGN has no preconditions.
        unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
        let f = std::fs::File::open(path).unwrap();
        // SAFETY: plain fcntl on an fd we own.
        let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
        assert_eq!(r, 0, "F_SETLEASE: {}", std::io::Error::last_os_error());
        HostLease(f)
    }

    /// Whether someone is waiting for the lease to go (the kernel started breaking it).
    pub fn broken(&self) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: plain fcntl on an fd we own.
        let r = unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_GETLEASE) };
        r == libc::F_UNLCK
    }

    /// Waits until an opener is blocked on the lease.
    pub fn wait_broken(&self) {
        let t = Instant::now();
        while !self.broken() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "nobody opened the leased file"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    /// Sends the request `submit` makes, which must wait for this lease to break; checks
    /// that `c`'s queue answers GETATTRs meanwhile (a blocked queue thread would hold them
    /// back) and that the request still waits, then drops the lease and gives the
    /// request's reply, which must be a success. `what` names the request.
    pub fn served_once_gone(
        self,
        c: &FuseClient,
        what: &str,
        submit: impl FnOnce() -> vfsd::frontend::fuse::FResult<vfsd::frontend::fuse::Ticket>,
    ) -> vfsd::frontend::fuse::Reply {
        let t = submit().unwrap();
        self.wait_broken();
        for _ in 0..4 {
            c.getattr(1).unwrap();
        }
        assert!(self.broken(), "the {what} still waits on the lease");
        drop(self);
        let r = c.wait(t).unwrap();
        assert_eq!(r.error, 0, "the {what} is served once the lease is gone");
        r
    }
}

impl Drop for HostLease {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: plain fcntl on an fd we own.
        unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    }
}

/// The process actually serving for the daemon spawned as `pid`: the supervisor's
/// child, or in the namespace sandbox that child's own child.
pub fn serving_pid(pid: i32) -> i32 {
    let first_child = |p: i32| -> Option<i32> {
        let c = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).ok()?;
        c.split_whitespace().next()?.parse().ok()
    };
    let t = Instant::now();
    let mut serving = loop {
        if let Some(c) = first_child(pid) {
            break c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "vfsd {pid} started no serving process"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // The sandbox's fork comes a moment after the serving process starts.
    std::thread::sleep(Duration::from_millis(100));
    while let Some(c) = first_child(serving) {
        serving = c;
    }
    serving
}

/// A bind mount, undone when dropped.
pub struct BindMount(PathBuf);

impl BindMount {
    pub fn new(src: &Path, at: &Path) -> BindMount {
        let st = Command::new("mount")
            .arg("--bind")
            .arg(src)
            .arg(at)
            .status()
            .unwrap();
        assert!(
            st.success(),
            "mount --bind {} {}",
            src.display(),
            at.display()
        );
        BindMount(at.to_path_buf())
    }
}

impl BindMount {
    /// Unmounts `at` (mounted by the caller) when dropped.
    pub fn adopt(at: &Path) -> BindMount {
        BindMount(at.to_path_buf())
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A name as FUSE requests carry it: NUL-terminated.
pub fn cstr(s: &str) -> Vec<u8> {
    std::ffi::CString::new(s).unwrap().into_bytes_with_nul()
}

/// A path for a libc call.
pub fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// A `security.capability` value: VFS_CAP_REVISION_2 with CAP_NET_RAW (13) permitted and
/// effective.
pub fn file_capability() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(0x0200_0000u32 | 1).to_le_bytes());
    v.extend_from_slice(&(1u32 << 13).to_le_bytes());
    v.extend_from_slice(&[0u8; 12]);
    v
}

/// lgetxattr on the host (a symlink's own xattrs): the value, or the errno.
pub fn host_getxattr(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (p, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    // SAFETY: NUL-terminated strings; the kernel writes at most buf.len() bytes.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// lsetxattr on the host: Ok or the errno.
pub fn host_setxattr(p: &Path, name: &str, v: &[u8]) -> Result<(), i32> {
    let (p, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    // SAFETY: NUL-terminated strings and a live buffer.
    let r = unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(())
    }
}

/// Request extensions (FUSE 7.38) as the guest kernel builds them.
pub mod ext {
    use vfsd::frontend::fuse::{FResult, FuseClient};

    fn block(kind: u32, mut body: Vec<u8>) -> Vec<u8> {
        while !body.len().is_multiple_of(8) {
            body.push(0);
        }
        let mut v = ((8 + body.len()) as u32).to_ne_bytes().to_vec();
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend(body);
        v
    }

    /// One security context (`fuse_secctx_header` with nr_secctx 1).
    pub fn secctx(name: &str, value: &[u8]) -> Vec<u8> {
        let mut body = (value.len() as u32).to_ne_bytes().to_vec();
        body.extend_from_slice(&0u32.to_ne_bytes());
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend_from_slice(value);
        block(1, body)
    }

    /// FUSE_EXT_GROUPS.
    pub fn groups(groups: &[u32]) -> Vec<u8> {
        let mut body = (groups.len() as u32).to_ne_bytes().to_vec();
        for g in groups {
            body.extend_from_slice(&g.to_ne_bytes());
        }
        block(32, body)
    }

    /// Sends `op` with `args` and the extension block `ext` (total_extlen set in the
    /// header).
    pub fn call(
        c: &FuseClient,
        op: u32,
        node: u64,
        args: &[&[u8]],
        ext: &[u8],
    ) -> FResult<Vec<u8>> {
        assert_eq!(ext.len() % 8, 0);
        let mut parts: Vec<&[u8]> = args.to_vec();
        parts.push(ext);
        let (u, mut req) = c.build(op, node, &parts);
        let units = (ext.len() / 8) as u16;
        req[36..38].copy_from_slice(&units.to_ne_bytes());
        let t = c.submit_bytes(1, &req, 4096, u)?;
        c.wait(t)?.ok()
    }
}

/// A host program's OFD lock attempt on `path` (true: granted, then released).
pub fn host_ofd_lock(path: &std::path::Path, typ: i32, start: i64, len: i64) -> bool {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: plain data, zeroed is valid; l_pid 0 as OFD locks require.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    // SAFETY: plain fcntl on an fd we own.
    unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&f), libc::F_OFD_SETLK, &fl) == 0 }
}

pub fn host_flock(path: &std::path::Path, op: i32) -> (bool, std::fs::File) {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: plain syscall on an fd we own.
    let ok = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), op | libc::LOCK_NB) } == 0;
    (ok, f)
}
