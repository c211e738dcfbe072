//! Request extensions (FUSE 7.38): blocks the guest appends to a request, counted in
//! 8-byte units by `fuse_in_header.total_extlen` (the low half of what fuse-backend-rs
//! calls `padding`). The 7.3 guest sends two kinds, both on requests that create a node
//! (CREATE, MKDIR, MKNOD, SYMLINK, TMPFILE):
//!
//! - the new node's security context (with FUSE_SECURITY_CTX; `--security-label`),
//!   typed by its count of contexts (0 to 31);
//! - FUSE_EXT_GROUPS: the parent's group when the caller has it only as a supplementary
//!   group (with FUSE_CREATE_SUPP_GROUP), so a set-group-ID bit is kept as the host
//!   kernel would keep it for a member of the group.
//!
//! A handler would read them as part of the name, so vfsd serves the request without them
//! (a copy cut short, the request's own copy left whole) and hands them to the filesystem
//! beside the call.

use std::ffi::CStr;

use super::codec::decode;
use super::request::{Request, HDR_LEN};
use crate::filesystem::{CreateExt, SecCtx};

/// Types at or below this count security contexts (`fuse_secctx_header.nr_secctx`).
const MAX_NR_SECCTX: u32 = 31;
const EXT_GROUPS: u32 = 32;
/// `padding`'s offset in the header: total_extlen is its low 16 bits.
const TOTAL_EXTLEN_AT: usize = 36;

/// Decodes the extensions of `req` that vfsd knows, and gives the request without them
/// (its header's length and total_extlen adjusted) when it has any. `req` itself is left
/// as it is, so a request served again (an OPEN or CREATE the queue thread hands to a
/// worker) finds its extensions again. Err: an errno for a malformed extension block.
pub fn take(req: &Request) -> Result<(CreateExt, Option<Request>), i32> {
    let units = (req.hdr.padding & 0xffff) as usize;
    if units == 0 {
        return Ok((CreateExt::default(), None));
    }
    let len = req.hdr.len as usize;
    let ext_len = units * 8;
    if len > req.bytes.len() || len < HDR_LEN + ext_len {
        return Err(libc::EINVAL);
    }
    let ext = parse(&req.bytes[len - ext_len..len])?;
    let mut hdr = req.hdr;
    hdr.len = (len - ext_len) as u32;
    hdr.padding &= !0xffff;
    let mut bytes = req.bytes[..len - ext_len].to_vec();
    bytes[..4].copy_from_slice(&hdr.len.to_ne_bytes());
    bytes[TOTAL_EXTLEN_AT..TOTAL_EXTLEN_AT + 4].copy_from_slice(&hdr.padding.to_ne_bytes());
    Ok((
        ext,
        Some(Request {
            hdr,
            bytes,
            whole: true,
        }),
    ))
}

/// A u32 at byte `at` of `b`, if `b` is long enough.
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    decode(b.get(at..)?)
}

/// Decodes an extension block: `fuse_ext_header`s, each followed by its data.
pub fn parse(mut block: &[u8]) -> Result<CreateExt, i32> {
    let mut ext = CreateExt::default();
    while !block.is_empty() {
        let size = u32_at(block, 0).ok_or(libc::EINVAL)? as usize;
        let kind = u32_at(block, 4).ok_or(libc::EINVAL)?;
        if size < 8 || !size.is_multiple_of(8) || size > block.len() {
            return Err(libc::EINVAL);
        }
        let data = &block[8..size];
        match kind {
            0 => {}
            1 => ext.secctx = Some(secctx(data)?),
            // vfsd labels a node with one context, as virtiofsd does.
            2..=MAX_NR_SECCTX => return Err(libc::EINVAL),
            EXT_GROUPS => {
                let n = u32_at(data, 0).ok_or(libc::EINVAL)? as usize;
                let groups = data.get(4..4 + n.checked_mul(4).ok_or(libc::EINVAL)?);
                let groups = groups.ok_or(libc::EINVAL)?;
                ext.groups = groups
                    .chunks(4)
                    .map(|g| u32::from_ne_bytes(g.try_into().unwrap()))
                    .collect();
            }
            // Newer kinds the guest only sends once negotiated; nothing to do.
            _ => {}
        }
        block = &block[size..];
    }
    Ok(ext)
}

