//! A controller bound to upstream vfio-pci, behind an IOMMU.
//!
//! Open: the device and an IOMMU context, through one of the kernel's two
//! interfaces: the vfio cdev (`/dev/vfio/devices/vfioN` bound to an
//! iommufd I/O address space, `/dev/iommu`) where the kernel has it, else
//! the function's IOMMU group in a type1v2 container. Then BAR0 mapped
//! uncached, bus mastering enabled, and (when the function has MSI-X) one
//! eventfd per vector. DMA memory and registered buffers get IOVAs from a
//! bump allocator the library owns (never reused, so a stale address can
//! only fault), whichever interface maps them. The engine disables the
//! controller before any mapping is removed; dropping the platform then
//! turns interrupts and bus mastering off.

use crate::dma::{DmaBuffer, DmaRegion, DmaRelease};
use crate::sys::vfio::{self as v, Mmio};
use crate::sys::{Anonymous, EventFd, PAGE_SIZE};
use crate::Recover;
use crate::{Error, Result};
use crate::{HostMapping, Platform};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use ugds_nvme::Iova;

/// First IOVA handed out; well inside the 39-bit address width of common
/// IOMMUs (and QEMU's intel-iommu default).
const IOVA_BASE: u64 = 0x10_0000_0000;

/// Most MSI-X vectors set up (queue pairs beyond this poll).
const MAX_VECTORS: u32 = 64;

/// PCI command register bits.
const PCI_COMMAND: u64 = 0x04;
const PCI_COMMAND_MEMORY: u16 = 1 << 1;
const PCI_COMMAND_MASTER: u16 = 1 << 2;

/// Which kernel interface reaches the device and its IOMMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum VfioInterface {
    /// The cdev where the kernel offers it (`/dev/iommu` and the
    /// function's `/dev/vfio/devices/vfioN` exist), the group otherwise.
    #[default]
    Auto,
    /// `/dev/vfio/<group>` in a type1v2 container (`/dev/vfio/vfio`).
    Group,
    /// `/dev/vfio/devices/vfioN` attached to an iommufd I/O address space
    /// (Linux 6.6 and later, `CONFIG_VFIO_DEVICE_CDEV`).
    Cdev,
}

impl std::str::FromStr for VfioInterface {
    type Err = Error;

    fn from_str(s: &str) -> Result<VfioInterface> {
        match s {
            "auto" => Ok(VfioInterface::Auto),
            "group" => Ok(VfioInterface::Group),
            "cdev" | "iommufd" => Ok(VfioInterface::Cdev),
            _ => Err(Error::InvalidArgument(format!("VFIO interface {s:?}: auto, group or cdev"))),
        }
    }
}

/// Where DMA mappings are made.
enum IommuCtx {
    /// A type1v2 container; the group stays open (and in it) as long as
    /// the container lives.
    Type1 { container: OwnedFd, _group: OwnedFd },
    /// An iommufd I/O address space the device is attached to.
    Iommufd { iommufd: OwnedFd, ioas: u32 },
}

struct Container {
    ctx: IommuCtx,
    iova: Mutex<IovaSpace>,
}

struct IovaSpace {
    next: u64,
    /// Live mappings: IOVA -> (length, memory owned by the platform).
    live: BTreeMap<u64, (usize, Option<Anonymous>)>,
}

impl Container {
    /// Maps `vaddr..vaddr+len` for the device at a fresh IOVA.
    ///
    /// # Safety
    /// The memory must stay allocated until [`unmap`](Self::unmap) of the
    /// returned IOVA (memory in `owned` is kept here until then).
    unsafe fn map(&self, vaddr: usize, len: usize, owned: Option<Anonymous>) -> Result<u64> {
        let mut sp = self.iova.lock().recover();
        let iova = sp.next;
        match &self.ctx {
            IommuCtx::Type1 { container, .. } => {
                // SAFETY: the caller keeps the memory until `unmap`.
                unsafe { v::map_dma(container, vaddr as u64, iova, len as u64) }?;
            }
            IommuCtx::Iommufd { iommufd, ioas } => {
                // SAFETY: as above.
                unsafe { v::ioas_map(iommufd, *ioas, vaddr as u64, iova, len as u64) }?;
            }
        }
        // A guard page of unmapped IOVA after each mapping: overruns fault.
        sp.next += (len + PAGE_SIZE) as u64;
        sp.live.insert(iova, (len, owned));
        Ok(iova)
    }

