//! What a create request carries beside its arguments (the server decodes the request
//! extensions, see `server::ext`): the new node's security context and the caller's
//! supplementary group. The server decodes the create opcodes itself and passes them to
//! the create paths as a parameter.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use fuse_backend_rs::api::filesystem::Context;

use super::xattr::Target;
use super::PassthroughFs;
use crate::sys;

/// A security context for a new node (FUSE_SECURITY_CTX).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecCtx {
    /// The xattr that holds it on a local filesystem, e.g. `security.selinux`.
    pub name: CString,
    pub value: Vec<u8>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateExt {
    pub secctx: Option<SecCtx>,
    /// Supplementary groups of the caller that matter for this create (FUSE_EXT_GROUPS:
    /// the parent's group, when the caller is in it only as a supplementary group).
    pub groups: Vec<u32>,
}

impl PassthroughFs {
    /// Switches to the guest caller's ids (translated to host ids, `--translate-uid/gid`)
    /// for a create (or a flag change made as the caller), with the supplementary group the
    /// request carried (FUSE_EXT_GROUPS,
    /// see `server::ext`).
    pub(super) fn creator(&self, ctx: &Context, groups: &[u32]) -> io::Result<sys::FsCred> {
        let ids = &self.cfg.id_translate;
        let groups = groups
            .iter()
            .copied()
            .map(|g| ids.gid.to_host(g))
            .collect::<io::Result<Vec<u32>>>()?;
        sys::FsCred::switch_with_groups(
            ids.uid.to_host(ctx.uid)?,
            ids.gid.to_host(ctx.gid)?,
            &groups,
        )
    }

    /// Labels the node just created as `name` in `dir` with the request's security context,
    /// before the guest hears of it. On failure the node is removed again (`rmdir` says
    /// whether it is a directory), so a create never leaves an unlabeled node behind.
    pub(super) fn label_new(
        &self,
        dir: RawFd,
        name: &CStr,
        rmdir: bool,
        secctx: Option<&SecCtx>,
    ) -> io::Result<()> {
        let Some(ctx) = secctx else {
            return Ok(());
        };
        let r = self.set_label(dir, name, ctx);
        if r.is_err() {
            let flags = if rmdir { libc::AT_REMOVEDIR } else { 0 };
            // SAFETY: NUL-terminated name relative to the parent's fd.
            unsafe { libc::unlinkat(dir, name.as_ptr(), flags) };
        }
        r
    }

    fn set_label(&self, dir: RawFd, name: &CStr, ctx: &SecCtx) -> io::Result<()> {
        let host = self.label_name(ctx)?;
        let path = sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let st = sys::statx(path.as_raw_fd(), sys::EMPTY, libc::AT_EMPTY_PATH)?.st;
        self.with_path_target(path.as_raw_fd(), st.st_mode & libc::S_IFMT, |t| {
            t.set(&host, &ctx.value, 0)
        })
    }

    /// The host name of the context's xattr, through the xattr map (`--xattrmap`).
    fn label_name(&self, ctx: &SecCtx) -> io::Result<CString> {
        self.cfg
            .xattrmap
            .to_host(&ctx.name)
            .or_errno(false)
            .map(|n| n.into_owned())
    }

    /// The security context of the regular file just created and opened as `fd`.
    pub(super) fn label_created_file(&self, fd: RawFd, secctx: Option<&SecCtx>) -> io::Result<()> {
        match secctx {
            Some(ctx) => Target::Fd(fd).set(&self.label_name(ctx)?, &ctx.value, 0),
            None => Ok(()),
        }
    }
}
