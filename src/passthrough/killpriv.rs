//! Privileges a data change takes away (the kernel's `file_remove_privs`).
//!
//! On a local filesystem a write, truncate, fallocate, copy into a file or O_TRUNC open by
//! a caller without CAP_FSETID clears S_ISUID, clears S_ISGID when group-exec is set, and
//! drops `security.capability`. The guest kernel's direct-I/O path leaves this to the
//! daemon, and the host kernel can't do it since the daemon writes with CAP_FSETID. So vfsd
//! does it itself, whether or not the guest set a KILL_SUIDGID flag: a non-root guest user
//! never has CAP_FSETID, and a hostile guest kernel would not ask.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::RawFd;

use super::xattr::Target;
use super::xattrmap::{HostName, XattrMap};
use crate::sys::{self, cvt};

/// Whether a data change by guest user `uid` must drop privileges: Some(the caller's host
/// gid, which decides S_ISGID without group-exec) or None. `guest_asked` is the request's
/// KILL_SUIDGID flag (the guest kernel found the caller without CAP_FSETID).
pub fn needed(uid: u32, host_gid: u32, guest_asked: bool) -> Option<u32> {
    (guest_asked || uid != 0).then_some(host_gid)
}

/// Drops set-id bits and the file capability of the regular file open as `fd` (an fd
/// opened for I/O, not O_PATH), as a write by a caller without CAP_FSETID whose group is
/// `gid` would (the kernel's `setattr_should_drop_suidgid`): the host's
/// `security.capability` and the name a guest's capability is mapped to.
/// `mapped` is where the xattr map keeps a guest's `security.capability`
/// (`PassthroughFs::mapped_cap`).
pub fn kill_suidgid(fd: RawFd, gid: u32, mapped: Option<&CStr>) -> io::Result<()> {
    let st = sys::statx(fd, sys::EMPTY, libc::AT_EMPTY_PATH)?.st;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    let mode = st.st_mode & 0o7777;
    let mut kill = mode & libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 || st.st_gid != gid {
        // Without group-exec, S_ISGID stays only for a member of the file's group (the
        // request names one group; a supplementary membership can't be seen).
        kill |= mode & libc::S_ISGID;
    }
    if kill != 0 {
        // SAFETY: plain syscall on an fd the caller owns.
        cvt(unsafe { libc::fchmod(fd, mode & !kill) })?;
    }
    for name in [CAP].into_iter().chain(mapped) {
        remove_if_present(fd, name)?;
    }
    Ok(())
}

/// After a chown of the regular file open as `fd`: the host kernel drops a real
/// `security.capability` itself, but not the name the xattr map keeps a guest's under.
pub fn kill_mapped_capability(fd: RawFd, mapped: Option<&CStr>) -> io::Result<()> {
    match mapped {
        Some(name) => remove_if_present(fd, name),
        None => Ok(()),
    }
}

/// Removes xattr `name` of `fd` if it is there. Only a name that is there is removed:
/// removing security.* names needs CAP_SETFCAP even when there is nothing to remove,
/// which an unprivileged daemon lacks (every non-root write would fail with EPERM).
fn remove_if_present(fd: RawFd, name: &CStr) -> io::Result<()> {
    let t = Target::Fd(fd);
    // An empty buffer only asks for the length.
    if t.get(name, &mut []).is_ok() {
        match t.remove(name) {
            // Gone in between (another writer dropped it first).
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            r => r?,
        }
    }
    Ok(())
}

const CAP: &CStr = c"security.capability";

/// The host name `map` gives `security.capability`, if not itself (none where the map
/// refuses the name: the guest can't have set one).
/// The host kept-under name of a guest's `security.capability`
/// (`user.vfsd.security.capability` under the default map): a capability the guest set
/// lives there, so a write must drop it too.
pub fn mapped_name(map: &XattrMap) -> Option<CString> {
    match map.to_host(CAP) {
        HostName::Name(n) if n.as_ref() != CAP => Some(n.into_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapped_capability_name_follows_the_map() {
        let name = |rules: &str| mapped_name(&XattrMap::parse(rules).unwrap());
        assert_eq!(
            mapped_name(&XattrMap::builtin()).as_deref(),
            Some(c"user.vfsd.security.capability")
        );
        assert_eq!(
            name(":map::user.virtiofs.:").as_deref(),
            Some(c"user.virtiofs.security.capability")
        );
        assert_eq!(name(":ok:all:::"), None, "the real name, removed anyway");
        assert_eq!(name(":bad:all:security.:security.::ok:all:::"), None);
    }
}
