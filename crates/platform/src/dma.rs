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
        assert!(vaddr.as_ptr() as usize % 8 == 0, "DMA memory must be 8-byte aligned");
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
        assert!(off <= self.len, "IOVA of byte {off:#x} outside {:#x} bytes", self.len);
        self.iova.0 + off as u64
    }

    /// Host address of the start (for logs and for the emulator's own use).
    pub fn vaddr(&self) -> *mut u8 {
        self.vaddr.as_ptr()
    }

    /// Whether `len` bytes at `off` lie inside the region (no overflow).
    #[inline(always)]
    fn fits(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len)
    }

    #[inline(always)]
    fn at<T>(&self, off: usize) -> *mut T {
        assert!(
            off % std::mem::align_of::<T>() == 0 && self.fits(off, std::mem::size_of::<T>()),
            "DMA access at {off:#x} outside {:#x} bytes",
            self.len
        );
        // SAFETY: checked to lie within the region, which `new` made valid.
        unsafe { self.vaddr.as_ptr().add(off).cast() }
    }

    /// Writes a submission entry at `off` (volatile).
    #[inline(always)]
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

    /// `N` volatile dword reads from `off` on, checked once (a completion
    /// entry's first three dwords).
    #[inline(always)]
    pub fn read_u32s<const N: usize>(&self, off: usize) -> [u32; N] {
        let p = self.at::<[u32; N]>(off).cast::<u32>();
        // SAFETY: `at` checked that the N dwords lie in the region, aligned.
        std::array::from_fn(|i| unsafe { p.add(i).read_volatile() })
    }

    /// Consumes the completion entry in slot `index` of a completion ring
    /// if it is new, that is if its phase tag is `phase`: the dword holding
    /// the tag loaded with acquire ordering, the rest read after it (see
    /// [`barrier::dma_rmb`](crate::barrier::dma_rmb)), and the entry's CID
    /// then overwritten with 0xffff, which no command is given, so that a
    /// stale entry whose phase tag the controller flips before writing its
    /// fields names no command instead of the one this slot completed a
    /// lap ago. `None` when the entry is not new. One bounds check for the
    /// whole entry.
    #[inline(always)]
    pub fn take_cqe(&self, index: usize, phase: bool) -> Option<Cqe> {
        let p = self.at::<[u32; 4]>(index.saturating_mul(Cqe::SIZE)).cast::<u32>();
        // SAFETY: `at` checked that the entry's four dwords lie in the
        // region, aligned; AtomicU32 has u32's layout, and an atomic
        // reference is the one kind allowed into device memory.
        let dw3 = unsafe { (*p.add(3).cast::<AtomicU32>()).load(Ordering::Acquire) };
        if (dw3 >> 16) & 1 != phase as u32 {
            return None;
        }
        crate::barrier::dma_rmb();
        // SAFETY: as above (the first three dwords, volatile).
        let [d0, d1, d2] = std::array::from_fn(|i| unsafe { p.add(i).read_volatile() });
        // SAFETY: as above (the fourth).
        unsafe { p.add(3).write_volatile(dw3 | 0xffff) };
        Some(Cqe::from_dwords([d0, d1, d2, dw3]))
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

    /// Copies `dst.len()` bytes out of the region, starting at `off`
    /// (volatile, byte by byte: for small control data such as Identify
    /// pages, never for bulk data).
    pub fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        assert!(self.fits(off, dst.len()), "DMA read of {} bytes at {off:#x} outside the region", dst.len());
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: in bounds (checked above, without overflow).
            *d = unsafe { self.vaddr.as_ptr().add(off + i).read_volatile() };
        }
    }

    /// Copies `src` into the region at `off` (volatile, byte by byte).
    pub fn write_bytes(&self, off: usize, src: &[u8]) {
        assert!(self.fits(off, src.len()), "DMA write of {} bytes at {off:#x} outside the region", src.len());
        for (i, s) in src.iter().enumerate() {
            // SAFETY: in bounds (checked above, without overflow).
            unsafe { self.vaddr.as_ptr().add(off + i).write_volatile(*s) };
        }
    }

    /// Zeroes the region (volatile).
    pub fn zero(&self) {
        for i in 0..self.len {
            // SAFETY: the whole region is valid for writes.
            unsafe { self.vaddr.as_ptr().add(i).write_volatile(0) };
        }
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

    /// `len` bytes of fresh anonymous memory whose "controller address" is
    /// its own address: for platforms whose queues the CPU serves (the
    /// kernel path, NVMe/TCP), where nothing but this process reads it.
    pub fn anonymous(len: usize) -> crate::Result<DmaBuffer> {
        let mem = crate::sys::Anonymous::populated(len)?;
        let (ptr, len) = (mem.as_ptr(), mem.len());
        // SAFETY: `mem` is `len` bytes, page-aligned, and lives as long as
        // the buffer's owner, which the DmaBuffer built here keeps.
        let region = unsafe { DmaRegion::new(NonNull::new(ptr).expect("mmap is not null"), len, Iova(ptr as u64)) };
        Ok(DmaBuffer::new(region, Arc::new(AnonymousOwner(mem))))
    }
}

