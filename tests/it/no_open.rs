//! `--no-open`: OPEN answered ENOSYS so the guest kernel stops sending OPEN and RELEASE,
//! then every file request names handle 0 and vfsd serves it from the node's own fd; and
//! FOPEN_NOFLUSH where a FLUSH would carry nothing.

use std::os::unix::fs::MetadataExt;

use crate::common::{errno, require_root, run_vfsd, serving_pid, Daemon, Tmpfs, ROOT};
use fuse_backend_rs::abi::fuse_abi::SetattrIn;
use vfsd::frontend::fuse::*;
use vfsd::frontend::FrontendConfig;

const POSIX_LOCKS: u64 = 1 << 1;
const ATOMIC_O_TRUNC: u64 = 1 << 3;
const FLOCK_LOCKS: u64 = 1 << 10;
const FOPEN_NOFLUSH: u32 = 1 << 5;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_FH: u32 = 1 << 6;
const OWNER: u64 = 0xa;

/// A client whose INIT offers what the guest kernel offers that `--no-open` touches.
fn client(d: &Daemon) -> (FuseClient, u64) {
    let c = FuseClient::new(d.frontend(Default::default()));
    let out = c
        .init_ext(
            38,
            POSIX_LOCKS | ATOMIC_O_TRUNC | FLOCK_LOCKS | (1 << 9) | (1 << 22),
        )
        .unwrap();
    (c, out.flags as u64)
}

/// The access modes (O_RDONLY, O_WRONLY, O_RDWR) of the serving process's fds that are
/// open for I/O (not O_PATH) on a regular file of the share. Files are matched by device
/// and inode, not by name: the sandboxed daemon's paths are its own, and its standard
/// streams may be files anywhere on the host.
fn io_fds_in_share(d: &Daemon) -> Vec<u32> {
    let pid = serving_pid(d.pid());
    let mut files = std::collections::HashSet::new();
    let mut dirs = vec![d.share.clone()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                dirs.push(e.path());
            } else if m.is_file() {
                files.insert((m.dev(), m.ino()));
            }
        }
    }
    let mut modes = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        // The magic link reaches the open file whatever namespace its path is in.
        let Ok(m) = std::fs::metadata(e.path()) else {
            continue;
        };
        if !files.contains(&(m.dev(), m.ino())) {
            continue;
        }
        let fd = e.file_name().to_string_lossy().into_owned();
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
            .unwrap_or(0);
        if flags & libc::O_PATH as u32 == 0 {
            modes.push(flags & libc::O_ACCMODE as u32);
        }
    }
    modes
}

#[test]
fn without_open_messages_a_file_is_created_written_read_and_truncated_by_node() {
    let d = Daemon::start(&["--no-open", "--cache", "always"]);
    let (c, flags) = client(&d);
    // The guest kernel would truncate on OPEN and release flocks and OFD locks on RELEASE:
    // neither comes, so truncates come as SETATTR and locks stay in the guest.
    assert_eq!(flags & ATOMIC_O_TRUNC, 0, "ATOMIC_O_TRUNC offered");
    assert_eq!(flags & FLOCK_LOCKS, 0, "FLOCK_LOCKS offered");
    assert_eq!(flags & POSIX_LOCKS, 0, "POSIX_LOCKS offered");

    // CREATE's handle would need a RELEASE: the guest kernel makes files with MKNOD.
    assert_eq!(
        errno(c.create(
            ROOT,
            "f",
            libc::O_WRONLY as u32 | libc::O_CREAT as u32,
            0o644
        )),
        libc::ENOSYS
    );
    let n = c.mknod(ROOT, "f", libc::S_IFREG | 0o644, 0).unwrap().nodeid;
    // Written through a write-only guest open, read back: the node's fd serves both.
    assert_eq!(c.write(n, 0, 0, b"hello, node").unwrap(), 11);
    assert_eq!(c.read(n, 0, 0, 64).unwrap(), b"hello, node");
    assert_eq!(std::fs::read(d.path("f")).unwrap(), b"hello, node");
    assert_eq!(errno(c.open(n, libc::O_RDONLY as u32)), libc::ENOSYS);
    // An O_TRUNC open is the guest kernel's SETATTR then, with handle 0.
    let s = SetattrIn {
        valid: FATTR_SIZE | FATTR_FH,
        fh: 0,
        size: 5,
        ..Default::default()
    };
    assert_eq!(c.setattr(n, &s).unwrap().attr.size, 5);
    assert_eq!(std::fs::read(d.path("f")).unwrap(), b"hello");
    c.fsync(n, 0, false).unwrap();
    // A RELEASE of handle 0 (a hostile guest's) is harmless.
    c.release(n, 0).unwrap();
    assert_eq!(c.read(n, 0, 0, 64).unwrap(), b"hello");

    // A file made on the host is read by node after a LOOKUP alone.
    std::fs::write(d.path("g"), b"from the host").unwrap();
    let g = c.lookup(ROOT, "g").unwrap().nodeid;
    assert_eq!(c.read(g, 0, 0, 64).unwrap(), b"from the host");
    // Handle 0 is for regular files only.
    let dir = c.mkdir(ROOT, "d", 0o755).unwrap().nodeid;
    assert_eq!(errno(c.read(dir, 0, 0, 64)), libc::EBADF);
}

