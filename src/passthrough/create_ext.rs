//! What a create's extensions (`filesystem::CreateExt`) do on the host: the caller's
//! supplementary group for the create, and the new node's security context as an xattr.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use fuse_backend_rs::api::filesystem::Context;

use super::xattr::Target;
use super::PassthroughFs;
use crate::filesystem::SecCtx;
use crate::sys;

impl PassthroughFs {
    /// Switches to the guest caller's ids (translated to host ids, `--translate-uid/gid`)
    /// for a create (or a flag change made as the caller), with the supplementary group the
    /// request carried (FUSE_EXT_GROUPS, see `server::wire::ext`).
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
