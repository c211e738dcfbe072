//! FUSE_INIT, negotiated by vfsd rather than by fuse-backend-rs.
//!
//! The crate speaks FUSE 7.33: it truncates the guest's flags to the ones it names, so
//! flags from 7.36 on (SECURITY_CTX, CREATE_SUPP_GROUP, DIRECT_IO_ALLOW_MMAP, …) could never
//! be offered through it. vfsd reads `fuse_init_in` with its INIT_EXT half itself, asks
//! the filesystem which of the full 64-bit flags it wants, and writes `fuse_init_out`.
//! The crate never sees INIT; its own protocol-version state keeps its default (7.33),
//! which only affects how it encodes negative LOOKUP replies (both forms are valid).

use std::io;

use vm_memory::ByteValued;

use super::codec::{decode, inval};
use crate::abi::flags;

/// The protocol minor vfsd speaks: 7.40 has every flag above, request extensions (7.38)
/// and FUSE_STATX (7.39). The guest's own minor is used when it is lower.
pub const MINOR: u32 = 40;
const MAJOR: u32 = 7;
/// Pages in one request (1 MiB with 4 KiB pages), the crate's limit for a request buffer.
pub const MAX_PAGES: u16 = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
}
// SAFETY: plain integers, no padding.
unsafe impl ByteValued for InitIn {}

/// The second half of `fuse_init_in` (7.36), present when the guest sets INIT_EXT.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct InitIn2 {
    flags2: u32,
    unused: [u32; 11],
}
// SAFETY: plain integers, no padding.
unsafe impl ByteValued for InitIn2 {}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub request_timeout: u16,
    pub unused: [u16; 11],
}
// SAFETY: plain integers laid out without padding (64 bytes, as the kernel's).
unsafe impl ByteValued for InitOut {}

/// What one INIT settled, kept for the requests after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Session {
    pub minor: u32,
    /// Flags both sides enabled.
    pub flags: u64,
}

impl Session {
    pub fn has(&self, flag: u64) -> bool {
        self.flags & flag != 0
    }
}

/// The guest's offer: protocol version and its 64-bit flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u64,
}

/// Decodes INIT's arguments. A guest that sets INIT_EXT but sends the short form gets
/// EINVAL rather than flags read from beyond its request.
pub fn parse(args: &[u8]) -> io::Result<Offer> {
    let i: InitIn = decode(args).ok_or_else(inval)?;
    let mut flags = i.flags as u64;
    if flags & flags::INIT_EXT != 0 {
        let rest = &args[std::mem::size_of::<InitIn>()..];
        let i2: InitIn2 = decode(rest).ok_or_else(inval)?;
        flags |= (i2.flags2 as u64) << 32;
    }
    Ok(Offer {
        major: i.major,
        minor: i.minor,
        max_readahead: i.max_readahead,
        flags,
    })
}

