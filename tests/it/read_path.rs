//! The READ fast path: cached reads are answered on the queue thread with RWF_NOWAIT; a
//! miss, a short read or a host filesystem without RWF_NOWAIT goes to the worker pool.
//! Either way the guest gets exactly the host's bytes, which these tests check along with
//! the daemon's own count of where each read was served.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::common::{self, is_root, pattern, require_root, Daemon, LoopFs, Tmpfs, ROOT};
use vfsd::frontend::fuse::{FuseClient, Ticket};

/// (reads answered without blocking on the queue thread, reads that would have blocked),
/// once the stats file shows `total` reads. The latter went to the pool, or were served
/// blocking by the queue thread when nothing else was in flight (`where_blocking_reads_go`).
fn read_counts(d: &Daemon, total: u64) -> (u64, u64) {
    let t = Instant::now();
    loop {
        let s = d.stats();
        let on = s["reads_on_queue_thread"].as_u64().unwrap();
        let off =
            s["reads_handed_off"].as_u64().unwrap() + s["reads_served_alone"].as_u64().unwrap();
        let served = s["opcodes"]["READ"]["count"].as_u64().unwrap_or(0);
        if served >= total {
            return (on, off);
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "stats never showed {total} reads"
        );
    }
}

/// A daemon on a filesystem with RWF_NOWAIT: a fresh ext4 loop mount when root (the same
/// everywhere), else the temporary directory if it has it (tmpfs does not).
struct Share {
    d: Daemon,
    _fs: Option<LoopFs>,
}

fn nowait_share(extra: &[&str]) -> Option<Share> {
    if is_root() {
        let fs = LoopFs::new(64);
        let d = Daemon::start_on(&fs.mnt, extra);
        return Some(Share { d, _fs: Some(fs) });
    }
    let d = Daemon::start(extra);
    std::fs::write(d.path("probe"), b"x").unwrap();
    let f = std::fs::File::open(d.path("probe")).unwrap();
    let mut b = [0u8; 1];
    let iov = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: one iovec over a live local buffer.
    let r = unsafe { libc::preadv2(f.as_raw_fd(), &iov, 1, 0, libc::RWF_NOWAIT) };
    if r < 0 {
        eprintln!("skipped: the temporary directory has no RWF_NOWAIT (run as root for ext4)");
        return None;
    }
    std::fs::remove_file(d.path("probe")).unwrap();
    Some(Share { d, _fs: None })
}

/// A tmpfs to share, which answers RWF_NOWAIT with EOPNOTSUPP (as a GlusterFS mount
/// does), holding `files` (root only).
fn tmpfs_share(files: &[(&str, &[u8])]) -> (tempfile::TempDir, Tmpfs) {
    require_root("mounting a tmpfs needs root");
    let mnt = tempfile::tempdir().unwrap();
    let tmpfs = Tmpfs::mount(mnt.path(), None);
    for (name, data) in files {
        std::fs::write(mnt.path().join(name), data).unwrap();
    }
    (mnt, tmpfs)
}

fn open_file(c: &FuseClient, name: &str) -> (u64, u64) {
    let e = c.lookup(ROOT, name).unwrap();
    let o = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    (e.nodeid, o.fh)
}

#[test]
fn cached_reads_are_served_on_the_queue_thread() {
    let Some(share) = nowait_share(&[]) else {
        return;
    };
    let d = &share.d;
    let data = pattern(1 << 20, 11);
    std::fs::write(d.path("f"), &data).unwrap(); // now in the host's page cache
    let c = d.client();
    let (node, fh) = open_file(&c, "f");
    for i in 0..64u64 {
        let off = (i * 12_288) % ((1 << 20) - 65536);
        let size = [4096u32, 512, 65536, 1][i as usize % 4];
        let got = c.read(node, fh, off, size).unwrap();
        assert_eq!(
            got,
            &data[off as usize..off as usize + size as usize],
            "at {off}"
        );
    }
    let (on, off) = read_counts(d, 64);
    assert_eq!((on, off), (64, 0));
}

