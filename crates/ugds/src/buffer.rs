//! Page-aligned host memory for I/O.

use ugds_platform::sys::{Anonymous, PAGE_SIZE};
use ugds_platform::Result;

/// Zeroed, page-aligned host memory, for use as an I/O buffer. Derefs to a
/// byte slice: fill it before a write, read it after a read. Register it
/// with [`Driver::register`](crate::Driver::register), and deregister it
/// before it is dropped.
pub struct HostBuffer {
    mem: Anonymous,
    len: usize,
}

impl HostBuffer {
    /// `len` bytes (the mapping is rounded up to whole pages).
    pub fn new(len: usize) -> Result<HostBuffer> {
        Ok(HostBuffer { mem: Anonymous::new(len.max(1))?, len })
    }

    /// Start of the buffer.
    pub fn as_ptr(&self) -> *const u8 {
        self.mem.as_ptr()
    }

    /// Start of the buffer, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.mem.as_ptr()
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The page size the buffer is aligned to.
    pub const ALIGN: usize = PAGE_SIZE;
}

impl std::ops::Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is live and at least `len` bytes. The device
        // reaches it only during I/O calls, and `Driver::register`'s contract
        // forbids touching the bytes while one of those is in flight.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for Deref, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer").field("ptr", &self.mem.as_ptr()).field("len", &self.len).finish()
    }
}