/// The reply to `offer`, given the flags the filesystem wants, and the session it opens.
/// None for a major version vfsd can't speak (answered EPROTO). A guest with a newer
/// major gets vfsd's version and is expected to INIT again with it, as the spec says.
pub fn reply(offer: &Offer, want: u64) -> Option<(Vec<u8>, Option<Session>)> {
    if offer.major < MAJOR {
        return None;
    }
    if offer.major > MAJOR {
        let out = InitOut {
            major: MAJOR,
            minor: MINOR,
            ..Default::default()
        };
        return Some((out.as_slice().to_vec(), None));
    }
    let minor = offer.minor.min(MINOR);
    let mut enabled = offer.flags & want;
    if minor < 36 {
        // flags2 does not exist before 7.36.
        enabled &= u32::MAX as u64;
    }
    if enabled >> 32 != 0 {
        enabled |= flags::INIT_EXT;
    }
    let out = InitOut {
        major: MAJOR,
        minor,
        max_readahead: offer.max_readahead,
        flags: enabled as u32,
        flags2: (enabled >> 32) as u32,
        // Requests are served in parallel; let the guest queue as many as it likes.
        max_background: u16::MAX,
        congestion_threshold: u16::MAX / 4 * 3,
        max_write: MAX_PAGES as u32 * 4096,
        time_gran: 1,
        max_pages: if enabled & flags::MAX_PAGES != 0 {
            MAX_PAGES
        } else {
            0
        },
        ..Default::default()
    };
    // Older guests read a shorter fuse_init_out (8 bytes before 7.5, 24 before 7.23).
    let len = match minor {
        0..=4 => 8,
        5..=22 => 24,
        _ => std::mem::size_of::<InitOut>(),
    };
    let bytes = out.as_slice()[..len].to_vec();
    Some((
        bytes,
        Some(Session {
            minor,
            flags: enabled,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init_bytes(minor: u32, flags: u64, ext: bool) -> Vec<u8> {
        let i = InitIn {
            major: 7,
            minor,
            max_readahead: 65536,
            flags: flags as u32 | if ext { flags::INIT_EXT as u32 } else { 0 },
        };
        let mut b = i.as_slice().to_vec();
        if ext {
            let i2 = InitIn2 {
                flags2: (flags >> 32) as u32,
                unused: [0; 11],
            };
            b.extend_from_slice(i2.as_slice());
        }
        b
    }

    #[test]
    fn init_out_is_the_kernels_64_bytes() {
        assert_eq!(std::mem::size_of::<InitOut>(), 64);
        assert_eq!(std::mem::size_of::<InitIn2>(), 48);
    }

    #[test]
    fn high_flags_are_read_and_offered_back_through_flags2() {
        let offered = flags::ASYNC_READ | flags::DIRECT_IO_ALLOW_MMAP | flags::SECURITY_CTX;
        let o = parse(&init_bytes(44, offered, true)).unwrap();
        assert_eq!(o.flags, offered | flags::INIT_EXT);
        let (b, s) = reply(&o, flags::ASYNC_READ | flags::DIRECT_IO_ALLOW_MMAP).unwrap();
        let out: InitOut = decode(&b).unwrap();
        assert_eq!(out.minor, MINOR);
        assert_eq!(out.flags2 as u64, flags::DIRECT_IO_ALLOW_MMAP >> 32);
        assert_ne!(out.flags as u64 & flags::INIT_EXT, 0);
        assert!(s.unwrap().has(flags::DIRECT_IO_ALLOW_MMAP));
        assert!(!s.unwrap().has(flags::SECURITY_CTX));
    }

    #[test]
    fn a_flag_the_guest_did_not_offer_is_never_enabled() {
        let o = parse(&init_bytes(44, flags::ASYNC_READ, false)).unwrap();
        let (b, s) = reply(&o, flags::ASYNC_READ | flags::DIRECT_IO_ALLOW_MMAP).unwrap();
        let out: InitOut = decode(&b).unwrap();
        assert_eq!(out.flags2, 0);
        assert_eq!(s.unwrap().flags, flags::ASYNC_READ);
    }

    #[test]
    fn init_ext_without_its_second_half_is_refused() {
        let mut b = init_bytes(44, flags::SECURITY_CTX, true);
        b.truncate(20);
        assert_eq!(parse(&b).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn old_guests_get_their_minor_and_reply_size() {
        let o = parse(&init_bytes(22, flags::ASYNC_READ, false)).unwrap();
        let (b, s) = reply(&o, u64::MAX).unwrap();
        assert_eq!(b.len(), 24);
        assert_eq!(s.unwrap().minor, 22);
        let o = parse(&init_bytes(
            31,
            flags::ASYNC_READ | flags::SECURITY_CTX,
            true,
        ))
        .unwrap();
        let (_, s) = reply(&o, u64::MAX).unwrap();
        assert_eq!(s.unwrap().flags >> 32, 0, "no flags2 before 7.36");
    }

    #[test]
    fn majors_other_than_7() {
        let mut o = parse(&init_bytes(44, 0, false)).unwrap();
        o.major = 6;
        assert!(reply(&o, 0).is_none());
        o.major = 8;
        let (b, s) = reply(&o, 0).unwrap();
        let out: InitOut = decode(&b).unwrap();
        assert_eq!((out.major, out.minor), (7, MINOR));
        assert!(s.is_none());
    }
}
