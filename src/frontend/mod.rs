//! A vhost-user-fs frontend: connects to a daemon's socket as a VMM does, shares
//! memfd-backed guest memory, sets up the virtqueues and drives them as the guest's
//! virtio-fs driver would. Used by the integration tests and by `vfsd-bench`.

pub mod fuse;
pub mod virtq;

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::Mutex;

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags,
    VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend as VuFrontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserDirtyLogRegion, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::{
    FileOffset, GuestAddress, GuestMemory, GuestMemoryMmap, GuestRegionMmap, MmapRegion,
};

pub use virtq::{Layout, RawDesc, VirtQueue};

#[derive(Clone, Debug)]
pub struct FrontendConfig {
    /// Request queues to set up (the hiprio queue comes on top).
    pub request_queues: usize,
    /// Requests that may be in flight per queue.
    pub slots: usize,
    /// Descriptors reserved per request in the ring.
    pub descs_per_slot: u16,
    /// Bytes of request and of reply room per slot.
    pub buf_size: usize,
    pub event_idx: bool,
}

impl Default for FrontendConfig {
    fn default() -> Self {
        FrontendConfig {
            request_queues: 1,
            slots: 16,
            descs_per_slot: 16,
            buf_size: (1 << 20) + 8192,
            event_idx: true,
        }
    }
}

pub struct Frontend {
    pub vu: VuFrontend,
    pub mem: GuestMemoryMmap,
    /// Queue 0 is hiprio, 1.. are request queues.
    pub queues: Vec<Mutex<VirtQueue>>,
    pub features: u64,
    pub protocol_features: VhostUserProtocolFeatures,
    pub cfg: FrontendConfig,
    /// The queues' call eventfds, readable without taking a queue's lock.
    call_fds: Vec<vmm_sys_util::eventfd::EventFd>,
    _memfd: File,
}

/// Hands queue `q`'s rings and eventfds to the device and enables it.
fn start_queue(
    vu: &mut VuFrontend,
    q: &VirtQueue,
    host_base: u64,
    base: u16,
    features: u64,
    protocol_features: VhostUserProtocolFeatures,
) -> io::Result<()> {
    let i = q.index;
    vu.set_vring_num(i, q.geo.size).map_err(vu_err)?;
    vu.set_vring_base(i, base).map_err(vu_err)?;
    vu.set_vring_addr(
        i,
        &VringConfigData {
            queue_max_size: q.geo.size,
            queue_size: q.geo.size,
            flags: 0,
            desc_table_addr: host_base + q.geo.desc,
            used_ring_addr: host_base + q.geo.used,
            avail_ring_addr: host_base + q.geo.avail,
            log_addr: None,
        },
    )
    .map_err(vu_err)?;
    vu.set_vring_call(i, &q.call).map_err(vu_err)?;
    vu.set_vring_kick(i, &q.kick).map_err(vu_err)?;
    if !protocol_features.is_empty()
        || features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0
    {
        vu.set_vring_enable(i, true).map_err(vu_err)?;
    }
    Ok(())
}

/// Hands the guest memory (one memfd region at guest address 0) to the device.
fn set_mem_table(vu: &mut VuFrontend, memfd: &File, size: u64, host_base: u64) -> io::Result<()> {
    vu.set_mem_table(&[VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: size,
        userspace_addr: host_base,
        mmap_offset: 0,
        mmap_handle: memfd.as_raw_fd(),
    }])
    .map_err(vu_err)
}

/// Connects to `socket` and negotiates features as QEMU does, up to SET_FEATURES.
fn negotiate(
    socket: &Path,
    cfg: &FrontendConfig,
) -> io::Result<(VuFrontend, u64, VhostUserProtocolFeatures)> {
    let nq = 1 + cfg.request_queues;
    let mut vu = VuFrontend::connect(socket, nq as u64).map_err(vu_err)?;
    let offered = vu.get_features().map_err(vu_err)?;
    let mut want = (1u64 << VIRTIO_F_VERSION_1)
        | (1 << VIRTIO_RING_F_INDIRECT_DESC)
        | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    if cfg.event_idx {
        want |= 1 << VIRTIO_RING_F_EVENT_IDX;
    }
    let features = offered & want;
    let mut protocol_features = VhostUserProtocolFeatures::empty();
    if features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
        let p = vu.get_protocol_features().map_err(vu_err)?;
        protocol_features = p
            & (VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
                | VhostUserProtocolFeatures::LOG_SHMFD
                | VhostUserProtocolFeatures::DEVICE_STATE);
        vu.set_protocol_features(protocol_features)
            .map_err(vu_err)?;
        if protocol_features.contains(VhostUserProtocolFeatures::MQ) {
            let max = vu.get_queue_num().map_err(vu_err)?;
            if (max as usize) < nq {
                return Err(io::Error::other(format!(
                    "device offers {max} queues, need {nq}"
                )));
            }
        }
    }
    vu.set_owner().map_err(vu_err)?;
    vu.set_features(features).map_err(vu_err)?;
    Ok((vu, features, protocol_features))
}

