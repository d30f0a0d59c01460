//! Where a controller lives: the only layer that knows, and the only crate
//! that makes system calls.
//!
//! A [`Platform`] gives the engine mapped registers, DMA memory for queues and
//! PRP lists, controller addresses for user buffers, and interrupt eventfds.
//! The engine above it is the same whichever platform it runs on.
//!
//! - [`vfio`]: a controller bound to upstream vfio-pci behind an IOMMU.
//! - [`ugds_drv`]: a controller bound to our kernel helper module.
//! - [`kernel`]: no controller: a file or block device the kernel keeps,
//!   reached through io_uring (the kernel path).
//! - [`tcp`]: a controller at the other end of an NVMe/TCP connection; the
//!   platform is the host memory the connection's queues copy from and to.
//! - [`attach`]: a controller another process owns (`ugds serve`), with
//!   I/O queue pairs of this process's own.
//! - the `ugds-emu` crate: an NVMe controller emulated in-process (tests,
//!   the CLI's default target, the C library's `UGDS_EMULATE`).
//!
//! Below them: [`dma`] (memory shared with a controller, every access
//! bounds-checked and volatile or atomic), [`barrier`] (ordering between
//! that memory and the registers), [`sys`] (every system call: mmap,
//! eventfd, pread/pwrite, the VFIO, iommufd, ugds_drv and dma-buf ioctls,
//! dlopen), [`device`] (GPU memory as a platform sees it), [`window`] (GPU
//! memory for platforms that reach it by copies), and [`Error`],
//! the error type of every ugds crate.

pub mod attach;
pub mod barrier;
pub mod device;
pub mod dma;
mod error;
pub mod kernel;
pub mod rdma;
pub mod readiness;
pub mod sys;
pub mod tcp;
pub mod ugds_drv;
pub mod vfio;
pub mod window;

pub use error::{Error, ErrorKind, Result};

use crate::device::DeviceMemory;
use crate::dma::DmaBuffer;
use crate::sys::EventFd;

/// Controller addresses of a user buffer, one per controller page.
///
/// Only a platform makes one (its fields are private), and only
/// [`Platform::unmap_host`], an `unsafe fn`, takes one back:
///
/// ```compile_fail,E0451
/// // Fields are private: a mapping cannot be written by hand.
/// let m = ugds_platform::HostMapping { pages: vec![0u64].into(), first_offset: 0, cookie: 0 };
/// ```
#[derive(Debug, Clone)]
pub struct HostMapping {
    pub(crate) pages: std::sync::Arc<[u64]>,
    pub(crate) first_offset: usize,
    pub(crate) cookie: u64,
}

impl HostMapping {
    /// Controller address of each page spanned, in order (shared, so a
    /// request path can keep it without holding the registry's locks).
    pub fn pages(&self) -> &std::sync::Arc<[u64]> {
        &self.pages
    }

    /// Offset of the buffer's first byte within the first page.
    pub fn first_offset(&self) -> usize {
        self.first_offset
    }

    /// The platform's name for this mapping, given back to unmap it.
    pub fn cookie(&self) -> u64 {
        self.cookie
    }

    /// The page span of `len` bytes at `vaddr`: its first page and length,
    /// in whole pages. Platforms map this span.
    pub fn span(vaddr: *const u8, len: usize) -> Result<(usize, usize)> {
        if len == 0 {
            return Err(crate::Error::ZeroSize);
        }
        let start = vaddr as usize & !(crate::sys::PAGE_SIZE - 1);
        let end = (vaddr as usize)
            .checked_add(len)
            .ok_or_else(|| crate::Error::InvalidArgument("buffer wraps the address space".into()))?
            .next_multiple_of(crate::sys::PAGE_SIZE);
        Ok((start, end - start))
    }

    /// `len` bytes at `vaddr` addressed by their own virtual addresses
    /// (the platforms whose "device" is this process: the kernel path and
    /// the fabrics' initiators, which copy the data themselves).
    pub fn identity(vaddr: *const u8, len: usize) -> Result<HostMapping> {
        let (start, span) = HostMapping::span(vaddr, len)?;
        let pages = (0..span / crate::sys::PAGE_SIZE).map(|i| (start + i * crate::sys::PAGE_SIZE) as u64).collect();
        Ok(HostMapping { pages, first_offset: vaddr as usize - start, cookie: start as u64 })
    }

    /// A mapping of the span of `vaddr` placed contiguously at `iova`
    /// (behind an IOMMU, or in the emulator's table); `cookie` is `iova`.
    ///
    /// # Safety
    /// The platform's controller reaches the span at `iova`, from now
    /// until the mapping is unmapped: the engine names these addresses in
    /// commands.
    pub unsafe fn contiguous(vaddr: *const u8, span: (usize, usize), iova: u64) -> HostMapping {
        let (start, len) = span;
        let pages = (0..len / crate::sys::PAGE_SIZE).map(|i| iova + (i * crate::sys::PAGE_SIZE) as u64).collect();
        HostMapping { pages, first_offset: vaddr as usize - start, cookie: iova }
    }

    /// A mapping from its parts: the controller address of each page, the
    /// buffer's offset in the first, and the platform's name for it.
    ///
    /// # Safety
    /// As for [`contiguous`](Self::contiguous): the controller reaches the
    /// buffer's pages at `pages` until the mapping is unmapped.
    pub unsafe fn from_parts(pages: std::sync::Arc<[u64]>, first_offset: usize, cookie: u64) -> HostMapping {
        HostMapping { pages, first_offset, cookie }
    }
}

/// What the engine needs from wherever the controller is.
pub trait Platform: Send + Sync {
    /// A short name for logs and `ugds identify` ("emulated", "vfio 0000:01:00.0").
    fn describe(&self) -> String;