    fn unmap(&self, iova: u64) -> Result<()> {
        let mut sp = self.iova.lock().recover();
        let Some(&(len, _)) = sp.live.get(&iova) else {
            return Err(Error::Platform(format!("no VFIO mapping at IOVA {iova:#x}")));
        };
        match &self.ctx {
            IommuCtx::Type1 { container, .. } => {
                v::unmap_dma(container, iova, len as u64)?;
            }
            IommuCtx::Iommufd { iommufd, ioas } => {
                v::ioas_unmap(iommufd, *ioas, iova, len as u64)?;
            }
        }
        // Only now, with the IOMMU entry gone, may the memory be freed.
        sp.live.remove(&iova);
        Ok(())
    }
}

impl DmaRelease for Container {
    fn release(&self, region: &DmaRegion) {
        if let Err(e) = self.unmap(region.iova(0)) {
            // Not unmapped: the memory stays allocated (leaked) rather than
            // freed under a live IOMMU entry.
            tracing::error!("VFIO unmap of DMA memory failed, memory kept: {e}");
            let mut sp = self.iova.lock().recover();
            if let Some((_, owned)) = sp.live.remove(&region.iova(0)) {
                std::mem::forget(owned);
            }
        }
    }
}

/// A controller behind vfio-pci.
pub struct VfioPlatform {
    bdf: String,
    container: Arc<Container>,
    device: OwnedFd,
    config_offset: u64,
    bar0: Mmio,
    /// Where BAR0 lies in the device file (shared with attached processes).
    bar0_offset: u64,
    vectors: Vec<EventFd>,
}

impl std::fmt::Debug for VfioPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VfioPlatform").field("bdf", &self.bdf).finish_non_exhaustive()
    }
}

fn sysfs(bdf: &str, what: &str) -> String {
    format!("/sys/bus/pci/devices/{bdf}/{what}")
}

impl VfioPlatform {
    /// Opens the PCI function `bdf` (e.g. `0000:00:04.0`), which must be
    /// bound to vfio-pci, through the cdev where the kernel has it.
    pub fn open(bdf: &str) -> Result<VfioPlatform> {
        VfioPlatform::open_with(bdf, VfioInterface::Auto)
    }

    /// As [`open`](Self::open), through the interface given.
    pub fn open_with(bdf: &str, interface: VfioInterface) -> Result<VfioPlatform> {
        let valid = bdf.len() == 12
            && bdf.chars().enumerate().all(|(i, c)| match i {
                4 | 7 => c == ':',
                10 => c == '.',
                _ => c.is_ascii_hexdigit(),
            });
        if !valid {
            return Err(Error::InvalidArgument(format!("{bdf:?} is not a PCI address like 0000:01:00.0")));
        }
        if !std::path::Path::new(&format!("/sys/bus/pci/devices/{bdf}")).exists() {
            return Err(Error::Platform(format!(
                "no PCI function {bdf} on this machine (`ugds list` shows the NVMe functions there are)"
            )));
        }
        let driver = std::fs::read_link(sysfs(bdf, "driver")).ok();
        let driver = driver.as_ref().and_then(|p| p.file_name()).map(|s| s.to_string_lossy().into_owned());
        if driver.as_deref() != Some("vfio-pci") {
            return Err(Error::Platform(format!(
                "{bdf} is bound to {}, not vfio-pci (echo vfio-pci > {}; echo {bdf} > /sys/bus/pci/drivers_probe)",
                driver.as_deref().unwrap_or("no driver"),
                sysfs(bdf, "driver_override")
            )));
        }
        // The kernel names the function's vfio device in sysfs
        // (vfio-dev/vfioN) even without the cdev; the node in
        // /dev/vfio/devices and /dev/iommu exist only with it.
        let cdev = cdev_name(bdf).filter(|n| std::path::Path::new(&format!("/dev/vfio/devices/{n}")).exists());
        let iommufd = std::path::Path::new("/dev/iommu").exists();
        let use_cdev = match interface {
            VfioInterface::Group => false,
            VfioInterface::Cdev => true,
            VfioInterface::Auto => cdev.is_some() && iommufd,
        };
        let (device, ctx) = if use_cdev {
            let (Some(cdev), true) = (cdev, iommufd) else {
                return Err(Error::Unsupported(format!(
                    "{bdf} cannot be opened through the vfio cdev: {} (the kernel needs CONFIG_VFIO_DEVICE_CDEV and CONFIG_IOMMUFD)",
                    if iommufd { "no /dev/vfio/devices/vfioN for it" } else { "no /dev/iommu" }
                )));
            };
            open_cdev(&cdev)?
        } else {
            open_group(bdf)?
        };

        let bar = v::region_info(&device, v::VFIO_PCI_BAR0_REGION_INDEX)?;
        if bar.flags & v::VFIO_REGION_INFO_FLAG_MMAP == 0 {
            return Err(Error::Unsupported("BAR0 cannot be mmapped".into()));
        }
        let bar0 = Mmio::map(&device, bar.size as usize, bar.offset)?;

        let cfg = v::region_info(&device, v::VFIO_PCI_CONFIG_REGION_INDEX)?;
        let mut cmd = [0u8; 2];
        v::pread_exact(&device, &mut cmd, cfg.offset + PCI_COMMAND)?;
        let c = u16::from_le_bytes(cmd) | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
        v::pwrite_exact(&device, &c.to_le_bytes(), cfg.offset + PCI_COMMAND)?;

        let mut p = VfioPlatform {
            bdf: bdf.to_string(),
            container: Arc::new(Container {
                ctx,
                iova: Mutex::new(IovaSpace { next: IOVA_BASE, live: BTreeMap::new() }),
            }),
            device,
            config_offset: cfg.offset,
            bar0,
            bar0_offset: bar.offset,
            vectors: Vec::new(),
        };
        p.setup_msix();
        Ok(p)
    }

