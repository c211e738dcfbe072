//! The source's side: the device state of a session (`PassthroughFs::save_state`), with
//! the offer of its own descriptions to a destination on the same host.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuse_backend_rs::api::filesystem::ROOT_ID;

use super::format::{
    framed, HandleState, NodeState, OwnerState, State, HEADER_LEN, MAX_NODES, MAX_STATE,
};
use super::{call, malformed, InFlight, ItemError, Mode, StateError};
use crate::passthrough::handover::{self, Item};
use crate::passthrough::inode::{Inode, InodeKey};
use crate::passthrough::PassthroughFs;
use crate::sys;

impl PassthroughFs {
    /// The device state of this session, header included, with the requests `in_flight`
    /// that the destination must answer.
    pub fn save_state(&self, in_flight: &[InFlight]) -> Result<Vec<u8>, StateError> {
        self.save_state_within(in_flight, MAX_STATE)
    }

    /// `save_state`, refusing a state over `limit` bytes before anything is offered.
    pub(super) fn save_state_within(
        &self,
        in_flight: &[InFlight],
        limit: usize,
    ) -> Result<Vec<u8>, StateError> {
        let mcfg = self.cfg.migration;
        let (records, next_node) = self.inodes.export();
        if records.len() > MAX_NODES {
            return Err(StateError::TooManyNodes(records.len()));
        }
        // The source's own descriptions for a destination on this host (`handover`), if
        // this daemon has a private directory to offer them in.
        let runtime = self.cfg.runtime_dir.clone();
        let mut pass: Vec<(Item, OwnedFd)> = Vec::new();
        let mut nodes = Vec::with_capacity(records.len());
        for r in records {
            let mut n = NodeState {
                id: r.inode.nodeid,
                lookups: r.lookups,
                file_type: r.file_type,
                name: r.name.as_ref().map(|(p, n)| (*p, n.to_bytes().to_vec())),
                path: None,
                handle: None,
                mount_root: r.name.as_ref().is_some_and(|(p, _)| {
                    self.inodes
                        .get(*p)
                        .is_ok_and(|p| p.key.mnt_id != r.inode.key.mnt_id)
                }),
                error: None,
            };
            let want_handle = mcfg.mode == Mode::FileHandles || mcfg.verify_handles;
            if want_handle {
                n.handle = match &r.handle {
                    Some(h) => Some(h.as_bytes().to_vec()),
                    None => r
                        .inode
                        .path_fd()
                        .and_then(|fd| sys::name_to_handle(fd.as_raw_fd()))
                        .map(|(h, _)| h.as_bytes().to_vec())
                        .map_err(|e| n.error = Some(format!("no file handle: {e}")))
                        .ok(),
                };
            }
            // A node without a name (unlinked) has no path to confirm: only the handover
            // moves it.
            if mcfg.mode == Mode::FindPaths && mcfg.confirm_paths && n.name.is_some() {
                if let Err(why) = self.confirm_path(&r.inode, &mut n) {
                    n.error = Some(why.to_string());
                }
            }
            // A file the host unlinked while the guest had it: its name finds nothing (or
            // another file), so it moves as a nameless node, by its own fd.
            if n.name.is_some()
                && runtime.is_some()
                && r.file_type == libc::S_IFREG
                && !still_named(&r.inode, &r.name)
            {
                let st = r.inode.path_fd().and_then(|fd| sys::fstat(&fd));
                if st.is_ok_and(|st| st.st_nlink == 0) {
                    n.name = None;
                }
            }
            if n.name.is_none() && n.path.is_none() && runtime.is_some() {
                // Open but unlinked, say: only its own fd can move it.
                if let Ok(fd) = r.inode.path_fd().and_then(|f| sys::dup(f.as_raw_fd())) {
                    pass.push((Item::Node(n.id), fd));
                }
            }
            nodes.push(n);
        }
        let (open, next_handle) = self.handles.export();
        if runtime.is_some() {
            for (fh, h) in &open {
                if let Ok(fd) = h.fd.try_clone() {
                    pass.push((Item::Handle(*fh), fd));
                }
            }
            for ((node, owner), fd) in self.locks.owner_fds() {
                pass.push((Item::Owner(node, owner), fd));
            }
        }
        let handles = open
            .into_iter()
            .map(|(fh, h)| HandleState {
                fh,
                node: h.inode.nodeid,
                flags: h.flags,
                dir: h.dir.is_some(),
                flock: h.flock.load(Ordering::Relaxed),
            })
            .collect();
        let owners = self
            .locks
            .export()
            .into_iter()
            .map(|o| OwnerState {
                node: o.node,
                owner: o.owner,
                pid: o.pid,
                handles: o.handles,
                ranges: o.ranges.iter().map(|r| (r.start, r.end, r.typ)).collect(),
            })
            .collect();
        let state = State {
            mode: mcfg.mode,
            flags: self.enabled.load(Ordering::Acquire) | self.no_open_mark(),
            next_node,
            next_handle,
            nodes,
            handles,
            owners,
            in_flight: in_flight.to_vec(),
            handover: None,
        };
        let mut body = postcard::to_stdvec(&state).map_err(|e| malformed(e.to_string()))?;
        // Its size is known before the socket exists: the offer (the last field) has a
        // fixed size. A state too large binds, shares and starts nothing.
        let offer_len = postcard::to_stdvec(&Some(handover::Offer::sized()))
            .map_err(|e| malformed(e.to_string()))?
            .len();
        let full = body.len() - 1 + if runtime.is_some() { offer_len } else { 1 };
        if HEADER_LEN + full > limit {
            return Err(StateError::TooLarge((HEADER_LEN + full) as u64));
        }
        if let Some(dir) = &runtime {
            match handover::Listener::bind(dir.fd()) {
                Ok(l) => {
                    // The encoded `None` gives way to the offer.
                    body.pop();
                    let offer = postcard::to_stdvec(&Some(l.offer()))
                        .map_err(|e| malformed(e.to_string()))?;
                    body.extend_from_slice(&offer);
                    // From now on a reset only closes: the destination may hold copies.
                    self.locks
                        .shared
                        .store(true, std::sync::atomic::Ordering::Release);
                    let dir = sys::dup(dir.fd())?;
                    std::thread::Builder::new()
                        .name("vfsd-handover".into())
                        .spawn(move || {
                            if l.serve(dir, pass) {
                                log::info!(
                                    "migration: the destination took this daemon's open files and locks"
                                );
                            }
                        })?;
                }
                Err(e) => {
                    log::info!("migration: no lock handover socket ({e}); locks are taken again")
                }
            }
        }
        Ok(framed(&body))
    }

