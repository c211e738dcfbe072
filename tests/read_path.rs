//! The READ fast path: cached reads are answered on the queue thread with RWF_NOWAIT; a
//! miss, a short read or a host filesystem without RWF_NOWAIT goes to the worker pool.
//! Either way the guest gets exactly the host's bytes, which these tests check along with
//! the daemon's own count of where each read was served.

mod common;

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::{is_root, pattern, Daemon, LoopFs, Tmpfs};
use vfsd::frontend::fuse::FuseClient;

const ROOT: u64 = 1;

/// (reads on the queue thread, reads handed off), once the stats file shows `total` reads.
fn read_counts(d: &Daemon, total: u64) -> (u64, u64) {
    let t = Instant::now();
    loop {
        let s = d.stats();
        let on = s["reads_on_queue_thread"].as_u64().unwrap();
        let off = s["reads_handed_off"].as_u64().unwrap();
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
        let fs = LoopFs::new(64)?;
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
fn uncached_and_short_reads_go_to_the_pool_with_the_right_bytes() {
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
fn a_host_filesystem_without_rwf_nowait_still_serves_reads() {
    if !is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    // tmpfs answers RWF_NOWAIT with EOPNOTSUPP.
    let mnt = tempfile::tempdir().unwrap();
    let _tmpfs = Tmpfs::mount(mnt.path(), None);
    let data = pattern(65536, 14);
    std::fs::write(mnt.path().join("f"), &data).unwrap();
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
    // (largest descriptor, indirect, read size, tried on the queue thread, decoded by vfsd's
    // direct READ path rather than fuse-backend-rs): one descriptor
    // each way; the Linux driver's shape (header and arguments apart, a separate reply
    // header); more reply pieces than the direct READ path takes (the general path serves
    // them, still on the queue thread); 7-byte pieces, where the opcode is not in the first
    // descriptor, so the queue thread does not recognise a READ and the pool serves it;
    // page-sized pieces.
    let shapes = [
        (0, false, 65536u32, true, true),
        (40, true, 4096, true, true),
        (40, true, 16384, true, false),
        (7, true, 1000, false, false),
        (4096, false, 65536, true, true),
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
    let (mut reads, mut on_queue_thread, mut direct) = (0, 0, 0);
    for (split, indirect, size, tried, decoded) in shapes {
        c.layout = Layout { split, indirect };
        for off in [0u64, 4095, 500_000] {
            let got = c.read(node, fh, off, size).unwrap();
            let want = &data[off as usize..off as usize + size as usize];
            assert!(
                got == want,
                "split {split} indirect {indirect} size {size} at {off}"
            );
            reads += 1;
            on_queue_thread += tried as u64;
            direct += decoded as u64;
        }
    }
    assert_eq!(read_counts(d, reads), (on_queue_thread, 0));
    assert_eq!(d.stats()["reads_direct"].as_u64().unwrap(), direct);
}
