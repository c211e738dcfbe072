//! Guest memory as the device maps it, and the server's reads and writes of it.

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

/// Guest memory as the device maps it. Each region carries a dirty-page log that is off
/// until the VMM migrates (VHOST_F_LOG_ALL, SET_LOG_BASE): then every write vfsd makes into
/// guest memory sets the bits of its pages, through vm-memory's writes or, where vfsd reads
/// a host file straight into guest buffers, by hand (`log_guest_write`).
pub type GuestMem = vm_memory::GuestMemoryMmap<crate::dirty_log::DirtyBitmap>;

/// Sets the dirty-page log bits of `len` bytes at `addr`, which vfsd wrote without
/// vm-memory (a host file read straight into guest buffers). A no-op while the VMM is not
/// logging.
pub fn log_guest_write(mem: &GuestMem, addr: GuestAddress, len: usize) {
    use vm_memory::bitmap::Bitmap;
    if let Ok(s) = mem.get_slice(addr, len) {
        s.bitmap().mark_dirty(0, len);
    }
}

/// Reads `buf.len()` bytes at `addr`: one region lookup and a copy where the range lies
/// in one region (every FUSE header does), vm-memory's general walk where it spans two or
/// is not all in memory (which then says what is wrong).
pub fn read_guest(
    mem: &GuestMem,
    buf: &mut [u8],
    addr: GuestAddress,
) -> Result<(), GuestMemoryError> {
    match mem.get_slice(addr, buf.len()) {
        Ok(s) if s.len() == buf.len() => {
            s.copy_to(buf);
            Ok(())
        }
        _ => mem.read_slice(buf, addr),
    }
}

/// Writes `buf` at `addr`, as `read_guest` reads (the dirty-page log marked either way).
/// Like vm-memory's write, one that reaches outside guest memory may have written the
/// part inside before its error: check the range first (`in_memory`).
pub fn write_guest(mem: &GuestMem, buf: &[u8], addr: GuestAddress) -> Result<(), GuestMemoryError> {
    match mem.get_slice(addr, buf.len()) {
        Ok(s) if s.len() == buf.len() => {
            s.copy_from(buf);
            Ok(())
        }
        _ => mem.write_slice(buf, addr),
    }
}

/// Whether `len` bytes at `addr` all lie in guest memory.
pub fn in_memory(mem: &GuestMem, addr: GuestAddress, len: usize) -> bool {
    mem.get_slice(addr, len).is_ok() || mem.check_range(addr, len)
}
