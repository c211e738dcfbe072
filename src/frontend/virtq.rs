//! The driver side of a split virtqueue, living in shared guest memory: what a guest's
//! virtio driver does, so tests and the load generator exercise vfsd's real queue code.

use std::io;
use std::sync::atomic::{fence, Ordering};
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

pub const VRING_DESC_F_NEXT: u16 = 1;
pub const VRING_DESC_F_WRITE: u16 = 2;
pub const VRING_DESC_F_INDIRECT: u16 = 4;
/// The used ring's flag by which a device without EVENT_IDX asks for no kicks.
pub const VRING_USED_F_NO_NOTIFY: u16 = 1;

/// How a request is laid out in descriptors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Largest buffer per descriptor (0: one descriptor per direction).
    pub split: usize,
    /// Put the chain in an indirect descriptor table.
    pub indirect: bool,
    /// (request prefix, reply prefix): place the request so that its bytes after the first
    /// prefix, and the reply room after its prefix, start on a page boundary, as the Linux
    /// driver places a WRITE's data and a READ's reply pages. O_DIRECT on the host needs
    /// it: (80, 16) puts a WRITE's data and a READ's data there.
    pub page_aligned_payload: Option<(usize, usize)>,
}

/// A hand-built chain element, for tests that need chains vfsd must reject.
#[derive(Clone, Copy, Debug)]
pub struct RawDesc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

/// Where one in-flight slot keeps its buffers.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// Request bytes (device-readable).
    req: u64,
    /// Reply bytes (device-writable).
    resp: u64,
    /// Where the current request's reply room starts (`resp`, or later for an aligned
    /// payload).
    resp_at: u64,
    /// Room for an indirect descriptor table.
    table: u64,
    busy: bool,
    done: Option<u32>,
}

