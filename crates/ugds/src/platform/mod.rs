//! Where a controller lives: the only layer that knows.
//!
//! A [`Platform`] gives the engine mapped registers, DMA memory for queues and
//! PRP lists, controller addresses for user buffers, and interrupt eventfds.
//! The engine above it is the same whichever platform it runs on.
//!
//! - [`emu`]: an NVMe controller emulated in-process, the default target.
//! - [`vfio`]: a controller bound to upstream vfio-pci behind an IOMMU.

pub mod emu;
pub mod vfio;

use crate::dma::DmaBuffer;
use crate::sys::EventFd;
use crate::Result;

/// Controller addresses of a user buffer, one per controller page.
#[derive(Debug, Clone)]
pub struct HostMapping {
    /// Controller address of each page spanned, in order.
    pub pages: Vec<u64>,
    /// Offset of the buffer's first byte within the first page.
    pub first_offset: usize,
    /// The platform's name for this mapping, given back to unmap it.
    pub cookie: u64,
}

/// What the engine needs from wherever the controller is.
pub trait Platform: Send + Sync {
    /// A short name for logs and `ugds identify` ("emulated", "vfio 0000:01:00.0").
    fn describe(&self) -> String;

    /// Reads a 32-bit controller register at byte offset `off` of BAR0.
    fn read32(&self, off: usize) -> u32;

    /// Writes a 32-bit controller register (doorbells included).
    fn write32(&self, off: usize, val: u32);

    /// Reads a 64-bit register as two dword reads, low first.
    fn read64(&self, off: usize) -> u64 {
        self.read32(off) as u64 | (self.read32(off + 4) as u64) << 32
    }

    /// Writes a 64-bit register as two dword writes, low first.
    fn write64(&self, off: usize, val: u64) {
        self.write32(off, val as u32);
        self.write32(off + 4, (val >> 32) as u32);
    }

    /// Allocates `len` bytes (rounded up to pages) of zeroed memory,
    /// contiguous for the controller and mapped for it.
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer>;

    /// Makes `len` bytes at `vaddr` reachable by the controller.
    ///
    /// # Safety
    /// The memory must stay valid until [`Platform::unmap_host`] returns for
    /// this mapping.
    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping>;

    /// Removes a mapping made by [`Platform::map_host`]. The caller makes
    /// sure no command that uses it is outstanding.
    fn unmap_host(&self, mapping: &HostMapping) -> Result<()>;

    /// The eventfd signalled by interrupt vector `vector`, set up on first
    /// use; `None` when the platform has no interrupts to offer.
    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>>;

    /// Number of interrupt vectors available (0: polling only).
    fn interrupt_vectors(&self) -> u16;
}
