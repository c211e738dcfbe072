//! `--host`: the workload's syscalls made by the bench itself on the files the daemons
//! serve, paced as the daemons' requests are: the limit a daemon's round trip sits on.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{precise_timers, report, Args, BenchError, Measured, Pacer, Workload};

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn cstr(p: &[u8]) -> CString {
    CString::new(p).expect("no NUL in a bench file name")
}

/// -1 (and errno) to an io::Error.
fn check(r: libc::c_long) -> std::io::Result<libc::c_long> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn open(path: &Path, flags: i32) -> std::io::Result<File> {
    let p = cstr(path.as_os_str().as_bytes());
    // SAFETY: a NUL-terminated path; the fd is owned by the File below.
    let fd = check(unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC) } as libc::c_long)?;
    // SAFETY: a fresh fd nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

pub fn run(a: &Args, dir: &Path) -> Result<(), BenchError> {
    if a.depth != 1 || a.queues != 1 {
        return Err("--host runs one job: --depth 1 --queues 1".into());
    }
    let (steps, timed) = match a.workload {
        Workload::Lookup
        | Workload::Getattr
        | Workload::RandreadShared
        | Workload::RandreadPerjob
        | Workload::RandwriteShared
        | Workload::RandwritePerjob => (1, 1),
        // openat(O_CREAT), timed; close and unlink, not.
        Workload::Create => (3, 1),
        _ => return Err("--host: lookup, getattr, create, randread-* or randwrite-* only".into()),
    };
    precise_timers();
    let d = open(dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let names: Vec<CString> = (0..1000)
        .map(|i| cstr(format!("m{i}").as_bytes()))
        .collect();
    let m0 = open(&dir.join("m0"), libc::O_PATH)?;
    let data = matches!(
        a.workload,
        Workload::RandreadShared
            | Workload::RandreadPerjob
            | Workload::RandwriteShared
            | Workload::RandwritePerjob
    )
    .then(|| open(&dir.join("data0"), libc::O_RDWR))
    .transpose()?;
    let blocks = ((a.file_mib << 20) / a.bs as u64).max(1);
    let mut buf = vec![0x5au8; a.bs];
    let created = cstr(b"h0");
    let mut fd = -1;
    let mut rng = 0x2545f4914f6cdd1du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let empty = cstr(b"");
    // SAFETY: zeroed is a valid `stat` to write into.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // One step of the operation; the bytes it moved.
    let mut step = |s: u8| -> std::io::Result<u64> {
        let off = (next(blocks) * a.bs as u64) as libc::off_t;
        let moved = match (a.workload, s) {
            (Workload::Lookup, _) => {
                let name = &names[next(names.len() as u64) as usize];
                // SAFETY: a directory fd, a NUL-terminated name, `st` to write.
                check(unsafe {
                    libc::fstatat(
                        d.as_raw_fd(),
                        name.as_ptr(),
                        &mut st,
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                } as libc::c_long)?;
                0
            }
            (Workload::Getattr, _) => {
                // SAFETY: an O_PATH fd, an empty NUL-terminated name, `st` to write.
                check(unsafe {
                    libc::fstatat(
                        m0.as_raw_fd(),
                        empty.as_ptr(),
                        &mut st,
                        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                    )
                } as libc::c_long)?;
                0
            }
            (Workload::RandreadShared | Workload::RandreadPerjob, _) => {
                let f = data.as_ref().expect("data file").as_raw_fd();
                // SAFETY: `buf` is valid for writes of its length.
                check(unsafe { libc::pread(f, buf.as_mut_ptr().cast(), buf.len(), off) } as _)?
                    as u64
            }
            (Workload::RandwriteShared | Workload::RandwritePerjob, _) => {
                let f = data.as_ref().expect("data file").as_raw_fd();
                // SAFETY: `buf` is valid for reads of its length.
                check(unsafe { libc::pwrite(f, buf.as_ptr().cast(), buf.len(), off) } as _)? as u64
            }
            (_, 0) => {
                let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
                // SAFETY: a directory fd and a NUL-terminated name; the fd is closed in
                // the next step.
                fd = check(
                    unsafe { libc::openat(d.as_raw_fd(), created.as_ptr(), flags, 0o644) }
                        as libc::c_long,
                )? as i32;
                0
            }
            (_, 1) => {
                // SAFETY: the fd step 0 opened, closed once.
                check(unsafe { libc::close(fd) } as libc::c_long)?;
                0
            }
            _ => {
                // SAFETY: a directory fd and a NUL-terminated name.
                check(
                    unsafe { libc::unlinkat(d.as_raw_fd(), created.as_ptr(), 0) } as libc::c_long,
                )?;
                0
            }
        };
        Ok(moved)
    };

    let gap = Duration::from_micros(a.gap_us);
    let t0 = Instant::now();
    let (measure_from, end) = (
        t0 + Duration::from_millis(a.warmup_ms),
        t0 + Duration::from_millis(a.warmup_ms) + Duration::from_secs_f64(a.seconds),
    );
    let mut pacer = Pacer::new(1, steps, timed, gap, false, t0);
    let (mut lats, mut bytes, mut cpu) = (Vec::with_capacity(1 << 20), 0u64, Duration::ZERO);
    loop {
        let cpu0 = thread_cpu();
        let now = Instant::now();
        if now >= end {
            break;
        }
        let Some((_, s)) = pacer.next(now, || true) else {
            if let Some(at) = pacer.wake_at() {
                std::thread::sleep(at.saturating_duration_since(now));
            }
            continue;
        };
        let moved = step(s)?;
        let done = Instant::now();
        let measuring = now >= measure_from;
        if measuring {
            // The whole operation's CPU, clean-up included, as the daemons' is counted.
            cpu += thread_cpu() - cpu0;
        }
        if let Some(lat) = pacer.completed(0, done) {
            if measuring {
                lats.push(lat.as_nanos().min(u32::MAX as u128) as u32);
                bytes += moved;
            }
        }
    }
    let elapsed = (end - measure_from).as_secs_f64();
    report(
        a,
        lats,
        Measured {
            elapsed,
            bytes,
            cpu_us: Some(cpu.as_secs_f64() * 1e6),
            switches: None,
            serialised: false,
        },
    )
}