#[test]
fn handle_zero_is_no_handle_without_no_open() {
    let d = Daemon::start(&["--cache", "always"]);
    std::fs::write(d.path("f"), b"data").unwrap();
    let (c, _) = client(&d);
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    assert_eq!(errno(c.read(n, 0, 0, 64)), libc::EBADF);
    assert_eq!(errno(c.write(n, 0, 0, b"x")), libc::EBADF);
    let (_, o) = c
        .create(
            ROOT,
            "new",
            libc::O_RDWR as u32 | libc::O_CREAT as u32,
            0o644,
        )
        .unwrap();
    assert_ne!(o.fh, 0);
}

#[test]
fn a_flush_is_refused_on_a_local_share_and_locks_are_the_guests() {
    let d = Daemon::start(&["--no-open"]);
    std::fs::write(d.path("f"), vec![0u8; 100]).unwrap();
    let (c, _) = client(&d);
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    // No lock reaches the host: a FLUSH carries nothing, and ENOSYS stops them.
    assert_eq!(errno(c.flush_owner(n, 0, OWNER)), libc::ENOSYS);
    assert_eq!(
        errno(c.setlk(n, 0, OWNER, Lock::range(0, 99, libc::F_WRLCK, 1))),
        libc::ENOSYS
    );
}

#[test]
#[ignore = "needs root"]
fn opens_say_noflush_only_where_a_flush_carries_nothing() {
    require_root("tmpfs and bindfs mounts");
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("tmpfs");
    let (src, fuse) = (dir.path().join("src"), dir.path().join("bindfs"));
    for p in [&local, &src, &fuse] {
        std::fs::create_dir(p).unwrap();
    }
    let _tmpfs = Tmpfs::mount(&local, None);
    let _bindfs = crate::fuse_host::Bindfs::mount(&src, &fuse);
    // A FUSE host flushes and reports errors on close: the guest's close must reach it.
    for (share, args, noflush) in [
        (&local, &["--no-posix-lock"][..], true),
        (&local, &[][..], false),
        (&fuse, &["--no-posix-lock"][..], false),
    ] {
        let d = Daemon::start_on(share, args);
        std::fs::write(share.join("f"), b"x").unwrap();
        let (c, _) = client(&d);
        let n = c.lookup(ROOT, "f").unwrap().nodeid;
        let o = c.open(n, libc::O_RDONLY as u32).unwrap();
        let what = format!("{} {args:?}", share.display());
        assert_eq!(o.open_flags & FOPEN_NOFLUSH != 0, noflush, "open, {what}");
        let (_, o) = c
            .create(ROOT, "g", libc::O_RDWR as u32 | libc::O_CREAT as u32, 0o644)
            .unwrap();
        assert_eq!(o.open_flags & FOPEN_NOFLUSH != 0, noflush, "create, {what}");
        std::fs::remove_file(share.join("g")).unwrap();
    }
    // Under --no-open on the FUSE host, a FLUSH is served (the close reaches the host).
    let d = Daemon::start_on(&fuse, &["--no-open"]);
    let (c, _) = client(&d);
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    assert_eq!(c.read(n, 0, 0, 8).unwrap(), b"x");
    c.flush(n, 0).unwrap();
}