#[test]
fn uncached_and_short_reads_are_served_blocking_with_the_right_bytes() {
    let Some(share) = nowait_share(&[]) else {
        return;
    };
    let d = &share.d;
    let data = pattern(10_000, 12);
    std::fs::write(d.path("short"), &data).unwrap();
    let big = pattern(4 << 20, 13);
    std::fs::write(d.path("cold"), &big).unwrap();
    // Push "cold" out of the page cache: written back, then dropped.
    let f = std::fs::File::open(d.path("cold")).unwrap();
    f.sync_all().unwrap();
    // SAFETY: fadvise on an fd we hold; it only drops clean cached pages.
    assert_eq!(
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) },
        0
    );
    let c = d.client();

    // A read that ends past EOF is short: it may not be answered from a partial cache.
    let (node, fh) = open_file(&c, "short");
    assert_eq!(c.read(node, fh, 8192, 4096).unwrap(), &data[8192..]);
    assert_eq!(c.read(node, fh, 20_000, 4096).unwrap(), b"");
    assert_eq!(read_counts(d, 2), (0, 2));

    // Not cached: RWF_NOWAIT gives EAGAIN and a worker reads from the disk.
    let (node, fh) = open_file(&c, "cold");
    let off = 3 << 20;
    assert_eq!(
        c.read(node, fh, off, 65536).unwrap(),
        &big[off as usize..off as usize + 65536]
    );
    let (on, off_pool) = read_counts(d, 3);
    assert_eq!(
        (on, off_pool),
        (0, 3),
        "a cold read was answered on the queue thread"
    );

    // Now cached: the next read of the same range stays on the queue thread.
    assert_eq!(
        c.read(node, fh, off, 4096).unwrap(),
        &big[off as usize..off as usize + 4096]
    );
    assert_eq!(read_counts(d, 4), (1, 3));
}

#[test]
#[ignore = "needs root"]
fn a_host_filesystem_without_rwf_nowait_still_serves_reads() {
    let data = pattern(65536, 14);
    let (mnt, _tmpfs) = tmpfs_share(&[("f", &data)]);
    let d = Daemon::start_on(mnt.path(), &[]);
    let c = d.client();
    let (node, fh) = open_file(&c, "f");
    for i in 0..8u64 {
        let off = i * 4096;
        assert_eq!(
            c.read(node, fh, off, 4096).unwrap(),
            &data[off as usize..off as usize + 4096]
        );
    }
    assert_eq!(read_counts(&d, 8), (0, 8));
}

/// A host filesystem without RWF_NOWAIT (tmpfs here, or a GlusterFS FUSE mount)
/// is found out once: handles opened on it afterwards never try.
#[test]
#[ignore = "needs root"]
fn rwf_nowait_is_given_up_once_per_host_filesystem() {
    let data = pattern(8192, 16);
    let (mnt, _tmpfs) = tmpfs_share(&[("a", &data), ("b", &data), ("c", &data)]);
    let d = Daemon::start_on(mnt.path(), &[]);
    let c = d.client();
    for name in ["a", "b", "c", "a", "b"] {
        let (node, fh) = open_file(&c, name);
        assert_eq!(c.read(node, fh, 0, 4096).unwrap(), &data[..4096]);
        c.release(node, fh).unwrap();
    }
    assert_eq!(read_counts(&d, 5), (0, 5));
    assert_eq!(d.stats()["nowait_unsupported"].as_u64(), Some(1));
}

