//! The VFIO ioctls (linux/vfio.h) and the iommufd ones (linux/iommufd.h)
//! that the vfio cdev interface needs, as the kernel defines them.
//!
//! Every call here is a thin wrapper: the structures are `#[repr(C)]`
//! copies of the kernel's, sizes asserted here, and every structure's
//! layout and every constant's value checked against the kernel's uapi
//! headers by `scripts/uapi-check` (run by the QEMU conformance run).

use crate::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const VFIO_TYPE: u64 = b';' as u64;
const VFIO_BASE: u64 = 100;

/// `_IO(';', VFIO_BASE + n)`: VFIO's ioctls carry no size or direction.
const fn io(n: u64) -> u64 {
    VFIO_TYPE << 8 | (VFIO_BASE + n)
}

pub const VFIO_GET_API_VERSION: u64 = io(0);
pub const VFIO_CHECK_EXTENSION: u64 = io(1);
pub const VFIO_SET_IOMMU: u64 = io(2);
pub const VFIO_GROUP_GET_STATUS: u64 = io(3);
pub const VFIO_GROUP_SET_CONTAINER: u64 = io(4);
pub const VFIO_GROUP_GET_DEVICE_FD: u64 = io(6);
pub const VFIO_DEVICE_GET_REGION_INFO: u64 = io(8);
pub const VFIO_DEVICE_GET_IRQ_INFO: u64 = io(9);
pub const VFIO_DEVICE_SET_IRQS: u64 = io(10);
pub const VFIO_IOMMU_MAP_DMA: u64 = io(13);
pub const VFIO_IOMMU_UNMAP_DMA: u64 = io(14);
pub const VFIO_DEVICE_BIND_IOMMUFD: u64 = io(18);
pub const VFIO_DEVICE_ATTACH_IOMMUFD_PT: u64 = io(19);

/// `_IO(';', n)`: iommufd's commands share VFIO's type, numbered from 0x80.
const fn iommufd_io(n: u64) -> u64 {
    VFIO_TYPE << 8 | n
}

pub const IOMMU_IOAS_ALLOC: u64 = iommufd_io(0x81);
pub const IOMMU_IOAS_MAP: u64 = iommufd_io(0x85);
pub const IOMMU_IOAS_UNMAP: u64 = iommufd_io(0x86);
pub const IOMMU_IOAS_MAP_FIXED_IOVA: u32 = 1 << 0;
pub const IOMMU_IOAS_MAP_WRITEABLE: u32 = 1 << 1;
pub const IOMMU_IOAS_MAP_READABLE: u32 = 1 << 2;

pub const VFIO_API_VERSION: i32 = 0;
pub const VFIO_TYPE1V2_IOMMU: u64 = 3;
pub const VFIO_GROUP_FLAGS_VIABLE: u32 = 1;
pub const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
pub const VFIO_PCI_BAR0_REGION_INDEX: u32 = 0;
pub const VFIO_PCI_CONFIG_REGION_INDEX: u32 = 7;
pub const VFIO_PCI_MSIX_IRQ_INDEX: u32 = 2;
pub const VFIO_IRQ_SET_DATA_NONE: u32 = 1 << 0;
pub const VFIO_IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
pub const VFIO_IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
pub const VFIO_DMA_MAP_FLAG_READ: u32 = 1 << 0;
pub const VFIO_DMA_MAP_FLAG_WRITE: u32 = 1 << 1;

#[repr(C)]
#[derive(Default, Debug)]
pub struct GroupStatus {
    pub argsz: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Default, Debug)]
pub struct RegionInfo {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub cap_offset: u32,
    pub size: u64,
    pub offset: u64,
}

#[repr(C)]
#[derive(Default, Debug)]
pub struct IrqInfo {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub count: u32,
}

#[repr(C)]
#[derive(Default, Debug)]
pub struct DmaMap {
    pub argsz: u32,
    pub flags: u32,
    pub vaddr: u64,
    pub iova: u64,
    pub size: u64,
}

#[repr(C)]
#[derive(Default, Debug)]
pub struct DmaUnmap {
    pub argsz: u32,
    pub flags: u32,
    pub iova: u64,
    pub size: u64,
}

