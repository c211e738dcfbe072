//! The stream a migration carries: its header (`MAGIC`, a version, a length), the
//! postcard body (`State`) and the caps on what decoding it may allocate.

use serde::{Deserialize, Serialize};

use super::{Mode, StateError};
use crate::filesystem::InFlight;
use crate::passthrough::handover;
use crate::passthrough::PassthroughFs;

/// The first bytes of a vfsd device state.
pub const MAGIC: [u8; 8] = *b"VFSDSTAT";
/// The format this vfsd writes and reads.
pub const VERSION: u32 = 3;
/// The largest state accepted: about a million nodes with 255-byte names under
/// find-paths (docs/design.md, Bounds).
pub const MAX_STATE: usize = 256 << 20;
/// The most nodes a state may carry: checked as the count is read, before any is decoded,
/// so a stream of minimal nodes (7 bytes each, 128 in memory) can't cost the destination
/// more than this many.
pub const MAX_NODES: usize = 1 << 21;
/// The most handles: each is an open file on the source, within its fd limit (the
/// kernel's nr_open default).
pub const MAX_HANDLES: usize = 1 << 20;
/// Header: magic, version (le32), body length (le64).
pub const HEADER_LEN: usize = 8 + 4 + 8;

/// A bit of a state's `flags` no INIT flag uses: the source served the guest under
/// `--no-open`, so a destination must too (the guest names every file by handle 0).
pub(super) const NO_OPEN_SESSION: u64 = 1 << 63;

impl PassthroughFs {
    pub(super) fn no_open_mark(&self) -> u64 {
        if self.cfg.no_open {
            NO_OPEN_SESSION
        } else {
            0
        }
    }
}

#[derive(Serialize, Deserialize, Debug)]
pub(super) struct State {
    pub(super) mode: Mode,
    pub(super) flags: u64,
    pub(super) next_node: u64,
    pub(super) next_handle: u64,
    #[serde(deserialize_with = "caps::nodes")]
    pub(super) nodes: Vec<NodeState>,
    #[serde(deserialize_with = "caps::handles")]
    pub(super) handles: Vec<HandleState>,
    #[serde(deserialize_with = "caps::owners")]
    pub(super) owners: Vec<OwnerState>,
    #[serde(deserialize_with = "caps::in_flight")]
    pub(super) in_flight: Vec<InFlight>,
    /// Where the destination takes the source's own descriptions (`handover`). Last, so
    /// the save can check its size before it binds the socket (`save_state`).
    pub(super) handover: Option<handover::Offer>,
}

/// Caps on what a load decodes: each sequence's length is checked as it is read, before
/// any of its elements, so what a stream can make the destination allocate is bounded by
/// the counts, not by how compactly the stream encodes them (docs/design.md, Bounds).
pub(super) mod caps {
    use serde::de::{Deserialize, Deserializer, Error, SeqAccess, Visitor};
    use std::cell::Cell;

    #[derive(Clone, Copy, Debug)]
    pub struct Caps {
        pub nodes: usize,
        pub handles: usize,
        pub owners: usize,
        /// Lock ranges over all owners.
        pub ranges: usize,
        /// Handles the owners name, over all owners.
        pub owner_handles: usize,
        pub in_flight: usize,
    }

    thread_local! {
        static CAPS: Cell<Option<Caps>> = const { Cell::new(None) };
        /// Ranges and owners' handles still allowed in this decode (their caps are over
        /// all owners).
        static RANGES_LEFT: Cell<usize> = const { Cell::new(0) };
        static OWNER_HANDLES_LEFT: Cell<usize> = const { Cell::new(0) };
        /// Elements decoded under a cap in this decode (for the tests).
        static DECODED: Cell<usize> = const { Cell::new(0) };
        /// Why a cap refused (postcard keeps no message of a custom error).
        static REFUSED: Cell<Option<String>> = const { Cell::new(None) };
    }

    /// Why the last decode on this thread was refused by a cap, if it was.
    pub fn refusal() -> Option<String> {
        REFUSED.take()
    }

    /// Runs `f` (a decode) under `caps`.
    pub fn with<T>(caps: Caps, f: impl FnOnce() -> T) -> T {
        CAPS.set(Some(caps));
        RANGES_LEFT.set(caps.ranges);
        OWNER_HANDLES_LEFT.set(caps.owner_handles);
        DECODED.set(0);
        REFUSED.set(None);
        let r = f();
        CAPS.set(None);
        r
    }

    /// Elements the last decode on this thread took.
    #[cfg(test)]
    pub fn decoded() -> usize {
        DECODED.get()
    }

