//! Loads and saves of whole states: what a load refuses, and what a save offers.

use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuse_backend_rs::api::filesystem::ROOT_ID;

use super::format::{caps, NodeState, OwnerState, State, NO_OPEN_SESSION};
use super::restore::MAX_ID_GAP;
use super::*;
use crate::passthrough::{handover, Config, PassthroughFs};
use crate::sys;

fn bytes(state: &State) -> Vec<u8> {
    let body = postcard::to_stdvec(state).unwrap();
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn empty() -> State {
    State {
        mode: Mode::FindPaths,
        flags: 0,
        next_node: 2,
        next_handle: 1,
        nodes: Vec::new(),
        handles: Vec::new(),
        owners: Vec::new(),
        handover: None,
        in_flight: Vec::new(),
    }
}

pub(super) fn fs(dir: &std::path::Path) -> Arc<PassthroughFs> {
    Arc::new(PassthroughFs::new(Config::new(dir)).unwrap())
}
#[test]
fn id_counters_near_wrapping_or_far_past_the_state_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs(dir.path());
    fs.load_state(&bytes(&empty())).unwrap();
    for (node, fh) in [
        (u64::MAX, 1),
        (2, u64::MAX),
        (MAX_ID_GAP + 10, 1),
        (1, 1),
        (2, 0),
    ] {
        let s = State {
            next_node: node,
            next_handle: fh,
            ..empty()
        };
        assert!(fs.load_state(&bytes(&s)).is_err(), "{node} {fh}");
    }
}

#[test]
fn a_state_of_the_other_mode_or_with_flags_not_offered_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs(dir.path());
    let other = State {
        mode: Mode::FileHandles,
        ..empty()
    };
    assert!(matches!(
        fs.load_state(&bytes(&other)),
        Err(StateError::Malformed(_))
    ));
    let flags = State {
        flags: 1 << 62,
        ..empty()
    };
    assert!(matches!(
        fs.load_state(&bytes(&flags)),
        Err(StateError::Flags(_))
    ));
    // A --no-open source's guest names files by handle 0, which only --no-open serves.
    let no_open = State {
        flags: NO_OPEN_SESSION,
        ..empty()
    };
    assert!(matches!(
        fs.load_state(&bytes(&no_open)),
        Err(StateError::Malformed(m)) if m.contains("--no-open")
    ));
}

/// vfsd does not offer FUSE_ATOMIC_O_TRUNC, but an older vfsd did: its guest sends O_TRUNC
/// in OPEN, which OPEN still serves.
#[test]
fn a_session_with_atomic_o_trunc_from_an_older_source_loads() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs(dir.path());
    let atomic_o_trunc = State {
        flags: crate::abi::flags::ATOMIC_O_TRUNC,
        ..empty()
    };
    assert!(fs.load_state(&bytes(&atomic_o_trunc)).is_ok());
}

#[test]
fn a_second_node_for_a_known_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let fs = fs(dir.path());
    let node = |id| NodeState {
        id,
        lookups: 1,
        file_type: libc::S_IFREG,
        name: Some((ROOT_ID, b"f".to_vec())),
        path: None,
        handle: None,
        mount_root: false,
        error: None,
    };
    let s = State {
        next_node: 4,
        nodes: vec![node(2), node(3)],
        ..empty()
    };
    assert!(fs.load_state(&bytes(&s)).is_err());
    let dir_as_root = State {
        next_node: 3,
        nodes: vec![NodeState {
            file_type: libc::S_IFDIR,
            path: Some(b"..".to_vec()),
            ..node(2)
        }],
        ..empty()
    };
    assert!(fs.load_state(&bytes(&dir_as_root)).is_err());
}

