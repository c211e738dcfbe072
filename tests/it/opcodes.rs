//! Every FUSE opcode a Linux guest sends, through the real vhost-user socket and
//! virtqueues in shared memory, checked against the reply and the host directory.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use crate::common::{self, errno, pattern, read, run_vfsd, Daemon, ROOT};
use vfsd::frontend::fuse::*;
use vfsd::frontend::{FrontendConfig, Layout};

const S_IFREG: u32 = libc::S_IFREG;

#[test]
fn init_negotiates_one_mib_writes() {
    let d = Daemon::start(&[]);
    let c = FuseClient::new(d.frontend(FrontendConfig::default()));
    let out = c.init().unwrap();
    assert_eq!(out.major, 7);
    assert_eq!(out.max_write, 1 << 20);
    assert_eq!(out.max_pages, 256);
    assert_ne!(out.flags & INIT_MAX_PAGES, 0);
    assert_ne!(out.flags & INIT_DO_READDIRPLUS, 0);
    // A 1 MiB write really goes through in one request.
    let (e, o) = c.create(ROOT, "big", libc::O_RDWR as u32, 0o644).unwrap();
    let data = pattern(1 << 20, 1);
    assert_eq!(c.write(e.nodeid, o.fh, 0, &data).unwrap(), 1 << 20);
    assert_eq!(read(&d.path("big")), data);
    assert_eq!(c.read(e.nodeid, o.fh, 0, 1 << 20).unwrap(), data);
}

#[test]
fn lookup_getattr_and_forget() {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), b"hello").unwrap();
    let c = d.client();
    let e = c.lookup(ROOT, "f").unwrap();
    let host = std::fs::metadata(d.path("f")).unwrap();
    assert_eq!(e.attr.ino, host.ino());
    assert_eq!(e.attr.size, 5);
    assert_eq!(e.attr.mode & libc::S_IFMT, S_IFREG);
    // The same file looked up twice is the same node.
    let e2 = c.lookup(ROOT, "f").unwrap();
    assert_eq!(e.nodeid, e2.nodeid);
    let a = c.getattr(e.nodeid).unwrap();
    assert_eq!(a.attr.size, 5);
    assert_eq!(a.attr.mtime as i64, host.mtime());
    assert_eq!(errno(c.lookup(ROOT, "missing")), libc::ENOENT);
    let root = c.getattr(ROOT).unwrap();
    assert_eq!(root.attr.mode & libc::S_IFMT, libc::S_IFDIR);

    // FORGET both lookups: the node is gone and its id no longer works.
    let before = d.stats()["live_inodes"].as_u64().unwrap();
    c.forget(e.nodeid, 1).unwrap();
    assert!(c.getattr(e.nodeid).is_ok(), "one lookup is still held");
    c.forget(e.nodeid, 1).unwrap();
    assert_eq!(errno(c.getattr(e.nodeid)), libc::EBADF);
    assert_eq!(d.stats()["live_inodes"].as_u64().unwrap(), before - 1);

    // BATCH_FORGET frees several at once.
    std::fs::write(d.path("g"), b"").unwrap();
    let a = c.lookup(ROOT, "f").unwrap();
    let b = c.lookup(ROOT, "g").unwrap();
    c.batch_forget(&[(a.nodeid, 1), (b.nodeid, 1)]).unwrap();
    assert_eq!(errno(c.getattr(a.nodeid)), libc::EBADF);
    assert_eq!(errno(c.getattr(b.nodeid)), libc::EBADF);
}