/// The VMM's view of the dirty-page log (`Frontend::start_dirty_log`).
pub struct DirtyLog {
    map: MmapRegion<()>,
    pages: u64,
    _file: File,
}

impl DirtyLog {
    /// The guest pages whose bits are set.
    pub fn dirty_pages(&self) -> Vec<u64> {
        let base = self.map.as_ptr();
        (0..self.pages)
            .filter(|p| {
                // SAFETY: the page's byte lies inside the mapping (pages / 8 < its length);
                // the daemon sets bits with atomic ors, a plain read sees them or not.
                let b = unsafe { std::ptr::read_volatile(base.add((p / 8) as usize)) };
                b & (1 << (p % 8)) != 0
            })
            .collect()
    }

    /// Clears every bit, as a VMM does after it copied the dirty pages.
    pub fn clear(&self) {
        // SAFETY: the whole mapping is ours to write; the daemon only ors bits in.
        unsafe { std::ptr::write_bytes(self.map.as_ptr(), 0, self.map.size()) };
    }
}

/// A pipe whose read end is a File.
fn pipe() -> io::Result<(File, std::os::fd::OwnedFd)> {
    let (rd, wr) = crate::sys::pipe()?;
    Ok((File::from(rd), wr))
}

fn vu_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("vhost-user: {e}"))
}

