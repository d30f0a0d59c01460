//! A controller bound to our kernel helper, `kmod/ugds_drv.ko`, through its
//! character device `/dev/ugds_drvN`.
//!
//! The module maps BAR0 uncached, allocates coherent DMA memory (mapped into
//! the process), pins host buffers and imports dma-bufs, returning the
//! controller address of every page, and bridges MSI-X vectors to eventfds.
//! Closing the file (or unbinding the function) makes the module stop the
//! controller before it releases anything; the engine disables it first
//! anyway.

use crate::dma::{DmaBuffer, DmaRegion, DmaRelease};
use crate::sys::ugds_drv as k;
pub use crate::sys::ugds_drv::ABI_VERSION;
use crate::sys::vfio::{open_rw, Mmio};
use crate::sys::{EventFd, PAGE_SIZE};
use crate::Recover;
use crate::{Error, Result};
use crate::{HostMapping, Platform};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use ugds_nvme::Iova;

/// Most MSI-X vectors wired to eventfds.
const MAX_VECTORS: u32 = 64;

struct File {
    fd: OwnedFd,
    /// DMA allocations by bus address: (handle, host address, length).
    dma: Mutex<HashMap<u64, (u64, usize, usize)>>,
}

impl DmaRelease for File {
    fn release(&self, region: &DmaRegion) {
        let Some((handle, host, len)) = self.dma.lock().recover().remove(&region.iova(0)) else {
            return;
        };
        // SAFETY: our own mapping of the coherent memory, no longer used.
        unsafe { libc::munmap(host as *mut libc::c_void, len) };
        if let Err(e) = k::free_dma(&self.fd, handle) {
            // Kept by the module until the file closes (after the device stopped).
            tracing::warn!("ugds_drv: freeing DMA memory failed (released at close): {e}");
        }
    }
}

/// A controller behind `/dev/ugds_drvN`.
pub struct UgdsDrvPlatform {
    path: String,
    file: Arc<File>,
    bar0: Mmio,
    vectors: Vec<EventFd>,
}

impl std::fmt::Debug for UgdsDrvPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UgdsDrvPlatform").field("path", &self.path).finish_non_exhaustive()
    }
}

/// What the module reports about an open file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrvCounters {
    /// Host pages this file has pinned.
    pub pinned_pages: u64,
    /// Entries in this file's ledger (DMA memory, pinned ranges, dma-bufs).
    pub live_mappings: u64,
    /// Pages pinned by every open file of the module.
    pub total_pinned_pages: u64,
    /// Ledger entries of every open file of the module.
    pub total_mappings: u64,
}

impl UgdsDrvPlatform {
    /// Opens `path` (e.g. `/dev/ugds_drv0`) and checks the module's ABI.
    pub fn open(path: &str) -> Result<UgdsDrvPlatform> {
        UgdsDrvPlatform::from_fd(open_rw(path)?, path)
    }

    /// Uses a descriptor the caller opened on `/dev/ugds_drvN` (the module
    /// allows one opener, so a C caller's fd is taken over, not reopened);
    /// `name` is for messages.
    pub fn from_fd(fd: OwnedFd, name: &str) -> Result<UgdsDrvPlatform> {
        let path = name;
        let info = k::info(&fd)?;
        if info.abi_version != k::ABI_VERSION {
            return Err(Error::Unsupported(format!(
                "{path}: ugds_drv ABI version {} (this library speaks {})",
                info.abi_version,
                k::ABI_VERSION
            )));
        }
        let bar0 = Mmio::map(&fd, info.bar0_size as usize, 0)?;
        let file = Arc::new(File { fd, dma: Mutex::new(HashMap::new()) });
        let mut p = UgdsDrvPlatform { path: path.to_string(), file, bar0, vectors: Vec::new() };
        for v in 0..info.msix_vectors.min(MAX_VECTORS) {
            let efd = EventFd::new()?;
            if let Err(e) = k::set_irq(&p.file.fd, v, efd.as_fd()) {
                tracing::warn!("{path}: vector {v}: {e}; later queues poll");
                break;
            }
            p.vectors.push(efd);
        }
        Ok(p)
    }

    /// The module's counters for this open file.
    pub fn counters(&self) -> Result<DrvCounters> {
        let info = k::info(&self.file.fd)?;
        Ok(DrvCounters {
            pinned_pages: info.pinned_pages,
            live_mappings: info.live_mappings,
            total_pinned_pages: info.total_pinned_pages,
            total_mappings: info.total_mappings,
        })
    }

    /// Imports `len` bytes at `offset` of a dma-buf (GPU memory exported by
    /// CUDA or HIP, or a udmabuf) for the controller.
    pub fn map_dmabuf(&self, dmabuf: i32, offset: u64, len: usize) -> Result<HostMapping> {
        if len == 0 {
            return Err(Error::ZeroSize);
        }
        let first = offset as usize / PAGE_SIZE;
        let npages = (offset as usize + len).div_ceil(PAGE_SIZE) - first;
        let mut pages = vec![0u64; npages];
        let m = k::Map { dmabuf_fd: dmabuf, offset, size: len as u64, ..Default::default() };
        let handle = k::map(&self.file.fd, "UGDS_DRV_IOC_MAP (dma-buf)", m, &mut pages)?;
        Ok(HostMapping { pages: pages.into(), first_offset: offset as usize % PAGE_SIZE, cookie: handle })
    }
}