#[test]
fn a_readers_node_fd_is_read_only_and_a_writer_gets_one_it_can_write_through() {
    let d = Daemon::start(&["--no-open", "--cache", "always"]);
    std::fs::write(d.path("f1"), b"data").unwrap();
    let (c, _) = client(&d);
    let n = c.lookup(ROOT, "f1").unwrap().nodeid;
    assert_eq!(c.read(n, 0, 0, 8).unwrap(), b"data");
    assert_eq!(
        io_fds_in_share(&d),
        [libc::O_RDONLY as u32],
        "a reader's fd"
    );
    assert_eq!(c.write(n, 0, 4, b"+").unwrap(), 1);
    assert_eq!(io_fds_in_share(&d), [libc::O_RDWR as u32], "after a write");
    assert_eq!(std::fs::read(d.path("f1")).unwrap(), b"data+");
    drop(c);
    drop(d);

    // A read-only share serves reads, and no fd of it is open for writing.
    let d = Daemon::start(&["--no-open", "--readonly"]);
    std::fs::write(d.path("f1"), b"data").unwrap();
    let (c, _) = client(&d);
    let n = c.lookup(ROOT, "f1").unwrap().nodeid;
    assert_eq!(c.read(n, 0, 0, 8).unwrap(), b"data");
    assert_eq!(errno(c.write(n, 0, 0, b"x")), libc::EROFS);
    assert_eq!(io_fds_in_share(&d), [libc::O_RDONLY as u32]);
}

#[test]
#[ignore = "needs root"]
fn an_append_only_file_takes_writes_at_its_end() {
    require_root("chattr +a");
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("tmpfs");
    std::fs::create_dir(&share).unwrap();
    let _tmpfs = Tmpfs::mount(&share, None);
    let d = Daemon::start_on(&share, &["--no-open"]);
    std::fs::write(d.path("f1"), b"log:").unwrap();
    let st = std::process::Command::new("chattr")
        .arg("+a")
        .arg(d.path("f1"))
        .status()
        .unwrap();
    assert!(st.success(), "chattr +a");
    let (c, _) = client(&d);
    let n = c.lookup(ROOT, "f1").unwrap().nodeid;
    let w = c.write(n, 0, 4, b"one");
    let _ = std::process::Command::new("chattr")
        .arg("-a")
        .arg(d.path("f1"))
        .status();
    assert_eq!(w.unwrap(), 3);
    assert_eq!(std::fs::read(d.path("f1")).unwrap(), b"log:one");
}

#[test]
fn a_migration_from_no_open_needs_no_open_on_the_destination() {
    let src = Daemon::start(&["--no-open"]);
    std::fs::write(src.path("f"), b"data").unwrap();
    let (c, _) = client(&src);
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    assert_eq!(c.read(n, 0, 0, 8).unwrap(), b"data");
    let state = c.fe.save_state().unwrap();

    let plain = Daemon::start_on(&src.share.clone(), &[]);
    let to_plain = FuseClient::new(plain.frontend(FrontendConfig::default()));
    assert!(
        to_plain.fe.load_state(&state).is_err(),
        "a destination without --no-open took it"
    );

    let same = Daemon::start_on(&src.share.clone(), &["--no-open"]);
    let to_same = FuseClient::new(same.frontend(FrontendConfig::default()));
    to_same.fe.load_state(&state).unwrap();
    assert_eq!(to_same.read(n, 0, 0, 8).unwrap(), b"data");
}

#[test]
fn node_fds_are_bounded_and_go_when_the_guest_forgets_the_node() {
    // Writing the files takes longer than the write idle time: the fds for writing stay
    // for the count.
    let d = Daemon::start(&[
        "--no-open",
        "--cache",
        "always",
        "--no-open-write-idle-ms",
        "600000",
    ]);
    let (c, _) = client(&d);
    let before = io_fds_in_share(&d).len();
    // The bound is 4096, or a quarter of the fd limit vfsd runs with.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", serving_pid(d.pid()))).unwrap();
    let nofile: usize = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap()
        .parse()
        .unwrap();
    let bound = (nofile / 4).clamp(16, 4096);
    let mut nodes = Vec::new();
    for i in 0..bound + 100 {
        let n = c
            .mknod(ROOT, &format!("f{i}"), libc::S_IFREG | 0o644, 0)
            .unwrap()
            .nodeid;
        c.write(n, 0, 0, b"x").unwrap();
        nodes.push(n);
    }
    let held = io_fds_in_share(&d).len() - before;
    assert!(
        held <= bound && held + bound / 16 >= bound,
        "{held} node fds for {} files written (bound {bound})",
        bound + 100
    );
    // Every file still works, its fd opened again when it was let go.
    for &n in nodes.iter().take(200) {
        assert_eq!(c.read(n, 0, 0, 8).unwrap(), b"x");
    }
    for chunk in nodes.chunks(200) {
        c.batch_forget(&chunk.iter().map(|&n| (n, 1)).collect::<Vec<_>>())
            .unwrap();
    }
    // FORGET has no reply: a request after it is served after it on the same queue.
    c.getattr(ROOT).unwrap();
    assert_eq!(
        io_fds_in_share(&d).len(),
        before,
        "node fds left after FORGET"
    );
    let ino = std::fs::metadata(d.path("f0")).unwrap().ino();
    assert_ne!(ino, 0);
}

