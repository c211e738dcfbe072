//! A chain's descriptors, read from the guest's table once.
//!
//! Where the request runs (`device::route`), the check before an effect, the reply and
//! WRITE's data all use this one reading. Each walk of a chain reads every descriptor
//! out of guest memory again, and under a guest one walk costs about as much as the rest
//! of a small request's user-space work; read once, a guest that rewrites its table
//! meanwhile also gains nothing.

use std::ops::Deref;

use smallvec::SmallVec;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::GuestAddress;

use super::guest::GuestMem;

/// Descriptors kept on the stack: a FUSE request's chain has 2 to 4, READ and WRITE more.
const ON_STACK: usize = 8;

/// The most descriptors a chain may have: twice what the largest request needs (INIT's
/// `MAX_PAGES` pages of data, plus header, arguments and the reply header). A longer
/// chain is refused (`Descs::overlong`) and never read further, which bounds what one
/// request costs the host: a guest can make a chain of up to 64 Ki zero-length
/// descriptors through an indirect table, and name it from every slot of its ring.
pub const MAX_DESCS: usize = 2 * super::init::MAX_PAGES as usize;

/// Writable buffers (address, length), in chain order.
pub type Bufs = SmallVec<[(GuestAddress, u32); 4]>;

/// A chain's descriptors, in order, indirect tables followed (as the chain's iterator
/// yields them), up to `MAX_DESCS`.
pub struct Descs {
    list: SmallVec<[Descriptor; ON_STACK]>,
    pub(super) overlong: bool,
}

impl Descs {
    /// Walks `chain` once, keeping up to `MAX_DESCS` descriptors (and flags a longer
    /// chain: `overlong`).
    pub fn read<M>(chain: &DescriptorChain<M>) -> Descs
    where
        M: Deref<Target = GuestMem> + Clone,
    {
        let mut list: SmallVec<[Descriptor; ON_STACK]> =
            chain.clone().take(MAX_DESCS + 1).collect();
        let overlong = list.len() > MAX_DESCS;
        list.truncate(MAX_DESCS);
        Descs { list, overlong }
    }

    /// An overlong chain's list cut to its first writable buffer (for the EINVAL that
    /// refuses it), so it never leaves the stack and is never read again.
    pub(super) fn keep_only_the_reply_room(&mut self) {
        if self.overlong {
            let reply = self.list.iter().copied().find(|d| d.is_write_only());
            self.list = reply.into_iter().collect();
        }
    }

    /// The heap the list took (0 while it fits the stack).
    pub fn heap_bytes(&self) -> usize {
        if self.list.spilled() {
            self.list.capacity() * std::mem::size_of::<Descriptor>()
        } else {
            0
        }
    }

    /// Whether the chain has more than `MAX_DESCS` descriptors (then only its reply
    /// buffer is here).
    pub fn overlong(&self) -> bool {
        self.overlong
    }

    /// Every descriptor, in order.
    pub fn all(&self) -> &[Descriptor] {
        &self.list
    }

    /// The descriptors the device reads, in order (as the chain's `readable()`).
    pub fn readable(&self) -> impl Iterator<Item = &Descriptor> {
        self.list.iter().filter(|d| !d.is_write_only())
    }

    /// The buffers the device writes, in order (as the chain's `writable()`).
    pub fn writable_bufs(&self) -> Bufs {
        self.list
            .iter()
            .filter(|d| d.is_write_only())
            .map(|d| (d.addr(), d.len()))
            .collect()
    }
}

/// For the server's unit tests: the one chain that `descs` (address, length, writable)
/// make on a mock queue in `mem`, popped.
#[cfg(test)]
pub(crate) fn mock_chain<'a>(
    mem: &'a GuestMem,
    descs: &[(u64, u32, bool)],
) -> DescriptorChain<&'a GuestMem> {
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::split::Descriptor;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueOwnedT};
    let size = descs.len().next_power_of_two().max(16) as u16;
    let vq = MockSplitQueue::new(mem, size);
    let raw: Vec<RawDescriptor> = descs
        .iter()
        .map(|&(a, l, w)| {
            let flags = if w { VRING_DESC_F_WRITE as u16 } else { 0 };
            RawDescriptor::from(Descriptor::new(a, l, flags, 0))
        })
        .collect();
    vq.build_desc_chain(&raw).unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let chain = q.iter(mem).unwrap().next().unwrap();
    chain
}