/// Keeps anonymous memory mapped until its last user goes.
struct AnonymousOwner(#[allow(dead_code)] crate::sys::Anonymous);

impl DmaRelease for AnonymousOwner {
    fn release(&self, _region: &DmaRegion) {}
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

#[cfg(test)]
mod tests {
    use super::*;

    fn region(mem: &mut [u64]) -> DmaRegion {
        // SAFETY: `mem` is 8-byte aligned and outlives the region in each test.
        unsafe { DmaRegion::new(NonNull::new(mem.as_mut_ptr().cast()).unwrap(), mem.len() * 8, Iova(0x1000)) }
    }

    /// The panic message of `f`, which must panic.
    fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
        let e = std::panic::catch_unwind(f).expect_err("an access outside the region must panic");
        e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap()
    }

    #[test]
    fn accesses_are_checked_without_overflow() {
        let mut mem = [0u64; 4];
        let r = region(&mut mem);
        r.write_u32(28, 7);
        assert_eq!(r.read_u32(28), 7);
        // Offsets near usize::MAX: refused by the bounds check itself (not
        // by an overflow check that release builds leave out).
        for off in [usize::MAX - 1, usize::MAX - 3, 32] {
            let m = panic_message(|| {
                r.read_u32(off);
            });
            assert!(m.contains("outside"), "{m}");
        }
        let m = panic_message(|| {
            let mut b = [0u8; 8];
            r.read_bytes(usize::MAX - 2, &mut b);
        });
        assert!(m.contains("outside"), "{m}");
        let m = panic_message(|| r.write_bytes(30, &[1, 2, 3]));
        assert!(m.contains("outside"), "{m}");
    }

    #[test]
    fn a_completion_entry_is_taken_once_its_phase_tag_is_new() {
        let mut mem = [0u64; 4];
        let r = region(&mut mem);
        // Slot 1: DW0 7, SQ head 3 on SQ 1, CID 5, phase 1, success.
        r.write_u32(16, 7);
        r.write_u32(24, 3 | 1 << 16);
        r.write_u32(28, 5 | 1 << 16);
        assert_eq!(r.take_cqe(1, false), None, "the phase tag is the old one");
        let c = r.take_cqe(1, true).expect("new");
        assert_eq!((c.dw0, c.sqhd, c.sqid, c.cid, c.phase()), (7, 3, 1, 5, true));
        // Taken: its CID is overwritten with one no command is given.
        assert_eq!(r.take_cqe(1, true).map(|c| c.cid), Some(0xffff));
        let m = panic_message(|| {
            r.take_cqe(2, true);
        });
        assert!(m.contains("outside"), "{m}");
        let m = panic_message(|| {
            r.take_cqe(usize::MAX / 16 + 1, true);
        });
        assert!(m.contains("outside"), "{m}");
    }

    #[test]
    fn byte_copies_round_trip() {
        let mut mem = [0u64; 4];
        let r = region(&mut mem);
        r.write_bytes(3, &[1, 2, 3, 4, 5]);
        let mut b = [0u8; 7];
        r.read_bytes(2, &mut b);
        assert_eq!(b, [0, 1, 2, 3, 4, 5, 0]);
        r.zero();
        r.read_bytes(2, &mut b);
        assert_eq!(b, [0; 7]);
    }
}