/// `struct vfio_device_bind_iommufd`.
#[repr(C)]
#[derive(Default, Debug)]
pub struct BindIommufd {
    pub argsz: u32,
    pub flags: u32,
    pub iommufd: i32,
    pub out_devid: u32,
}

/// `struct vfio_device_attach_iommufd_pt` (6.6 layout; later kernels accept
/// it by `argsz`).
#[repr(C)]
#[derive(Default, Debug)]
pub struct AttachIommufdPt {
    pub argsz: u32,
    pub flags: u32,
    pub pt_id: u32,
}

/// `struct iommu_ioas_alloc`.
#[repr(C)]
#[derive(Default, Debug)]
pub struct IoasAlloc {
    pub size: u32,
    pub flags: u32,
    pub out_ioas_id: u32,
}

/// `struct iommu_ioas_map`.
#[repr(C)]
#[derive(Default, Debug)]
pub struct IoasMap {
    pub size: u32,
    pub flags: u32,
    pub ioas_id: u32,
    pub reserved: u32,
    pub user_va: u64,
    pub length: u64,
    pub iova: u64,
}

/// `struct iommu_ioas_unmap`.
#[repr(C)]
#[derive(Default, Debug)]
pub struct IoasUnmap {
    pub size: u32,
    pub ioas_id: u32,
    pub iova: u64,
    pub length: u64,
}

const _: () = assert!(std::mem::size_of::<BindIommufd>() == 16);
const _: () = assert!(std::mem::size_of::<AttachIommufdPt>() == 12);
const _: () = assert!(std::mem::size_of::<IoasAlloc>() == 12);
const _: () = assert!(std::mem::size_of::<IoasMap>() == 40);
const _: () = assert!(std::mem::size_of::<IoasUnmap>() == 24);
const _: () = assert!(std::mem::size_of::<GroupStatus>() == 8);
const _: () = assert!(std::mem::size_of::<RegionInfo>() == 32);
const _: () = assert!(std::mem::size_of::<IrqInfo>() == 16);
const _: () = assert!(std::mem::size_of::<DmaMap>() == 32);
const _: () = assert!(std::mem::size_of::<DmaUnmap>() == 24);

fn check(op: &'static str, r: libc::c_int) -> Result<libc::c_int> {
    if r < 0 {
        Err(Error::os(op))
    } else {
        Ok(r)
    }
}

/// An ioctl whose argument is a plain integer.
///
/// # Safety
/// `req` must take an integer argument (not an address).
unsafe fn ioctl_val(fd: &OwnedFd, op: &'static str, req: u64, arg: u64) -> Result<libc::c_int> {
    // SAFETY: the request takes an integer argument, no memory (caller).
    check(op, unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as libc::c_ulong) })
}

/// An ioctl whose argument is a pointer to `T`, which the kernel may read
/// and write (`argsz` set by the caller).
///
/// # Safety
/// `req` must take a pointer to exactly a `T`, and any address inside `*arg`
/// must be valid for what the kernel does with it.
unsafe fn ioctl_ptr<T>(fd: &OwnedFd, op: &'static str, req: u64, arg: &mut T) -> Result<libc::c_int> {
    // SAFETY: `arg` is a live, exclusively borrowed `#[repr(C)]` structure of
    // the type the request expects (caller).
    check(op, unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) })
}

/// VFIO_GET_API_VERSION.
pub fn api_version(container: &OwnedFd) -> Result<i32> {
    // SAFETY: takes no argument.
    unsafe { ioctl_val(container, "VFIO_GET_API_VERSION", VFIO_GET_API_VERSION, 0) }
}

/// VFIO_CHECK_EXTENSION: whether the container supports IOMMU type `ext`.
pub fn check_extension(container: &OwnedFd, ext: u64) -> Result<bool> {
    // SAFETY: takes an integer.
    unsafe { ioctl_val(container, "VFIO_CHECK_EXTENSION", VFIO_CHECK_EXTENSION, ext) }.map(|r| r != 0)
}

/// VFIO_SET_IOMMU.
pub fn set_iommu(container: &OwnedFd, kind: u64) -> Result<()> {
    // SAFETY: takes an integer.
    unsafe { ioctl_val(container, "VFIO_SET_IOMMU", VFIO_SET_IOMMU, kind) }.map(drop)
}

