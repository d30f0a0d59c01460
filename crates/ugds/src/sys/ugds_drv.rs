//! The ugds_drv ioctl ABI (kmod/ugds_drv_uapi.h), mirrored.

use crate::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd};

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

/// An ioctl with a pointer to `T`.
pub fn ioctl<T>(fd: &OwnedFd, op: &'static str, req: u64, arg: &mut T) -> Result<()> {
    // SAFETY: `arg` is a live, exclusively borrowed `#[repr(C)]` structure of
    // the size encoded in `req`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
    if r < 0 {
        Err(Error::os(op))
    } else {
        Ok(())
    }
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
