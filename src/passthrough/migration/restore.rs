//! The destination's side: a state loaded into a fresh daemon (`load_state`), or the
//! session of a serving process that died taken over (`take_over`); its nodes, handles
//! and lock owners installed again.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use fuse_backend_rs::api::filesystem::ROOT_ID;

use super::find::{in_parallel, kept_node, levels, unlinked_node, Found, FIND_BATCH};
use super::format::{
    caps, HandleState, NodeState, OwnerState, State, HEADER_LEN, MAX_HANDLES,
    MAX_IN_FLIGHT_REQUEST, MAX_NODES, NO_OPEN_SESSION,
};
use super::retake::LockWait;
use super::{call, malformed, parse_header, InFlight, ItemError, Mode, OnError, StateError};
use crate::filesystem::wake::{Blocker, FinishOwned};
use crate::passthrough::filelocks::{self, OwnerRecord, Range};
use crate::passthrough::handle::Handle;
use crate::passthrough::handover::{self, Item};
use crate::passthrough::inode::Inode;
use crate::passthrough::PassthroughFs;
use crate::sys;

/// Node and handle numbers a state may continue from: past the largest it names by at
/// most this, and far from wrapping.
pub(super) const MAX_ID_GAP: u64 = 1 << 32;
const MAX_ID: u64 = 1 << 62;
/// How long a load waits, over all its handles, for host lease holders to let go of the
/// files it opens again (`reopen_for_load`).
const LEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// What a load did (logged, and for the tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LoadReport {
    pub nodes: usize,
    pub handles: usize,
    pub owners: usize,
    /// Nodes, handles and owners left out under `--migration-on-error guest-error`.
    pub failed: usize,
    /// Locks still held elsewhere (the source), taken by waiting threads.
    pub waiting_locks: usize,
    /// The requests the source left unanswered, for the server to take up.
    pub in_flight: Vec<InFlight>,
}

impl PassthroughFs {
    /// Loads a device state `save_state` made (on this or another vfsd) into a daemon
    /// that has served no request since it started or was reset. On an error (and with
    /// `abort`, on any node, handle or lock that can't be restored) nothing stays loaded.
    pub fn load_state(self: &Arc<Self>, bytes: &[u8]) -> Result<LoadReport, StateError> {
        let len = parse_header(bytes)?;
        let body = &bytes[HEADER_LEN.min(bytes.len())..];
        if body.len() != len {
            return Err(StateError::Truncated {
                got: body.len(),
                want: len,
            });
        }
        let state: State = caps::with(self.load_caps(), || postcard::from_bytes(body))
            .map_err(|e| malformed(caps::refusal().unwrap_or_else(|| e.to_string())))?;
        // A fresh session, as after DESTROY: a load replaces whatever was there.
        self.reset();
        let r = self.restore(&state, None);
        if r.is_err() {
            self.reset();
        }
        r
    }

    /// What a load decodes at most: nodes and handles as `MAX_NODES`, `MAX_HANDLES`;
    /// owners and ranges what this daemon's `--max-locks` lets a guest hold (a granted
    /// wait may pass it by one range per waiter, twice), requests in flight its waiters.
    fn load_caps(&self) -> caps::Caps {
        caps::Caps {
            nodes: MAX_NODES,
            handles: MAX_HANDLES,
            owners: self.cfg.max_locks,
            ranges: self.cfg.max_locks + 2 * self.cfg.max_lock_waiters,
            owner_handles: MAX_HANDLES,
            in_flight: self.cfg.max_lock_waiters,
        }
    }