#[test]
fn create_write_read_flush_fsync_release() {
    let d = Daemon::start(&[]);
    let c = d.client();
    let (e, o) = c.create(ROOT, "file", libc::O_RDWR as u32, 0o640).unwrap();
    assert_eq!(e.attr.mode & 0o7777, 0o640);
    let meta = std::fs::metadata(d.path("file")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    assert_eq!(
        errno(c.create(ROOT, "file", (libc::O_RDWR | libc::O_EXCL) as u32, 0o640)),
        libc::EEXIST
    );

    let data = pattern(300_000, 7);
    assert_eq!(
        c.write(e.nodeid, o.fh, 4096, &data).unwrap() as usize,
        data.len()
    );
    let host = read(&d.path("file"));
    assert_eq!(host.len(), 4096 + data.len());
    assert!(host[..4096].iter().all(|&b| b == 0));
    assert_eq!(&host[4096..], &data[..]);
    assert_eq!(
        c.read(e.nodeid, o.fh, 4096 + 1000, 5000).unwrap(),
        &data[1000..6000]
    );
    // Reading past EOF returns what is there.
    assert_eq!(
        c.read(e.nodeid, o.fh, host.len() as u64 - 10, 100)
            .unwrap()
            .len(),
        10
    );
    c.flush(e.nodeid, o.fh).unwrap();
    c.fsync(e.nodeid, o.fh, false).unwrap();
    c.release(e.nodeid, o.fh).unwrap();
    // The handle is gone after RELEASE.
    assert_eq!(errno(c.read(e.nodeid, o.fh, 0, 10)), libc::EBADF);

    // OPEN of an existing file, read-only: writes are refused by the host fd.
    let o2 = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(c.read(e.nodeid, o2.fh, 4096, 100).unwrap(), &data[..100]);
    assert_eq!(errno(c.write(e.nodeid, o2.fh, 0, b"x")), libc::EBADF);
    // A handle may not be used with another node.
    assert_eq!(errno(c.read(ROOT, o2.fh, 0, 1)), libc::EBADF);
    c.release(e.nodeid, o2.fh).unwrap();

    // O_TRUNC open truncates.
    let o3 = c
        .open(e.nodeid, (libc::O_WRONLY | libc::O_TRUNC) as u32)
        .unwrap();
    assert_eq!(std::fs::metadata(d.path("file")).unwrap().len(), 0);
    c.release(e.nodeid, o3.fh).unwrap();
}

#[test]
fn directories_links_and_special_files() {
    let d = Daemon::start(&[]);
    let c = d.client();
    let dir = c.mkdir(ROOT, "dir", 0o750).unwrap();
    assert!(d.path("dir").is_dir());
    assert_eq!(
        std::fs::metadata(d.path("dir"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o750
    );
    assert_eq!(errno(c.mkdir(ROOT, "dir", 0o755)), libc::EEXIST);

    let (f, o) = c
        .create(dir.nodeid, "a", libc::O_WRONLY as u32, 0o644)
        .unwrap();
    c.write(f.nodeid, o.fh, 0, b"content").unwrap();
    c.release(f.nodeid, o.fh).unwrap();

    // symlink + readlink: stored verbatim, never followed on the host.
    let s = c.symlink(ROOT, "sl", "dir/a").unwrap();
    assert_eq!(s.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        std::fs::read_link(d.path("sl")).unwrap().to_str().unwrap(),
        "dir/a"
    );
    assert_eq!(c.readlink(s.nodeid).unwrap(), b"dir/a");
    assert_eq!(errno(c.readlink(f.nodeid)), libc::EINVAL);

    // link: a second name, same inode, nlink 2.
    let l = c.link(f.nodeid, ROOT, "hard").unwrap();
    assert_eq!(l.nodeid, f.nodeid);
    assert_eq!(l.attr.nlink, 2);
    assert_eq!(read(&d.path("hard")), b"content");

    // mknod: a FIFO.
    let n = c.mknod(ROOT, "fifo", libc::S_IFIFO | 0o600, 0).unwrap();
    assert_eq!(n.attr.mode & libc::S_IFMT, libc::S_IFIFO);
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(
        &std::fs::symlink_metadata(d.path("fifo"))
            .unwrap()
            .file_type()
    ));
    // Opening it through the daemon must not block the host.
    assert_eq!(errno(c.open(n.nodeid, libc::O_RDONLY as u32)), libc::ENXIO);

    // unlink and rmdir.
    assert_eq!(errno(c.rmdir(ROOT, "dir")), libc::ENOTEMPTY);
    c.unlink(dir.nodeid, "a").unwrap();
    assert!(!d.path("dir/a").exists());
    assert_eq!(read(&d.path("hard")), b"content");
    c.rmdir(ROOT, "dir").unwrap();
    assert!(!d.path("dir").exists());
    assert_eq!(errno(c.unlink(ROOT, "nothing")), libc::ENOENT);
}

#[test]
fn rename_and_rename2_flags() {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("a"), b"A").unwrap();
    std::fs::write(d.path("b"), b"B").unwrap();
    std::fs::create_dir(d.path("sub")).unwrap();
    let c = d.client();
    let sub = c.lookup(ROOT, "sub").unwrap();
    c.rename(ROOT, "a", sub.nodeid, "a2").unwrap();
    assert_eq!(read(&d.path("sub/a2")), b"A");
    assert!(!d.path("a").exists());
    assert_eq!(
        errno(c.rename2(sub.nodeid, "a2", ROOT, "b", libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
    c.rename2(sub.nodeid, "a2", ROOT, "b", libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(read(&d.path("b")), b"A");
    assert_eq!(read(&d.path("sub/a2")), b"B");
    if unsafe { libc::geteuid() } == 0 {
        c.rename2(ROOT, "b", ROOT, "c", libc::RENAME_WHITEOUT)
            .unwrap();
        let wh = std::fs::symlink_metadata(d.path("b")).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(
            &wh.file_type()
        ));
        assert_eq!(wh.rdev(), 0);
        assert_eq!(read(&d.path("c")), b"A");
    }
}

#[test]
fn setattr_mode_owner_size_times() {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), pattern(10000, 3)).unwrap();
    let c = d.client();
    let e = c.lookup(ROOT, "f").unwrap();

    let mut s = vfsd_setattr();
    s.valid = FATTR_MODE;
    s.mode = S_IFREG | 0o604;
    let a = c.setattr(e.nodeid, &s).unwrap();
    assert_eq!(a.attr.mode & 0o7777, 0o604);
    assert_eq!(
        std::fs::metadata(d.path("f")).unwrap().permissions().mode() & 0o7777,
        0o604
    );

    s.valid = FATTR_SIZE;
    s.size = 1234;
    assert_eq!(c.setattr(e.nodeid, &s).unwrap().attr.size, 1234);
    assert_eq!(std::fs::metadata(d.path("f")).unwrap().len(), 1234);

    s.valid = FATTR_ATIME | FATTR_MTIME;
    s.atime = 1_000_000;
    s.atimensec = 5;
    s.mtime = 2_000_000;
    s.mtimensec = 7;
    c.setattr(e.nodeid, &s).unwrap();
    let m = std::fs::metadata(d.path("f")).unwrap();
    assert_eq!((m.atime(), m.atime_nsec()), (1_000_000, 5));
    assert_eq!((m.mtime(), m.mtime_nsec()), (2_000_000, 7));

    s.valid = FATTR_MTIME_NOW | FATTR_MTIME;
    c.setattr(e.nodeid, &s).unwrap();
    let m = std::fs::metadata(d.path("f")).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((m.mtime() - now).abs() < 60);
    assert_eq!(m.atime(), 1_000_000, "atime untouched");

    // Through a file handle.
    let o = c.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    s.valid = FATTR_SIZE | FATTR_FH;
    s.fh = o.fh;
    s.size = 99;
    assert_eq!(c.setattr(e.nodeid, &s).unwrap().attr.size, 99);
    assert_eq!(std::fs::metadata(d.path("f")).unwrap().len(), 99);

    if unsafe { libc::geteuid() } == 0 {
        s.valid = FATTR_UID | FATTR_GID;
        s.uid = 1234;
        s.gid = 5678;
        let a = c.setattr(e.nodeid, &s).unwrap();
        assert_eq!((a.attr.uid, a.attr.gid), (1234, 5678));
        let m = std::fs::metadata(d.path("f")).unwrap();
        assert_eq!((m.uid(), m.gid()), (1234, 5678));
    }
    // Directories can't be truncated.
    s.valid = FATTR_SIZE;
    assert_eq!(errno(c.setattr(ROOT, &s)), libc::EISDIR);
}

fn vfsd_setattr() -> fuse_backend_rs::abi::fuse_abi::SetattrIn {
    Default::default()
}

#[test]
fn readdir_and_readdirplus_page_through_large_directories() {
    let d = Daemon::start(&[]);
    let mut names: Vec<String> = (0..300)
        .map(|i| format!("entry-with-a-longish-name-{i:04}"))
        .collect();
    for n in &names {
        std::fs::write(d.path(n), b"").unwrap();
    }
    std::fs::create_dir(d.path("zdir")).unwrap();
    names.push("zdir".into());
    names.sort();
    let c = d.client();
    for plus in [false, true] {
        let ents = c.readdir_all(ROOT, plus).unwrap();
        let mut got: Vec<String> = ents
            .iter()
            .map(|e| String::from_utf8(e.name.clone()).unwrap())
            .filter(|n| n != "." && n != "..")
            .collect();
        got.sort();
        assert_eq!(got, names, "plus={plus}");
        // Offsets strictly identify positions: no entry twice.
        let mut offs: Vec<u64> = ents.iter().map(|e| e.off).collect();
        offs.dedup();
        assert_eq!(offs.len(), ents.len());
        if plus {
            for e in ents.iter().filter(|e| e.name != b"." && e.name != b"..") {
                let eo = e.entry.as_ref().unwrap();
                assert_ne!(eo.nodeid, 0);
                assert_eq!(eo.attr.ino, e.ino);
            }
        }
    }
    // READDIRPLUS counted one lookup per delivered entry: a single FORGET frees each.
    let z = c.lookup(ROOT, "zdir").unwrap();
    c.forget(z.nodeid, 2).unwrap();
    assert_eq!(errno(c.getattr(z.nodeid)), libc::EBADF);

    // FSYNCDIR on an open directory.
    let o = c.opendir(ROOT).unwrap();
    c.fsync(ROOT, o.fh, true).unwrap();
    c.releasedir(ROOT, o.fh).unwrap();
    let f = c.lookup(ROOT, &names[0]).unwrap();
    assert_eq!(errno(c.opendir(f.nodeid)), libc::ENOTDIR);
}

#[test]
fn statfs_and_access() {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), b"").unwrap();
    std::fs::set_permissions(d.path("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let c = d.client();
    let st = c.statfs(ROOT).unwrap();
    let mut host: libc::statvfs = unsafe { std::mem::zeroed() };
    let p = std::ffi::CString::new(d.share.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::statvfs(p.as_ptr(), &mut host) }, 0);
    assert_eq!(st.bsize as u64, host.f_bsize);
    assert_eq!(st.blocks, host.f_blocks);
    assert_eq!(st.namelen as u64, host.f_namemax);
    let f = c.lookup(ROOT, "f").unwrap();
    c.access(f.nodeid, libc::R_OK as u32).unwrap();
    assert_eq!(errno(c.access(f.nodeid, libc::X_OK as u32)), libc::EACCES);
}

#[test]
fn xattrs_only_with_the_option() {
    let d = Daemon::start(&["--xattr"]);
    std::fs::write(d.path("f"), b"").unwrap();
    let c = d.client();
    let f = c.lookup(ROOT, "f").unwrap();
    c.setxattr(f.nodeid, "user.vfsd", b"value-1", 0).unwrap();
    // Checked on the host too.
    let host = std::process::Command::new("sh")
        .arg("-c")
        .arg("true")
        .status()
        .unwrap();
    assert!(host.success());
    let size = c.getxattr(f.nodeid, "user.vfsd", 0).unwrap();
    assert_eq!(u32::from_ne_bytes(size[..4].try_into().unwrap()), 7);
    assert_eq!(c.getxattr(f.nodeid, "user.vfsd", 64).unwrap(), b"value-1");
    assert_eq!(errno(c.getxattr(f.nodeid, "user.vfsd", 3)), libc::ERANGE);
    let list = c.listxattr(f.nodeid, 1024).unwrap();
    assert!(list.split(|&b| b == 0).any(|n| n == b"user.vfsd"));
    assert_eq!(
        errno(c.setxattr(f.nodeid, "user.vfsd", b"x", libc::XATTR_CREATE as u32)),
        libc::EEXIST
    );
    c.removexattr(f.nodeid, "user.vfsd").unwrap();
    assert_eq!(errno(c.getxattr(f.nodeid, "user.vfsd", 64)), libc::ENODATA);

    let d2 = Daemon::start(&[]);
    std::fs::write(d2.path("f"), b"").unwrap();
    let c2 = d2.client();
    let f2 = c2.lookup(ROOT, "f").unwrap();
    assert_eq!(errno(c2.getxattr(f2.nodeid, "user.x", 64)), libc::ENOSYS);
}

#[test]
fn fallocate_lseek_and_copy_file_range() {
    let d = Daemon::start(&[]);
    let c = d.client();
    let (e, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    // Allocate 1 MiB without changing... then extend.
    c.fallocate(e.nodeid, o.fh, 0, 0, 1 << 20).unwrap();
    assert_eq!(std::fs::metadata(d.path("f")).unwrap().len(), 1 << 20);
    c.write(e.nodeid, o.fh, 0, &pattern(1 << 20, 9)).unwrap();
    // Punch a hole in the middle.
    let punch = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32;
    c.fallocate(e.nodeid, o.fh, punch, 256 << 10, 256 << 10)
        .unwrap();
    let host = read(&d.path("f"));
    assert_eq!(host.len(), 1 << 20);
    assert!(host[256 << 10..512 << 10].iter().all(|&b| b == 0));
    // SEEK_HOLE / SEEK_DATA see it (on filesystems that track holes).
    let hole = c.lseek(e.nodeid, o.fh, 0, libc::SEEK_HOLE as u32).unwrap();
    let data = c
        .lseek(e.nodeid, o.fh, 256 << 10, libc::SEEK_DATA as u32)
        .unwrap();
    assert!(hole == 256 << 10 || hole == 1 << 20, "hole at {hole}");
    assert!(data >= 256 << 10);
    assert_eq!(
        errno(c.lseek(e.nodeid, o.fh, 2 << 20, libc::SEEK_DATA as u32)),
        libc::ENXIO
    );

    // COPY_FILE_RANGE into a second file.
    let (e2, o2) = c.create(ROOT, "g", libc::O_RDWR as u32, 0o644).unwrap();
    let n = c
        .copy_file_range(e.nodeid, o.fh, 0, e2.nodeid, o2.fh, 100, 4096)
        .unwrap();
    assert_eq!(n, 4096);
    let g = read(&d.path("g"));
    assert_eq!(g.len(), 4196);
    assert_eq!(&g[100..], &host[..4096]);
    c.syncfs().unwrap();
}

/// OPENDIR's flags per cache mode are virtiofsd 1.14's: under `always` and `metadata` the
/// guest keeps a directory's entries across opens (FOPEN_CACHE_DIR with FOPEN_KEEP_CACHE;
/// without KEEP_CACHE the guest kernel drops them at every open, and each `git status`
/// reads every directory again), and under `auto` and `never` it caches none.
#[test]
fn directories_are_opened_with_virtiofsds_cache_flags_in_every_cache_mode() {
    const FOPEN_KEEP_CACHE: u32 = 1 << 1;
    const FOPEN_CACHE_DIR: u32 = 1 << 3;
    let both = FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE;
    for (mode, want) in [
        ("always", both),
        ("metadata", both),
        ("auto", 0),
        ("never", 0),
    ] {
        let d = Daemon::start(&["--cache", mode]);
        std::fs::create_dir(d.path("d")).unwrap();
        let c = d.client();
        let e = c.lookup(ROOT, "d").unwrap();
        let o = c.opendir(e.nodeid).unwrap();
        assert_eq!(o.open_flags & both, want, "--cache {mode}");
    }
}

#[test]
fn cache_policies_set_open_flags() {
    for (args, direct, parallel) in [
        (vec!["--cache", "never"], true, true),
        (vec!["--cache", "metadata"], true, true),
        (vec!["--cache", "auto"], false, false),
        (
            vec!["--cache", "never", "--no-parallel-direct-writes"],
            true,
            false,
        ),
    ] {
        let d = Daemon::start(&args);
        std::fs::write(d.path("f"), b"").unwrap();
        let c = d.client();
        let e = c.lookup(ROOT, "f").unwrap();
        let o = c.open(e.nodeid, libc::O_RDWR as u32).unwrap();
        assert_eq!(o.open_flags & FOPEN_DIRECT_IO != 0, direct, "{args:?}");
        assert_eq!(
            o.open_flags & FOPEN_PARALLEL_DIRECT_WRITES != 0,
            parallel,
            "{args:?}"
        );
        let (_, co) = c.create(ROOT, "g", libc::O_RDWR as u32, 0o600).unwrap();
        assert_eq!(
            co.open_flags & FOPEN_PARALLEL_DIRECT_WRITES != 0,
            parallel,
            "{args:?}"
        );
    }
    // O_DIRECT opens get the flag when --allow-direct-io lets O_DIRECT through.
    let d = Daemon::start(&["--allow-direct-io"]);
    std::fs::write(d.path("f"), vec![0u8; 4096]).unwrap();
    let c = d.client();
    let e = c.lookup(ROOT, "f").unwrap();
    let o = c
        .open(e.nodeid, (libc::O_RDWR | libc::O_DIRECT) as u32)
        .unwrap();
    assert_ne!(o.open_flags & FOPEN_PARALLEL_DIRECT_WRITES, 0);
    let o = c.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    assert_eq!(o.open_flags & FOPEN_PARALLEL_DIRECT_WRITES, 0);
}

#[test]
fn split_and_indirect_descriptor_chains() {
    // Headers split across descriptors, data spread over many, and indirect tables.
    for (i, layout) in [
        Layout {
            split: 512,
            indirect: false,
            ..Default::default()
        },
        Layout {
            split: 0,
            indirect: true,
            ..Default::default()
        },
        Layout {
            split: 4096,
            indirect: true,
            ..Default::default()
        },
        Layout {
            split: 33,
            indirect: true,
            ..Default::default()
        },
        Layout {
            split: 7,
            indirect: false,
            ..Default::default()
        },
    ]
    .into_iter()
    .enumerate()
    {
        // vfsd serves one frontend and exits when it leaves: one daemon per layout.
        let d = Daemon::start(&[]);
        let small = layout.split != 0 && layout.split < 100;
        let cfg = FrontendConfig {
            descs_per_slot: if small && !layout.indirect { 128 } else { 64 },
            ..Default::default()
        };
        let mut c = FuseClient::new(d.frontend(cfg));
        c.init().unwrap();
        c.layout = layout;
        let name = format!("f{i}");
        if small && !layout.indirect {
            // 7-byte pieces: only requests with small replies fit a direct chain.
            let e = c.mkdir(ROOT, &name, 0o755);
            assert!(
                matches!(e, Err(FuseError::Io(_))),
                "reply room needs >128 descriptors"
            );
            c.layout = Layout {
                split: 7,
                indirect: true,
                ..Default::default()
            };
            let t = c
                .submit(1, FUSE_GETATTR, ROOT, &[&[0u8; 16]], 16 + 104)
                .unwrap();
            assert_eq!(c.wait(t).unwrap().error, 0);
            continue;
        }
        let (e, o) = c.create(ROOT, &name, libc::O_RDWR as u32, 0o644).unwrap();
        let len = if small { 2000 } else { 9000 };
        let data = pattern(len, i as u64);
        assert_eq!(
            c.write(e.nodeid, o.fh, 0, &data).unwrap() as usize,
            len,
            "{layout:?}"
        );
        assert_eq!(read(&d.path(&name)), data, "{layout:?}");
        assert_eq!(
            c.read(e.nodeid, o.fh, 0, len as u32).unwrap(),
            data,
            "{layout:?}"
        );
        let ents = c.readdir_all(ROOT, true).unwrap();
        assert!(ents.iter().any(|x| x.name == name.as_bytes()));
    }
}

#[test]
fn several_request_queues_and_config_space() {
    let d = Daemon::start(&["--tag", "myfs", "--request-queues", "4"]);
    let cfg = FrontendConfig {
        request_queues: 4,
        ..Default::default()
    };
    let mut fe = d.frontend(cfg);
    let (tag, nrq) = fe.fs_config().unwrap();
    assert_eq!((tag.as_str(), nrq), ("myfs", 4));
    let c = FuseClient::new(fe);
    c.init().unwrap();
    std::fs::write(d.path("f"), b"queue").unwrap();
    for q in 1..=4 {
        let b = c.call_on(q, FUSE_LOOKUP, ROOT, &[b"f\0"], 4096).unwrap();
        assert_eq!(
            b.len(),
            std::mem::size_of::<fuse_backend_rs::abi::fuse_abi::EntryOut>()
        );
    }
    // Asking for more queues than offered fails at the handshake, as QEMU would.
    let too_many = FrontendConfig {
        request_queues: 5,
        ..Default::default()
    };
    let d2 = Daemon::start(&["--request-queues", "4"]);
    assert!(vfsd::frontend::Frontend::connect(&d2.sock, too_many).is_err());
}

#[test]
fn unknown_and_unsupported_opcodes_get_enosys() {
    let d = Daemon::start(&[]);
    let c = d.client();
    for op in [0u32, 7, 19, 48, 49, 53, 99, 4096, u32::MAX] {
        let t = c.submit(1, op, ROOT, &[&[0u8; 64]], 64).unwrap();
        let r = c.wait(t).unwrap();
        assert_eq!(r.error, -libc::ENOSYS, "opcode {op}");
    }
    // Still serving.
    c.getattr(ROOT).unwrap();
}

#[test]
fn destroy_drops_all_nodes() {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), b"").unwrap();
    let c = d.client();
    let e = c.lookup(ROOT, "f").unwrap();
    c.destroy().unwrap();
    assert_eq!(errno(c.getattr(e.nodeid)), libc::EBADF);
    c.getattr(ROOT).unwrap();
}

