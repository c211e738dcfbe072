//! The dirty-page log of guest memory (VHOST_F_LOG_ALL, SET_LOG_BASE): one bit per 4 KiB
//! guest page in a map the VMM shares, set for every page vfsd writes while it migrates.
//!
//! vhost-user-backend's own bitmap hands the log to the regions mapped when SET_LOG_BASE
//! came, and a region mapped later (a SET_MEM_TABLE or ADD_MEM_REG while the VMM logs,
//! which QEMU sends when the guest's memory map changes) would not log at all. This one
//! keeps the log it was given so the device can hand it on to such regions
//! (`inherit`), and the device drops it when the VMM stops logging (`stop`) rather than
//! marking pages nobody reads.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use vhost_user_backend::bitmap::{AtomicBitmapMmap, BitmapReplace, MemRegionBitmap, MmapLogReg};
use vm_memory::bitmap::{Bitmap, BitmapSlice, NewBitmap, WithBitmapSlice};
use vm_memory::{Address, GuestMemoryRegion};

/// The log's page size, fixed by the vhost-user protocol.
const LOG_PAGE: usize = 4096;

/// A region's part of the log: which bits of the shared map are this region's pages.
#[derive(Clone)]
pub struct RegionLog {
    log: Arc<MmapLogReg>,
    /// The region's first guest page (its guest address / 4 KiB).
    first_page: usize,
    pages: usize,
}

impl fmt::Debug for RegionLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionLog")
            .field("first_page", &self.first_page)
            .field("pages", &self.pages)
            .finish()
    }
}

impl MemRegionBitmap for RegionLog {
    fn new<R: GuestMemoryRegion>(region: &R, log: Arc<MmapLogReg>) -> io::Result<Self> {
        // The crate's bitmap checks that the map covers the region's last page (the map's
        // length is private to it); then every bit `mark` indexes lies inside the map.
        AtomicBitmapMmap::new(region, log.clone())?;
        let invalid = || io::Error::from(io::ErrorKind::InvalidData);
        let start = usize::try_from(region.start_addr().raw_value()).map_err(|_| invalid())?;
        let len = usize::try_from(region.len()).map_err(|_| invalid())?;
        Ok(RegionLog {
            log,
            first_page: start / LOG_PAGE,
            pages: len.div_ceil(LOG_PAGE),
        })
    }
}

impl RegionLog {
    /// Sets the bits of `len` bytes at `offset` into the region.
    fn mark(&self, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        let first = offset / LOG_PAGE;
        let last = offset.saturating_add(len - 1) / LOG_PAGE;
        for page in first..=last.min(self.pages.saturating_sub(1)) {
            let bit = self.first_page + page;
            self.log[bit / 8].fetch_or(1 << (bit % 8), Ordering::Relaxed);
        }
    }

    fn is_marked(&self, offset: usize) -> bool {
        let page = offset / LOG_PAGE;
        let bit = self.first_page + page;
        page < self.pages && self.log[bit / 8].load(Ordering::Relaxed) & (1 << (bit % 8)) != 0
    }
}

/// One region's dirty bitmap (and, through `slice_at`, a slice of it).
#[derive(Clone, Default, Debug)]
pub struct DirtyBitmap {
    inner: Arc<Shared>,
    /// This slice's offset into its region.
    base: usize,
}

#[derive(Default, Debug)]
struct Shared {
    /// Whether `log` is set: a write while the VMM does not log reads only this.
    on: AtomicBool,
    log: RwLock<Option<RegionLog>>,
}

impl DirtyBitmap {
    /// The log this region writes to, if the VMM logs.
    pub fn log(&self) -> Option<Arc<MmapLogReg>> {
        if !self.inner.on.load(Ordering::Acquire) {
            return None;
        }
        self.inner
            .log
            .read()
            .unwrap()
            .as_ref()
            .map(|l| l.log.clone())
    }

    /// Hands `log` (another region's) to this region if it has none: a region mapped
    /// while the VMM logs.
    pub fn inherit<R: GuestMemoryRegion>(
        &self,
        region: &R,
        log: Arc<MmapLogReg>,
    ) -> io::Result<()> {
        if self.log().is_none() {
            self.replace(RegionLog::new(region, log)?);
        }
        Ok(())
    }

    /// The VMM stopped logging (SET_FEATURES without VHOST_F_LOG_ALL).
    pub fn stop(&self) {
        let mut log = self.inner.log.write().unwrap();
        self.inner.on.store(false, Ordering::Release);
        *log = None;
    }
}

impl BitmapReplace for DirtyBitmap {
    type InnerBitmap = RegionLog;

    fn replace(&self, log: RegionLog) {
        let mut l = self.inner.log.write().unwrap();
        *l = Some(log);
        self.inner.on.store(true, Ordering::Release);
    }
}

impl Bitmap for DirtyBitmap {
    fn mark_dirty(&self, offset: usize, len: usize) {
        if !self.inner.on.load(Ordering::Acquire) {
            return;
        }
        if let Some(log) = self.inner.log.read().unwrap().as_ref() {
            log.mark(self.base.saturating_add(offset), len);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.inner.on.load(Ordering::Acquire)
            && self
                .inner
                .log
                .read()
                .unwrap()
                .as_ref()
                .is_some_and(|l| l.is_marked(self.base.saturating_add(offset)))
    }

    fn slice_at(&self, offset: usize) -> Self {
        DirtyBitmap {
            inner: self.inner.clone(),
            base: self.base.saturating_add(offset),
        }
    }
}

impl WithBitmapSlice<'_> for DirtyBitmap {
    type S = Self;
}

impl BitmapSlice for DirtyBitmap {}

impl NewBitmap for DirtyBitmap {
    fn with_len(_len: usize) -> Self {
        Self::default()
    }
}
