//! What a create request carries beside its arguments: the request extensions the server
//! decodes (`server::wire::ext`) and hands to the filesystem's create calls.

use std::ffi::CString;

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
