//! Lock waits a stop of their ring suspended, taken up again when it runs.

use std::sync::atomic::Ordering;

use log::{info, warn};
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryLoadGuard};

use super::pool::Job;
use super::vring::Ticket;
use super::{FsDevice, TrackedVring};
use crate::server::GuestMem;
use vhost_user_backend::VringT;

impl FsDevice {
    /// Takes up the requests a stop of this ring suspended (`server::waiters`): after a VM
    /// stop and go, a failed migration, or on a migration's destination. Only while the
    /// guest still waits for exactly them: its ring then has as many requests in flight
    /// (next avail minus next used) as were suspended. A guest that reset its queue
    /// meanwhile does not, and they are dropped rather than answered into its new ring.
    pub(super) fn resume_suspended(
        &self,
        vring: &TrackedVring,
        queue: u16,
        mem: &GuestMemoryLoadGuard<GuestMem>,
    ) {
        let (list, tickets) = {
            let state = vring.get_mut();
            let q = state.get_queue();
            if !state.is_enabled() || !q.ready() {
                // Not running yet: left for the kick that starts it (`set_enabled`).
                return;
            }
            let list = self.server.take_suspended(queue);
            if list.is_empty() {
                return;
            }
            let next = q.next_avail();
            // One the stop moved the base back over is popped again and waits anew: its
            // position lies between the base and the guest's avail index, and its avail
            // slot still names its chain (positions wrap at 65,536: a wait popped long
            // ago, with more than 65,536 minus the ring's size requests since, can alias
            // that window, but its slot names another chain, as the guest can't reuse a
            // head it still waits on).
            let avail = q
                .avail_idx(&**mem, Ordering::Acquire)
                .map(|w| w.0)
                .unwrap_or(next);
            let (list, popped_again): (Vec<_>, Vec<_>) = list.into_iter().partition(|r| {
                let unpopped = r.position.wrapping_sub(next) < avail.wrapping_sub(next);
                !(unpopped && avail_slot(mem, q, r.position) == Some(r.head))
            });
            if !popped_again.is_empty() {
                info!(
                    "queue {queue}: {} suspended lock wait(s) will be popped again",
                    popped_again.len()
                );
            }
            let in_flight = next.wrapping_sub(q.next_used()) as usize;
            let mut heads = std::collections::HashSet::new();
            let mut positions = std::collections::HashSet::new();
            let sound = list.iter().all(|r| {
                r.head < q.size()
                    && heads.insert(r.head)
                    && positions.insert(r.position)
                    && self.server.resumable(r)
                    && reply_buffer(mem, q, r.head) == Some(r.reply_at)
            });
            if list.is_empty() {
                return;
            }
            if in_flight != list.len() || !sound {
                warn!(
                    "queue {queue}: {} suspended lock wait(s) dropped: the ring has {in_flight} request(s) in flight (reset since?){}",
                    list.len(),
                    if sound { "" } else { ", or they are not sound" }
                );
                return;
            }
            // Under the ring's lock, as `popped` wants.
            let tickets: Vec<Ticket> = list
                .iter()
                .map(|r| vring.popped(r.position, 1)[0])
                .collect();
            vring.record_popped(
                q.size(),
                next,
                next,
                q.next_used(),
                list.iter().map(|r| r.head),
            );
            (list, tickets)
        };
        info!(
            "queue {queue}: {} suspended lock wait(s) resumed",
            list.len()
        );
        for (r, ticket) in list.iter().zip(tickets) {
            let job = Job {
                vring,
                ticket,
                head: r.head,
                queue,
            };
            job.complete(self.server.resume(mem, r, &mut || job.later()));
        }
    }
}

/// The chain head in the avail ring's slot for avail position `position`.
pub(super) fn avail_slot(mem: &GuestMem, q: &impl QueueT, position: u16) -> Option<u16> {
    let size = q.size();
    if size == 0 {
        return None;
    }
    // struct virtq_avail { le16 flags; le16 idx; le16 ring[size]; ... }
    let at = q
        .avail_ring()
        .checked_add(4 + 2 * u64::from(position % size))?;
    mem.read_obj::<u16>(GuestAddress(at)).ok().map(u16::from_le)
}

/// Where a request on the chain at `head` of `q`'s descriptor table gets its reply, as
/// the request path takes it: the first device-writable buffer, if it holds a reply
/// header. Read from the guest's table as it is now, so a resumed wait answers only into
/// its own chain's buffer, not where a device state says.
fn reply_buffer(mem: &GuestMem, q: &impl QueueT, head: u16) -> Option<u64> {
    use virtio_bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    // struct virtq_desc { le64 addr; le32 len; le16 flags; le16 next; }
    let desc = |table: u64, i: u16| -> Option<(u64, u32, u16, u16)> {
        let at = table.checked_add(16 * u64::from(i))?;
        let mut b = [0u8; 16];
        mem.read_slice(&mut b, GuestAddress(at)).ok()?;
        Some((
            u64::from_le_bytes(b[..8].try_into().unwrap()),
            u32::from_le_bytes(b[8..12].try_into().unwrap()),
            u16::from_le_bytes(b[12..14].try_into().unwrap()),
            u16::from_le_bytes(b[14..16].try_into().unwrap()),
        ))
    };
    let (mut table, mut count, mut i) = (q.desc_table(), u32::from(q.size()), head);
    let mut indirect = false;
    for _ in 0..crate::server::MAX_DESCS {
        if u32::from(i) >= count {
            return None;
        }
        let (addr, len, flags, next) = desc(table, i)?;
        let flags = u32::from(flags);
        if flags & VRING_DESC_F_INDIRECT != 0 {
            // One indirect table, at the chain's top level, as the queue's iterator takes it.
            if indirect || len == 0 || len % 16 != 0 {
                return None;
            }
            (indirect, table, count, i) = (true, addr, len / 16, 0);
            continue;
        }
        if flags & VRING_DESC_F_WRITE != 0 {
            let room =
                len as usize >= std::mem::size_of::<fuse_backend_rs::abi::fuse_abi::OutHeader>();
            return room.then_some(addr);
        }
        if flags & VRING_DESC_F_NEXT == 0 {
            return None;
        }
        i = next;
    }
    None
}
