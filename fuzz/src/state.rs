//! The `migration_state` target: arbitrary bytes loaded as a device state (the
//! VHOST_USER_SET_DEVICE_STATE_FD load) into a fresh `PassthroughFs` on a temporary share,
//! as a migration destination does; then the session is ended (DESTROY) as a reset would.
//!
//! Input format:
//!
//! ```text
//! opts: u8      the destination's options: bit 0 `--migration-mode file-handles`,
//!               bit 1 `--migration-on-error guest-error`, bit 2 `--migration-verify-handles`,
//!               bit 3 `--readonly`, bit 4 small lock bounds (--max-locks 16,
//!               --max-lock-waiters 4), bit 7 raw: the rest is the whole stream, header
//!               included (else the harness writes a valid header for it)
//! body: [u8]    the state's postcard body (or, raw, the whole stream)
//! ```
//!
//! Besides "no panic, no hang, bounded memory", every input is checked for threads it
//! leaves running (2 s after the session ended), for leaked file descriptors once those
//! threads are gone and the filesystem was dropped, and for a load that keeps its word: a
//! state it refused leaves no node but the root.

use fuse_backend_rs::abi::fuse_abi::*;
use vfsd::filesystem::FileSystem;
use vfsd::passthrough::migration::{self, Mode, OnError};

use crate::request::{op, Seq};
use crate::*;

pub mod opt {
    pub const FILE_HANDLES: u8 = 0x01;
    pub const GUEST_ERROR: u8 = 0x02;
    pub const VERIFY_HANDLES: u8 = 0x04;
    pub const READONLY: u8 = 0x08;
    pub const SMALL_LOCK_BOUNDS: u8 = 0x10;
    pub const RAW: u8 = 0x80;
}

/// A destination for options `opts` (see the module's doc).
fn destination(opts: u8) -> Fixture {
    Fixture::with(0, |cfg| {
        cfg.readonly = opts & opt::READONLY != 0;
        cfg.migration.mode = if opts & opt::FILE_HANDLES != 0 {
            Mode::FileHandles
        } else {
            Mode::FindPaths
        };
        cfg.migration.on_error = if opts & opt::GUEST_ERROR != 0 {
            OnError::GuestError
        } else {
            OnError::Abort
        };
        cfg.migration.verify_handles = opts & opt::VERIFY_HANDLES != 0;
        if opts & opt::SMALL_LOCK_BOUNDS != 0 {
            cfg.max_locks = 16;
            cfg.max_lock_waiters = 4;
        }
    })
}

/// `body` with the header a vfsd stream starts with.
pub fn with_header(body: &[u8]) -> Vec<u8> {
    let mut out = migration::MAGIC.to_vec();
    out.extend_from_slice(&migration::VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(body);
    out
}

pub fn run(data: &[u8]) {
    init();
    let Some((&opts, body)) = data.split_first() else {
        return;
    };
    let stream = if opts & opt::RAW != 0 {
        body.to_vec()
    } else {
        with_header(body)
    };
    let threads_before = threads();
    no_fd_leak(|| {
        let f = destination(opts);
        let fs = f.server.fs().clone();
        let loaded = fs.load_state(&stream);
        if tracing() {
            eprintln!("load: {loaded:?}");
        }
        if loaded.is_err() {
            let c = fs.counters();
            assert_eq!(
                (c.live_inodes, c.open_handles, c.locks_held),
                (1, 0, 0),
                "a refused state left something loaded: {loaded:?}"
            );
        }
        // The session ends (the VMM resets the device, or the guest unmounts): every lock
        // retake is called off and waited for, started or not, until it has dropped all
        // it held (the filesystem, a handle and with it the handle's fd); every node and
        // handle goes. So the filesystem's count is exact once `destroy` returns. The
        // retake threads themselves may take a moment more to exit: wait (bounded) for
        // every thread this input started to be gone.
        fs.destroy();
        // Exact unless DESTROY gave up on a retake at its one-second deadline (hundreds
        // of retakes on a busy machine): then the count must still settle, soon.
        let t = std::time::Instant::now();
        let mut held = std::sync::Arc::strong_count(&fs);
        while held != 2 && t.elapsed() < std::time::Duration::from_secs(2) {
            std::thread::sleep(std::time::Duration::from_millis(1));
            held = std::sync::Arc::strong_count(&fs);
        }
        assert_eq!(
            held, 2,
            "something besides the server holds the filesystem 2 s after the session ended"
        );
        let t = std::time::Instant::now();
        let mut left = started_since(&threads_before);
        while !left.is_empty() && t.elapsed() < std::time::Duration::from_secs(2) {
            std::thread::sleep(std::time::Duration::from_millis(1));
            left = started_since(&threads_before);
        }
        assert!(
            left.is_empty(),
            "threads the input started still run 2 s after DESTROY: {left:?}"
        );
        drop(fs);
        drop(f);
    });
}

/// The ids of this process's threads.
fn threads() -> std::collections::BTreeSet<u64> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        .collect()
}

