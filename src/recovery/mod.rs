//! Surviving the death of a serving process: what it records as it serves (`record`),
//! the process that keeps its fds when it dies (`keeper`), and the next serving
//! process's take-over of both (`collect`).
//!
//! The supervisor sees the keeper's report, starts a new serving process with the
//! keeper's channel, and replays the frontend's set-up into it as for an upgrade. The new
//! process takes the record and the fds it names from the keeper before it confines
//! itself, loads the nodes and handles as a migration's destination would (with the dead
//! process's own fds, so offsets and locks on open files carry on), and, as each ring
//! starts, continues from where the dead one stopped and answers the requests it held
//! (`device::recover`).

pub mod keeper;
pub mod record;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::passthrough::handover::Item;
use record::{HandleState, NodeState, OwnerState, Record, RingState};

/// What a dead serving process left, taken from its keeper.
pub struct Inherited {
    pub fs: FsState,
    /// Per ring: where it was and what it held, if it ran.
    pub rings: Vec<Option<RingState>>,
}

/// A dead serving process's file system state (`PassthroughFs::take_over`).
pub struct FsState {
    /// Its session's INIT flags (0: no session yet).
    pub session: u64,
    /// Its next node id and handle number.
    pub next_ids: (u64, u64),
    pub nodes: Vec<NodeState>,
    pub handles: Vec<HandleState>,
    pub owners: Vec<KeptOwner>,
    /// The fds it held, by node, handle and owner.
    pub kept: HashMap<Item, OwnedFd>,
}

/// A POSIX lock owner with the ranges its kept description holds on the host
/// (inclusive, `filelocks::OFFSET_MAX` for the end of file).
pub struct KeptOwner {
    pub owner: OwnerState,
    pub ranges: Vec<(u64, u64, i32)>,
}

/// Takes a dead serving process's record and fds from its keeper over `channel`.
pub fn collect(channel: UnixStream) -> io::Result<Inherited> {
    let keeper = keeper::Client::new(channel)?;
    let rec = Record::map(keeper.record()?, false)?;
    let nodes = rec.nodes();
    let handles = rec.handles();
    let mut wanted: Vec<(Item, RawFd)> = Vec::new();
    // Only the fds of nodes no name may find: nameless ones (an O_TMPFILE, a file
    // unlinked through the guest) and those with open handles (a file the host may have
    // unlinked). The others are found again by name or handle, in this process's own
    // mount namespace, whose mount ids the nodes' host keys must carry (a dead process's
    // fd is on its namespace's mount); and few fds keep clear of the fd limit the node
    // cache is sized to.
    let open: std::collections::HashSet<u64> = handles.iter().map(|h| h.node).collect();
    wanted.extend(
        nodes
            .iter()
            .filter(|n| n.fd >= 0 && (n.name.is_none() || open.contains(&n.id)))
            .map(|n| (Item::Node(n.id), n.fd)),
    );
    wanted.extend(
        handles
            .iter()
            .filter(|h| h.fd >= 0)
            .map(|h| (Item::Handle(h.fh), h.fd)),
    );
    let owners = rec.owners();
    wanted.extend(
        owners
            .iter()
            .filter(|o| o.fd >= 0)
            .map(|o| (Item::Owner(o.node, o.owner), o.fd)),
    );
    let numbers: Vec<RawFd> = wanted.iter().map(|&(_, fd)| fd).collect();
    let fds = keeper.fetch(&numbers)?;
    keeper.done();
    let mut kept: HashMap<Item, OwnedFd> = wanted
        .into_iter()
        .zip(fds)
        .filter_map(|((item, _), fd)| Some((item, fd?)))
        .collect();
    // A node's fd must be the file the record says (a hostile record could name any fd
    // of the dead process's table): one that is not is closed, and the node is found
    // again by its handle or name instead.
    for n in &nodes {
        let ours = kept.get(&Item::Node(n.id)).is_some_and(|fd| {
            crate::sys::fstat(fd).is_ok_and(|st| st.st_dev == n.dev && st.st_ino == n.ino)
        });
        if !ours {
            kept.remove(&Item::Node(n.id));
        }
    }
    // An owner's ranges are what its description holds now, as the host tells.
    let owners = owners
        .into_iter()
        .filter_map(|o| {
            let fd = kept.get(&Item::Owner(o.node, o.owner))?;
            let ranges = held_ranges(fd.as_raw_fd()).ok()?;
            Some(KeptOwner { owner: o, ranges })
        })
        .collect();
    Ok(Inherited {
        fs: FsState {
            session: rec.session(),
            next_ids: rec.next_ids(),
            nodes,
            handles,
            owners,
            kept,
        },
        rings: (0..record::MAX_RINGS).map(|q| rec.ring_state(q)).collect(),
    })
}

/// The OFD locks the open file description `fd` holds, from /proc/self/fdinfo: sorted
/// (start, inclusive end, F_RDLCK or F_WRLCK).
fn held_ranges(fd: RawFd) -> io::Result<Vec<(u64, u64, i32)>> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))?;
    let mut out = Vec::new();
    for line in info.lines().filter(|l| l.starts_with("lock:")) {
        // lock:  1: OFDLCK  ADVISORY  WRITE -1 08:01:1234 0 EOF
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 || f[2] != "OFDLCK" {
            continue;
        }
        let typ = match f[4] {
            "READ" => libc::F_RDLCK,
            "WRITE" => libc::F_WRLCK,
            _ => continue,
        };
        let max = crate::passthrough::filelocks::OFFSET_MAX;
        let start: u64 = f[7].parse().map_err(io::Error::other)?;
        let end: u64 = match f[8] {
            "EOF" => max,
            e => e.parse().map_err(io::Error::other)?,
        };
        out.push((start, end, typ));
    }
    out.sort_unstable();
    Ok(out)
}