/// Requests that would block: lone ones (one per pop, nothing else in flight on the queue,
/// many times in a row) are served by the queue thread itself, sparing the hand-off; several
/// that arrive together go to the pool, to be served in parallel. Requests that may wait
/// long (FSYNC) never hold up the queue thread.
#[test]
#[ignore = "needs root"]
fn where_blocking_reads_go() {
    // tmpfs refuses RWF_NOWAIT, so every read would block.
    let data = pattern(65536, 17);
    let (mnt, _tmpfs) = tmpfs_share(&[("f", &data)]);
    let d = Daemon::start_on(mnt.path(), &["--thread-pool-size", "4"]);
    let c = d.client();
    let e = c.lookup(ROOT, "f").unwrap();
    let h = c.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    // (READs served alone, READs handed to the pool, requests served alone). Each count
    // is read once the stats show the request, which the daemon records after counting
    // where it went.
    let seen = |op: &str, n: u64| {
        let t = Instant::now();
        while d.stats()["opcodes"][op]["count"].as_u64().unwrap_or(0) < n {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "stats never showed {op}"
            );
        }
    };
    let counts = |reads: u64| {
        read_counts(&d, reads);
        let s = d.stats();
        let n = |k: &str| s[k].as_u64().unwrap();
        (
            n("reads_served_alone"),
            n("reads_handed_off"),
            n("served_alone"),
        )
    };
    // The queue thread serves lone requests from the 17th lone pop in a row on (device's
    // LONE_POPS), counting INIT, the LOOKUP and the OPEN.
    let mut getattrs = 0;
    let mut lone_getattrs = |n: u64| {
        for _ in 0..n {
            c.getattr(ROOT).unwrap();
        }
        getattrs += n;
        seen("GETATTR", getattrs);
    };
    lone_getattrs(16);
    let base = counts(0).2;
    assert_eq!(
        base, 3,
        "the 17th to 19th pops, GETATTRs, were served alone"
    );
    for i in 0..4u64 {
        let off = i * 4096;
        let got = c.read(e.nodeid, h.fh, off, 4096).unwrap();
        assert_eq!(got, &data[off as usize..off as usize + 4096]);
    }
    assert_eq!(counts(4), (4, 0, base + 4), "lone reads: the queue thread");

    // Four READs made available before one kick: one batch, so the pool.
    let tickets: Vec<Ticket> = {
        let mut q = c.fe.queues[1].lock().unwrap();
        let t = (0..4u64)
            .map(|i| {
                let (unique, req) = c.read_req(e.nodeid, h.fh, i * 8192, 8192);
                let slot = q.free_slot().unwrap();
                q.submit(&c.fe.mem, slot, &req, 8192 + 4096, c.layout)
                    .unwrap();
                Ticket {
                    queue: 1,
                    slot,
                    unique,
                }
            })
            .collect();
        q.notify().unwrap();
        t
    };
    for (i, t) in tickets.into_iter().enumerate() {
        let got = c.wait(t).unwrap().ok().unwrap();
        assert_eq!(got, &data[i * 8192..(i + 1) * 8192]);
    }
    assert_eq!(
        counts(8),
        (4, 4, base + 4),
        "reads that came together: the pool"
    );

    // Parallel work starts the count again: 16 lone GETATTRs go to the pool, the WRITE
    // after them is served alone. A lone FSYNC never is.
    lone_getattrs(16);
    assert_eq!(counts(8), (4, 4, base + 4));
    assert_eq!(c.write(e.nodeid, h.fh, 0, b"abcd").unwrap(), 4);
    seen("WRITE", 1);
    assert_eq!(counts(8), (4, 4, base + 5));
    c.fsync(e.nodeid, h.fh, false).unwrap();
    seen("FSYNC", 1);
    assert_eq!(counts(8), (4, 4, base + 5));
    assert_eq!(&std::fs::read(mnt.path().join("f")).unwrap()[..4], b"abcd");
}

#[test]
fn without_a_pool_every_read_is_served_in_place() {
    let d = Daemon::start(&["--thread-pool-size", "0"]);
    let data = pattern(8192, 15);
    std::fs::write(d.path("f"), &data).unwrap();
    let c = d.client();
    let (node, fh) = open_file(&c, "f");
    assert_eq!(c.read(node, fh, 100, 5000).unwrap(), &data[100..5100]);
    assert_eq!(c.read(node, fh, 8000, 4096).unwrap(), &data[8000..]);
    // No attempt and no hand-off: the queue thread serves everything the ordinary way.
    assert_eq!(read_counts(&d, 2), (0, 0));
}

