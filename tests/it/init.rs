//! FUSE_INIT as vfsd negotiates it (not the crate): the full 64-bit flags through
//! INIT_EXT, the protocol minor, and `--allow-mmap`'s FUSE_DIRECT_IO_ALLOW_MMAP.

use crate::common::{Daemon, ROOT, SECURITY_CTX};
use fuse_backend_rs::abi::fuse_abi::{InitIn, InitOut};
use vfsd::frontend::fuse::*;
use vfsd::frontend::FrontendConfig;

const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
const INIT_EXT: u32 = 1 << 30;
const ASYNC_READ: u64 = 1;

fn fresh(d: &Daemon) -> FuseClient {
    FuseClient::new(d.frontend(FrontendConfig::default()))
}

fn flags64(o: &InitOut) -> u64 {
    o.flags as u64 | (o.flags2 as u64) << 32
}

#[test]
fn allow_mmap_is_negotiated_through_the_second_flags_word() {
    let d = Daemon::start(&["--cache", "never", "--allow-mmap"]);
    let c = fresh(&d);
    let out = c
        .init_ext(44, ASYNC_READ | DIRECT_IO_ALLOW_MMAP | SECURITY_CTX)
        .unwrap();
    assert_eq!((out.major, out.minor), (7, 40));
    let f = flags64(&out);
    assert_ne!(f & DIRECT_IO_ALLOW_MMAP, 0, "flags {f:#x}");
    assert_ne!(out.flags & INIT_EXT, 0, "flags2 is only read with INIT_EXT");
    assert_eq!(
        f & SECURITY_CTX,
        0,
        "not asked for: --security-label is off"
    );
    assert_ne!(f & ASYNC_READ, 0);
    // The session works after it.
    c.lookup(ROOT, "nothing").unwrap_err();
    c.getattr(1).unwrap();
}

#[test]
fn without_allow_mmap_the_flag_stays_off() {
    let d = Daemon::start(&["--cache", "never"]);
    let out = fresh(&d)
        .init_ext(44, ASYNC_READ | DIRECT_IO_ALLOW_MMAP)
        .unwrap();
    assert_eq!(flags64(&out) & DIRECT_IO_ALLOW_MMAP, 0);
    assert_eq!(out.flags2, 0);
    assert_eq!(out.flags & INIT_EXT, 0);
}

#[test]
fn libvirt_spelling_of_allow_mmap() {
    let d = Daemon::start(&["--cache", "never", "-o", "allow_mmap"]);
    let out = fresh(&d).init_ext(44, DIRECT_IO_ALLOW_MMAP).unwrap();
    assert_ne!(flags64(&out) & DIRECT_IO_ALLOW_MMAP, 0);
}

#[test]
fn a_flag_in_the_second_word_is_ignored_without_init_ext() {
    // The guest sends the 7.36 second half but does not set INIT_EXT: it must not count.
    let d = Daemon::start(&["--allow-mmap"]);
    let c = fresh(&d);
    let mut second = [0u8; 48];
    second[..4].copy_from_slice(&((DIRECT_IO_ALLOW_MMAP >> 32) as u32).to_ne_bytes());
    let i = InitIn {
        major: 7,
        minor: 44,
        max_readahead: 65536,
        flags: ASYNC_READ as u32,
    };
    let b = c
        .call(
            FUSE_INIT,
            0,
            &[vm_memory::ByteValued::as_slice(&i), &second],
            4096,
        )
        .unwrap();
    let out: InitOut = decode(&b).unwrap();
    assert_eq!(out.flags2, 0);
}

#[test]
fn init_ext_without_the_second_half_is_einval() {
    let d = Daemon::start(&[]);
    let c = fresh(&d);
    let i = InitIn {
        major: 7,
        minor: 44,
        max_readahead: 65536,
        flags: INIT_EXT,
    };
    let e = c
        .call(FUSE_INIT, 0, &[vm_memory::ByteValued::as_slice(&i)], 4096)
        .unwrap_err();
    assert!(matches!(e, FuseError::Errno(libc::EINVAL)), "{e:?}");
    // A proper INIT after it still works.
    c.init().unwrap();
    c.getattr(1).unwrap();
}

