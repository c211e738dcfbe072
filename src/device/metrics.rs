//! What `--metrics` reads of the device: requests in flight per queue, the pool's
//! backlog and the device-state transfers.

use std::sync::atomic::Ordering;

use super::{state, FsDevice, TrackedVring};

/// The device's queues, as read at one moment (`FsDevice::queue_gauges`).
pub struct QueueGauges {
    /// Per queue that has served a kick (0 is hiprio): requests popped and not yet
    /// answered, lock waits included.
    pub in_flight: Vec<(usize, usize)>,
    /// Requests handed to the worker pool that no worker has taken yet.
    pub pool_queued: usize,
    pub pool_threads: usize,
}

impl FsDevice {
    /// Requests in flight per queue and the pool's backlog, for `--metrics`.
    pub fn queue_gauges(&self) -> QueueGauges {
        let rings = self.rings.lock().unwrap();
        QueueGauges {
            in_flight: (rings.iter().enumerate())
                .filter_map(|(q, r)| Some((q, r.as_ref()?.in_flight())))
                .collect(),
            pool_queued: self.pool.as_ref().map_or(0, |p| p.queued()),
            pool_threads: self.cfg.thread_pool_size,
        }
    }

    /// The device-state transfers (migration), for `--metrics`.
    pub fn migration_stats(&self) -> &state::MigrationStats {
        self.transfer.stats()
    }

    /// Keeps `vring` at its first event, for `queue_gauges`, and has it recorded should
    /// this process die (`recovery`).
    pub(super) fn keep_ring(&self, vring: &TrackedVring, queue: usize) {
        let bit = 1u64 << queue;
        if self.rings_seen.load(Ordering::Relaxed) & bit == 0 {
            if let Some(r) = &self.record {
                vring.attach_record(r, queue);
            }
            if let Some(slot) = self.rings.lock().unwrap().get_mut(queue) {
                *slot = Some(vring.clone());
            }
            self.rings_seen.fetch_or(bit, Ordering::Relaxed);
        }
    }
}