#[test]
fn reads_in_every_descriptor_shape_return_the_host_bytes() {
    use vfsd::frontend::virtq::Layout;
    // (largest descriptor, indirect, read size, served on the queue thread by vfsd's direct
    // READ path, handed from the queue thread to the pool): one descriptor each way; the
    // Linux driver's shape (header and arguments apart, a separate reply header); more
    // reply pieces than the direct READ path takes (handed to the pool, where
    // fuse-backend-rs serves them); 7-byte pieces, where the opcode is not in the first
    // descriptor but in the request's copy, which the queue thread places it by, and the
    // reply header is split, which the direct READ path does not take (handed to the
    // pool); page-sized pieces.
    let shapes = [
        (0, false, 65536u32, true, false),
        (40, true, 4096, true, false),
        (40, true, 16384, false, true),
        (7, true, 1000, false, true),
        (4096, false, 65536, true, false),
    ];
    let Some(share) = nowait_share(&[]) else {
        return;
    };
    let d = &share.d;
    let data = pattern(1 << 20, 16);
    std::fs::write(d.path("f"), &data).unwrap();
    let mut c = FuseClient::new(d.frontend(vfsd::frontend::FrontendConfig {
        descs_per_slot: 64,
        ..Default::default()
    }));
    c.init().unwrap();
    let (node, fh) = open_file(&c, "f");
    let (mut reads, mut on_queue_thread, mut handed) = (0, 0, 0);
    for (split, indirect, size, served, handed_off) in shapes {
        c.layout = Layout {
            split,
            indirect,
            ..Default::default()
        };
        for off in [0u64, 4095, 500_000] {
            let got = c.read(node, fh, off, size).unwrap();
            let want = &data[off as usize..off as usize + size as usize];
            assert!(
                got == want,
                "split {split} indirect {indirect} size {size} at {off}"
            );
            reads += 1;
            on_queue_thread += served as u64;
            handed += handed_off as u64;
        }
    }
    assert_eq!(read_counts(d, reads), (on_queue_thread, handed));
    assert_eq!(
        d.stats()["reads_direct"].as_u64().unwrap(),
        on_queue_thread,
        "the one no-wait entry point is the direct READ path"
    );
}

/// vfsd's own WRITE path takes header, arguments and data from any
/// descriptor shape, and the host file gets exactly the guest's bytes.
#[test]
fn writes_in_every_descriptor_shape_land_byte_exact() {
    use vfsd::frontend::virtq::Layout;
    let d = Daemon::start(&["--cache", "never"]);
    let mut c = FuseClient::new(d.frontend(vfsd::frontend::FrontendConfig {
        descs_per_slot: 256,
        ..Default::default()
    }));
    c.init().unwrap();
    std::fs::write(d.path("f"), vec![0u8; 1 << 21]).unwrap();
    let (node, fh) = {
        let e = c.lookup(ROOT, "f").unwrap();
        (e.nodeid, c.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh)
    };
    let mut model = vec![0u8; 1 << 21];
    let mut seed = 100;
    for (split, indirect) in [(0, false), (40, true), (7, true), (4096, false), (81, true)] {
        c.layout = Layout {
            split,
            indirect,
            ..Default::default()
        };
        for (off, len) in [
            (0usize, 1usize),
            (4095, 1000),
            (100_000, 65536),
            (1 << 20, 1 << 20),
        ] {
            if split != 0 && (80 + len) / split > 250 {
                continue; // more descriptors than a slot has
            }
            seed += 1;
            let data = pattern(len, seed);
            assert_eq!(
                c.write(node, fh, off as u64, &data).unwrap() as usize,
                len,
                "split {split} indirect {indirect} len {len}"
            );
            model[off..off + len].copy_from_slice(&data);
            let host = common::read(&d.path("f"));
            let bad = host.iter().zip(&model).position(|(a, b)| a != b);
            assert!(
                bad.is_none(),
                "split {split} indirect {indirect} len {len}: first bad byte {bad:?}"
            );
        }
    }
    assert!(common::read(&d.path("f")) == model);
    // Fewer data bytes than WriteIn.size promises: EINVAL, nothing written.
    let w = fuse_backend_rs::abi::fuse_abi::WriteIn {
        fh,
        offset: 0,
        size: 100,
        ..Default::default()
    };
    let r = c.call(
        vfsd::frontend::fuse::FUSE_WRITE,
        node,
        &[vm_memory::ByteValued::as_slice(&w), &[9u8; 50]],
        64,
    );
    assert_eq!(common::errno(r), libc::EINVAL);
    assert!(common::read(&d.path("f")) == model);
}