#[test]
fn exits_zero_when_the_frontend_disconnects() {
    let mut d = Daemon::start(&[]);
    {
        let c = d.client();
        c.getattr(ROOT).unwrap();
    }
    let st = d
        .wait_exit(Duration::from_secs(10))
        .expect("vfsd kept running after disconnect");
    assert!(st.success(), "{st:?}");
}

#[test]
fn exits_cleanly_on_sigterm() {
    let mut d = Daemon::start(&[]);
    let _c = d.client();
    unsafe { libc::kill(d.pid(), libc::SIGTERM) };
    let st = d
        .wait_exit(Duration::from_secs(10))
        .expect("vfsd ignored SIGTERM");
    assert!(st.success(), "{st:?}");
    assert!(!d.sock.exists(), "socket left behind");
}

#[test]
fn serves_a_listening_socket_passed_with_fd() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("share")).unwrap();
    std::fs::write(dir.path().join("share/f"), b"via fd").unwrap();
    let sock = dir.path().join("s");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let fd = listener.as_raw_fd();
    // Inherited across exec, as libvirt hands it over.
    unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    let mut child = std::process::Command::new(common::vfsd_bin())
        .arg(format!("--fd={fd}"))
        .arg("--shared-dir")
        .arg(dir.path().join("share"))
        .args(["--log-level", "warn"])
        .spawn()
        .unwrap();
    drop(listener);
    let c = FuseClient::new(
        vfsd::frontend::Frontend::connect(&sock, FrontendConfig::default()).unwrap(),
    );
    c.init().unwrap();
    let e = c.lookup(ROOT, "f").unwrap();
    assert_eq!(e.attr.size, 6);
    drop(c);
    assert!(child.wait().unwrap().success());
}

