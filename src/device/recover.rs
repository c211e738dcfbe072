//! A ring taken over from a serving process that died (`recovery`): where it stood, and
//! the chains it held, popped again by their heads.
//!
//! The requests a dead process held are no longer in the avail ring where it found them
//! (the guest may have reused those slots), only in the descriptor table at their heads.
//! virtio-queue pops chains only from an avail ring, so a scratch avail ring, naming
//! exactly those heads, is laid in a memory region of its own placed beyond the guest's
//! memory, and a queue on the guest's descriptor table pops them from there. Their
//! buffers are the guest's: replies go where the chains say.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;

use log::{info, warn};
use vhost_user_backend::VringT;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{
    Bytes, GuestAddress, GuestMemory, GuestMemoryLoadGuard, GuestMemoryRegion, GuestRegionMmap,
    MmapRegion,
};

use super::pool::Job;
use super::resume::avail_slot;
use super::vring::Ticket;
use super::{FsDevice, TrackedVring};
use crate::recovery::record::RingState;
use crate::server::{GuestMem, Opcode, Popped};

/// The requests a ring's dead server held, and where the ring goes on from.
pub struct TakenOver {
    /// The avail index to pop from next.
    pub next_avail: u16,
    /// The used index the guest has seen.
    pub next_used: u16,
    /// Heads to serve again.
    pub heads: Vec<u16>,
    /// Those of them a process already died serving again: answered EIO, not run a
    /// third time.
    pub twice: Vec<u16>,
}

/// What the dead process's record `st` says of a ring of `size` entries, set against
/// the guest's own indices: `used` (its used index now) and `avail_slot(p)`, the head
/// its avail ring names at position `p` up to `avail` (its avail index).
pub fn take_over(
    st: &RingState,
    size: u16,
    used: u16,
    avail: u16,
    avail_slot: impl Fn(u16) -> Option<u16>,
) -> TakenOver {
    let mut heads: std::collections::BTreeSet<u16> =
        st.heads.iter().copied().filter(|&h| h < size).collect();
    // A head that was going on the used ring went if the guest's index moved past the
    // one recorded: answered, not to be answered twice.
    if let Some(h) = st.completing {
        if used == st.next_used.wrapping_add(1) {
            heads.remove(&h);
        }
    }
    // Heads still offered by the avail ring from where the record says it popped to were
    // marked but not taken: they are popped again, as new.
    let offered = avail.wrapping_sub(st.next_avail);
    if offered <= size {
        for i in 0..offered {
            if let Some(h) = avail_slot(st.next_avail.wrapping_add(i)) {
                heads.remove(&h);
            }
        }
    }
    let twice = st
        .again
        .iter()
        .copied()
        .filter(|h| heads.contains(h))
        .collect();
    TakenOver {
        next_avail: st.next_avail,
        next_used: used,
        heads: heads.into_iter().collect(),
        twice,
    }
}

/// Guest memory with a scratch region after it, and a queue over the guest's descriptor
/// table at `desc_table` (a ring of `size`) whose avail ring, in the scratch region,
/// offers `heads` in order: popping it gives their chains.
pub fn scratch_queue(
    mem: &GuestMem,
    desc_table: u64,
    size: u16,
    heads: &[u16],
) -> Result<(Arc<GuestMem>, Queue), String> {
    // virtq_avail: flags, idx, ring[size], used_event; virtq_used: flags, idx,
    // ring[size] of 8 bytes, avail_event.
    let avail_len = (6 + 2 * u64::from(size)).next_multiple_of(4096);
    let used_len = (6 + 8 * u64::from(size)).next_multiple_of(4096);
    let end = mem
        .iter()
        .map(|r| r.start_addr().0 + r.len())
        .max()
        .unwrap_or(0);
    let avail = end.next_multiple_of(1 << 20);
    let used = avail + avail_len;
    let region = MmapRegion::new((avail_len + used_len) as usize)
        .map_err(|e| format!("scratch ring: {e}"))
        .and_then(|m| {
            GuestRegionMmap::new(m, GuestAddress(avail)).ok_or("scratch ring: no room".to_string())
        })?;
    let with = Arc::new(
        mem.insert_region(Arc::new(region))
            .map_err(|e| format!("scratch ring: {e}"))?,
    );
    for (i, &h) in heads.iter().enumerate() {
        with.write_obj(h.to_le(), GuestAddress(avail + 4 + 2 * i as u64))
            .map_err(|e| e.to_string())?;
    }
    with.write_obj((heads.len() as u16).to_le(), GuestAddress(avail + 2))
        .map_err(|e| e.to_string())?;
    let mut q = Queue::new(size).map_err(|e| e.to_string())?;
    q.set_size(size);
    q.set_desc_table_address(Some(desc_table as u32), Some((desc_table >> 32) as u32));
    q.set_avail_ring_address(Some(avail as u32), Some((avail >> 32) as u32));
    q.set_used_ring_address(Some(used as u32), Some((used >> 32) as u32));
    q.set_ready(true);
    if !q.is_valid(&*with) {
        return Err("the ring's descriptor table is not in guest memory".into());
    }
    Ok((with, q))
}