/// VFIO_GROUP_GET_STATUS.
pub fn group_status(group: &OwnedFd) -> Result<GroupStatus> {
    let mut st = GroupStatus { argsz: std::mem::size_of::<GroupStatus>() as u32, flags: 0 };
    // SAFETY: takes a `GroupStatus`, which holds no addresses.
    unsafe { ioctl_ptr(group, "VFIO_GROUP_GET_STATUS", VFIO_GROUP_GET_STATUS, &mut st) }?;
    Ok(st)
}

/// VFIO_GROUP_SET_CONTAINER.
pub fn group_set_container(group: &OwnedFd, container: &OwnedFd) -> Result<()> {
    let mut cfd: i32 = container.as_raw_fd();
    // SAFETY: takes a pointer to an int holding a descriptor.
    unsafe { ioctl_ptr(group, "VFIO_GROUP_SET_CONTAINER", VFIO_GROUP_SET_CONTAINER, &mut cfd) }.map(drop)
}

/// VFIO_DEVICE_GET_REGION_INFO for region `index`.
pub fn region_info(device: &OwnedFd, index: u32) -> Result<RegionInfo> {
    let mut r = RegionInfo { argsz: std::mem::size_of::<RegionInfo>() as u32, index, ..Default::default() };
    // SAFETY: takes a `RegionInfo` (no capability chain asked for: argsz is
    // the structure's own size), which holds no addresses.
    unsafe { ioctl_ptr(device, "VFIO_DEVICE_GET_REGION_INFO", VFIO_DEVICE_GET_REGION_INFO, &mut r) }?;
    Ok(r)
}

/// VFIO_DEVICE_GET_IRQ_INFO for interrupt `index`.
pub fn irq_info(device: &OwnedFd, index: u32) -> Result<IrqInfo> {
    let mut i = IrqInfo { argsz: std::mem::size_of::<IrqInfo>() as u32, index, ..Default::default() };
    // SAFETY: takes an `IrqInfo`, which holds no addresses.
    unsafe { ioctl_ptr(device, "VFIO_DEVICE_GET_IRQ_INFO", VFIO_DEVICE_GET_IRQ_INFO, &mut i) }?;
    Ok(i)
}

/// VFIO_IOMMU_MAP_DMA: the device may read and write `vaddr..vaddr+size`
/// at `iova`.
///
/// # Safety
/// The memory must stay allocated (and not be reused for anything the
/// device must not touch) until it is unmapped.
pub unsafe fn map_dma(container: &OwnedFd, vaddr: u64, iova: u64, size: u64) -> Result<()> {
    let mut m = DmaMap {
        argsz: std::mem::size_of::<DmaMap>() as u32,
        flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
        vaddr,
        iova,
        size,
    };
    // SAFETY: takes a `DmaMap`; the memory it names is the caller's to vouch for.
    unsafe { ioctl_ptr(container, "VFIO_IOMMU_MAP_DMA", VFIO_IOMMU_MAP_DMA, &mut m) }.map(drop)
}

/// VFIO_IOMMU_UNMAP_DMA.
pub fn unmap_dma(container: &OwnedFd, iova: u64, size: u64) -> Result<()> {
    let mut u = DmaUnmap { argsz: std::mem::size_of::<DmaUnmap>() as u32, flags: 0, iova, size };
    // SAFETY: takes a `DmaUnmap`, which holds no host addresses.
    unsafe { ioctl_ptr(container, "VFIO_IOMMU_UNMAP_DMA", VFIO_IOMMU_UNMAP_DMA, &mut u) }.map(drop)
}

/// IOMMU_IOAS_MAP at a fixed IOVA, readable and writable.
///
/// # Safety
/// As for [`map_dma`].
pub unsafe fn ioas_map(iommufd: &OwnedFd, ioas: u32, vaddr: u64, iova: u64, length: u64) -> Result<()> {
    let mut m = IoasMap {
        size: std::mem::size_of::<IoasMap>() as u32,
        flags: IOMMU_IOAS_MAP_FIXED_IOVA | IOMMU_IOAS_MAP_READABLE | IOMMU_IOAS_MAP_WRITEABLE,
        ioas_id: ioas,
        reserved: 0,
        user_va: vaddr,
        length,
        iova,
    };
    // SAFETY: takes an `IoasMap`; the memory it names is the caller's to vouch for.
    unsafe { ioctl_ptr(iommufd, "IOMMU_IOAS_MAP", IOMMU_IOAS_MAP, &mut m) }.map(drop)
}

