//! The vhost-user backend: features, config space, memory, the device-state transfer
//! and the queue threads' events.

use std::io;
use std::sync::atomic::Ordering;

use log::warn;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost_user_backend::VhostUserBackend;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::{GuestAddressSpace, GuestMemory, GuestMemoryRegion};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};

use super::{FsDevice, Mapped, Mem, TrackedVring, MAX_QUEUE_SIZE, TAG_LEN};

impl VhostUserBackend for FsDevice {
    type Bitmap = crate::dirty_log::DirtyBitmap;
    type Vring = TrackedVring;

    fn num_queues(&self) -> usize {
        1 + self.cfg.request_queues
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            // Dirty-page logging for migration: guest memory writes go to the log the
            // VMM hands over with SET_LOG_BASE (`server::GuestMem`).
            | VhostUserVirtioFeatures::LOG_ALL.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let mut f = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::LOG_SHMFD
            | VhostUserProtocolFeatures::DEVICE_STATE;
        if self.cfg.tag.is_some() {
            f |= VhostUserProtocolFeatures::CONFIG;
        }
        f
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let c = self.config_space();
        let start = (offset as usize).min(c.len());
        let end = start.saturating_add(size as usize).min(c.len());
        c[start..end].to_vec()
    }

    fn acked_features(&self, features: u64) {
        if features & VhostUserVirtioFeatures::LOG_ALL.bits() == 0 {
            // Logging ended (or never began): no page needs marking any more.
            self.mapped.lock().unwrap().log = None;
            if let Some(mem) = self.mem.read().unwrap().as_ref() {
                for r in mem.memory().iter() {
                    r.bitmap().stop();
                }
            }
        }
    }

    fn update_memory(&self, mem: Mem) -> io::Result<()> {
        // A memory map that changes while the VMM logs: its new regions log to the same
        // map as the regions they replace. (A write that lands in a new region before
        // this runs, microseconds after the map changed, is not logged.)
        // The log is kept apart from the map as well: QEMU with CONFIGURE_MEM_SLOTS may
        // remove every region (REM_MEM_REG) before it adds the new ones.
        let mut prev = self.mapped.lock().unwrap();
        let new = mem.memory().into_inner();
        let log = prev
            .map
            .as_ref()
            .and_then(|m| m.iter().find_map(|r| r.bitmap().log()))
            .or_else(|| prev.log.clone());
        if let Some(log) = &log {
            for r in new.iter() {
                r.bitmap().inherit(r, log.clone())?;
            }
        }
        *prev = Mapped {
            map: Some(new),
            log,
        };
        *self.mem.write().unwrap() = Some(mem);
        Ok(())
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: std::fs::File,
    ) -> io::Result<Option<std::fs::File>> {
        self.transfer.start(
            self.server.clone(),
            self.num_queues(),
            direction,
            phase,
            file,
        )?;
        Ok(None)
    }

    fn reset_device(&self) {
        // A reset guest waits for nothing it sent before.
        self.server.set_suspended(Vec::new());
    }

    fn check_device_state(&self) -> io::Result<()> {
        self.transfer.check()
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        self.masks.clone()
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (c, n) = self.exit.get(thread_index)?;
        Some((c.try_clone().ok()?, n.try_clone().ok()?))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Self::Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected event set {evset:?}")));
        }
        // `device_event` counts among this thread's queues (`queue_masks`).
        let (Some(vring), Some(queue)) = (
            vrings.get(device_event as usize),
            self.masks
                .get(thread_id)
                .and_then(|&mask| nth_queue(mask, device_event as usize)),
        ) else {
            return Err(io::Error::other(format!(
                "event {device_event} for unknown queue of thread {thread_id}"
            )));
        };
        // An error ends the thread's event loop, and the thread serves other queues too
        // (hiprio beside the first request queue): a ring the guest broke stays broken
        // until it is set up again, and the others go on. Logged at powers of two, since
        // the guest kicks as often as it likes.
        self.keep_ring(vring, queue);
        if let Err(e) = self.process_queue(vring, queue) {
            let n = self.queue_errors.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                warn!("queue {queue}: {e} (ring errors so far: {n})");
            }
        }
        Ok(())
    }
}

impl FsDevice {
    /// `struct virtio_fs_config`: the tag, NUL-padded, then le32 num_request_queues.
    fn config_space(&self) -> Vec<u8> {
        let mut c = vec![0u8; TAG_LEN + 4];
        if let Some(tag) = &self.cfg.tag {
            c[..tag.len()].copy_from_slice(tag.as_bytes());
        }
        c[TAG_LEN..].copy_from_slice(&(self.cfg.request_queues as u32).to_le_bytes());
        c
    }
}

/// The queues each queue thread serves, as bit masks: the hiprio queue (0) with the first
/// request queue, as virtiofsd serves them, and every further request queue on a thread of
/// its own. A FORGET that the guest sends while that thread serves a request is then
/// taken up when the request is done, by a thread already awake rather than by waking a
/// thread of its own: under `--cache never` a fifth of a tree walk's requests are FORGETs.
/// Nothing served on a queue thread waits for a FORGET or INTERRUPT (a waiting SETLKW moves
/// to a thread of its own).
pub(super) fn queue_masks(request_queues: usize) -> Vec<u64> {
    std::iter::once(0b11)
        .chain((2..=request_queues).map(|q| 1u64 << q))
        .collect()
}

/// The queue index of the `nth` queue in `mask` (the vring a thread's event names).
fn nth_queue(mask: u64, nth: usize) -> Option<usize> {
    (0..64).filter(|q| mask & (1u64 << q) != 0).nth(nth)
}