/// The threads not in `before`, with their names. A thread's entry goes once it has
/// exited, after everything it held was dropped.
fn started_since(before: &std::collections::BTreeSet<u64>) -> Vec<(u64, String)> {
    threads()
        .difference(before)
        .map(|&tid| {
            let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"));
            (tid, comm.unwrap_or_default().trim_end().to_string())
        })
        .collect()
}

/// A session on a fresh share, saved as a source would: INIT, nodes looked up (a file, a
/// directory and a file in it), handles open (read-write, read-only, a directory), POSIX
/// locks of two owners, a flock, and a file open but unlinked. `opts` as for the target.
fn saved_session(opts: u8) -> Vec<u8> {
    use op::*;
    const SETLK: u32 = 32;
    const RDWR: u32 = libc::O_RDWR as u32;
    let lk = |fh: u64, owner: u64, start: u64, end: u64, typ: i32, flags: u32| {
        obj(LkIn {
            fh,
            owner,
            lk: FileLock {
                start,
                end,
                type_: typ as u32,
                pid: 42,
            },
            lk_flags: flags,
            padding: 0,
        })
    };
    let mut s = Seq::new(0);
    // Node ids: f 2, d 3, d/g 4, new 5. Handles: 1 f rw, 2 f ro, 3 d, 4 new.
    s.req(INIT, 0, &init_in_for_seeds())
        .req(LOOKUP, 1, &cstr("f"))
        .req(LOOKUP, 1, &cstr("d"))
        .req(LOOKUP, 3, &cstr("g"))
        .req(
            OPEN,
            2,
            &obj(OpenIn {
                flags: RDWR,
                fuse_flags: 0,
            }),
        )
        .req(OPEN, 2, &obj(OpenIn::default()))
        .req(OPENDIR, 3, &obj(OpenIn::default()))
        .req(SETLK, 2, &lk(1, 0x77, 0, 9, libc::F_WRLCK, 0))
        .req(SETLK, 2, &lk(1, 0x77, 20, 29, libc::F_RDLCK, 0))
        .req(SETLK, 2, &lk(2, 0x78, 100, 199, libc::F_RDLCK, 0))
        .req(SETLK, 2, &lk(2, 0x79, 0, 0, libc::F_RDLCK, 1)) // FUSE_LK_FLOCK
        .req(
            CREATE,
            1,
            &body(&[
                &obj(CreateIn {
                    flags: RDWR,
                    mode: 0o100644,
                    umask: 0,
                    fuse_flags: 0,
                }),
                &cstr("new"),
            ]),
        )
        .req(UNLINK, 1, &cstr("new"));
    let f = Fixture::with(0, |cfg| {
        if opts & opt::FILE_HANDLES != 0 {
            cfg.migration.mode = Mode::FileHandles;
        }
        cfg.migration.verify_handles = opts & opt::VERIFY_HANDLES != 0;
    });
    let mem = guest_memory();
    for r in s.records() {
        crate::request::serve_one(&f, &mem, r);
    }
    let state = f.server.fs().save_state(&[]).expect("save_state");
    state[migration::HEADER_LEN..].to_vec()
}

fn init_in_for_seeds() -> Vec<u8> {
    // 7.38 with FUSE_INIT_EXT and every flag the first word has, as the driver sends.
    let mut v = obj(InitIn {
        major: 7,
        minor: 38,
        max_readahead: 0x2_0000,
        flags: 0x7fff_ffff | (1 << 30),
    });
    v.extend_from_slice(&[0u8; 48]);
    v
}

pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    init();
    let mut out = Vec::new();
    for (name, opts) in [
        ("session", 0u8),
        ("session_guest_error", opt::GUEST_ERROR),
        ("session_verify_handles", opt::VERIFY_HANDLES),
        ("session_small_lock_bounds", opt::SMALL_LOCK_BOUNDS),
    ] {
        let mut input = vec![opts];
        input.extend_from_slice(&saved_session(opts));
        out.push((name, input));
    }
    // File handles need CAP_DAC_READ_SEARCH.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let mut input = vec![opt::FILE_HANDLES];
        input.extend_from_slice(&saved_session(opt::FILE_HANDLES));
        out.push(("session_file_handles", input));
    }
    // The whole stream, header included.
    let mut raw = vec![opt::RAW];
    raw.extend_from_slice(&with_header(&saved_session(0)));
    out.push(("raw", raw));
    out
}
