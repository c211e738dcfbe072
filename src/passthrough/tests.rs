//! Unit tests of the filesystem layer, called directly (no transport).

use std::ffi::CString;

use crate::filesystem::{FileSystem, OpenWait};
use fuse_backend_rs::api::filesystem::{Context, ROOT_ID};

use super::{Config, PassthroughFs};

fn fs() -> (tempfile::TempDir, PassthroughFs) {
    let d = tempfile::tempdir().unwrap();
    let fs = PassthroughFs::new(Config::new(d.path())).unwrap();
    (d, fs)
}

fn name(s: &str) -> CString {
    CString::new(s).unwrap()
}

#[test]
fn hard_links_share_one_node_and_forget_closes_its_fd() {
    let (d, fs) = fs();
    std::fs::write(d.path().join("a"), b"x").unwrap();
    std::fs::hard_link(d.path().join("a"), d.path().join("b")).unwrap();
    let ctx = Context::default();
    let a = fs.lookup(&ctx, ROOT_ID, &name("a")).unwrap();
    let b = fs.lookup(&ctx, ROOT_ID, &name("b")).unwrap();
    assert_eq!(a.inode, b.inode);
    assert_eq!(fs.inodes.len(), 2, "root plus one node for both names");
    let node = std::sync::Arc::downgrade(&fs.inodes.get(a.inode).unwrap());
    assert_eq!(node.upgrade().unwrap().lookups(), 2);
    fs.forget(&ctx, a.inode, 1);
    assert!(node.upgrade().is_some(), "one lookup still held");
    fs.forget(&ctx, a.inode, 1);
    assert!(fs.inodes.get(a.inode).is_err());
    // Nothing holds the node any more, so its O_PATH fd is closed.
    assert!(node.upgrade().is_none());
}

#[test]
fn readdirplus_undoes_the_lookup_of_an_entry_that_did_not_fit() {
    let (d, fs) = fs();
    for i in 0..5 {
        std::fs::write(d.path().join(format!("f{i}")), b"").unwrap();
    }
    let ctx = Context::default();
    let (fh, _) = fs.opendir(&ctx, ROOT_ID, 0).unwrap();
    let mut delivered = Vec::new();
    fs.readdirplus(&ctx, ROOT_ID, fh, 4096, 0, &mut |d, e| {
        if d.name == b"." || d.name == b".." {
            return Ok(1);
        }
        if delivered.len() == 2 {
            return Ok(0); // "buffer full"
        }
        delivered.push(e.inode);
        Ok(1)
    })
    .unwrap();
    assert_eq!(delivered.len(), 2);
    // Only the delivered entries hold a lookup; the refused third one was forgotten.
    assert_eq!(fs.inodes.len(), 1 + 2);
    for id in delivered {
        assert_eq!(fs.inodes.get(id).unwrap().lookups(), 1);
    }
}

