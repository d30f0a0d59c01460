//! Memory another driver exported as a dma-buf: a GPU's (CUDA and HIP export
//! their allocations this way), an RDMA NIC's, or a udmabuf standing in.
//!
//! `ugds::Driver::register_dmabuf` registers
//! `len` bytes at `offset` of a dma-buf. The registration's address (its
//! registry key and the base buffer offsets count from) is where the bytes
//! are mapped in this process when the exporter allows `mmap`, else an
//! inaccessible reservation of the same size. The platforms reach it as they
//! reach GPU memory: `ugds_drv` imports the dma-buf, the emulated controller
//! copies through the CPU mapping (and refuses if there is none), vfio
//! refuses.

use super::{DeviceRuntime, DmabufExport};
use crate::{Error, Result};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// One registered dma-buf range; see the module docs.
pub struct Dmabuf {
    fd: OwnedFd,
    /// Offset in the dma-buf of the registered range's first byte.
    offset: u64,
    /// The mapping (or reservation): its start, its length, and where the
    /// registered range starts in it.
    map: usize,
    map_len: usize,
    base: usize,
    /// Whether `map` is the dma-buf's bytes (else PROT_NONE).
    mapped: bool,
}

impl std::fmt::Debug for Dmabuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dmabuf")
            .field("offset", &self.offset)
            .field("map_len", &self.map_len)
            .field("mapped", &self.mapped)
            .finish_non_exhaustive()
    }
}

/// DMA_BUF_IOCTL_SYNC = _IOW('b', 0, struct dma_buf_sync { __u64 flags; }).
const DMA_BUF_IOCTL_SYNC: libc::c_ulong = 0x4008_6200;
const SYNC_READ: u64 = 1;
const SYNC_WRITE: u64 = 2;
const SYNC_END: u64 = 4;

impl Dmabuf {
    /// Takes a duplicate of `fd` and maps (or reserves) `len` bytes at `offset`.
    pub fn new(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Dmabuf> {
        if len == 0 {
            return Err(Error::ZeroSize);
        }
        let fd = fd.try_clone_to_owned().map_err(|e| Error::io("dup dma-buf", e))?;
        // SAFETY: lseek on a descriptor we own; dma-bufs report their size.
        let size = unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_END) };
        if size < 0 {
            return Err(Error::InvalidArgument("not a dma-buf (cannot tell its size)".into()));
        }
        if offset.checked_add(len as u64).is_none_or(|end| end > size as u64) {
            return Err(Error::InvalidArgument(format!(
                "{offset:#x}+{len:#x} runs past the dma-buf's {size:#x} bytes"
            )));
        }
        let page = crate::sys::PAGE_SIZE as u64;
        let map_off = offset & !(page - 1);
        let map_len = ((offset + len as u64).next_multiple_of(page) - map_off) as usize;
        // SAFETY: a new shared mapping of the dma-buf, owned by the result.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                map_off as libc::off_t,
            )
        };
        let (map, mapped) = if p != libc::MAP_FAILED {
            (p as usize, true)
        } else {
            // SAFETY: an anonymous reservation nobody can touch, owned by the result.
            let r = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if r == libc::MAP_FAILED {
                return Err(Error::os("reserve an address range for a dma-buf"));
            }
            (r as usize, false)
        };
        let base = map + (offset - map_off) as usize;
        Ok(Dmabuf { fd, offset, map, map_len, base, mapped })
    }

    /// The registration's address.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Whether the CPU can reach the bytes (the exporter allowed mmap).
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }

    fn sync(&self, flags: u64) {
        let s = flags;
        // SAFETY: the ioctl reads one u64; failure only means the exporter
        // has nothing to synchronise.
        unsafe { libc::ioctl(self.fd.as_raw_fd(), DMA_BUF_IOCTL_SYNC, &s as *const u64) };
    }

    fn check(&self, addr: u64, len: usize) -> Result<()> {
        if !self.mapped {
            return Err(Error::Unsupported("the dma-buf's exporter does not allow CPU access (mmap)".into()));
        }
        let (a, end) = (addr as usize, addr as usize + len);
        if a < self.map || end > self.map + self.map_len {
            return Err(Error::InvalidArgument(format!("{addr:#x}+{len:#x} is outside the dma-buf mapping")));
        }
        Ok(())
    }
}

impl DeviceRuntime for Dmabuf {
    fn name(&self) -> &'static str {
        "dma-buf"
    }

    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.check(dst, src.len())?;
        self.sync(SYNC_WRITE);
        // SAFETY: checked to lie in our live shared mapping.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        self.sync(SYNC_WRITE | SYNC_END);
        Ok(())
    }

    unsafe fn copy_from_device(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.check(src, dst.len())?;
        self.sync(SYNC_READ);
        // SAFETY: checked to lie in our live shared mapping.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        self.sync(SYNC_READ | SYNC_END);
        Ok(())
    }

    fn host_register(&self, _ptr: *mut u8, _len: usize) -> bool {
        false
    }

    fn host_unregister(&self, _ptr: *mut u8) {}

    fn export_dmabuf(&self, ptr: u64, len: usize) -> Result<DmabufExport> {
        let at =
            (ptr as usize).checked_sub(self.base).ok_or_else(|| Error::InvalidArgument("before the range".into()))?;
        let fd = self.fd.try_clone().map_err(|e| Error::io("dup dma-buf", e))?;
        Ok(DmabufExport { fd, offset: self.offset + at as u64, len })
    }
}

impl Drop for Dmabuf {
    fn drop(&mut self) {
        // SAFETY: our mapping; the registry dropped its last user.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.map_len) };
    }
}