pub struct QueueGeometry {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

pub struct VirtQueue {
    pub index: usize,
    pub geo: QueueGeometry,
    pub kick: EventFd,
    pub call: EventFd,
    slots: Vec<Slot>,
    descs_per_slot: u16,
    buf_size: usize,
    avail_idx: u16,
    last_used: u16,
    event_idx: bool,
    /// The available index at the last kick decision (`kick`).
    kicked_idx: u16,
}

pub const TABLE_ENTRIES: usize = 512;

impl VirtQueue {
    /// Lays a queue out at `base`: rings first, then `slots` pairs of buffers of
    /// `buf_size` bytes. Returns the queue and the first address after it.
    pub fn new(
        index: usize,
        base: u64,
        slots: usize,
        descs_per_slot: u16,
        buf_size: usize,
        event_idx: bool,
    ) -> io::Result<(VirtQueue, u64)> {
        // A split virtqueue's size is a power of two up to 32768; a device handed another
        // size wraps ring indices differently from this driver.
        let size = u16::try_from(slots * descs_per_slot as usize)
            .ok()
            .filter(|s| s.is_power_of_two())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{slots} slots of {descs_per_slot} descriptors: the queue size must be a power of two up to 32768"
                    ),
                )
            })?;
        let q = size as u64;
        let desc = base;
        let avail = desc + 16 * q;
        let used = align(avail + 6 + 2 * q, 4);
        let mut next = align(used + 6 + 8 * q, 4096);
        let mut s = Vec::with_capacity(slots);
        for _ in 0..slots {
            let req = next;
            let resp = req + buf_size as u64;
            let table = resp + buf_size as u64;
            next = align(table + 16 * TABLE_ENTRIES as u64, 4096);
            s.push(Slot {
                req,
                resp,
                resp_at: resp,
                table,
                busy: false,
                done: None,
            });
        }
        let vq = VirtQueue {
            index,
            geo: QueueGeometry {
                size,
                desc,
                avail,
                used,
            },
            kick: EventFd::new(libc::EFD_NONBLOCK)?,
            call: EventFd::new(libc::EFD_NONBLOCK)?,
            slots: s,
            descs_per_slot,
            buf_size,
            avail_idx: 0,
            last_used: 0,
            event_idx,
            kicked_idx: 0,
        };
        Ok((vq, next))
    }

    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    pub fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| !s.busy)
    }

    pub fn in_flight(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.busy && s.done.is_none())
            .count()
    }

    /// Places `req` in slot `slot` with `resp_len` bytes of reply room and makes it
    /// available to the device (without kicking).
    pub fn submit(
        &mut self,
        mem: &GuestMemoryMmap,
        slot: usize,
        req: &[u8],
        resp_len: usize,
        layout: Layout,
    ) -> io::Result<()> {
        // Slots start on page boundaries (`new`); the shift moves the payload to the next.
        let shift = |prefix: usize| ((4096 - prefix % 4096) % 4096) as u64;
        let (req_shift, resp_shift) = layout
            .page_aligned_payload
            .map_or((0, 0), |(rq, rp)| (shift(rq), shift(rp)));
        if req.len() + req_shift as usize > self.buf_size
            || resp_len + resp_shift as usize > self.buf_size
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "request larger than a slot",
            ));
        }
        let s = self.slots[slot];
        let (req_at, resp_at) = (s.req + req_shift, s.resp + resp_shift);
        self.slots[slot].resp_at = resp_at;
        mem.write_slice(req, GuestAddress(req_at))
            .map_err(io::Error::other)?;
        // Poison the reply area so a reply that was never written can't pass for one.
        mem.write_slice(&[0xa5u8; 64][..resp_len.min(64)], GuestAddress(resp_at))
            .map_err(io::Error::other)?;
        let mut parts: Vec<(u64, u32, u16)> = Vec::new();
        for (addr, len, flags) in [
            (req_at, req.len(), 0),
            (resp_at, resp_len, VRING_DESC_F_WRITE),
        ] {
            let piece = if layout.split == 0 {
                len.max(1)
            } else {
                layout.split
            };
            let mut off = 0;
            while off < len {
                let n = piece.min(len - off);
                parts.push((addr + off as u64, n as u32, flags));
                off += n;
            }
        }
        let descs: Vec<RawDesc> = parts
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| RawDesc {
                addr,
                len,
                flags: flags
                    | if i + 1 < parts.len() {
                        VRING_DESC_F_NEXT
                    } else {
                        0
                    },
                next: (i + 1) as u16,
            })
            .collect();
        self.publish(mem, slot, &descs, layout.indirect)
    }

    /// Writes `descs` (with `next` relative to the chain) for slot `slot` and publishes
    /// the head. With `indirect`, they go in the slot's table behind one descriptor. The
    /// reply is read back from the slot's reply buffer (`slot_addrs`).
    pub fn submit_raw(
        &mut self,
        mem: &GuestMemoryMmap,
        slot: usize,
        descs: &[RawDesc],
        indirect: bool,
    ) -> io::Result<()> {
        self.slots[slot].resp_at = self.slots[slot].resp;
        self.publish(mem, slot, descs, indirect)
    }

    fn publish(
        &mut self,
        mem: &GuestMemoryMmap,
        slot: usize,
        descs: &[RawDesc],
        indirect: bool,
    ) -> io::Result<()> {
        let s = self.slots[slot];
        let first = slot as u16 * self.descs_per_slot;
        if indirect {
            if descs.len() > TABLE_ENTRIES {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "chain too long",
                ));
            }
            for (i, d) in descs.iter().enumerate() {
                write_desc(mem, s.table + 16 * i as u64, d)?;
            }
            let d = RawDesc {
                addr: s.table,
                len: (16 * descs.len()) as u32,
                flags: VRING_DESC_F_INDIRECT,
                next: 0,
            };
            write_desc(mem, self.geo.desc + 16 * first as u64, &d)?;
        } else {
            if descs.len() > self.descs_per_slot as usize {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "chain too long",
                ));
            }
            for (i, d) in descs.iter().enumerate() {
                let mut d = *d;
                d.next = d.next.wrapping_add(first);
                write_desc(mem, self.geo.desc + 16 * (first as u64 + i as u64), &d)?;
            }
        }
        self.slots[slot].busy = true;
        self.slots[slot].done = None;
        let q = self.geo.size;
        let ring = self.geo.avail + 4 + 2 * (self.avail_idx % q) as u64;
        mem.write_obj(first, GuestAddress(ring))
            .map_err(io::Error::other)?;
        // Descriptors and ring entry must be visible before the index that publishes them.
        fence(Ordering::SeqCst);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.store(
            self.avail_idx,
            GuestAddress(self.geo.avail + 2),
            Ordering::Release,
        )
        .map_err(io::Error::other)?;
        Ok(())
    }

    /// Kicks unconditionally, whatever the device asked for.
    pub fn notify(&self) -> io::Result<()> {
        fence(Ordering::SeqCst);
        self.kick.write(1)
    }

    /// Kicks for the requests made available since the last call, unless the device said
    /// it needs no kick for them, as a guest driver decides: with EVENT_IDX, only if the
    /// new requests pass the used ring's avail_event; without, unless the used ring's
    /// flags carry VRING_USED_F_NO_NOTIFY. A device that watches the ring (polls) stops
    /// the kicks that way.
    pub fn kick(&mut self, mem: &GuestMemoryMmap) -> io::Result<()> {
        let (old, new) = (self.kicked_idx, self.avail_idx);
        self.kicked_idx = new;
        // The new index must be visible before the device's answer is read: a device
        // that reads the ring after writing avail_event then sees these requests.
        fence(Ordering::SeqCst);
        let needed = if self.event_idx {
            let at = self.geo.used + 4 + 8 * self.geo.size as u64;
            let event: u16 = mem
                .load(GuestAddress(at), Ordering::Acquire)
                .map_err(io::Error::other)?;
            need_event(event, new, old)
        } else {
            let flags: u16 = mem
                .load(GuestAddress(self.geo.used), Ordering::Acquire)
                .map_err(io::Error::other)?;
            flags & VRING_USED_F_NO_NOTIFY == 0
        };
        if needed {
            self.kick.write(1)?;
        }
        Ok(())
    }

    /// Collects used-ring entries; returns how many arrived.
    pub fn reap(&mut self, mem: &GuestMemoryMmap) -> io::Result<usize> {
        let used_idx: u16 = mem
            .load(GuestAddress(self.geo.used + 2), Ordering::Acquire)
            .map_err(io::Error::other)?;
        let mut n = 0;
        while self.last_used != used_idx {
            let e = self.geo.used + 4 + 8 * (self.last_used % self.geo.size) as u64;
            let id: u32 = mem.read_obj(GuestAddress(e)).map_err(io::Error::other)?;
            let len: u32 = mem
                .read_obj(GuestAddress(e + 4))
                .map_err(io::Error::other)?;
            let slot = id as usize / self.descs_per_slot as usize;
            match self.slots.get_mut(slot) {
                Some(s) if s.busy && id.is_multiple_of(self.descs_per_slot as u32) => {
                    s.done = Some(len)
                }
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("device returned unknown descriptor {id}"),
                    ))
                }
            }
            self.last_used = self.last_used.wrapping_add(1);
            n += 1;
        }
        if self.event_idx {
            // used_event: interrupt us as soon as the next entry is used.
            let ue = self.geo.avail + 4 + 2 * self.geo.size as u64;
            mem.store(self.last_used, GuestAddress(ue), Ordering::Release)
                .map_err(io::Error::other)?;
            fence(Ordering::SeqCst);
        }
        Ok(n)
    }

    pub fn is_done(&self, slot: usize) -> bool {
        self.slots[slot].done.is_some()
    }

    /// The reply of a finished slot (bytes the device said it wrote) and frees the slot.
    pub fn take(&mut self, mem: &GuestMemoryMmap, slot: usize) -> io::Result<Vec<u8>> {
        let (len, at) = self.finish(slot)?;
        let mut out = vec![0u8; len];
        mem.read_slice(&mut out, at).map_err(io::Error::other)?;
        Ok(out)
    }

    /// Frees a finished slot: its used length, checked against the buffer, and where its
    /// reply is.
    fn finish(&mut self, slot: usize) -> io::Result<(usize, GuestAddress)> {
        let s = &mut self.slots[slot];
        let len = s
            .done
            .take()
            .ok_or_else(|| io::Error::other("slot not finished"))? as usize;
        s.busy = false;
        if len > self.buf_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "used length beyond the buffer",
            ));
        }
        Ok((len, GuestAddress(s.resp_at)))
    }

    /// Frees a finished slot and gives its used length, reading into `head` the first
    /// bytes of its reply (as many as fit, up to the used length) and no more: the rest of
    /// a large reply stays in guest memory, uncopied.
    pub fn take_head(
        &mut self,
        mem: &GuestMemoryMmap,
        slot: usize,
        head: &mut [u8],
    ) -> io::Result<usize> {
        let (len, at) = self.finish(slot)?;
        let n = len.min(head.len());
        mem.read_slice(&mut head[..n], at)
            .map_err(io::Error::other)?;
        Ok(len)
    }

    /// Frees a slot whose request the device dropped (test use).
    pub fn abandon(&mut self, slot: usize) {
        self.slots[slot].busy = false;
        self.slots[slot].done = None;
    }

    /// Forgets every request and zeroes the rings, as a rebooted guest's driver starts
    /// over in the same memory.
    pub fn reset(&mut self, mem: &GuestMemoryMmap) -> io::Result<()> {
        let end = self.geo.used + 6 + 8 * self.geo.size as u64;
        let zeros = vec![0u8; (end - self.geo.desc) as usize];
        mem.write_slice(&zeros, GuestAddress(self.geo.desc))
            .map_err(io::Error::other)?;
        for s in &mut self.slots {
            s.busy = false;
            s.done = None;
        }
        self.avail_idx = 0;
        self.last_used = 0;
        self.kicked_idx = 0;
        Ok(())
    }

    /// The used ring's index as the device last wrote it.
    pub fn used_idx(&self, mem: &GuestMemoryMmap) -> io::Result<u16> {
        mem.read_obj(GuestAddress(self.geo.used + 2))
            .map_err(io::Error::other)
    }

    pub fn slot_addrs(&self, slot: usize) -> (u64, u64) {
        (self.slots[slot].req, self.slots[slot].resp)
    }
}