    /// Takes over the session a serving process that died left (`recovery`): its nodes
    /// and handles as its crash record names them, with the fds it held (`kept`, by node
    /// and handle), into this daemon, fresh since it started. A node or handle that can't
    /// be restored is left out (the guest gets errors for it), whatever
    /// `--migration-on-error` says: the alternative is the whole share gone.
    pub(crate) fn take_over(
        self: &Arc<Self>,
        dead: crate::recovery::FsState,
    ) -> Result<LoadReport, StateError> {
        let crate::recovery::FsState {
            session,
            next_ids,
            nodes,
            handles,
            owners,
            kept,
        } = dead;
        let nodes = parents_first(nodes)
            .into_iter()
            .map(|n| NodeState {
                id: n.id,
                lookups: n.lookups,
                file_type: n.file_type,
                name: n.name,
                path: None,
                handle: n.handle,
                mount_root: false,
                error: None,
            })
            .collect::<Vec<_>>();
        let max_node = nodes.iter().map(|n| n.id).max().unwrap_or(ROOT_ID);
        let max_fh = handles.iter().map(|h| h.fh).max().unwrap_or(0);
        let state = State {
            mode: self.cfg.migration.mode,
            flags: session | self.no_open_mark(),
            next_node: next_ids.0.max(max_node + 1),
            next_handle: next_ids.1.max(max_fh + 1),
            nodes,
            handles: handles
                .iter()
                .map(|h| HandleState {
                    fh: h.fh,
                    node: h.node,
                    flags: h.flags,
                    dir: h.dir,
                    flock: libc::F_UNLCK,
                })
                .collect(),
            owners: owners
                .into_iter()
                .map(|o| OwnerState {
                    node: o.owner.node,
                    owner: o.owner.owner,
                    pid: o.owner.pid,
                    // The handles it locked through are not recorded: every open handle
                    // of its file stands for them, so the owner (an OFD lock's is its
                    // open file) ends only with the last of them, never early.
                    handles: handles
                        .iter()
                        .filter(|h| h.node == o.owner.node)
                        .map(|h| h.fh)
                        .collect(),
                    ranges: o.ranges,
                })
                .collect(),
            in_flight: Vec::new(),
            handover: None,
        };
        self.reset();
        let r = self.restore(&state, Some(kept));
        if r.is_err() {
            self.reset();
        }
        r
    }