#[test]
fn no_open_needs_a_cache_mode_that_keeps_file_data() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    for mode in ["never", "metadata"] {
        let (code, err) = run_vfsd(&[
            "--socket-path",
            sock.to_str().unwrap(),
            "--shared-dir",
            "/",
            "--no-open",
            "--cache",
            mode,
        ]);
        assert_eq!(code, Some(1), "{mode}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("--no-open"), "{err}");
    }
}

/// Sends `op` with `parts` on handle 0 of file "f" (holding "data") while a host process
/// holds a lease on it, checks that the queue serves GETATTRs while the request waits,
/// and gives the file's bytes once the lease is gone and the request succeeded.
fn served_once_a_host_lease_is_gone(op: u32, what: &str, parts: &[&[u8]]) -> Vec<u8> {
    let d = Daemon::start(&["--no-open", "--thread-pool-size", "4"]);
    std::fs::write(d.path("f"), b"data").unwrap();
    let (mut c, _) = client(&d);
    // Well under lease-break-time (45 s), when a blocked open would end.
    c.timeout = std::time::Duration::from_secs(5);
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    // The queue is alone, so a short request is tried on its thread.
    for _ in 0..32 {
        c.getattr(ROOT).unwrap();
    }
    crate::common::HostLease::take(&d.path("f"))
        .served_once_gone(&c, what, || c.submit(1, op, n, parts, 256));
    std::fs::read(d.path("f")).unwrap()
}

#[test]
fn a_write_whose_node_fd_waits_on_a_host_lease_waits_in_the_pool_while_the_queue_goes_on() {
    // A WRITE is short enough to be served on the queue thread. Its node's first fd for
    // writing waits for a host lease break: that wait belongs to a worker.
    use fuse_backend_rs::abi::fuse_abi::WriteIn;
    use vm_memory::ByteValued;
    let w = WriteIn {
        fh: 0,
        offset: 4,
        size: 1,
        ..Default::default()
    };
    let data = served_once_a_host_lease_is_gone(FUSE_WRITE, "WRITE", &[w.as_slice(), b"!"]);
    assert_eq!(data, b"data!");
}

#[test]
fn an_o_trunc_open_of_a_leased_file_waits_for_the_lease_in_the_pool() {
    // Under --no-open the guest's open(O_TRUNC) is a SETATTR of the size on handle 0: it
    // waits for the lease in the pool, as an O_TRUNC OPEN would, instead of failing with
    // EAGAIN.
    use vm_memory::ByteValued;
    let s = SetattrIn {
        valid: FATTR_SIZE | FATTR_FH,
        fh: 0,
        size: 0,
        ..Default::default()
    };
    let data = served_once_a_host_lease_is_gone(FUSE_SETATTR, "SETATTR", &[s.as_slice()]);
    assert_eq!(data, b"");
}

/// How long a writer's node fd outlives the guest's last write (docs/features.md): two
/// seconds idle, seen by a reaper that looks every half second.
const WRITE_IDLE_AT_MOST: std::time::Duration = std::time::Duration::from_millis(2500);

/// Past `WRITE_IDLE_AT_MOST`, for a busy machine.
fn wait_out_the_write_idle_time() {
    std::thread::sleep(WRITE_IDLE_AT_MOST + std::time::Duration::from_millis(1000));
}

/// Runs the host file at `path`: its exit code, or the errno its execve failed with.
fn run_on_host(path: &std::path::Path) -> Result<i32, i32> {
    match std::process::Command::new(path).status() {
        Ok(st) => Ok(st.code().unwrap_or(-1)),
        Err(e) => Err(e.raw_os_error().unwrap_or(0)),
    }
}

