//! Memory shared with a controller.
//!
//! A [`DmaRegion`] is built once, unsafely, from memory the platform
//! guarantees; every access after that is a bounds-checked volatile or
//! atomic access. No Rust reference (`&[u8]`, `&mut T`) into such memory is
//! ever formed: the controller may write it at any time.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use ugds_nvme::{Cqe, Iova, Sqe};

/// A range of host memory the controller reaches at `iova`, contiguous in
/// both the host and the controller's address space.
#[derive(Debug)]
pub struct DmaRegion {
    vaddr: NonNull<u8>,
    len: usize,
    iova: Iova,
}

// SAFETY: the region is memory shared with a device; all accesses through it
// are volatile or atomic, so sharing it between threads adds no data race
// that the device does not already impose.
unsafe impl Send for DmaRegion {}
// SAFETY: as above.
unsafe impl Sync for DmaRegion {}

impl DmaRegion {
    /// Describes `len` bytes at `vaddr`, reached by the controller at `iova`.
    ///
    /// # Safety
    /// `vaddr..vaddr+len` must be valid for reads and writes, 8-byte aligned,
    /// and stay so for the life of the region.
    pub unsafe fn new(vaddr: NonNull<u8>, len: usize, iova: Iova) -> DmaRegion {
        debug_assert!(vaddr.as_ptr() as usize % 8 == 0);
        DmaRegion { vaddr, len, iova }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The controller's address of byte `off`.
    pub fn iova(&self, off: usize) -> u64 {
        debug_assert!(off <= self.len);
        self.iova.0 + off as u64
    }

    /// Host address of the start (for logs and for the emulator's own use).
    pub fn vaddr(&self) -> *mut u8 {
        self.vaddr.as_ptr()
    }

    #[inline(always)]
    fn at<T>(&self, off: usize) -> *mut T {
        assert!(
            off % std::mem::align_of::<T>() == 0 && off + std::mem::size_of::<T>() <= self.len,
            "DMA access at {off:#x} outside {:#x} bytes",
            self.len
        );
        // SAFETY: checked to lie within the region, which `new` made valid.
        unsafe { self.vaddr.as_ptr().add(off).cast() }
    }

    /// Writes a submission entry at `off` (volatile).
    #[inline]
    pub fn write_sqe(&self, off: usize, sqe: &Sqe) {
        // SAFETY: `at` checked bounds and alignment.
        unsafe { self.at::<Sqe>(off).write_volatile(*sqe) }
    }

    /// Reads a submission entry at `off` (volatile).
    #[inline]
    pub fn read_sqe(&self, off: usize) -> Sqe {
        // SAFETY: `at` checked bounds and alignment.
        unsafe { self.at::<Sqe>(off).read_volatile() }
    }

    /// Loads the dword at `off` with acquire ordering: later loads are not
    /// performed before it (used for the CQE dword holding the phase tag).
    #[inline]
    pub fn load_u32_acquire(&self, off: usize) -> u32 {
        // SAFETY: in bounds and 4-aligned; AtomicU32 has u32's layout, and an
        // atomic reference is the one kind allowed into device memory.
        unsafe { (*self.at::<AtomicU32>(off)).load(Ordering::Acquire) }
    }

    /// Stores the dword at `off` with release ordering: earlier stores are
    /// visible before it (the emulator writes the CQE phase dword this way).
    #[inline]
    pub fn store_u32_release(&self, off: usize, v: u32) {
        // SAFETY: as for `load_u32_acquire`.
        unsafe { (*self.at::<AtomicU32>(off)).store(v, Ordering::Release) }
    }

    /// Volatile dword read.
    #[inline]
    pub fn read_u32(&self, off: usize) -> u32 {
        // SAFETY: `at` checked bounds and alignment.
        unsafe { self.at::<u32>(off).read_volatile() }
    }

    /// Volatile dword write.
    #[inline]
    pub fn write_u32(&self, off: usize, v: u32) {
        // SAFETY: `at` checked bounds and alignment.
        unsafe { self.at::<u32>(off).write_volatile(v) }
    }

    /// Volatile qword read.
    #[inline]
    pub fn read_u64(&self, off: usize) -> u64 {
        // SAFETY: `at` checked bounds and alignment.
        unsafe { self.at::<u64>(off).read_volatile() }
    }

    /// Volatile qword write (PRP list entries).
    #[inline]
    pub fn write_u64(&self, off: usize, v: u64) {
        // SAFETY: `at` checked bounds and alignment.
        unsafe { self.at::<u64>(off).write_volatile(v) }
    }

    /// Reads a completion entry at `off`: the phase dword first (acquire),
    /// then the rest, so the other fields are at least as new as the phase.
    #[inline]
    pub fn read_cqe(&self, off: usize) -> Cqe {
        let dw3 = self.load_u32_acquire(off + 12);
        crate::barrier::dma_rmb();
        Cqe::from_dwords([self.read_u32(off), self.read_u32(off + 4), self.read_u32(off + 8), dw3])
    }

    /// Copies `dst.len()` bytes out of the region, starting at `off`.
    pub fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        assert!(off + dst.len() <= self.len, "DMA read outside the region");
        // SAFETY: in bounds; the device does not write this range while the
        // host reads it (callers read only completed transfers).
        unsafe { std::ptr::copy_nonoverlapping(self.vaddr.as_ptr().add(off), dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies `src` into the region at `off`.
    pub fn write_bytes(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= self.len, "DMA write outside the region");
        // SAFETY: in bounds; callers write only before handing the range to
        // the device.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.vaddr.as_ptr().add(off), src.len()) }
    }

    /// Zeroes the region.
    pub fn zero(&self) {
        // SAFETY: the whole region is valid for writes.
        unsafe { std::ptr::write_bytes(self.vaddr.as_ptr(), 0, self.len) }
    }
}

/// Releases DMA memory back to the platform that allocated it.
pub trait DmaRelease: Send + Sync {
    /// Removes the controller's access to `region`, then frees it.
    fn release(&self, region: &DmaRegion);
}

/// DMA memory owned by the library: released (unmapped from the controller,
/// then freed) on drop. The engine drops one only when the controller can no
/// longer reach it: its queue was deleted, or the controller was disabled.
pub struct DmaBuffer {
    region: DmaRegion,
    owner: Arc<dyn DmaRelease>,
}

impl DmaBuffer {
    /// Wraps a region that `owner` will release.
    pub fn new(region: DmaRegion, owner: Arc<dyn DmaRelease>) -> DmaBuffer {
        DmaBuffer { region, owner }
    }
}

impl std::ops::Deref for DmaBuffer {
    type Target = DmaRegion;
    fn deref(&self) -> &DmaRegion {
        &self.region
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        self.owner.release(&self.region);
    }
}

impl std::fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.region.fmt(f)
    }
}