    /// Reads a 32-bit controller register at byte offset `off` of BAR0.
    fn read32(&self, off: usize) -> u32;

    /// Writes a 32-bit controller register (doorbells included).
    ///
    /// # Safety
    /// A register write can start the controller's DMA (a doorbell over an
    /// entry that names memory, a queue base, CC.EN): the caller makes sure
    /// every address the controller may then use is memory mapped for it
    /// and kept until the controller is done. Only the engine writes
    /// registers.
    ///
    /// ```compile_fail,E0133
    /// fn ring(p: &dyn ugds_platform::Platform) {
    ///     p.write32(0x1000, 1); // error[E0133]: needs an unsafe block
    /// }
    /// ```
    unsafe fn write32(&self, off: usize, val: u32);

    /// Reads a 64-bit register as two dword reads, low first.
    fn read64(&self, off: usize) -> u64 {
        self.read32(off) as u64 | (self.read32(off + 4) as u64) << 32
    }

    /// Writes a 64-bit register as two dword writes, low first.
    ///
    /// # Safety
    /// As for [`write32`](Self::write32).
    unsafe fn write64(&self, off: usize, val: u64) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            self.write32(off, val as u32);
            self.write32(off + 4, (val >> 32) as u32);
        }
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

    /// Makes registered GPU memory reachable by the controller. Platforms
    /// without a path to GPU memory refuse it.
    ///
    /// # Safety
    /// The memory must stay allocated until [`Platform::unmap_host`]
    /// returns for this mapping.
    unsafe fn map_device(&self, mem: &DeviceMemory) -> Result<HostMapping> {
        Err(crate::Error::Unsupported(format!("{} cannot reach {} memory", self.describe(), mem.runtime.name())))
    }

    /// Makes `len` bytes at `offset` of a dma-buf reachable by the
    /// controller (the module imports it); platforms that cannot refuse.
    /// Used by an owner for memory an attached process registered.
    ///
    /// # Safety
    /// As for [`map_host`](Self::map_host): the exporter's memory stays
    /// until [`unmap_host`](Self::unmap_host) returns for this mapping.
    unsafe fn import_dmabuf(&self, fd: std::os::fd::BorrowedFd<'_>, offset: u64, len: usize) -> Result<HostMapping> {
        let _ = (fd, offset, len);
        Err(crate::Error::Unsupported(format!("{} cannot import a dma-buf", self.describe())))
    }

    /// Whether the controller reaches device memory through the GPU
    /// runtime's copies rather than by its own DMA (the emulated
    /// controller). Stream-ordered I/O then stages such memory: an I/O a
    /// stream waits on must not need the runtime (see `gpu::stream`).
    fn copies_device_memory(&self) -> bool {
        false
    }

    /// Removes a mapping made by [`Platform::map_host`] or
    /// [`Platform::map_device`]. Memory the platform's own table owns (a
    /// [`DmaBuffer`]'s: only its drop frees it) is refused.
    ///
    /// # Safety
    /// `mapping` is one this platform made and has not unmapped, and no
    /// command that uses it is outstanding: once this returns, the device
    /// may no longer reach the memory, and its owner may free it.
    ///
    /// ```compile_fail,E0133
    /// fn unmap(p: &dyn ugds_platform::Platform, m: &ugds_platform::HostMapping) {
    ///     let _ = p.unmap_host(m); // error[E0133]: needs an unsafe block
    /// }
    /// ```
    unsafe fn unmap_host(&self, mapping: &HostMapping) -> Result<()>;

    /// The eventfd signalled by interrupt vector `vector`, set up on first
    /// use; `None` when the platform has no interrupts to offer.
    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>>;

    /// Number of interrupt vectors available (0: polling only).
    fn interrupt_vectors(&self) -> u16;

    /// The controller's PCI address (`0000:01:00.0`), where it is a PCI
    /// function: where it sits in the PCIe hierarchy (volumes steer a GPU
    /// to the members nearest it). `None` for an emulated controller or a
    /// file.
    fn pci_address(&self) -> Option<String> {
        None
    }

    /// Whether the controller is known to be gone for good (an attached
    /// process whose owner has ended): waits give up at their next look
    /// instead of at their deadline. A hint, read every few hundred idle
    /// polls; removal is still found by reading CSTS.
    fn gone(&self) -> bool {
        false
    }

    /// The owner's admin service, when the controller belongs to another
    /// process ([`attach::AttachPlatform`]): the engine then brings up
    /// nothing and sends its admin commands there.
    fn remote_admin(&self) -> Option<&dyn attach::RemoteAdmin> {
        None
    }

    /// The registers (doorbells included) shared with attached processes
    /// by descriptor; refused where they cannot be.
    fn share_registers(&self) -> Result<attach::SharedRegisters> {
        Err(crate::Error::Unsupported(format!(
            "{}: its registers cannot be shared with another process",
            self.describe()
        )))
    }
}

/// The one way ugds takes a lock: a lock whose holder panicked is used as
/// it is. Every critical section in ugds leaves its state consistent at
/// each step a panic can interrupt (a request's slot, a queue's tracker, a
/// registry entry), and refusing the lock forever would leave memory under
/// DMA unaccounted for; so poisoning is not an error here.
///
/// ```
/// use ugds_platform::Recover;
/// let m = std::sync::Mutex::new(1);
/// let _ = std::panic::catch_unwind(|| {
///     let _g = m.lock().recover();
///     panic!("while holding it");
/// });
/// assert_eq!(*m.lock().recover(), 1);
/// ```
pub trait Recover<G> {
    /// The guard, poisoned or not.
    fn recover(self) -> G;
}

impl<G> Recover<G> for std::sync::LockResult<G> {
    #[inline]
    fn recover(self) -> G {
        self.unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