#[test]
fn a_program_the_guest_wrote_runs_on_the_host_once_its_writes_are_idle() {
    let d = Daemon::start(&["--no-open", "--cache", "always"]);
    let (c, _) = client(&d);
    // The guest's `cp` of an executable: MKNOD, WRITEs on handle 0, and no close that
    // reaches vfsd.
    let prog = c
        .mknod(ROOT, "prog", libc::S_IFREG | 0o755, 0)
        .unwrap()
        .nodeid;
    let script = b"#!/bin/sh\nexit 7\n";
    assert_eq!(c.write(prog, 0, 0, script).unwrap(), script.len() as u32);
    // While the guest writes, the host sees a file open for writing, as with a host writer.
    assert_eq!(run_on_host(&d.path("prog")), Err(libc::ETXTBSY));
    assert_eq!(io_fds_in_share(&d), [libc::O_RDWR as u32], "while written");
    wait_out_the_write_idle_time();
    assert_eq!(run_on_host(&d.path("prog")), Ok(7));
    assert_eq!(
        io_fds_in_share(&d),
        Vec::<u32>::new(),
        "a writer's fd left open"
    );
    // The guest reads it on, through a read-only fd.
    assert_eq!(c.read(prog, 0, 0, 64).unwrap(), script);
    assert_eq!(
        io_fds_in_share(&d),
        [libc::O_RDONLY as u32],
        "a reader's fd"
    );
    assert_eq!(run_on_host(&d.path("prog")), Ok(7));
}

/// An inotify watch that counts IN_CLOSE_WRITE events on one file.
struct CloseWriteWatch(std::os::fd::OwnedFd);

impl CloseWriteWatch {
    fn new(path: &std::path::Path) -> CloseWriteWatch {
        use std::os::fd::FromRawFd;
        // SAFETY: a plain syscall; the fd it returns is ours.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just opened and is owned here alone.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated path, our inotify fd.
        let wd = unsafe {
            libc::inotify_add_watch(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                p.as_ptr(),
                libc::IN_CLOSE_WRITE,
            )
        };
        assert!(wd >= 0, "{}", std::io::Error::last_os_error());
        CloseWriteWatch(fd)
    }

    /// The events that came since the last call.
    fn closes(&self) -> usize {
        let mut buf = [0u8; 4096];
        let mut n = 0;
        loop {
            // SAFETY: reads into a live buffer of its length.
            let r = unsafe {
                libc::read(
                    std::os::fd::AsRawFd::as_raw_fd(&self.0),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if r <= 0 {
                return n;
            }
            // Events on a watched file carry no name: each is a bare inotify_event.
            n += r as usize / std::mem::size_of::<libc::inotify_event>();
        }
    }
}

#[test]
fn a_write_after_the_idle_close_opens_the_file_again_and_readers_keep_their_fd() {
    let d = Daemon::start(&["--no-open", "--cache", "always"]);
    std::fs::write(d.path("r"), b"read me").unwrap();
    let (c, _) = client(&d);
    let r = c.lookup(ROOT, "r").unwrap().nodeid;
    assert_eq!(c.read(r, 0, 0, 64).unwrap(), b"read me");
    let f = c.mknod(ROOT, "f", libc::S_IFREG | 0o644, 0).unwrap().nodeid;
    let watch = CloseWriteWatch::new(&d.path("f"));
    // Writes a second apart, for longer than the idle time, go through one fd.
    for (i, b) in b"one".iter().enumerate() {
        if i > 0 {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        assert_eq!(c.write(f, 0, i as u64, &[*b]).unwrap(), 1);
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(watch.closes(), 0, "closed while written");
    let mut modes = io_fds_in_share(&d);
    modes.sort();
    assert_eq!(modes, [libc::O_RDONLY as u32, libc::O_RDWR as u32]);

    wait_out_the_write_idle_time();
    // The host sees the writer's close; the reader's fd stays.
    assert_eq!(watch.closes(), 1, "IN_CLOSE_WRITE at the idle close");
    assert_eq!(io_fds_in_share(&d), [libc::O_RDONLY as u32]);
    assert_eq!(c.read(r, 0, 0, 64).unwrap(), b"read me");
    // A later write opens the file again, and lands.
    assert_eq!(c.write(f, 0, 3, b"two").unwrap(), 3);
    assert_eq!(std::fs::read(d.path("f")).unwrap(), b"onetwo");
    assert_eq!(c.read(f, 0, 0, 64).unwrap(), b"onetwo");
    // A truncate is a write too: its fd goes the same way.
    let s = SetattrIn {
        valid: FATTR_SIZE | FATTR_FH,
        fh: 0,
        size: 3,
        ..Default::default()
    };
    assert_eq!(c.setattr(f, &s).unwrap().attr.size, 3);
    wait_out_the_write_idle_time();
    assert_eq!(
        watch.closes(),
        1,
        "IN_CLOSE_WRITE after the second idle time"
    );
    assert_eq!(io_fds_in_share(&d), [libc::O_RDONLY as u32]);
    assert_eq!(std::fs::read(d.path("f")).unwrap(), b"one");
    assert_eq!(c.read(f, 0, 0, 64).unwrap(), b"one");
}
