//! Page-aligned host memory for I/O.

use ugds_platform::sys::shared::{sharing, SharedMemory};
use ugds_platform::sys::{Anonymous, PAGE_SIZE};
use ugds_platform::Result;

/// The pages behind a buffer: private, or (in a process attached to a
/// controller another process owns) a memfd the owner maps for the device.
enum Memory {
    Private(Anonymous),
    Shared(SharedMemory),
}

impl Memory {
    fn as_ptr(&self) -> *mut u8 {
        match self {
            Memory::Private(m) => m.as_ptr(),
            Memory::Shared(m) => m.as_ptr(),
        }
    }
}

/// Zeroed, page-aligned host memory, for use as an I/O buffer. Derefs to a
/// byte slice: fill it before a write, read it after a read. Register it
/// with [`Driver::register`](crate::Driver::register), and deregister it
/// before it is dropped.
///
/// In a process attached to a controller another process owns
/// ([`ugds_platform::attach`]) the buffer is shared memory (a memfd), so
/// that the owner can map it for the device: register such buffers there.
pub struct HostBuffer {
    mem: Memory,
    len: usize,
}

impl HostBuffer {
    /// `len` bytes (the mapping is rounded up to whole pages).
    pub fn new(len: usize) -> Result<HostBuffer> {
        let mem = if sharing() {
            Memory::Shared(SharedMemory::new(len.max(1))?)
        } else {
            // Huge pages where the buffer is large enough (Anonymous::huge).
            Memory::Private(Anonymous::huge(len.max(1), false)?)
        };
        Ok(HostBuffer { mem, len })
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