    /// `kept`: the fds of a dead serving process (`take_over`), used before any other
    /// way of finding a node; their errors leave the node or handle out.
    fn restore(
        self: &Arc<Self>,
        state: &State,
        kept: Option<HashMap<Item, OwnedFd>>,
    ) -> Result<LoadReport, StateError> {
        let taking_over = kept.is_some();
        let mcfg = self.cfg.migration;
        // A source that offered FUSE_ATOMIC_O_TRUNC (an older vfsd, as virtiofsd does) left
        // a guest that sends O_TRUNC in OPEN: served as sent, though not offered here.
        let extra = state.flags
            & !(self.wanted_flags() | self.no_open_mark())
            & !(crate::abi::flags::INIT_EXT | crate::abi::flags::ATOMIC_O_TRUNC);
        if extra & NO_OPEN_SESSION != 0 {
            return Err(malformed(
                "the source served the guest under --no-open (it sends handle 0 for every \
                 file): run this vfsd with --no-open too"
                    .to_string(),
            ));
        }
        if extra != 0 {
            return Err(StateError::Flags(extra));
        }
        if state.mode != mcfg.mode {
            return Err(malformed(format!(
                "the source used {:?}, this daemon --migration-mode {:?}",
                state.mode, mcfg.mode
            )));
        }
        let max_node = state.nodes.iter().map(|n| n.id).max().unwrap_or(ROOT_ID);
        let max_fh = state.handles.iter().map(|h| h.fh).max().unwrap_or(0);
        let bounded = |next: u64, max: u64| {
            next > max && next <= max.saturating_add(MAX_ID_GAP) && next < MAX_ID
        };
        if !bounded(state.next_node, max_node) || !bounded(state.next_handle, max_fh) {
            return Err(malformed("bad id counters"));
        }
        if state.in_flight.len() > self.cfg.max_lock_waiters
            || state
                .in_flight
                .iter()
                .any(|r| r.request.len() > MAX_IN_FLIGHT_REQUEST)
        {
            return Err(malformed(format!(
                "{} requests in flight (at most --max-lock-waiters {}, of {MAX_IN_FLIGHT_REQUEST} bytes each)",
                state.in_flight.len(),
                self.cfg.max_lock_waiters
            )));
        }
        let mut report = LoadReport {
            in_flight: state.in_flight.clone(),
            ..LoadReport::default()
        };
        let guest_error = mcfg.on_error == OnError::GuestError || taking_over;
        // Errors that `guest-error` turns into a missing node, handle or owner.
        let soft = |e: StateError, report: &mut LoadReport| {
            if guest_error {
                log::warn!("migration: {e}; the guest gets errors for it");
                report.failed += 1;
                Ok(())
            } else {
                Err(e)
            }
        };
        let root = self.inodes.get(ROOT_ID)?;
        let mut restored: HashMap<u64, Arc<Inode>> = HashMap::new();
        restored.insert(ROOT_ID, root.clone());
        let anchor = match state.mode {
            Mode::FileHandles => Some(self.inodes.root_anchor()?),
            Mode::FindPaths => None,
        };
        let mut passed = match (&state.handover, &self.cfg.runtime_dir) {
            _ if taking_over => kept.unwrap_or_default(),
            (Some(_), None) => {
                log::info!(
                    "migration: no runtime directory for the lock handover; locks are taken again"
                );
                HashMap::new()
            }
            (Some(offer), Some(dir)) => {
                match handover::receive(dir.fd(), offer, &expected(state)) {
                    Ok(p) => {
                        self.locks
                            .shared
                            .store(true, std::sync::atomic::Ordering::Release);
                        p
                    }
                    Err(e) => {
                        log::info!("migration: no lock handover from the source ({e}); locks are taken again");
                        HashMap::new()
                    }
                }
            }
            (None, _) => HashMap::new(),
        };
        let mut ids = std::collections::HashSet::with_capacity(state.nodes.len());
        for n in &state.nodes {
            if n.id <= ROOT_ID || n.id >= state.next_node || !ids.insert(n.id) {
                return Err(malformed(format!("bad or repeated node id {}", n.id)));
            }
        }
        // Level by level from the root: a node's parent (earlier in the state) is found
        // first, and the nodes of one level are found in parallel, since finding a file
        // again (an openat, a statx, a file handle) is most of a large load's time.
        // A batch at a time: every file found holds an fd until it is installed, and the
        // node fd cache gives fds back only as nodes come in.
        let batches = levels(&state.nodes)
            .into_iter()
            .flat_map(|l| l.chunks(FIND_BATCH).map(<[_]>::to_vec).collect::<Vec<_>>());
        for level in batches {
            let fds: Vec<Option<OwnedFd>> = level
                .iter()
                .map(|n| passed.remove(&Item::Node(n.id)))
                .collect();
            let find = |(n, fd): (&&NodeState, Option<OwnedFd>)| match (&n.error, fd) {
                (Some(why), _) => Err(format!("the source could not send it: {why}").into()),
                // A name first (the host key then has this namespace's mount id), the
                // kept fd where the name finds nothing (a file the host unlinked).
                (None, Some(fd)) if taking_over && n.name.is_some() => self
                    .find_node(n, state.mode, &restored, anchor.as_ref(), &root)
                    .or_else(|_| kept_node(fd, n, &restored)),
                (None, Some(fd)) if taking_over => kept_node(fd, n, &restored),
                (None, Some(fd)) if n.name.is_none() && n.path.is_none() => {
                    unlinked_node(fd, n, root.key.dev)
                }
                (None, _) => self.find_node(n, state.mode, &restored, anchor.as_ref(), &root),
            };
            let found = in_parallel(level.iter().zip(fds).collect(), find);
            for (n, found) in level.into_iter().zip(found) {
                self.restore_found(n, found, &mut restored, &mut report, &soft)?;
            }
        }
        self.inodes.continue_ids_from(state.next_node);

        let mut waits = Vec::new();
        let lease_deadline = std::time::Instant::now() + LEASE_WAIT;
        for h in &state.handles {
            let fd = passed.remove(&Item::Handle(h.fh));
            match self.restore_handle(h, state.next_handle, &restored, fd, lease_deadline) {
                Ok(Some(w)) => waits.push(w),
                Ok(None) => {}
                Err(why) => {
                    soft(StateError::Handle { fh: h.fh, why }, &mut report)?;
                    continue;
                }
            }
            report.handles += 1;
        }
        for o in &state.owners {
            let fd = passed.remove(&Item::Owner(o.node, o.owner));
            match self.restore_owner(o, &restored, fd) {
                Ok(Some(w)) => waits.push(w),
                Ok(None) => {}
                Err(why) => {
                    let e = StateError::Lock {
                        node: o.node,
                        owner: o.owner,
                        why,
                    };
                    soft(e, &mut report)?;
                    continue;
                }
            }
            report.owners += 1;
        }
        // Each wait takes a thread, like a guest's SETLKW: bounded the same way.
        if waits.len() > self.cfg.max_lock_waiters {
            return Err(StateError::Malformed(format!(
                "{} locks to wait for, over --max-lock-waiters {}",
                waits.len(),
                self.cfg.max_lock_waiters
            )));
        }
        report.waiting_locks = waits.len();
        // The record carries the counters on, so a process taking over from this one
        // never hands out a number the guest may still hold.
        if let Some(r) = &self.cfg.crash_record {
            r.note_next_node(state.next_node);
            r.note_next_handle(state.next_handle);
        }
        for w in waits {
            w.spawn();
        }
        self.start_session(state.flags);
        Ok(report)
    }