#[test]
fn bad_options_fail_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let sock = sock.to_str().unwrap();
    let (code, err) = run_vfsd(&["--socket-path", sock, "--shared-dir", "/does/not/exist"]);
    assert_eq!(code, Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("/does/not/exist") && err.contains("No such file"),
        "{err}"
    );
    let (code, err) = run_vfsd(&[
        "--socket-path",
        sock,
        "--shared-dir",
        "/",
        "--cache",
        "sometimes",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("sometimes"), "{err}");
    let (code, err) = run_vfsd(&["--shared-dir", "/"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--socket-path"), "{err}");
    // A socket path another daemon is listening on.
    let d = Daemon::start(&[]);
    let (code, err) = run_vfsd(&[
        "--socket-path",
        d.sock.to_str().unwrap(),
        "--shared-dir",
        "/",
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("in use"), "{err}");
    // The running daemon was not disturbed.
    d.client().getattr(ROOT).unwrap();
    // --print-capabilities is JSON.
    let out = std::process::Command::new(common::vfsd_bin())
        .arg("--print-capabilities")
        .output()
        .unwrap();
    let caps: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(caps["type"], "fs");
    // --help lists every virtiofsd option users pass.
    let out = std::process::Command::new(common::vfsd_bin())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--socket-path",
        "--fd",
        "--shared-dir",
        "--tag",
        "--cache",
        "--thread-pool-size",
        "--xattr",
        "--readonly",
        "--writeback",
        "--allow-direct-io",
        "--announce-submounts",
        "--sandbox",
        "--seccomp",
        "--log-level",
        "--print-capabilities",
        "--version",
        "--modcaps",
        "--rlimit-nofile",
        "--inode-file-handles",
        "--syslog",
        "--socket-group",
        "--no-readdirplus",
        "--preserve-noatime",
        "--no-killpriv-v2",
    ] {
        assert!(help.contains(opt), "--help lacks {opt}");
    }
}

/// vfsd started on `sock` (sharing `shared_dir`) exits 1 saying the path is in use, and
/// leaves the live socket's name alone.
fn assert_refused_as_in_use(sock: &std::path::Path, shared_dir: &std::path::Path) {
    let (code, err) = run_vfsd(&[
        "--socket-path",
        sock.to_str().unwrap(),
        "--shared-dir",
        shared_dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("in use"), "{err}");
    assert!(sock.exists(), "the live socket's name was removed");
}

/// A socket bound at the path but not listening yet is another daemon starting, between
/// its bind and its listen: the path is in use, not a stale socket to replace.
#[test]
fn a_socket_path_bound_by_a_live_socket_is_in_use_before_it_listens() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let _bound = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    assert_refused_as_in_use(&sock, dir.path());
}

/// A live socket at a path with a space in it is in use: the check goes by the file, not
/// by a table of names split at whitespace.
#[test]
fn a_socket_path_with_a_space_bound_by_a_live_socket_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vfsd sock");
    let _live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    assert_refused_as_in_use(&sock, dir.path());
}

/// Runs `f` on a thread of its own that first moved into new namespaces (`flags`, for
/// that thread alone), and keeps the thread, with whatever `f` returns, until the value
/// given back is dropped.
fn in_new_namespaces<T: Send + 'static>(
    flags: libc::c_int,
    f: impl FnOnce() -> T + Send + 'static,
) -> impl Drop {
    struct Held(
        Option<std::sync::mpsc::Sender<()>>,
        Option<std::thread::JoinHandle<()>>,
    );
    impl Drop for Held {
        fn drop(&mut self) {
            drop(self.0.take());
            let _ = self.1.take().unwrap().join();
        }
    }
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        // SAFETY: unshare affects only this thread's namespaces.
        assert_eq!(
            unsafe { libc::unshare(flags) },
            0,
            "unshare: {}",
            std::io::Error::last_os_error()
        );
        let kept = f();
        ready_tx.send(()).unwrap();
        let _ = done_rx.recv();
        drop(kept);
    });
    ready_rx.recv().expect("the namespace thread failed");
    Held(Some(done_tx), Some(t))
}