/// IOMMU_IOAS_UNMAP.
pub fn ioas_unmap(iommufd: &OwnedFd, ioas: u32, iova: u64, length: u64) -> Result<()> {
    let mut u = IoasUnmap { size: std::mem::size_of::<IoasUnmap>() as u32, ioas_id: ioas, iova, length };
    // SAFETY: takes an `IoasUnmap`, which holds no host addresses.
    unsafe { ioctl_ptr(iommufd, "IOMMU_IOAS_UNMAP", IOMMU_IOAS_UNMAP, &mut u) }.map(drop)
}

/// VFIO_DEVICE_BIND_IOMMUFD.
pub fn bind_iommufd(device: &OwnedFd, iommufd: &OwnedFd) -> Result<()> {
    let mut b = BindIommufd {
        argsz: std::mem::size_of::<BindIommufd>() as u32,
        iommufd: iommufd.as_raw_fd(),
        ..Default::default()
    };
    // SAFETY: takes a `BindIommufd`, which holds no addresses.
    unsafe { ioctl_ptr(device, "VFIO_DEVICE_BIND_IOMMUFD", VFIO_DEVICE_BIND_IOMMUFD, &mut b) }.map(drop)
}

/// IOMMU_IOAS_ALLOC: a new I/O address space's id.
pub fn ioas_alloc(iommufd: &OwnedFd) -> Result<u32> {
    let mut a = IoasAlloc { size: std::mem::size_of::<IoasAlloc>() as u32, ..Default::default() };
    // SAFETY: takes an `IoasAlloc`, which holds no addresses.
    unsafe { ioctl_ptr(iommufd, "IOMMU_IOAS_ALLOC", IOMMU_IOAS_ALLOC, &mut a) }?;
    Ok(a.out_ioas_id)
}

/// VFIO_DEVICE_ATTACH_IOMMUFD_PT.
pub fn attach_iommufd_pt(device: &OwnedFd, pt_id: u32) -> Result<()> {
    let mut a = AttachIommufdPt { argsz: std::mem::size_of::<AttachIommufdPt>() as u32, flags: 0, pt_id };
    // SAFETY: takes an `AttachIommufdPt`, which holds no addresses.
    unsafe { ioctl_ptr(device, "VFIO_DEVICE_ATTACH_IOMMUFD_PT", VFIO_DEVICE_ATTACH_IOMMUFD_PT, &mut a) }.map(drop)
}