impl UgdsDrvPlatform {
    /// Maps CUDA memory at `ptr..ptr+len` with nvidia_p2p: the 64 KiB
    /// aligned span is pinned by the NVIDIA driver and mapped for the
    /// controller. Needs a module built with `NVIDIA_SRC`.
    pub fn map_nvidia_p2p(&self, ptr: u64, len: usize) -> Result<HostMapping> {
        const GRAN: u64 = 64 << 10;
        let start = ptr & !(GRAN - 1);
        let end = (ptr + len as u64).next_multiple_of(GRAN);
        let npages = ((end - start) as usize) / PAGE_SIZE;
        let mut pages = vec![0u64; npages];
        let m =
            k::Map { vaddr: start, size: end - start, dmabuf_fd: -1, flags: k::MAP_NVIDIA_P2P, ..Default::default() };
        let handle = k::map(&self.file.fd, "UGDS_DRV_IOC_MAP (nvidia_p2p)", m, &mut pages)?;
        // Keep the pages from the one holding `ptr` on.
        let skip = ((ptr - start) as usize) / PAGE_SIZE;
        pages.drain(..skip);
        Ok(HostMapping { pages: pages.into(), first_offset: ptr as usize % PAGE_SIZE, cookie: handle })
    }
}

impl Platform for UgdsDrvPlatform {
    fn describe(&self) -> String {
        format!("ugds_drv {} ({} MSI-X vectors)", self.path, self.vectors.len())
    }

    #[inline]
    fn read32(&self, off: usize) -> u32 {
        self.bar0.read32(off)
    }

    #[inline]
    unsafe fn write32(&self, off: usize, val: u32) {
        self.bar0.write32(off, val)
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        let len = len.max(1).next_multiple_of(PAGE_SIZE);
        let d = k::alloc_dma(&self.file.fd, len as u64)?;
        let p = match crate::sys::mmap_shared(&self.file.fd, len, d.mmap_offset, "mmap ugds_drv DMA memory") {
            Ok(p) => p,
            Err(e) => {
                let _ = k::free_dma(&self.file.fd, d.handle);
                return Err(e);
            }
        };
        // dma_alloc_coherent memory is zeroed; the rings rely on that.
        self.file.dma.lock().recover().insert(d.bus_addr, (d.handle, p.as_ptr() as usize, len));
        // SAFETY: the mapping is `len` bytes, page aligned, and stays until
        // `release` (run by the DmaBuffer's drop) unmaps it.
        let region = unsafe { DmaRegion::new(p, len, Iova(d.bus_addr)) };
        Ok(DmaBuffer::new(region, self.file.clone()))
    }

    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        let span = HostMapping::span(vaddr, len)?;
        let npages = span.1 / PAGE_SIZE;
        let mut pages = vec![0u64; npages];
        let m = k::Map { vaddr: vaddr as u64, size: len as u64, dmabuf_fd: -1, ..Default::default() };
        let handle = k::map(&self.file.fd, "UGDS_DRV_IOC_MAP", m, &mut pages)?;
        Ok(HostMapping { pages: pages.into(), first_offset: vaddr as usize - span.0, cookie: handle })
    }

    unsafe fn map_device(&self, mem: &crate::device::DeviceMemory) -> Result<HostMapping> {
        // The module imports the dma-buf (attach, pin, map) and holds its own
        // reference; our descriptor is closed when `export` drops.
        let dmabuf = mem
            .runtime
            .export_dmabuf(mem.ptr, mem.len)
            .and_then(|x| self.map_dmabuf(std::os::fd::AsRawFd::as_raw_fd(&x.fd), x.offset, x.len));
        match dmabuf {
            Ok(m) => Ok(m),
            // Without dma-buf support (older driver or kernel), a module built
            // with NVIDIA's sources maps CUDA memory with nvidia_p2p.
            Err(e) if mem.runtime.name() == "CUDA" => self.map_nvidia_p2p(mem.ptr, mem.len).map_err(|p2p| {
                Error::Platform(format!("{}: dma-buf import failed ({e}); nvidia_p2p failed ({p2p})", self.path))
            }),
            Err(e) => Err(e),
        }
    }

    unsafe fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        k::unmap(&self.file.fd, mapping.cookie)
    }

    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>> {
        Ok(self.vectors.get(vector as usize))
    }

    fn interrupt_vectors(&self) -> u16 {
        self.vectors.len() as u16
    }

    fn pci_address(&self) -> Option<String> {
        pci_address_in(std::path::Path::new("/sys"), &self.path)
    }

    unsafe fn import_dmabuf(&self, fd: std::os::fd::BorrowedFd<'_>, offset: u64, len: usize) -> Result<HostMapping> {
        self.map_dmabuf(std::os::fd::AsRawFd::as_raw_fd(&fd), offset, len)
    }

    fn share_registers(&self) -> Result<crate::attach::SharedRegisters> {
        let fd = self.file.fd.try_clone().map_err(|e| Error::io("dup the ugds_drv descriptor", e))?;
        Ok(crate::attach::SharedRegisters {
            fd: Arc::new(fd),
            offset: 0,
            len: self.bar0.len(),
            wake: None,
            device: true,
        })
    }
}

/// The PCI function behind the module's character device `dev`
/// (`/dev/ugds_drv0`), from its class device's `device` link under the
/// sysfs mounted at `sysfs`.
pub fn pci_address_in(sysfs: &std::path::Path, dev: &str) -> Option<String> {
    let name = std::path::Path::new(dev).file_name()?.to_str()?;
    let link = std::fs::read_link(sysfs.join("class/ugds_drv").join(name).join("device")).ok()?;
    Some(link.file_name()?.to_str()?.to_string())
}