impl Frontend {
    /// Connects to `socket` and brings the device up in the order QEMU uses.
    pub fn connect(socket: &Path, cfg: FrontendConfig) -> io::Result<Frontend> {
        let nq = 1 + cfg.request_queues;
        let (mut vu, features, protocol_features) = negotiate(socket, &cfg)?;
        let event_idx = features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;

        // Lay the queues out and size the memory to fit them.
        let mut queues = Vec::with_capacity(nq);
        let mut next = 0x1000u64;
        for i in 0..nq {
            // The hiprio queue carries only FORGETs: a few small slots.
            let (slots, buf) = if i == 0 {
                (4, 4096)
            } else {
                (cfg.slots, cfg.buf_size)
            };
            let (q, end) = VirtQueue::new(i, next, slots, cfg.descs_per_slot, buf, event_idx)?;
            queues.push(q);
            next = end;
        }
        let size = next as usize;

        // SAFETY: memfd_create with a NUL-terminated name; the fd is owned by `memfd` below.
        let fd = unsafe { libc::memfd_create(c"vfsd-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh fd nothing else owns.
        let memfd = unsafe { File::from_raw_fd(fd) };
        memfd.set_len(size as u64)?;
        let region = MmapRegion::from_file(FileOffset::new(memfd.try_clone()?, 0), size)
            .map_err(io::Error::other)?;
        let region = GuestRegionMmap::new(region, GuestAddress(0))
            .ok_or_else(|| io::Error::other("bad region"))?;
        let mem = GuestMemoryMmap::from_regions(vec![region]).map_err(io::Error::other)?;
        let host_base = mem
            .get_host_address(GuestAddress(0))
            .map_err(io::Error::other)? as u64;
        set_mem_table(&mut vu, &memfd, size as u64, host_base)?;

        for q in &queues {
            start_queue(&mut vu, q, host_base, 0, features, protocol_features)?;
        }
        let call_fds = queues
            .iter()
            .map(|q| q.call.try_clone())
            .collect::<io::Result<_>>()?;
        Ok(Frontend {
            call_fds,
            vu,
            mem,
            queues: queues.into_iter().map(Mutex::new).collect(),
            features,
            protocol_features,
            cfg,
            _memfd: memfd,
        })
    }

    /// Stops `queue` as a VMM does on a reset or shutdown (GET_VRING_BASE); gives the
    /// ring base the device reports.
    pub fn stop_queue(&self, queue: usize) -> io::Result<u32> {
        self.vu.get_vring_base(queue).map_err(vu_err)
    }

    /// Sets `queue` up again in the same memory with zeroed rings, as the driver of a
    /// guest that rebooted does.
    pub fn restart_queue(&mut self, queue: usize) -> io::Result<()> {
        let mut q = self.queues[queue].lock().unwrap();
        q.reset(&self.mem)?;
        let host_base = self
            .mem
            .get_host_address(GuestAddress(0))
            .map_err(io::Error::other)? as u64;
        start_queue(
            &mut self.vu,
            &q,
            host_base,
            0,
            self.features,
            self.protocol_features,
        )
    }

    /// The guest memory's size (one region at guest address 0).
    fn mem_size(&self) -> u64 {
        vm_memory::Address::raw_value(&self.mem.last_addr()) + 1
    }

    fn host_base(&self) -> io::Result<u64> {
        Ok(self
            .mem
            .get_host_address(GuestAddress(0))
            .map_err(io::Error::other)? as u64)
    }

    /// Starts every queue again where it stopped, rings untouched, as a VMM does when a
    /// stopped VM goes on (or a migration failed and the source resumes): SET_VRING_BASE
    /// with the bases the stops gave, then the rest of the queue set-up.
    pub fn resume_queues(&mut self, bases: &[u32]) -> io::Result<()> {
        let host_base = self.host_base()?;
        for (q, &base) in self.queues.iter().zip(bases) {
            let q = q.lock().unwrap();
            start_queue(
                &mut self.vu,
                &q,
                host_base,
                base as u16,
                self.features,
                self.protocol_features,
            )?;
        }
        Ok(())
    }

    /// Moves this guest to the daemon at `socket`, as a migration's destination QEMU does
    /// with the guest memory it received: the same memory and rings, the device `state`
    /// loaded before the queues start at the `bases` the source's stops gave. The
    /// connection to the source closes. Requests still in flight stay waited for.
    pub fn migrate_to(&mut self, socket: &Path, state: &[u8], bases: &[u32]) -> io::Result<()> {
        let (mut vu, features, protocol_features) = negotiate(socket, &self.cfg)?;
        if features != self.features & !VhostUserVirtioFeatures::LOG_ALL.bits() {
            return Err(io::Error::other("the destination offers other features"));
        }
        set_mem_table(&mut vu, &self._memfd, self.mem_size(), self.host_base()?)?;
        self.vu = vu;
        self.features = features;
        self.protocol_features = protocol_features;
        self.load_state(state)?;
        self.resume_queues(bases)
    }

    /// Sleeps until the device signals `queue` or `timeout` passes.
    pub fn wait_call(&self, queue: usize, timeout: std::time::Duration) {
        virtq::wait_readable(self.call_fds[queue].as_raw_fd(), timeout);
        let _ = self.call_fds[queue].read();
    }

    /// Saves the device state as a migration source does: every queue stopped
    /// (GET_VRING_BASE), then SET_DEVICE_STATE_FD (save) with a pipe read to its end, and
    /// CHECK_DEVICE_STATE.
    pub fn save_state(&self) -> io::Result<Vec<u8>> {
        self.save_state_with_bases().map(|(s, _)| s)
    }

    /// `save_state`, and the ring bases the stops gave (for `migrate_to`).
    pub fn save_state_with_bases(&self) -> io::Result<(Vec<u8>, Vec<u32>)> {
        let bases = (0..self.queues.len())
            .map(|q| self.stop_queue(q))
            .collect::<io::Result<Vec<u32>>>()?;
        let (mut rd, wr) = pipe()?;
        let other = self
            .vu
            .set_device_state_fd(
                VhostTransferStateDirection::SAVE,
                VhostTransferStatePhase::STOPPED,
                wr,
            )
            .map_err(vu_err)?;
        if other.is_some() {
            return Err(io::Error::other(
                "the device answered with a channel of its own",
            ));
        }
        let mut state = Vec::new();
        std::io::Read::read_to_end(&mut rd, &mut state)?;
        self.vu.check_device_state().map_err(vu_err)?;
        Ok((state, bases))
    }

    /// Loads a device state as a migration destination does: SET_DEVICE_STATE_FD (load)
    /// with a pipe that `state` is written into and closed, then CHECK_DEVICE_STATE (an
    /// error there is the load's failure).
    pub fn load_state(&self, state: &[u8]) -> io::Result<()> {
        let (rd, wr) = pipe()?;
        let mut wr = File::from(wr);
        self.vu
            .set_device_state_fd(
                VhostTransferStateDirection::LOAD,
                VhostTransferStatePhase::STOPPED,
                rd.into(),
            )
            .map_err(vu_err)?;
        // The daemon may refuse to read on (a bad header): EPIPE then is its answer.
        match std::io::Write::write_all(&mut wr, state) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
            r => r?,
        }
        drop(wr);
        self.vu.check_device_state().map_err(vu_err)
    }

    /// Starts dirty-page logging as QEMU does when it migrates (`vhost_migration_log`):
    /// SET_LOG_BASE with a shared log of one bit per 4 KiB page, then VHOST_F_LOG_ALL in
    /// SET_FEATURES.
    pub fn start_dirty_log(&mut self) -> io::Result<DirtyLog> {
        let pages = self.mem_size().div_ceil(4096);
        let bytes = pages.div_ceil(8).next_multiple_of(4096);
        // SAFETY: memfd_create with a NUL-terminated name; the fd is owned below.
        let fd = unsafe { libc::memfd_create(c"vfsd-dirty-log".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(bytes)?;
        let map =
            MmapRegion::<()>::from_file(FileOffset::new(file.try_clone()?, 0), bytes as usize)
                .map_err(io::Error::other)?;
        self.vu
            .set_log_base(
                0,
                Some(VhostUserDirtyLogRegion {
                    mmap_size: bytes,
                    mmap_offset: 0,
                    mmap_handle: file.as_raw_fd(),
                }),
            )
            .map_err(vu_err)?;
        self.features |= VhostUserVirtioFeatures::LOG_ALL.bits();
        self.vu.set_features(self.features).map_err(vu_err)?;
        self.vu.get_features().map_err(vu_err)?; // orders it before the rings' requests
        Ok(DirtyLog {
            map,
            pages,
            _file: file,
        })
    }

    /// Sends the memory table again, as QEMU does when the guest's memory map changes
    /// (while it logs, too): the device maps every region anew.
    pub fn remap_memory(&mut self) -> io::Result<()> {
        let (size, base) = (self.mem_size(), self.host_base()?);
        set_mem_table(&mut self.vu, &self._memfd, size, base)
    }

    /// Takes the memory region out and puts it back (REM_MEM_REG, ADD_MEM_REG), as QEMU
    /// does with CONFIGURE_MEM_SLOTS when the guest's memory map changes: for a moment
    /// the device has no memory at all.
    pub fn replug_memory(&mut self) -> io::Result<()> {
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: self.mem_size(),
            userspace_addr: self.host_base()?,
            mmap_offset: 0,
            mmap_handle: self._memfd.as_raw_fd(),
        };
        self.vu.remove_mem_region(&region).map_err(vu_err)?;
        self.vu.add_mem_region(&region).map_err(vu_err)?;
        // Neither waits for the device here: a round trip orders them before the requests
        // that follow on the rings (QEMU waits for each one's REPLY_ACK).
        self.vu.get_features().map(drop).map_err(vu_err)
    }

    /// Ends dirty-page logging as a VMM does after a migration ends or fails:
    /// SET_FEATURES without VHOST_F_LOG_ALL.
    pub fn stop_dirty_log(&mut self) -> io::Result<()> {
        self.features &= !VhostUserVirtioFeatures::LOG_ALL.bits();
        self.vu.set_features(self.features).map_err(vu_err)?;
        // SET_FEATURES has no reply here: a round trip orders it before the requests
        // that follow on the rings (QEMU waits for a reply while it logs).
        self.vu.get_features().map(drop).map_err(vu_err)
    }

    /// Reads `struct virtio_fs_config` (tag, num_request_queues) from the backend.
    pub fn fs_config(&mut self) -> io::Result<(String, u32)> {
        let len = 40u32;
        let (_, data) = self
            .vu
            .get_config(
                0,
                len,
                VhostUserConfigFlags::WRITABLE,
                &vec![0u8; len as usize],
            )
            .map_err(vu_err)?;
        if data.len() < 40 {
            return Err(io::Error::other("short config space"));
        }
        let tag_end = data[..36].iter().position(|&b| b == 0).unwrap_or(36);
        let tag = String::from_utf8_lossy(&data[..tag_end]).into_owned();
        let nrq = u32::from_le_bytes(data[36..40].try_into().unwrap());
        Ok((tag, nrq))
    }
}