/// One `fuse_secctx` (size, padding), then the xattr name and the context's bytes.
fn secctx(data: &[u8]) -> Result<SecCtx, i32> {
    let size = u32_at(data, 0).ok_or(libc::EINVAL)? as usize;
    let rest = data.get(8..).ok_or(libc::EINVAL)?;
    let name = CStr::from_bytes_until_nul(rest).map_err(|_| libc::EINVAL)?;
    let value = rest[name.to_bytes_with_nul().len()..]
        .get(..size)
        .ok_or(libc::EINVAL)?;
    if name.to_bytes().is_empty() || !name.to_bytes().starts_with(b"security.") {
        return Err(libc::EINVAL);
    }
    Ok(SecCtx {
        name: name.to_owned(),
        value: value.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pad8(mut v: Vec<u8>) -> Vec<u8> {
        while !v.len().is_multiple_of(8) {
            v.push(0);
        }
        v
    }

    fn secctx_ext(name: &str, value: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&(value.len() as u32).to_ne_bytes());
        body.extend_from_slice(&0u32.to_ne_bytes());
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend_from_slice(value);
        let body = pad8(body);
        let mut v = ((8 + body.len()) as u32).to_ne_bytes().to_vec();
        v.extend_from_slice(&1u32.to_ne_bytes());
        v.extend_from_slice(&body);
        v
    }

    fn groups_ext(groups: &[u32]) -> Vec<u8> {
        let mut body = (groups.len() as u32).to_ne_bytes().to_vec();
        for g in groups {
            body.extend_from_slice(&g.to_ne_bytes());
        }
        let body = pad8(body);
        let mut v = ((8 + body.len()) as u32).to_ne_bytes().to_vec();
        v.extend_from_slice(&EXT_GROUPS.to_ne_bytes());
        v.extend_from_slice(&body);
        v
    }

    #[test]
    fn a_context_and_a_group_together() {
        let mut b = secctx_ext("security.selinux", b"system_u:object_r:tmp_t:s0\0");
        b.extend(groups_ext(&[1234]));
        let e = parse(&b).unwrap();
        let s = e.secctx.unwrap();
        assert_eq!(s.name.to_bytes(), b"security.selinux");
        assert_eq!(s.value, b"system_u:object_r:tmp_t:s0\0");
        assert_eq!(e.groups, vec![1234]);
    }

    #[test]
    fn no_context_header_is_accepted() {
        // nr_secctx 0: the guest has no LSM that labels files.
        let mut b = 8u32.to_ne_bytes().to_vec();
        b.extend_from_slice(&0u32.to_ne_bytes());
        assert!(parse(&b).unwrap().secctx.is_none());
    }

    #[test]
    fn malformed_blocks_are_einval() {
        let good = secctx_ext("security.selinux", b"x");
        for bad in [
            vec![1u8, 2, 3],                                    // shorter than a header
            [4u32.to_ne_bytes(), 1u32.to_ne_bytes()].concat(),  // size below 8
            [12u32.to_ne_bytes(), 1u32.to_ne_bytes()].concat(), // not a multiple of 8
            [64u32.to_ne_bytes(), 1u32.to_ne_bytes()].concat(), // past the end
            [
                16u32.to_ne_bytes(),
                32u32.to_ne_bytes(),
                9u32.to_ne_bytes(),
                0u32.to_ne_bytes(),
            ]
            .concat(), // 9 groups in 4 bytes
            [
                16u32.to_ne_bytes(),
                2u32.to_ne_bytes(),
                0u32.to_ne_bytes(),
                0u32.to_ne_bytes(),
            ]
            .concat(), // two contexts
            secctx_ext("user.x", b"v"),                         // not a security.* name
            {
                let mut v = good.clone();
                v[8] = 200; // context longer than its block
                v
            },
        ] {
            assert_eq!(parse(&bad).err(), Some(libc::EINVAL), "{bad:?}");
        }
        assert!(parse(&good).is_ok());
    }

    #[test]
    fn unknown_kinds_are_skipped() {
        let mut b = [16u32.to_ne_bytes(), 77u32.to_ne_bytes(), [0; 4], [0; 4]].concat();
        b.extend(groups_ext(&[5, 6]));
        assert_eq!(parse(&b).unwrap().groups, vec![5, 6]);
    }

    #[test]
    fn taking_the_extensions_leaves_the_request_as_it_came() {
        use fuse_backend_rs::abi::fuse_abi::InHeader;
        use vm_memory::ByteValued;
        let ext = groups_ext(&[1234]);
        let args = b"name\0\0\0\0".to_vec();
        let hdr = InHeader {
            len: (HDR_LEN + args.len() + ext.len()) as u32,
            opcode: 35, // CREATE
            padding: (ext.len() / 8) as u32,
            ..Default::default()
        };
        let bytes = [hdr.as_slice(), &args, &ext].concat();
        let req = Request {
            hdr,
            bytes: bytes.clone(),
            whole: true,
        };
        for _ in 0..2 {
            let (e, cut) = take(&req).unwrap();
            assert_eq!(e.groups, [1234]);
            let cut = cut.expect("the request without its extensions");
            assert_eq!(cut.hdr.len as usize, HDR_LEN + args.len());
            assert_eq!(cut.hdr.padding & 0xffff, 0);
            assert_eq!(&cut.bytes[HDR_LEN..], &args[..]);
            assert_eq!(decode::<InHeader>(&cut.bytes).unwrap().len, cut.hdr.len);
            // A second serving finds the same extensions.
            assert_eq!(req.bytes, bytes);
        }
        let plain = Request {
            hdr: InHeader { padding: 0, ..hdr },
            bytes,
            whole: true,
        };
        assert!(take(&plain).unwrap().1.is_none());
    }
}