/// A socket bound at the same path from another network namespace (the file is the same)
/// is in use: the kernel is asked about the file, in every network namespace.
#[test]
#[ignore = "needs root"]
fn a_socket_path_bound_from_another_network_namespace_is_in_use() {
    common::require_root("unshare(CLONE_NEWNET)");
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let at = sock.clone();
    let _other = in_new_namespaces(libc::CLONE_NEWNET, move || {
        std::os::unix::net::UnixListener::bind(&at).unwrap()
    });
    assert_refused_as_in_use(&sock, dir.path());
}

/// A socket bound at the same path name in another mount namespace, over a tmpfs mounted
/// there (as a user in `unshare -Urm` can), is another file: vfsd starts and serves.
#[test]
#[ignore = "needs root"]
fn a_socket_of_the_same_name_in_another_mount_namespace_is_not_in_use() {
    common::require_root("unshare(CLONE_NEWNS) and mount");
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    let sockdir = dir.path().join("run");
    std::fs::create_dir(&share).unwrap();
    std::fs::create_dir(&sockdir).unwrap();
    let sock = sockdir.join("vfsd.sock");
    let (at, over) = (sock.clone(), sockdir.clone());
    let _other = in_new_namespaces(libc::CLONE_NEWNS, move || {
        let run = |args: &[&str]| {
            let st = std::process::Command::new(args[0])
                .args(&args[1..])
                .status()
                .unwrap();
            assert!(st.success(), "{args:?}");
        };
        // Not propagated back to the test's namespace.
        run(&["mount", "--make-rprivate", "/"]);
        run(&["mount", "-t", "tmpfs", "other", over.to_str().unwrap()]);
        std::os::unix::net::UnixListener::bind(&at).unwrap()
    });
    assert!(!sock.exists(), "the tmpfs is visible outside its namespace");
    let child = std::process::Command::new(common::vfsd_bin())
        .arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(&share)
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut d = Daemon {
        process: child.into(),
        stats: dir.path().join("stats.json"),
        share,
        sock,
        dir,
    };
    let t = std::time::Instant::now();
    while !d.sock.exists() {
        let exited = d.wait_exit(Duration::ZERO);
        assert!(exited.is_none(), "vfsd refused to start: {exited:?}");
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "vfsd did not bind its socket"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    d.client().getattr(ROOT).unwrap();
}

#[test]
fn a_zero_length_write_writes_nothing_and_succeeds() {
    // As write(2) of 0 bytes on ext4, and as virtiofsd answers it.
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), b"abc").unwrap();
    let c = d.client();
    let e = c.lookup(ROOT, "f").unwrap();
    let o = c.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    assert_eq!(c.write(e.nodeid, o.fh, 10, &[]).unwrap(), 0);
    assert_eq!(std::fs::read(d.path("f")).unwrap(), b"abc");
}

