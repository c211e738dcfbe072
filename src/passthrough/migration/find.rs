//! Finding a node's file again on the destination: by its name in its parent (found
//! first), by a path, by its file handle, or from an fd the source or a dead serving
//! process left; never outside the share. Nodes are found level by level, in parallel.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use fuse_backend_rs::api::filesystem::ROOT_ID;

use super::format::NodeState;
use super::{call, ItemError, Mode};
use crate::passthrough::inode::{Inode, InodeKey};
use crate::passthrough::PassthroughFs;
use crate::sys;

/// A name the state may carry: one path component, never `.`, `..` or empty.
fn component(name: &[u8]) -> Result<CString, String> {
    if name.is_empty() || name == b"." || name == b".." || name.len() > 255 {
        return Err(format!("bad name {:?}", String::from_utf8_lossy(name)));
    }
    if name.contains(&b'/') {
        return Err(format!(
            "name {:?} has a slash",
            String::from_utf8_lossy(name)
        ));
    }
    CString::new(name).map_err(|_| "name with a NUL byte".to_string())
}

impl PassthroughFs {
    /// Opens node `n`'s file the way the state says to find it.
    pub(super) fn find_node(
        &self,
        n: &NodeState,
        mode: Mode,
        restored: &HashMap<u64, Arc<Inode>>,
        anchor: Option<&OwnedFd>,
        root: &Arc<Inode>,
    ) -> Result<Found, ItemError> {
        let name = match &n.name {
            Some((p, name)) => {
                let parent = restored
                    .get(p)
                    .ok_or_else(|| format!("its parent {p} is not in the state before it"))?;
                if !parent.is_dir() {
                    return Err(format!("its parent {p} is not a directory").into());
                }
                Some((parent.clone(), component(name)?))
            }
            None => None,
        };
        let nofollow = libc::O_PATH | libc::O_NOFOLLOW;
        let fd = match (mode, anchor) {
            (Mode::FileHandles, Some(anchor)) => {
                let h = n.handle.as_ref().ok_or("no file handle in the state")?;
                let h = sys::FileHandle::from_bytes(h).map_err(|_| "a malformed file handle")?;
                match &name {
                    // A submount's root: by its name in its parent (inside the share by
                    // construction), and only if it is the very directory the source had.
                    Some((parent, cname)) if n.mount_root => {
                        let pfd = parent.path_fd()?;
                        let fd =
                            sys::openat(pfd.as_raw_fd(), cname, nofollow, 0).map_err(|source| {
                                ItemError::Call {
                                    what: format!("{cname:?}"),
                                    source,
                                }
                            })?;
                        let now = sys::name_to_handle(fd.as_raw_fd())
                            .map_err(call("no file handle to check"))?;
                        if now.0.as_bytes() != h.as_bytes() {
                            return Err("another file is at its name (file handles differ)".into());
                        }
                        fd
                    }
                    _ => {
                        // Decoded on its parent's mount (restored before it), which is its
                        // own: the share's root's for a node with no name.
                        let parent_dir = match &name {
                            Some((parent, _)) => {
                                let pfd = parent.path_fd()?;
                                let dir = libc::O_RDONLY | libc::O_DIRECTORY;
                                Some(sys::openat(pfd.as_raw_fd(), c".", dir, 0)?)
                            }
                            None => None,
                        };
                        let mount_fd = parent_dir.as_ref().unwrap_or(anchor);
                        let fd = sys::open_by_handle(mount_fd.as_raw_fd(), &h, nofollow)
                            .map_err(call("its file handle does not open"))?;
                        self.check_inside_share(&fd, name.as_ref(), root)?;
                        fd
                    }
                }
            }
            _ => {
                let fd = match (&n.path, &name) {
                    (Some(path), _) => self.open_path(root, path)?,
                    (None, Some((parent, cname))) => {
                        let pfd = parent.path_fd()?;
                        sys::openat(pfd.as_raw_fd(), cname, nofollow, 0).map_err(|source| {
                            ItemError::Call {
                                what: format!("{cname:?}"),
                                source,
                            }
                        })?
                    }
                    (None, None) => return Err("no name finds it".into()),
                };
                if let Some(h) = &n.handle {
                    // --migration-verify-handles: the very file the source had.
                    let now = sys::name_to_handle(fd.as_raw_fd())
                        .map_err(call("no file handle to verify"))?;
                    if now.0.as_bytes() != h.as_slice() {
                        return Err("a different file is at its path (file handles differ)".into());
                    }
                }
                fd
            }
        };
        let st = sys::statx(
            fd.as_raw_fd(),
            sys::EMPTY,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )?;
        if st.st.st_mode & libc::S_IFMT != n.file_type {
            return Err(format!(
                "its file type changed ({:o} to {:o})",
                n.file_type,
                st.st.st_mode & libc::S_IFMT
            )
            .into());
        }
        Ok((fd, st, name))
    }

    /// Opens a path of the share component by component from its root, never following a
    /// symlink or leaving the share (`..` is refused).
    pub(super) fn open_path(&self, root: &Arc<Inode>, path: &[u8]) -> Result<OwnedFd, ItemError> {
        if path.len() > libc::PATH_MAX as usize {
            return Err("a path longer than PATH_MAX".into());
        }
        let mut cur: OwnedFd = {
            let r = root.path_fd()?;
            sys::openat(r.as_raw_fd(), c".", libc::O_PATH | libc::O_DIRECTORY, 0)?
        };
        let parts: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
        for (i, part) in parts.iter().enumerate() {
            let c = component(part)?;
            let last = i + 1 == parts.len();
            let flags = libc::O_PATH | libc::O_NOFOLLOW | if last { 0 } else { libc::O_DIRECTORY };
            cur = sys::openat(cur.as_raw_fd(), &c, flags, 0).map_err(|source| ItemError::Call {
                what: format!("{c:?}"),
                source,
            })?;
        }
        Ok(cur)
    }

