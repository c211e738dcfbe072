//! A test build's fault injection (cargo feature `test-hooks`, never in a release of
//! vfsd), read from the environment once:
//!
//! - `VFSD_TEST_CRASH=popped:OPCODE[:N]` makes the serving process die before serving the
//!   Nth request of that opcode (default the first), `served:...` after the file system
//!   acted and before its reply goes on the used ring; with a last `:every` the
//!   supervisor passes the variable on to the processes that replace a dead one (else
//!   they never get it). The death is an abort, a real one even for a pid namespace's
//!   init, which ignores signals it sends itself.
//! - `VFSD_TEST_PANIC_NODEID=N`: every request for node N but INIT panics, so the panic
//!   handling is exercised through the real socket.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum When {
    Popped,
    Served,
}

fn armed() -> Option<(When, u32, u32)> {
    static ARMED: OnceLock<Option<(When, u32, u32)>> = OnceLock::new();
    *ARMED.get_or_init(|| {
        let v = std::env::var("VFSD_TEST_CRASH").ok()?;
        let mut it = v.split(':');
        let when = match it.next()? {
            "popped" => When::Popped,
            "served" => When::Served,
            _ => return None,
        };
        let op = it.next()?.parse().ok()?;
        let nth = match it.next() {
            None | Some("every") => 1,
            Some(n) => n.parse().ok()?,
        };
        Some((when, op, nth))
    })
}

pub fn crash(when: When, op: u32) {
    static SEEN: AtomicU32 = AtomicU32::new(0);
    if let Some((w, o, nth)) = armed() {
        if w == when && o == op && SEEN.fetch_add(1, Ordering::Relaxed) + 1 == nth {
            log::warn!("crash hook: dying at opcode {op}");
            std::process::abort();
        }
    }
}

/// Panics for a request of opcode `op` for node `nodeid` if `VFSD_TEST_PANIC_NODEID`
/// names that node (INIT never).
pub fn panic_for(nodeid: u64, op: u32) {
    static NODE: OnceLock<Option<u64>> = OnceLock::new();
    let node = *NODE.get_or_init(|| {
        std::env::var("VFSD_TEST_PANIC_NODEID")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    if Some(nodeid) == node && op != crate::server::opcode::Opcode::Init as u32 {
        panic!("VFSD_TEST_PANIC_NODEID: request for node {nodeid}");
    }
}