#[test]
fn lookup_of_a_name_the_host_gave_to_another_file_finds_that_file_not_the_known_one() {
    let d = Daemon::start(&[]);
    let c = d.client();
    std::fs::write(d.path("f"), b"old").unwrap();
    std::fs::create_dir(d.path("dir")).unwrap();
    let old = c.lookup(ROOT, "f").unwrap();
    let dir = c.lookup(ROOT, "dir").unwrap();
    // Known names, found again: the same nodes.
    assert_eq!(c.lookup(ROOT, "f").unwrap().nodeid, old.nodeid);
    assert_eq!(c.lookup(ROOT, "dir").unwrap().nodeid, dir.nodeid);
    // The host renames another file over "f" and puts a symlink where "dir" was.
    std::fs::write(d.path("g"), b"new!").unwrap();
    std::fs::rename(d.path("g"), d.path("f")).unwrap();
    std::fs::rename(d.path("dir"), d.path("dir2")).unwrap();
    std::os::unix::fs::symlink("/etc", d.path("dir")).unwrap();
    let new = c.lookup(ROOT, "f").unwrap();
    assert_ne!(new.nodeid, old.nodeid);
    assert_eq!(new.attr.ino, std::fs::metadata(d.path("f")).unwrap().ino());
    assert_eq!(new.attr.size, 4);
    let link = c.lookup(ROOT, "dir").unwrap();
    assert_ne!(link.nodeid, dir.nodeid);
    assert_eq!(
        link.attr.mode & libc::S_IFMT,
        libc::S_IFLNK,
        "a host symlink was followed"
    );
    // The known directory is found under its new name as the node the guest has.
    assert_eq!(c.lookup(ROOT, "dir2").unwrap().nodeid, dir.nodeid);
    assert_eq!(errno(c.lookup(ROOT, "gone")), libc::ENOENT);
}

#[test]
fn a_missing_name_is_a_negative_entry_cached_for_at_most_a_second_and_not_under_cache_never() {
    for (cache, valid) in [("auto", Some(1)), ("always", Some(1)), ("never", None)] {
        let d = Daemon::start(&["--cache", cache]);
        let c = d.client();
        let r = c.lookup_reply(ROOT, b"missing\0");
        match valid {
            Some(secs) => {
                let e = r.unwrap_or_else(|e| panic!("{cache}: {e}"));
                assert_eq!(
                    (e.nodeid, e.entry_valid, e.entry_valid_nsec),
                    (0, secs, 0),
                    "{cache}"
                );
            }
            None => assert_eq!(errno(r), libc::ENOENT, "{cache}"),
        }
        // Any other error stays an error.
        std::fs::write(d.path("file"), b"").unwrap();
        let file = c.lookup(ROOT, "file").unwrap().nodeid;
        assert_eq!(
            errno(c.lookup_reply(file, b"x\0")),
            libc::ENOTDIR,
            "{cache}"
        );
    }
}