#[test]
fn names_are_single_components() {
    let (_d, fs) = fs();
    let ctx = Context::default();
    for bad in ["a/b", "/etc", "../x"] {
        let e = fs.lookup(&ctx, ROOT_ID, &name(bad)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{bad}");
    }
    assert_eq!(
        fs.lookup(&ctx, ROOT_ID, &name("..")).unwrap().inode,
        ROOT_ID
    );
}

#[test]
fn open_options_follow_the_cache_policy() {
    let d = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(d.path());
    cfg.cache = super::CachePolicy::Never;
    let fs = PassthroughFs::new(cfg).unwrap();
    let bits = fs.file_open_options(libc::O_RDWR as u32).bits();
    assert_ne!(bits & super::FOPEN_PARALLEL_DIRECT_WRITES, 0);
    assert_ne!(bits & 1, 0, "FOPEN_DIRECT_IO");
    let mut cfg = Config::new(d.path());
    cfg.parallel_direct_writes = false;
    cfg.allow_direct_io = true;
    let fs = PassthroughFs::new(cfg).unwrap();
    assert_eq!(
        fs.file_open_options((libc::O_RDWR | libc::O_DIRECT) as u32)
            .bits()
            & super::FOPEN_PARALLEL_DIRECT_WRITES,
        0
    );
}

#[test]
fn truncate_is_exclusive_and_counted() {
    let (d, fs) = fs();
    std::fs::write(d.path().join("f"), vec![1u8; 8192]).unwrap();
    let ctx = Context::default();
    let e = fs.lookup(&ctx, ROOT_ID, &name("f")).unwrap();
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    st.st_size = 100;
    let (a, _) = fs
        .setattr(
            &ctx,
            e.inode,
            st,
            None,
            fuse_backend_rs::abi::fuse_abi::SetattrValid::SIZE,
        )
        .unwrap();
    assert_eq!(a.st_size, 100);
    let s = fs.inodes.get(e.inode).unwrap().io.stats();
    assert_eq!((s.exclusive_writes, s.exclusive_violations), (1, 0));
}

#[test]
fn writes_inside_the_known_size_do_not_ask_the_host_again() {
    let (d, fs) = fs();
    let path = d.path().join("f");
    std::fs::write(&path, vec![0u8; 65536]).unwrap();
    let ctx = Context::default();
    let e = fs.lookup(&ctx, ROOT_ID, &name("f")).unwrap();
    let (fh, _) = fs
        .open_file(&ctx, e.inode, libc::O_RDWR as u32, 0, OpenWait::Allowed)
        .unwrap();
    let buf = vec![7u8; 4096];
    let write = |off: u64| {
        let iov = [libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        }];
        // SAFETY: `buf` outlives the call and pwritev only reads it.
        let n = unsafe { fs.write_iov(e.inode, fh, off, &iov, None, 0) }.unwrap();
        assert_eq!(n, 4096);
    };
    let stats = || fs.inodes.get(e.inode).unwrap().io.stats();
    // Sixteen writes inside EOF: one size query, all shared.
    for i in 0..16 {
        write(i * 4096);
    }
    let s = stats();
    assert_eq!(
        (s.shared_writes, s.exclusive_writes, s.size_checks),
        (16, 0, 1)
    );
    // Past EOF: exclusive; then the new end is known without asking.
    write(65536);
    write(65536);
    let s = stats();
    assert_eq!((s.shared_writes, s.exclusive_writes), (17, 1));
    assert_eq!(s.size_checks, 2);
    // A truncate forgets the size: a write past the new end is exclusive again.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    st.st_size = 4096;
    let valid = fuse_backend_rs::abi::fuse_abi::SetattrValid::SIZE;
    fs.setattr(&ctx, e.inode, st, Some(fh), valid).unwrap();
    let before = stats().exclusive_writes;
    write(8192);
    assert_eq!(
        stats().exclusive_writes,
        before + 1,
        "extends after a truncate"
    );
    // Shrunk behind vfsd's back (another host): a GETATTR sees the new size.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    fs.getattr(&ctx, e.inode, None).unwrap();
    let before = stats().exclusive_writes;
    write(0);
    assert_eq!(
        stats().exclusive_writes,
        before + 1,
        "extends after a host truncate"
    );
    assert_eq!(stats().exclusive_violations, 0);
}

#[test]
fn an_open_that_must_not_wait_keeps_only_the_flags_the_guest_asked_for() {
    // OpenWait::Never opens with O_NONBLOCK to learn of a lease; the handle must not keep
    // it (a FUSE host filesystem would see it in every request), unless the guest asked.
    let (d, fs) = fs();
    std::fs::write(d.path().join("f"), b"x").unwrap();
    let ctx = Context::default();
    let e = fs.lookup(&ctx, ROOT_ID, &name("f")).unwrap();
    let status = |flags: i32, wait| {
        let (fh, _) = fs.open_file(&ctx, e.inode, flags as u32, 0, wait).unwrap();
        let h = fs.handles.get(fh, e.inode).unwrap();
        // SAFETY: F_GETFL on an fd the handle owns; no memory is passed.
        let fl = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&h.fd), libc::F_GETFL) };
        assert!(fl >= 0);
        fl & (libc::O_NONBLOCK | libc::O_ACCMODE)
    };
    for wait in [OpenWait::Allowed, OpenWait::Never] {
        assert_eq!(status(libc::O_RDWR, wait), libc::O_RDWR, "{wait:?}");
        assert_eq!(
            status(libc::O_RDONLY | libc::O_NONBLOCK, wait),
            libc::O_NONBLOCK,
            "{wait:?}"
        );
    }
}