/// A body: `empty()`'s fields around `nodes` given encoded by hand.
fn with_raw_nodes(count: usize, each: &[u8]) -> Vec<u8> {
    let mut body = postcard::to_stdvec(&(Mode::FindPaths, 0u64, 2u64, 1u64)).unwrap();
    body.extend_from_slice(&postcard::to_stdvec(&(count as u64)).unwrap()[..]);
    for _ in 0..count {
        body.extend_from_slice(each);
    }
    // No handles, owners, requests in flight or handover.
    body.extend_from_slice(&[0, 0, 0, 0]);
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

#[test]
fn a_stream_with_more_nodes_than_the_cap_is_refused_before_any_is_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs(dir.path());
    // The smallest node there is: id 3, no lookups, no type, no name: 7 bytes, about
    // 128 in memory once decoded.
    let minimal = [3, 0, 0, 0, 0, 0, 0];
    let ok = with_raw_nodes(1, &minimal);
    assert!(fs.load_state(&ok).is_err()); // id 3 is past next_node: decoded, refused
    assert_eq!(caps::decoded(), 1, "the count does not see decoded nodes");
    let flood = with_raw_nodes(MAX_NODES + 1, &minimal);
    assert!(flood.len() < MAX_STATE);
    match fs.load_state(&flood) {
        Err(StateError::Malformed(why)) => assert!(why.contains("over the limit"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        caps::decoded(),
        0,
        "nodes decoded before the count was checked"
    );
}

#[test]
fn lock_ranges_over_what_the_destination_lets_a_guest_hold_are_refused_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs(dir.path());
    let cap = fs.cfg.max_locks + 2 * fs.cfg.max_lock_waiters;
    let owner = |n: usize| OwnerState {
        node: 2,
        owner: 1,
        pid: 1,
        handles: vec![1],
        ranges: vec![(0, 0, libc::F_WRLCK); n],
    };
    // Over all owners: two of more than half the cap each.
    let half = cap / 2 + 1;
    let s = State {
        owners: vec![owner(half), owner(half)],
        ..empty()
    };
    match fs.load_state(&bytes(&s)) {
        Err(StateError::Malformed(why)) => assert!(why.contains("lock ranges"), "{why}"),
        other => panic!("{other:?}"),
    }
    // The first owner's ranges and the two owners' handle lists: not the second's ranges.
    assert_eq!(caps::decoded(), 2 + half + 1);
    // The handles owners name, the same way: 8 bytes in memory for each byte.
    let many = |n: usize| OwnerState {
        handles: vec![1; n],
        ..owner(1)
    };
    let half = MAX_HANDLES / 2 + 1;
    let s = State {
        owners: vec![many(half), many(half)],
        ..empty()
    };
    match fs.load_state(&bytes(&s)) {
        Err(StateError::Malformed(why)) => assert!(why.contains("handles of lock"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(caps::decoded(), half + 1 + 1);
}

#[test]
fn a_save_too_large_binds_no_handover_socket_and_shares_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    let private = std::fs::Permissions::from_mode(0o700);
    std::fs::set_permissions(run.path(), private).unwrap();
    let rd = sys::openat(
        libc::AT_FDCWD,
        &CString::new(run.path().as_os_str().as_encoded_bytes()).unwrap(),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )
    .unwrap();
    let mut cfg = Config::new(dir.path());
    cfg.runtime_dir = Some(Arc::new(handover::RuntimeDir::from_fd(rd).unwrap()));
    let fs = Arc::new(PassthroughFs::new(cfg).unwrap());
    let sockets = || std::fs::read_dir(run.path()).unwrap().count();
    assert!(matches!(
        fs.save_state_within(&[], HEADER_LEN + 8),
        Err(StateError::TooLarge(_))
    ));
    assert_eq!(sockets(), 0, "a handover socket for a state never sent");
    assert!(!fs.locks.shared.load(Ordering::Acquire));
    // Within the limit: offered.
    fs.save_state_within(&[], MAX_STATE).unwrap();
    assert_eq!(sockets(), 1);
    assert!(fs.locks.shared.load(Ordering::Acquire));
}

#[test]
fn too_many_or_too_large_requests_in_flight_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs(dir.path());
    let r = |len| InFlight {
        queue: 1,
        head: 0,
        position: 0,
        reply_at: 0,
        request: vec![0; len],
    };
    let one = State {
        in_flight: vec![r(88)],
        ..empty()
    };
    assert_eq!(fs.load_state(&bytes(&one)).unwrap().in_flight, vec![r(88)]);
    let large = State {
        in_flight: vec![r(MAX_IN_FLIGHT_REQUEST + 1)],
        ..empty()
    };
    assert!(fs.load_state(&bytes(&large)).is_err());
    let many = State {
        in_flight: (0..=fs.cfg.max_lock_waiters).map(|_| r(88)).collect(),
        ..empty()
    };
    assert!(fs.load_state(&bytes(&many)).is_err());
}