/// VFIO_GROUP_GET_DEVICE_FD with the device's name.
pub fn group_get_device_fd(group: &OwnedFd, name: &str) -> Result<OwnedFd> {
    let c = std::ffi::CString::new(name).map_err(|_| Error::InvalidArgument(format!("bad device name {name:?}")))?;
    // SAFETY: the argument is a NUL-terminated string that outlives the call.
    let fd = check("VFIO_GROUP_GET_DEVICE_FD", unsafe {
        libc::ioctl(group.as_raw_fd(), VFIO_GROUP_GET_DEVICE_FD as _, c.as_ptr())
    })?;
    // SAFETY: a fresh descriptor the kernel handed us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// VFIO_DEVICE_SET_IRQS for `index` with one eventfd per vector (or none, to disable).
pub fn set_irq_eventfds(device: &OwnedFd, index: u32, fds: &[i32]) -> Result<()> {
    // struct vfio_irq_set { argsz, flags, index, start, count; __u8 data[] }
    let mut buf = vec![0u32; 5 + fds.len()];
    buf[0] = (20 + 4 * fds.len()) as u32;
    buf[1] =
        VFIO_IRQ_SET_ACTION_TRIGGER | if fds.is_empty() { VFIO_IRQ_SET_DATA_NONE } else { VFIO_IRQ_SET_DATA_EVENTFD };
    buf[2] = index;
    buf[3] = 0;
    buf[4] = fds.len() as u32;
    for (i, &fd) in fds.iter().enumerate() {
        buf[5 + i] = fd as u32;
    }
    // SAFETY: `buf` holds a complete vfio_irq_set with `count` eventfds.
    check("VFIO_DEVICE_SET_IRQS", unsafe {
        libc::ioctl(device.as_raw_fd(), VFIO_DEVICE_SET_IRQS as _, buf.as_mut_ptr())
    })?;
    Ok(())
}

/// Opens a file read-write.
pub fn open_rw(path: &str) -> Result<OwnedFd> {
    let c = std::ffi::CString::new(path).map_err(|_| Error::InvalidArgument(format!("bad path {path:?}")))?;
    // SAFETY: a NUL-terminated path that outlives the call.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(Error::os(format!("open {path}")));
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads `buf.len()` bytes at `offset` of a device region.
pub fn pread_exact(fd: &OwnedFd, buf: &mut [u8], offset: u64) -> Result<()> {
    // SAFETY: `buf` is a live, writable slice.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), offset as libc::off_t) };
    if n != buf.len() as isize {
        return Err(Error::os("pread (device region)"));
    }
    Ok(())
}

/// Writes `buf` at `offset` of a device region.
pub fn pwrite_exact(fd: &OwnedFd, buf: &[u8], offset: u64) -> Result<()> {
    // SAFETY: `buf` is a live slice.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), offset as libc::off_t) };
    if n != buf.len() as isize {
        return Err(Error::os("pwrite (device region)"));
    }
    Ok(())
}

/// A shared mapping of a device region (BAR0), unmapped on drop.
pub struct Mmio {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: MMIO is accessed only with volatile reads and writes through raw
// pointers; the mapping itself is owned by this value.
unsafe impl Send for Mmio {}
// SAFETY: as above.
unsafe impl Sync for Mmio {}

impl Mmio {
    /// Maps `len` bytes of `fd` at `offset`, shared, read-write.
    pub fn map(fd: &OwnedFd, len: usize, offset: u64) -> Result<Mmio> {
        Ok(Mmio { ptr: super::mmap_shared(fd, len, offset, "mmap BAR0")?, len })
    }

    /// Volatile 32-bit read; all ones outside the region (as PCI reads of
    /// nothing return).
    #[inline]
    pub fn read32(&self, off: usize) -> u32 {
        if off % 4 != 0 || off + 4 > self.len {
            return u32::MAX;
        }
        // SAFETY: in bounds and aligned; device registers are read volatile.
        unsafe { self.ptr.as_ptr().add(off).cast::<u32>().read_volatile() }
    }

    /// Volatile 32-bit write; ignored outside the region.
    #[inline]
    pub fn write32(&self, off: usize, v: u32) {
        if off % 4 != 0 || off + 4 > self.len {
            return;
        }
        // SAFETY: in bounds and aligned; device registers are written volatile.
        unsafe { self.ptr.as_ptr().add(off).cast::<u32>().write_volatile(v) }
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Puts zeroed private memory in place of the device's pages, at the
    /// same addresses: the device file is no longer held by this mapping,
    /// and an access still racing with this one touches nothing.
    pub fn retire(&self) {
        // SAFETY: replaces our own mapping in place (MAP_FIXED over exactly
        // its range); every access to it is a volatile access through a raw
        // pointer, which then reads zeros or writes to the private page.
        let p = unsafe {
            libc::mmap(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            tracing::warn!("could not retire a register mapping: {}", std::io::Error::last_os_error());
        }
    }
}

impl Drop for Mmio {
    fn drop(&mut self) {
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux() {
        // From linux/vfio.h: _IO(VFIO_TYPE, VFIO_BASE + n), VFIO_TYPE ';'.
        assert_eq!(VFIO_GET_API_VERSION, 0x3b64);
        assert_eq!(VFIO_SET_IOMMU, 0x3b66);
        assert_eq!(VFIO_GROUP_SET_CONTAINER, 0x3b68);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(VFIO_DEVICE_GET_REGION_INFO, 0x3b6c);
        assert_eq!(VFIO_DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3b72);
        assert_eq!(VFIO_DEVICE_BIND_IOMMUFD, 0x3b76);
        assert_eq!(VFIO_DEVICE_ATTACH_IOMMUFD_PT, 0x3b77);
        // From linux/iommufd.h: _IO(IOMMUFD_TYPE, n), IOMMUFD_TYPE ';'.
        assert_eq!(IOMMU_IOAS_ALLOC, 0x3b81);
        assert_eq!(IOMMU_IOAS_MAP, 0x3b85);
        assert_eq!(IOMMU_IOAS_UNMAP, 0x3b86);
    }
}