#[test]
fn an_older_guest_gets_its_own_minor_and_no_second_word() {
    let d = Daemon::start(&["--allow-mmap"]);
    let out = fresh(&d)
        .init_ext(31, ASYNC_READ | DIRECT_IO_ALLOW_MMAP)
        .unwrap();
    assert_eq!(out.minor, 31);
    assert_eq!(out.flags2, 0);
}

/// With FUSE_ATOMIC_O_TRUNC the guest kernel leaves an O_TRUNC open's truncation to OPEN,
/// before it looks for a program running from the file (tests/guest/running_program.rs
/// shows the program emptied): vfsd never offers it, in any cache mode.
#[test]
fn atomic_o_trunc_is_never_offered() {
    const ATOMIC_O_TRUNC: u64 = 1 << 3;
    for cache in ["never", "auto", "always", "metadata"] {
        let d = Daemon::start(&["--cache", cache]);
        let out = fresh(&d).init_ext(44, ASYNC_READ | ATOMIC_O_TRUNC).unwrap();
        assert_eq!(flags64(&out) & ATOMIC_O_TRUNC, 0, "--cache {cache}");
    }
}

#[test]
fn max_write_and_max_pages_match_the_request_limit() {
    let d = Daemon::start(&[]);
    let out = fresh(&d).init().unwrap();
    assert_eq!(out.max_pages, 256);
    assert_eq!(out.max_write, 1 << 20);
}

/// A guest that reboots without DESTROY (a reset, a crash) sends a new INIT on the same
/// connection: everything the old boot held goes, as DESTROY lets it go. Its flock (on a
/// handle's host fd), its POSIX locks, its handles, and its nodes, so an unlinked file it
/// kept open is no longer pinned on the host.
#[test]
fn a_new_init_releases_everything_the_old_session_held() {
    use std::os::fd::AsRawFd;
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), vec![0u8; 4096]).unwrap();
    std::fs::write(d.path("gone"), vec![1u8; 1 << 20]).unwrap();
    let c = d.client();
    let f = c.lookup(ROOT, "f").unwrap();
    let h = c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
    c.setlk(f.nodeid, h, 7, Lock::flock(libc::F_WRLCK)).unwrap();
    let h2 = c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
    c.setlk(f.nodeid, h2, 8, Lock::range(0, 9, libc::F_WRLCK, 1))
        .unwrap();
    let g = c.lookup(ROOT, "gone").unwrap();
    let gh = c.open(g.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    c.unlink(ROOT, "gone").unwrap();
    let host_flock_free = || {
        let file = std::fs::File::open(d.path("f")).unwrap();
        // SAFETY: plain syscall on an fd we own.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    };
    assert!(!host_flock_free(), "the guest's flock is on the host");
    let before = d.stats();
    assert!(before["live_inodes"].as_u64().unwrap() >= 3);
    assert_eq!(before["open_handles"].as_u64().unwrap(), 3);

    // The reboot: a new INIT, no DESTROY.
    c.init().unwrap();
    assert!(
        host_flock_free(),
        "the old boot's flock outlived the new INIT"
    );
    let after = d.stats();
    assert_eq!(after["open_handles"].as_u64().unwrap(), 0);
    assert_eq!(
        after["live_inodes"].as_u64().unwrap(),
        1,
        "only the root stays known"
    );
    assert_eq!(after["locks_held"].as_u64().unwrap(), 0);
    assert!(
        c.read(g.nodeid, gh, 0, 4096).is_err(),
        "an old handle still works"
    );
    assert!(c.getattr(f.nodeid).is_err(), "an old node still works");
    // The new boot starts afresh.
    let f = c.lookup(ROOT, "f").unwrap();
    let h = c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
    c.setlk(f.nodeid, h, 7, Lock::flock(libc::F_WRLCK)).unwrap();
    c.release_flock(f.nodeid, h, 7).unwrap();
}
