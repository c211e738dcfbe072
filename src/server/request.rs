//! A request's readable part, copied out of guest memory once.

use std::ops::Deref;

use fuse_backend_rs::abi::fuse_abi::{InHeader, WriteIn};
use virtio_queue::DescriptorChain;
use vm_memory::{ByteValued, Bytes, GuestMemoryMmap};

use super::opcode;

/// The largest request the crate accepts (its MAX_BUFFER_SIZE plus a header page); a
/// longer readable part is not copied past this.
const MAX_REQUEST: usize = (1 << 20) + 4096;
pub const HDR_LEN: usize = std::mem::size_of::<InHeader>();
/// WRITE's header and arguments; its data stays in guest memory.
pub const WRITE_IN_LEN: usize = HDR_LEN + std::mem::size_of::<WriteIn>();

pub struct Request {
    pub hdr: InHeader,
    /// The header and what follows it, as the guest sent them (for WRITE only the
    /// header and WriteIn).
    pub bytes: Vec<u8>,
}

impl Request {
    /// The bytes after the header.
    pub fn args(&self) -> &[u8] {
        &self.bytes[HDR_LEN..]
    }
}

/// A `T` from the start of `b`, if it is long enough.
pub fn decode<T: ByteValued + Default>(b: &[u8]) -> Option<T> {
    let mut v = T::default();
    let n = std::mem::size_of::<T>();
    v.as_mut_slice().copy_from_slice(b.get(..n)?);
    Some(v)
}

/// Copies the readable descriptors of `chain` (up to the crate's limit) out of guest
/// memory. Errors say why the request can't be answered at all.
pub fn copy<M>(mem: &GuestMemoryMmap, chain: &DescriptorChain<M>) -> Result<Request, String>
where
    M: Deref<Target = GuestMemoryMmap> + Clone,
{
    let mut bytes = Vec::new();
    let mut limit = MAX_REQUEST;
    for d in chain.clone().readable() {
        if bytes.len() >= limit {
            break;
        }
        let take = (d.len() as usize).min(limit - bytes.len());
        let at = bytes.len();
        bytes.resize(at + take, 0);
        mem.read_slice(&mut bytes[at..], d.addr())
            .map_err(|e| format!("bad readable descriptor: {e}"))?;
        if at < HDR_LEN && bytes.len() >= HDR_LEN {
            // The header decides how much more is worth copying.
            let hdr: InHeader = decode(&bytes).unwrap_or_default();
            if hdr.opcode == opcode::WRITE {
                limit = WRITE_IN_LEN;
                bytes.truncate(limit);
            }
        }
    }
    let hdr: InHeader = decode(&bytes).ok_or("request shorter than a FUSE header")?;
    Ok(Request { hdr, bytes })
}