/// Pops every chain `q` (from `scratch_queue`) offers.
pub fn pop_all(q: &mut Queue, mem: &Arc<GuestMem>) -> Vec<DescriptorChain<Arc<GuestMem>>> {
    let mut out = Vec::new();
    while let Some(c) = q.pop_descriptor_chain(mem.clone()) {
        out.push(c);
    }
    out
}

impl FsDevice {
    /// The first time ring `queue` runs after its serving process died: it goes on from
    /// where that one left it, and the requests it held are served again, or answered
    /// as `FuseServer::serve_again` says.
    pub(super) fn take_up(
        &self,
        vring: &TrackedVring,
        queue: usize,
        mem: &GuestMemoryLoadGuard<GuestMem>,
    ) {
        let (taken, table, size, tickets) = {
            let mut state = vring.get_mut();
            if !state.is_enabled() || !state.get_queue().ready() {
                return;
            }
            let Some(st) = self
                .taken_over
                .lock()
                .unwrap()
                .get_mut(queue)
                .and_then(Option::take)
            else {
                return;
            };
            let q = state.get_queue_mut();
            let size = q.size();
            let (Ok(used), Ok(avail)) = (
                q.used_idx(&**mem, Ordering::Acquire),
                q.avail_idx(&**mem, Ordering::Acquire),
            ) else {
                warn!(
                    "queue {queue}: its rings can't be read; what the dead process held is dropped"
                );
                return;
            };
            let t = take_over(&st, size, used.0, avail.0, |p| avail_slot(mem, q, p));
            q.set_next_avail(t.next_avail);
            q.set_next_used(t.next_used);
            // A poll of the dead process may have left VRING_USED_F_NO_NOTIFY set: the
            // guest kicks again from here on.
            if let Err(e) = q.enable_notification(&**mem) {
                warn!("queue {queue}: could not let the guest kick again: {e}");
            }
            // All at the ring's next index: a stop while one still runs then finds no span
            // of positions to move the base back over (those entries were answered).
            let tickets: Vec<Ticket> = (t.heads.iter())
                .map(|_| vring.popped(t.next_avail, 1)[0])
                .collect();
            vring.record_popped_again(size, t.next_avail, t.next_used, t.heads.iter().copied());
            (t, q.desc_table(), size, tickets)
        };
        // A death between a used entry and its interrupt would leave the guest unaware of
        // an answer: it hears once now, whatever follows (a spare interrupt is harmless).
        let _ = vring.signal_used_queue();
        info!(
            "queue {queue}: taken over at avail {} used {}, {} request(s) the dead process held, {} of them in flight at the death before too",
            taken.next_avail,
            taken.next_used,
            taken.heads.len(),
            taken.twice.len()
        );
        if taken.heads.is_empty() {
            return;
        }
        let (with, mut q) = match scratch_queue(mem, table, size, &taken.heads) {
            Ok(x) => x,
            Err(e) => {
                warn!("queue {queue}: {e}; the requests the dead process held get no answer");
                return;
            }
        };
        let chains = pop_all(&mut q, &with);
        let mut done = Vec::new();
        for (chain, ticket) in chains.into_iter().zip(tickets) {
            let head = chain.head_index();
            let popped = Popped::new(&with, chain);
            let twice = taken.twice.contains(&head);
            let queue = queue as u16;
            // An OPEN or CREATE may wait for a host lease's break (up to the host's
            // lease-break-time): on a thread of its own, as the pool would take it, so the
            // others and the ring's new requests go on meanwhile.
            if matches!(popped.opcode(), Some(Opcode::Open | Opcode::Create)) {
                let (server, with) = (self.server.clone(), with.clone());
                let job = Job {
                    vring: vring.clone(),
                    ticket,
                    head,
                    queue,
                };
                let spawned =
                    thread::Builder::new()
                        .name("vfsd-taken-over".into())
                        .spawn(move || {
                            job.complete(
                                server.serve_again(&with, popped, twice, &mut || job.later()),
                            )
                        });
                if let Err(e) = spawned {
                    warn!("queue {queue}: a request the dead process held gets no answer: {e}");
                }
                continue;
            }
            let job = Job {
                vring,
                ticket,
                head,
                queue,
            };
            if let Some(len) = self
                .server
                .serve_again(&with, popped, twice, &mut || job.later())
            {
                done.push((ticket, head, len));
            }
        }
        vring.complete(&done);
        // The guest learns of the answers even if it asked not to be told of each.
        let _ = vring.signal_used_queue();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(heads: &[u16], next_avail: u16, next_used: u16, completing: Option<u16>) -> RingState {
        RingState {
            size: 16,
            next_avail,
            next_used,
            completing,
            heads: heads.to_vec(),
            again: Vec::new(),
        }
    }

    #[test]
    fn a_head_a_process_died_serving_again_is_not_run_a_third_time() {
        let mut s = st(&[3, 5, 7], 10, 7, Some(5));
        s.again = vec![5, 7];
        // 5 went on the used ring before the death: answered, not poisoned.
        let t = take_over(&s, 16, 8, 10, |_| None);
        assert_eq!(t.heads, vec![3, 7]);
        assert_eq!(t.twice, vec![7]);
    }

    #[test]
    fn a_head_the_guest_saw_answered_is_not_served_again() {
        let t = take_over(&st(&[3, 5], 10, 7, Some(5)), 16, 8, 10, |_| None);
        assert_eq!(t.heads, vec![3]);
        assert_eq!((t.next_avail, t.next_used), (10, 8));
        // Not published: both again.
        let t = take_over(&st(&[3, 5], 10, 7, Some(5)), 16, 7, 10, |_| None);
        assert_eq!(t.heads, vec![3, 5]);
    }

    #[test]
    fn heads_still_offered_by_the_avail_ring_are_popped_as_new() {
        // Marked at 10 and 11, but the index never moved past 10.
        let slots = |p: u16| Some([4u16, 6][usize::from(p - 10)]);
        let t = take_over(&st(&[2, 4, 6], 10, 9, None), 16, 9, 12, slots);
        assert_eq!(t.heads, vec![2]);
    }

    #[test]
    fn heads_past_the_ring_are_dropped() {
        let t = take_over(&st(&[2, 40], 0, 0, None), 16, 0, 0, |_| None);
        assert_eq!(t.heads, vec![2]);
    }

    #[test]
    fn chains_at_given_heads_pop_from_the_guests_table() {
        use virtio_queue::desc::{split::Descriptor, RawDescriptor};
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let table = 0x1000u64;
        // Heads 1 and 3: one descriptor each, readable at 0x4000 and 0x5000.
        for (i, addr) in [(1u16, 0x4000u64), (3, 0x5000)] {
            let d = RawDescriptor::from(Descriptor::new(addr, 64, 0, 0));
            mem.write_obj(d, GuestAddress(table + 16 * u64::from(i)))
                .unwrap();
        }
        let (with, mut q) = scratch_queue(&mem, table, 8, &[3, 1]).unwrap();
        let popped = pop_all(&mut q, &with);
        let got: Vec<(u16, u64)> = popped
            .iter()
            .map(|c| (c.head_index(), c.clone().next().unwrap().addr().0))
            .collect();
        assert_eq!(got, vec![(3, 0x5000), (1, 0x4000)]);
    }
}