    /// A cap of its own per sequence, or a budget all owners share.
    #[derive(Clone, Copy)]
    enum Cap {
        Own(fn(&Caps) -> usize),
        Shared(&'static std::thread::LocalKey<Cell<usize>>),
    }

    fn capped<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
        what: &'static str,
        cap: Cap,
    ) -> Result<Vec<T>, D::Error> {
        struct V<T> {
            what: &'static str,
            max: usize,
            cap: Cap,
            _t: std::marker::PhantomData<T>,
        }
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Vec<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "at most {} {}", self.max, self.what)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
                // postcard gives the exact length up front.
                let n = seq
                    .size_hint()
                    .ok_or_else(|| A::Error::custom(format!("{} without a count", self.what)))?;
                if n > self.max {
                    let why = format!("{n} {}, over the limit of {}", self.what, self.max);
                    REFUSED.set(Some(why.clone()));
                    return Err(A::Error::custom(why));
                }
                if let Cap::Shared(left) = self.cap {
                    left.set(left.get() - n);
                }
                let mut v = Vec::with_capacity(n.min(4096));
                while let Some(x) = seq.next_element()? {
                    DECODED.set(DECODED.get() + 1);
                    v.push(x);
                }
                Ok(v)
            }
        }
        let caps = CAPS
            .get()
            .ok_or_else(|| D::Error::custom("decoded outside a load"))?;
        let max = match cap {
            Cap::Own(f) => f(&caps),
            Cap::Shared(left) => left.get(),
        };
        d.deserialize_seq(V::<T> {
            what,
            max,
            cap,
            _t: std::marker::PhantomData,
        })
    }

    pub fn nodes<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
        capped(d, "nodes", Cap::Own(|c| c.nodes))
    }
    pub fn handles<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        capped(d, "handles", Cap::Own(|c| c.handles))
    }
    pub fn owners<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        capped(d, "lock owners", Cap::Own(|c| c.owners))
    }
    pub fn ranges<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        capped(d, "lock ranges", Cap::Shared(&RANGES_LEFT))
    }
    pub fn owner_handles<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        capped(
            d,
            "handles of lock owners",
            Cap::Shared(&OWNER_HANDLES_LEFT),
        )
    }
    pub fn in_flight<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        capped(d, "requests in flight", Cap::Own(|c| c.in_flight))
    }
}

/// The largest request an `InFlight` carries (a SETLKW is 88 bytes).
pub const MAX_IN_FLIGHT_REQUEST: usize = 256;

#[derive(Serialize, Deserialize, Debug)]
pub(super) struct NodeState {
    pub(super) id: u64,
    /// 0: a forgotten directory that names go through.
    pub(super) lookups: u64,
    pub(super) file_type: u32,
    /// Its parent's id and its name there.
    pub(super) name: Option<(u64, Vec<u8>)>,
    /// A path from the share's root, where `--migration-confirm-paths` found the name
    /// stale; it then takes the place of `name`.
    pub(super) path: Option<Vec<u8>>,
    pub(super) handle: Option<Vec<u8>>,
    /// The root of a mount other than its parent's (a submount of the share): a handle
    /// opens only on its own mount, and mount ids differ between daemons, so under
    /// file-handles the destination finds it by its name and checks its handle.
    pub(super) mount_root: bool,
    /// Why the source could not describe it (the destination decides what follows).
    pub(super) error: Option<String>,
}

#[derive(Serialize, Deserialize, Debug)]
pub(super) struct HandleState {
    pub(super) fh: u64,
    pub(super) node: u64,
    pub(super) flags: i32,
    pub(super) dir: bool,
    pub(super) flock: i32,
}

#[derive(Serialize, Deserialize, Debug)]
pub(super) struct OwnerState {
    pub(super) node: u64,
    pub(super) owner: u64,
    pub(super) pid: u32,
    #[serde(deserialize_with = "caps::owner_handles")]
    pub(super) handles: Vec<u64>,
    #[serde(deserialize_with = "caps::ranges")]
    pub(super) ranges: Vec<(u64, u64, i32)>,
}

/// Checks the header; gives the body's length.
pub fn parse_header(h: &[u8]) -> Result<usize, StateError> {
    if h.len() < HEADER_LEN {
        return Err(StateError::Truncated {
            got: h.len(),
            want: HEADER_LEN,
        });
    }
    if h[..8] != MAGIC {
        return Err(StateError::BadMagic);
    }
    let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
    if version != VERSION {
        return Err(StateError::Version(version));
    }
    let len = u64::from_le_bytes(h[12..20].try_into().unwrap());
    if len > (MAX_STATE - HEADER_LEN) as u64 {
        return Err(StateError::TooLarge(len));
    }
    Ok(len as usize)
}

/// The stream of body `body`: the header, then the body.
pub(super) fn framed(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(body);
    out
}