    /// One eventfd per MSI-X vector; without MSI-X every queue polls.
    fn setup_msix(&mut self) {
        let irq = v::irq_info(&self.device, v::VFIO_PCI_MSIX_IRQ_INDEX);
        let Some(irq) = irq.ok().filter(|i| i.count > 0) else {
            tracing::info!(bdf = self.bdf, "no MSI-X: queues poll");
            return;
        };
        let n = irq.count.min(MAX_VECTORS);
        let fds: Result<Vec<EventFd>> = (0..n).map(|_| EventFd::new()).collect();
        let Ok(fds) = fds else { return };
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        match v::set_irq_eventfds(&self.device, v::VFIO_PCI_MSIX_IRQ_INDEX, &raw) {
            Ok(()) => self.vectors = fds,
            Err(e) => tracing::warn!(bdf = self.bdf, "MSI-X set-up failed, queues poll: {e}"),
        }
    }

    /// The PCI address.
    pub fn bdf(&self) -> &str {
        &self.bdf
    }

    /// The interface the device was opened through (never `Auto`).
    pub fn interface(&self) -> VfioInterface {
        match self.container.ctx {
            IommuCtx::Type1 { .. } => VfioInterface::Group,
            IommuCtx::Iommufd { .. } => VfioInterface::Cdev,
        }
    }
}

/// The function's vfio cdev (`vfioN`), when the kernel made one.
fn cdev_name(bdf: &str) -> Option<String> {
    std::fs::read_dir(sysfs(bdf, "vfio-dev"))
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("vfio"))
}

/// The group interface: the function's IOMMU group in a new type1v2
/// container, and the device fd from the group.
fn open_group(bdf: &str) -> Result<(OwnedFd, IommuCtx)> {
    let group_link = std::fs::read_link(sysfs(bdf, "iommu_group")).map_err(|e| Error::io("read iommu_group", e))?;
    let group_no = group_link.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let container = v::open_rw("/dev/vfio/vfio")?;
    let ver = v::api_version(&container)?;
    if ver != v::VFIO_API_VERSION {
        return Err(Error::Unsupported(format!("VFIO API version {ver}")));
    }
    if !v::check_extension(&container, v::VFIO_TYPE1V2_IOMMU)? {
        return Err(Error::Unsupported("the kernel's VFIO has no type1v2 IOMMU (no IOMMU enabled?)".into()));
    }
    let group = v::open_rw(&format!("/dev/vfio/{group_no}"))?;
    let st = v::group_status(&group)?;
    if st.flags & v::VFIO_GROUP_FLAGS_VIABLE == 0 {
        return Err(Error::Platform(format!(
            "IOMMU group {group_no} is not viable: bind every device in it to vfio-pci"
        )));
    }
    v::group_set_container(&group, &container)?;
    v::set_iommu(&container, v::VFIO_TYPE1V2_IOMMU)?;
    let device = v::group_get_device_fd(&group, bdf)?;
    Ok((device, IommuCtx::Type1 { container, _group: group }))
}