    /// Installs node `n` found as `found` (or leaves it out, as `soft` says).
    fn restore_found(
        &self,
        n: &NodeState,
        found: Result<Found, ItemError>,
        restored: &mut HashMap<u64, Arc<Inode>>,
        report: &mut LoadReport,
        soft: &dyn Fn(StateError, &mut LoadReport) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        match found {
            Ok((fd, st, name)) => {
                let parent = name.as_ref().map(|(p, c)| (p, c.as_c_str()));
                let inode = self
                    .inodes
                    .restore(n.id, n.lookups, fd, &st, parent)
                    .map_err(|e| StateError::Node {
                        node: n.id,
                        why: e.into(),
                    })?;
                restored.insert(n.id, inode);
                if n.lookups > 0 {
                    report.nodes += 1;
                }
                Ok(())
            }
            Err(why) => soft(StateError::Node { node: n.id, why }, report),
        }
    }

    fn restore_handle(
        self: &Arc<Self>,
        h: &HandleState,
        next: u64,
        restored: &HashMap<u64, Arc<Inode>>,
        passed: Option<OwnedFd>,
        lease_deadline: std::time::Instant,
    ) -> Result<Option<LockWait>, ItemError> {
        let inode = restored
            .get(&h.node)
            .filter(|i| i.lookups() > 0)
            .ok_or_else(|| format!("its node {} was not restored", h.node))?;
        if h.dir != inode.is_dir() {
            return Err("its node's file type does not match".into());
        }
        let flags = if h.dir {
            libc::O_RDONLY | libc::O_DIRECTORY
        } else {
            // Opened again: never create or truncate what the guest already has open; and
            // through this daemon's own rules for guest flags (its --allow-direct-io,
            // --preserve-noatime, writeback).
            let f = h.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
            let f = self.host_flags(f as u32);
            self.check_open_flags(f)?;
            f
        };
        // The source's own description (its offset, its flock) if it is this node's file,
        // a regular file or directory, open with the state's access mode.
        let usable = |fd: &OwnedFd| {
            (inode.is_reg() || inode.is_dir()) && same_file(fd, inode) && same_access(fd, flags)
        };
        let fd = match passed.filter(usable) {
            Some(fd) => fd,
            None => self.reopen_for_load(inode, flags, lease_deadline)?,
        };
        let nowait = !h.dir && self.nowait_unsupported.worth_trying(inode.key.mnt_id);
        let handle = Handle {
            inode: inode.clone(),
            fd,
            flags,
            dir: h.dir.then(Default::default),
            nowait_reads: AtomicBool::new(nowait),
            flock: AtomicI32::new(libc::F_UNLCK),
            flock_pending: Default::default(),
            write_tick: Default::default(),
        };
        self.handles.restore(h.fh, handle, next)?;
        if h.flock == libc::F_UNLCK {
            return Ok(None);
        }
        if h.flock != libc::F_RDLCK && h.flock != libc::F_WRLCK {
            return Err("bad flock type".into());
        }
        let handle = self.handles.get(h.fh, h.node)?;
        match filelocks::flock(handle.fd.as_raw_fd(), h.flock, false) {
            Ok(()) => {
                handle.flock.store(h.flock, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                let retake = Arc::new(Blocker::holding_before_start());
                *handle.flock_pending.lock().unwrap() = Some(retake.clone());
                Ok(Some(LockWait::Flock {
                    fs: self.clone(),
                    handle,
                    typ: h.flock,
                    retake: FinishOwned(retake),
                }))
            }
            Err(e) => Err(call("flock")(e)),
        }
    }

    /// Opens a handle's file again without waiting on a host lease: a blocking open would
    /// wait `lease-break-time` (45 s by default) for each leased file while the VM is
    /// paused. The open (O_NONBLOCK) tells the holder to let go; the load tries again
    /// until `deadline`, one for the whole load, and then gives the handle up.
    fn reopen_for_load(
        &self,
        inode: &Arc<Inode>,
        flags: i32,
        deadline: std::time::Instant,
    ) -> Result<OwnedFd, ItemError> {
        loop {
            match self.reopen(inode, flags | libc::O_NONBLOCK) {
                Ok(fd) => {
                    if flags & libc::O_NONBLOCK == 0 {
                        sys::clear_nonblock(fd.as_raw_fd())?;
                    }
                    return Ok(fd);
                }
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    if std::time::Instant::now() >= deadline {
                        return Err("a host lease holds it, and its holder did not let go".into());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn restore_owner(
        self: &Arc<Self>,
        o: &OwnerState,
        restored: &HashMap<u64, Arc<Inode>>,
        passed: Option<OwnedFd>,
    ) -> Result<Option<LockWait>, ItemError> {
        let inode = restored
            .get(&o.node)
            .filter(|i| i.lookups() > 0 && i.is_reg())
            .ok_or_else(|| format!("its node {} was not restored", o.node))?;
        // An owner locks through the guest's handles: with all of them left out, nobody
        // could ever unlock it short of a FORGET (under `guest-error`).
        if !o.handles.is_empty() && !self.handles_open(o.node, &o.handles) {
            return Err("its handles were all left out".into());
        }
        let mut ranges = Vec::with_capacity(o.ranges.len());
        for &(start, end, typ) in &o.ranges {
            ranges.push(Range::new(start, end, typ as u32).map_err(|_| "a bad range")?);
        }
        let rec = OwnerRecord {
            node: o.node,
            owner: o.owner,
            pid: o.pid,
            handles: o.handles.clone(),
            ranges,
        };
        let open = || self.lock_description(o.node)(self.cfg.readonly);
        // The source's own description holds the ranges already: placing them again on
        // it succeeds at once, and nobody else can take them meanwhile.
        let usable = |fd: &OwnedFd| {
            // SAFETY: plain fcntl on an fd we own.
            let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
            same_file(fd, inode) && fl >= 0 && fl & libc::O_PATH == 0
        };
        let fd = match passed.filter(usable) {
            Some(fd) => fd,
            None => open()?,
        };
        match self.locks.restore_owner(&rec, fd) {
            Ok(()) => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                let retake = Arc::new(Blocker::holding_before_start());
                self.locks.set_pending(rec.node, rec.owner, retake.clone());
                Ok(Some(LockWait::Posix {
                    fs: self.clone(),
                    rec,
                    retake: FinishOwned(retake),
                }))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The fds a handover may bring for `state`: its handles, its owners, its nameless nodes.
fn expected(state: &State) -> std::collections::HashSet<Item> {
    let mut e: std::collections::HashSet<Item> =
        state.handles.iter().map(|h| Item::Handle(h.fh)).collect();
    e.extend(state.owners.iter().map(|o| Item::Owner(o.node, o.owner)));
    e.extend(
        state
            .nodes
            .iter()
            .filter(|n| n.name.is_none() && n.path.is_none())
            .map(|n| Item::Node(n.id)),
    );
    e
}

/// Whether `fd` is open (not O_PATH) with the access mode of `flags`.
fn same_access(fd: &OwnedFd, flags: i32) -> bool {
    // SAFETY: plain fcntl on an fd we own.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    fl >= 0 && fl & libc::O_PATH == 0 && fl & libc::O_ACCMODE == flags & libc::O_ACCMODE
}

/// Whether `fd` (from the handover) is `inode`'s file. By device and inode number: the
/// mount id differs, as the source's fd is on a mount of its own sandbox.
fn same_file(fd: &OwnedFd, inode: &Inode) -> bool {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    sys::statx(fd.as_raw_fd(), sys::EMPTY, flags)
        .is_ok_and(|st| st.st.st_dev == inode.key.dev && st.st.st_ino == inode.key.ino)
}

/// Nodes ordered so that each comes after the parent its name is in; a node whose
/// parent is missing (or in a loop of names) keeps no name.
fn parents_first(
    nodes: Vec<crate::recovery::record::NodeState>,
) -> Vec<crate::recovery::record::NodeState> {
    let ids: std::collections::HashSet<u64> = nodes.iter().map(|n| n.id).collect();
    let mut children: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        match &n.name {
            Some((p, _)) if *p != n.id && (ids.contains(p) || *p == ROOT_ID) => {
                children.entry(*p).or_default().push(i)
            }
            _ => roots.push(i),
        }
    }
    let mut order = Vec::with_capacity(nodes.len());
    let mut stack: Vec<u64> = vec![ROOT_ID];
    let mut placed = vec![false; nodes.len()];
    for &i in &roots {
        placed[i] = true;
        order.push(i);
        stack.push(nodes[i].id);
    }
    while let Some(id) = stack.pop() {
        for &c in children.get(&id).map(Vec::as_slice).unwrap_or(&[]) {
            if !placed[c] {
                placed[c] = true;
                order.push(c);
                stack.push(nodes[c].id);
            }
        }
    }
    let mut nodes: Vec<Option<_>> = nodes.into_iter().map(Some).collect();
    let mut out: Vec<_> = order.iter().filter_map(|&i| nodes[i].take()).collect();
    // What a loop of names left unplaced comes last, nameless.
    out.extend(nodes.into_iter().flatten().map(|mut n| {
        n.name = None;
        n
    }));
    out
}
