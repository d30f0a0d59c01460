//! The ugds_drv ioctl ABI (kmod/ugds_drv_uapi.h), mirrored.

use crate::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd};

/// The ioctl ABI this library speaks (`UGDS_DRV_ABI_VERSION` in kmod/ugds_drv_uapi.h).
pub const ABI_VERSION: u32 = 2;

/// `Map::flags`: map GPU memory by CUDA virtual address with nvidia_p2p.
pub const MAP_NVIDIA_P2P: u32 = 1;

const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    dir << 30 | (size as u64) << 16 | (b'U' as u64) << 8 | nr
}
const W: u64 = 1;
const R: u64 = 2;

#[repr(C)]
#[derive(Default, Debug)]
pub struct Info {
    pub abi_version: u32,
    pub msix_vectors: u32,
    pub bar0_size: u64,
    pub pinned_pages: u64,
    pub live_mappings: u64,
    pub total_pinned_pages: u64,
    pub total_mappings: u64,
}

#[repr(C)]
#[derive(Default, Debug)]
pub struct Dma {
    pub size: u64,
    pub bus_addr: u64,
    pub mmap_offset: u64,
    pub handle: u64,
}

#[repr(C)]
#[derive(Default, Debug)]
pub struct Map {
    pub vaddr: u64,
    pub size: u64,
    pub dmabuf_fd: i32,
    pub flags: u32,
    pub offset: u64,
    pub pages_ptr: u64,
    pub npages: u64,
    pub handle: u64,
}

#[repr(C)]
#[derive(Default, Debug)]
pub struct Irq {
    pub vector: u32,
    pub eventfd: i32,
}

const _: () = assert!(std::mem::size_of::<Info>() == 48);
const _: () = assert!(std::mem::size_of::<Dma>() == 32);
const _: () = assert!(std::mem::size_of::<Map>() == 56);
const _: () = assert!(std::mem::size_of::<Irq>() == 8);

pub const IOC_INFO: u64 = ioc(R, 0, std::mem::size_of::<Info>());
pub const IOC_ALLOC_DMA: u64 = ioc(R | W, 1, std::mem::size_of::<Dma>());
pub const IOC_FREE_DMA: u64 = ioc(W, 2, 8);
pub const IOC_MAP: u64 = ioc(R | W, 3, std::mem::size_of::<Map>());
pub const IOC_UNMAP: u64 = ioc(W, 4, 8);
pub const IOC_SET_IRQ: u64 = ioc(W, 5, std::mem::size_of::<Irq>());

/// The size an ioctl request number encodes (`_IOC_SIZE`).
const fn ioc_size(req: u64) -> usize {
    ((req >> 16) & 0x3fff) as usize
}

const _: () = assert!(ioc_size(IOC_INFO) == std::mem::size_of::<Info>());
const _: () = assert!(ioc_size(IOC_ALLOC_DMA) == std::mem::size_of::<Dma>());
const _: () = assert!(ioc_size(IOC_FREE_DMA) == std::mem::size_of::<u64>());
const _: () = assert!(ioc_size(IOC_MAP) == std::mem::size_of::<Map>());
const _: () = assert!(ioc_size(IOC_UNMAP) == std::mem::size_of::<u64>());
const _: () = assert!(ioc_size(IOC_SET_IRQ) == std::mem::size_of::<Irq>());

/// An ioctl with a pointer to `T`.
///
/// # Safety
/// `req` must take a pointer to exactly a `T` (its encoded size is checked
/// here), and every pointer inside `*arg` must be valid for what the module
/// does with it.
unsafe fn ioctl<T>(fd: &OwnedFd, op: &'static str, req: u64, arg: &mut T) -> Result<()> {
    assert_eq!(ioc_size(req), std::mem::size_of::<T>(), "{op}: argument size");
    // SAFETY: `arg` is a live, exclusively borrowed `#[repr(C)]` value of the
    // size encoded in `req`; the caller vouches for pointers inside it.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
    if r < 0 {
        Err(Error::os(op))
    } else {
        Ok(())
    }
}

/// UGDS_DRV_IOC_INFO.
pub fn info(fd: &OwnedFd) -> Result<Info> {
    let mut i = Info::default();
    // SAFETY: INFO takes an `Info`, which holds no pointers.
    unsafe { ioctl(fd, "UGDS_DRV_IOC_INFO", IOC_INFO, &mut i) }?;
    Ok(i)
}

/// UGDS_DRV_IOC_ALLOC_DMA: `size` bytes of coherent memory.
pub fn alloc_dma(fd: &OwnedFd, size: u64) -> Result<Dma> {
    let mut d = Dma { size, ..Default::default() };
    // SAFETY: ALLOC_DMA takes a `Dma`, which holds no pointers.
    unsafe { ioctl(fd, "UGDS_DRV_IOC_ALLOC_DMA", IOC_ALLOC_DMA, &mut d) }?;
    Ok(d)
}

/// UGDS_DRV_IOC_FREE_DMA.
pub fn free_dma(fd: &OwnedFd, handle: u64) -> Result<()> {
    let mut h = handle;
    // SAFETY: FREE_DMA takes a u64 handle.
    unsafe { ioctl(fd, "UGDS_DRV_IOC_FREE_DMA", IOC_FREE_DMA, &mut h) }
}

/// UGDS_DRV_IOC_MAP: `m` says what to map (its page-array fields are set
/// here); the module writes one bus address per page into `pages`. Returns
/// the mapping's handle.
pub fn map(fd: &OwnedFd, op: &'static str, mut m: Map, pages: &mut [u64]) -> Result<u64> {
    m.pages_ptr = pages.as_mut_ptr() as u64;
    m.npages = pages.len() as u64;
    // SAFETY: MAP takes a `Map`; its one pointer is `pages`, exclusively
    // borrowed for the call, with room for `npages` entries.
    unsafe { ioctl(fd, op, IOC_MAP, &mut m) }?;
    Ok(m.handle)
}

/// UGDS_DRV_IOC_UNMAP.
pub fn unmap(fd: &OwnedFd, handle: u64) -> Result<()> {
    let mut h = handle;
    // SAFETY: UNMAP takes a u64 handle.
    unsafe { ioctl(fd, "UGDS_DRV_IOC_UNMAP", IOC_UNMAP, &mut h) }
}

/// UGDS_DRV_IOC_SET_IRQ: MSI-X `vector` signals `eventfd`.
pub fn set_irq(fd: &OwnedFd, vector: u32, eventfd: std::os::fd::BorrowedFd<'_>) -> Result<()> {
    let mut irq = Irq { vector, eventfd: eventfd.as_raw_fd() };
    // SAFETY: SET_IRQ takes an `Irq`, which holds no pointers.
    unsafe { ioctl(fd, "UGDS_DRV_IOC_SET_IRQ", IOC_SET_IRQ, &mut irq) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_header() {
        // _IOR('U', 0, 48 bytes), _IOWR('U', 1, 32), _IOW('U', 2, 8), _IOWR('U', 3, 56).
        assert_eq!(IOC_INFO, 0x8030_5500);
        assert_eq!(IOC_ALLOC_DMA, 0xc020_5501);
        assert_eq!(IOC_FREE_DMA, 0x4008_5502);
        assert_eq!(IOC_MAP, 0xc038_5503);
        assert_eq!(IOC_UNMAP, 0x4008_5504);
        assert_eq!(IOC_SET_IRQ, 0x4008_5505);
    }
}