    /// `--migration-confirm-paths`: whether the node's name still finds its file; if
    /// not, its current path from the host kernel (`/proc/self/fd`), checked the same way.
    fn confirm_path(&self, inode: &Arc<Inode>, n: &mut NodeState) -> Result<(), ItemError> {
        let fd = inode.path_fd().map_err(call("cannot open it"))?;
        let st = sys::statx(
            fd.as_raw_fd(),
            sys::EMPTY,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )?;
        let key = InodeKey::of(&st);
        let found_at = |p: &Arc<Inode>, name: &CStr| {
            let pfd = p.path_fd().ok()?;
            let s = sys::statx(pfd.as_raw_fd(), name, libc::AT_SYMLINK_NOFOLLOW).ok()?;
            (InodeKey::of(&s) == key).then_some(())
        };
        if let Some((pid, name)) = &n.name {
            let parent = self.inodes.get(*pid).ok().or_else(|| inode.parent());
            let cname =
                CString::new(name.clone()).map_err(|e| ItemError::Refused(e.to_string()))?;
            if parent.and_then(|p| found_at(&p, &cname)).is_some() {
                return Ok(());
            }
        }
        // The kernel's idea of the path, relative to the share's root (readlinkat on the
        // /proc/self/fd vfsd opened before its sandbox).
        let name = sys::fd_name(fd.as_raw_fd());
        let buf = sys::readlinkat(self.proc_self_fd.as_raw_fd(), &name)
            .ok()
            .filter(|b| b.len() < libc::PATH_MAX as usize)
            .ok_or("its name is stale and its path unknown")?;
        if buf.ends_with(b" (deleted)") {
            return Err("it was deleted".into());
        }
        let root = self.cfg.root_dir.as_os_str().as_encoded_bytes();
        let root = root.strip_suffix(b"/").unwrap_or(root);
        let rel = buf
            .strip_prefix(root)
            .and_then(|r| r.strip_prefix(b"/"))
            .ok_or_else(|| "its path is outside the share".to_string())?
            .to_vec();
        if rel.is_empty() {
            return Err("its path is the share's root".into());
        }
        // That path must find this very file now.
        let root_inode = self.inodes.get(ROOT_ID)?;
        let now = self.open_path(&root_inode, &rel)?;
        let s = sys::statx(
            now.as_raw_fd(),
            sys::EMPTY,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )?;
        if InodeKey::of(&s) != key {
            return Err("its current path finds another file".into());
        }
        n.path = Some(rel);
        Ok(())
    }
}

/// Whether `inode`'s file is still at `name` (its parent's id and its name there), told
/// by a statx of the name in the parent's fd: only directories are opened (once each,
/// then cached), where opening each of 100,000 files, most of them no longer holding an
/// fd, was most of a save's time. False: not known, and the caller looks closer.
fn still_named(inode: &Arc<Inode>, name: &Option<(u64, CString)>) -> bool {
    let (Some(parent), Some((_, name))) = (inode.parent(), name) else {
        return false;
    };
    let Ok(dir) = parent.path_fd() else {
        return false;
    };
    sys::statx(dir.as_raw_fd(), name, libc::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| InodeKey::of(&st) == inode.key && st.st.st_nlink > 0)
}