/// Writes descriptor `d` at `at` (a ring's table or an indirect one).
pub fn write_desc(mem: &GuestMemoryMmap, at: u64, d: &RawDesc) -> io::Result<()> {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&d.addr.to_le_bytes());
    b[8..12].copy_from_slice(&d.len.to_le_bytes());
    b[12..14].copy_from_slice(&d.flags.to_le_bytes());
    b[14..16].copy_from_slice(&d.next.to_le_bytes());
    mem.write_slice(&b, GuestAddress(at))
        .map_err(io::Error::other)
}

/// Whether a device whose avail_event is `event` wants a kick for the requests between
/// available indices `old` and `new` (the virtio spec's vring_need_event).
fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Waits until `fd` is readable or `timeout` passes, to the microsecond (poll's
/// milliseconds would turn a 100 µs wait into none).
pub(crate) fn wait_readable(fd: i32, timeout: Duration) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `p` is one valid pollfd and `ts` a valid timespec for the duration of the
    // call; no signal mask is passed.
    unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
}

#[cfg(test)]
mod tests {
    use super::need_event;

    #[test]
    fn a_kick_goes_only_when_the_new_requests_pass_avail_event() {
        // The device waits for the request at index 5: published 5 -> 6, a kick.
        assert!(need_event(5, 6, 5));
        // It asked for 7 (it watches the ring): 5 -> 6 needs none, 6 -> 8 does.
        assert!(!need_event(7, 6, 5));
        assert!(need_event(7, 8, 6));
        // Across the index's wrap.
        assert!(need_event(u16::MAX, 0, u16::MAX));
        assert!(!need_event(1, 0, u16::MAX));
    }
}