    /// A file a handle opened must lie inside the share: a directory's `..` chain
    /// reaches the share's root; another file is where its name in its (restored,
    /// checked) parent says; an unlinked file (no links) has no place to be outside of.
    fn check_inside_share(
        &self,
        fd: &OwnedFd,
        name: Option<&(Arc<Inode>, CString)>,
        root: &Arc<Inode>,
    ) -> Result<(), ItemError> {
        let outside = || ItemError::from("its file handle names a file outside the share");
        let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
        let st = sys::statx(fd.as_raw_fd(), sys::EMPTY, flags)?;
        if st.st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            let mut cur = sys::openat(fd.as_raw_fd(), c".", libc::O_PATH, 0)?;
            for _ in 0..4096 {
                let s = sys::statx(cur.as_raw_fd(), sys::EMPTY, flags)?;
                if InodeKey::of(&s) == root.key {
                    return Ok(());
                }
                let up = sys::openat(cur.as_raw_fd(), c"..", libc::O_PATH, 0)?;
                let su = sys::statx(up.as_raw_fd(), sys::EMPTY, flags)?;
                if InodeKey::of(&su) == InodeKey::of(&s) {
                    return Err(outside()); // the file system's root
                }
                cur = up;
            }
            return Err(outside());
        }
        // A file with no links could be any deleted file on this file system: only the
        // handover (the source's own fd) moves those.
        let (parent, cname) = name.ok_or_else(outside)?;
        let pfd = parent.path_fd()?;
        let s =
            sys::statx(pfd.as_raw_fd(), cname, libc::AT_SYMLINK_NOFOLLOW).map_err(|_| outside())?;
        if InodeKey::of(&s) != InodeKey::of(&st) {
            return Err(outside());
        }
        Ok(())
    }
}

/// Nodes found again at once in a load (`PassthroughFs::restore`): a few times the
/// cores, far below any fd limit.
pub(super) const FIND_BATCH: usize = 2048;

/// A node's file found again: its fd, what statx says of it, and its parent and name.
pub(super) type Found = (OwnedFd, sys::StatX, Option<(Arc<Inode>, CString)>);

/// The state's nodes by depth: a node is one deeper than its parent if the parent comes
/// before it in the state, else at the top (where a missing parent is then an error,
/// as in the state's order).
pub(super) fn levels(nodes: &[NodeState]) -> Vec<Vec<&NodeState>> {
    let mut depth: HashMap<u64, usize> = HashMap::with_capacity(nodes.len());
    let mut out: Vec<Vec<&NodeState>> = Vec::new();
    for n in nodes {
        let d = match &n.name {
            Some((p, _)) => depth.get(p).map_or(0, |d| d + 1),
            None => 0,
        };
        depth.insert(n.id, d);
        if out.len() <= d {
            out.resize_with(d + 1, Vec::new);
        }
        out[d].push(n);
    }
    out
}

/// `f` over `items` on the machine's cores (at most 8 threads), results in order; small
/// batches on this thread.
pub(super) fn in_parallel<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    const SMALL: usize = 512;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    if items.len() < SMALL || threads < 2 {
        return items.into_iter().map(f).collect();
    }
    let per = items.len().div_ceil(threads);
    let mut chunks: Vec<Vec<T>> = Vec::new();
    let mut items = items.into_iter();
    loop {
        let c: Vec<T> = items.by_ref().take(per).collect();
        if c.is_empty() {
            break;
        }
        chunks.push(c);
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|c| s.spawn(move || c.into_iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a node search panicked"))
            .collect()
    })
}

/// A node's fd kept from a dead serving process (`take_over`): its file, and the name
/// the record gives it where its parent came first. A directory must be on the share's
/// own file system (one elsewhere is found again by its name, checked on the way).
pub(super) fn kept_node(
    fd: OwnedFd,
    n: &NodeState,
    restored: &HashMap<u64, Arc<Inode>>,
) -> Result<Found, ItemError> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    let st = sys::statx(fd.as_raw_fd(), sys::EMPTY, flags)?;
    if st.st.st_mode & libc::S_IFMT != n.file_type {
        return Err("the fd kept for it is another file type".into());
    }
    let root = restored.get(&ROOT_ID).ok_or("no root")?;
    if n.file_type == libc::S_IFDIR && st.st.st_dev != root.key.dev {
        return Err("a kept directory off the share's file system".into());
    }
    let name = match &n.name {
        Some((p, name)) => match restored.get(p) {
            Some(parent) if parent.is_dir() => Some((parent.clone(), component(name)?)),
            _ => None,
        },
        None => None,
    };
    Ok((fd, st, name))
}

/// A node no name finds, from the source's own fd: taken only for a file with no links
/// left (an open but unlinked one), which is nowhere outside the share either.
pub(super) fn unlinked_node(
    fd: OwnedFd,
    n: &NodeState,
    share_dev: u64,
) -> Result<Found, ItemError> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    let st = sys::statx(fd.as_raw_fd(), sys::EMPTY, flags)?;
    // Only an unlinked regular file on the share's file system: a directory fd (even a
    // removed one) would lead out of the share through `..`.
    let reg = st.st.st_mode & libc::S_IFMT == libc::S_IFREG && n.file_type == libc::S_IFREG;
    if st.st.st_nlink != 0 || !reg || st.st.st_dev != share_dev {
        return Err("the fd the source passed is not an unlinked regular file of the share".into());
    }
    Ok((fd, st, None))
}