/// The cdev interface: the device node bound to a new iommufd, attached to
/// a fresh I/O address space. Until the attach, the device can do no DMA.
fn open_cdev(name: &str) -> Result<(OwnedFd, IommuCtx)> {
    let device = v::open_rw(&format!("/dev/vfio/devices/{name}"))?;
    let iommufd = v::open_rw("/dev/iommu")?;
    v::bind_iommufd(&device, &iommufd)?;
    let ioas = v::ioas_alloc(&iommufd)?;
    v::attach_iommufd_pt(&device, ioas)?;
    Ok((device, IommuCtx::Iommufd { iommufd, ioas }))
}

impl Drop for VfioPlatform {
    fn drop(&mut self) {
        // The engine disabled the controller already; stop interrupts and
        // bus mastering as well before the descriptors close.
        if !self.vectors.is_empty() {
            let _ = v::set_irq_eventfds(&self.device, v::VFIO_PCI_MSIX_IRQ_INDEX, &[]);
        }
        let mut cmd = [0u8; 2];
        if v::pread_exact(&self.device, &mut cmd, self.config_offset + PCI_COMMAND).is_ok() {
            let c = u16::from_le_bytes(cmd) & !PCI_COMMAND_MASTER;
            let _ = v::pwrite_exact(&self.device, &c.to_le_bytes(), self.config_offset + PCI_COMMAND);
        }
    }
}

impl Platform for VfioPlatform {
    fn describe(&self) -> String {
        let via = match self.interface() {
            VfioInterface::Cdev => "vfio cdev + iommufd",
            _ => "vfio group + type1",
        };
        format!("vfio-pci {} ({via}, {} MSI-X vectors)", self.bdf, self.vectors.len())
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
        let mem = Anonymous::populated(len)?;
        let (host, len) = (mem.as_ptr(), mem.len());
        // SAFETY: the memory is `mem`, which the container keeps until unmap.
        let iova = unsafe { self.container.map(host as usize, len, Some(mem)) }?;
        // SAFETY: the memory is owned by the container's table entry until
        // `release` has unmapped it from the IOMMU.
        let region = unsafe { DmaRegion::new(NonNull::new(host).expect("mmap is not null"), len, Iova(iova)) };
        Ok(DmaBuffer::new(region, self.container.clone()))
    }

    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        let span = HostMapping::span(vaddr, len)?;
        // SAFETY: `map_host`'s caller keeps the memory until `unmap_host`.
        let iova = unsafe { self.container.map(span.0, span.1, None) }?;
        // SAFETY: the IOMMU maps the span at `iova` until `unmap_host`.
        Ok(unsafe { HostMapping::contiguous(vaddr, span, iova) })
    }

    unsafe fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        // A DmaBuffer's memory (queues, PRP lists): only its drop frees it.
        let owned = self.container.iova.lock().recover().live.get(&mapping.cookie).is_some_and(|(_, o)| o.is_some());
        if owned {
            return Err(Error::InvalidArgument(format!(
                "IOVA {:#x} is a DMA buffer of the platform's own",
                mapping.cookie
            )));
        }
        self.container.unmap(mapping.cookie)
    }

    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>> {
        Ok(self.vectors.get(vector as usize))
    }

    fn interrupt_vectors(&self) -> u16 {
        self.vectors.len() as u16
    }

    fn pci_address(&self) -> Option<String> {
        Some(self.bdf.clone())
    }

    fn share_registers(&self) -> Result<crate::attach::SharedRegisters> {
        let fd = self.device.try_clone().map_err(|e| Error::io("dup the vfio device", e))?;
        Ok(crate::attach::SharedRegisters {
            fd: Arc::new(fd),
            offset: self.bar0_offset,
            len: self.bar0.len(),
            wake: None,
            device: true,
        })
    }
}
