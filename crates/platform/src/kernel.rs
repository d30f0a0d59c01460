//! The kernel path: a file on any filesystem, or a block device the kernel
//! keeps, reached through io_uring instead of a controller's queues.
//!
//! There is no controller here: the engine drives a ring per queue (see
//! `ugds::engine::uring`) on the descriptors this platform opened, and the
//! kernel moves the data (its page cache, or straight to the device with
//! `O_DIRECT` where the memory, offset and size are aligned as the file
//! needs). User buffers are "mapped" at their own addresses: the kernel
//! reaches them by virtual address, and pins them per I/O itself.
//! Interrupt vectors are eventfds a ring signals on each completion.
//!
//! GPU memory is mapped at addresses from [`DEVICE_IOVA_BASE`] up, far
//! above any user address: a command whose data lies there moves through a
//! pinned host bounce buffer and the runtime's copy engine (the kernel
//! reads into the bounce buffer, the runtime copies it on; the reverse for
//! writes), several commands in flight at once, so that a large request's
//! disk reads overlap its copies.

use crate::device::{DeviceMemory, DeviceRuntime};
use crate::dma::DmaBuffer;
use crate::sys::uring::direct_io_alignment;
use crate::sys::uring::{fixed_copies, Ring, BOUNCE_BUFFERS, FIXED_BUFFERS, FIXED_BUFFER_MAX};
use crate::sys::{EventFd, PAGE_SIZE};
use crate::window::DeviceWindows;
use crate::Recover;
use crate::{Error, HostMapping, Platform, Result};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use ugds_nvme::regs;

/// The alignment assumed for direct I/O when the kernel does not say
/// (`statx` without `STATX_DIOALIGN`): a page, which every device takes.
const DEFAULT_DIRECT_ALIGN: u32 = 4096;

/// Interrupt vectors (eventfds) a kernel-path handle has.
const VECTORS: u16 = 64;

pub use crate::window::DEVICE_IOVA_BASE;

/// Host memory registered on the kernel path: its slot in the rings'
/// registered-buffer tables and that slot's generation.
#[derive(Clone, Copy, Debug)]
struct HostRange {
    len: usize,
    slot: u16,
    generation: u32,
}

/// The rings' registered-buffer slots for host memory
/// (`BOUNCE_BUFFERS..FIXED_BUFFERS`): which are free, and the generation
/// each was last given.
#[derive(Debug)]
struct HostSlots {
    free: Vec<u16>,
    generation: Box<[u32]>,
    next_generation: u32,
}

impl HostSlots {
    fn new() -> HostSlots {
        let n = (FIXED_BUFFERS - BOUNCE_BUFFERS) as usize;
        // Handed out lowest first.
        HostSlots {
            free: (BOUNCE_BUFFERS..FIXED_BUFFERS).rev().collect(),
            generation: vec![0; n].into(),
            next_generation: 1,
        }
    }
}

/// A host buffer as the rings register it: slot, generation, first byte, length.
pub type FixedHost = (u16, u32, *mut u8, usize);

/// Serializes file growth (`KernelPlatform::grow`) in the process.
static GROW: Mutex<()> = Mutex::new(());

/// A file or block device opened for the kernel path.
pub struct KernelPlatform {
    path: PathBuf,
    /// Opened with `O_DIRECT`, when the file takes it.
    direct: Option<OwnedFd>,
    buffered: OwnedFd,
    /// Memory and offset/size alignment of direct I/O.
    direct_align: (u32, u32),
    size: u64,
    writable: bool,
    /// A namespace's generic character device (`/dev/ngXnY`): its id, LBA
    /// size and the controller's largest transfer; commands are passed
    /// through as NVMe commands.
    passthrough: Option<(u32, u32, Option<usize>)>,
    /// Made when a queue first names the vector (most handles poll: an
    /// open does not make 64 eventfds it never uses).
    vectors: Box<[OnceLock<EventFd>]>,
    /// GPU memory mapped, by its address here.
    devices: DeviceWindows,
    /// Registered host memory, by its first page's address.
    hosts: RwLock<BTreeMap<usize, HostRange>>,
    slots: Mutex<HostSlots>,
    /// Bumped when a host range is unmapped: rings then release the slots
    /// they hold for memory no longer registered.
    host_epoch: AtomicU64,
    /// The kernel has no `cachestat`: `cached` answers `None`.
    no_cachestat: AtomicBool,
    /// A ring holding this handle's registered buffers (host ranges and
    /// the bounce slabs it has used), pinned once, which its queues' rings
    /// copy their tables from; made at the first need, `None` where the
    /// kernel has no registered buffers.
    buffer_source: OnceLock<Option<Mutex<Ring>>>,
}

impl std::fmt::Debug for KernelPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelPlatform")
            .field("path", &self.path)
            .field("direct", &self.direct.is_some())
            .field("size", &self.size)
            .field("writable", &self.writable)
            .finish_non_exhaustive()
    }
}

impl KernelPlatform {
    /// Opens `path` for reading and writing, or for reading only when
    /// writing is not allowed (writes then fail with a clear error).
    pub fn open(path: impl AsRef<Path>) -> Result<KernelPlatform> {
        let path = path.as_ref();
        refuse_zoned(path)?;
        if is_nvme_generic(path) {
            return KernelPlatform::passthrough(path);
        }
        let (buffered, writable) = match crate::sys::open_file(path, true, false) {
            Ok(fd) => (fd, true),
            Err(Error::Os { errno: libc::EACCES | libc::EROFS | libc::EPERM, .. }) => {
                (crate::sys::open_file(path, false, false)?, false)
            }
            Err(e) => return Err(e),
        };
        KernelPlatform::from_parts(path.to_path_buf(), buffered, writable)
    }

    /// The kernel path on a descriptor the caller opened (a duplicate is
    /// kept); `O_DIRECT` is tried on `/proc/self/fd/N`, as the descriptor's
    /// own flags are the caller's.
    pub fn from_fd(fd: BorrowedFd<'_>) -> Result<KernelPlatform> {
        let dup = fd.try_clone_to_owned().map_err(|e| Error::io("dup", e))?;
        let mode = crate::sys::access_mode(dup.as_fd())?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dup)));
        refuse_zoned(&path)?;
        if mode == libc::O_WRONLY {
            // ugds reads too (a partial block's rest, a read after the
            // write): the file opened anew for both, where it may be.
            let rw = crate::sys::open_file(&path, true, false).map_err(|e| {
                Error::InvalidArgument(format!("the descriptor is open for writing only, and ugds needs to read ({e})"))
            })?;
            let path = PathBuf::from(format!("/proc/self/fd/{}", rw.as_raw_fd()));
            return KernelPlatform::from_parts(path, rw, true);
        }
        let writable = mode == libc::O_RDWR;
        // A descriptor opened O_DIRECT (cuFile's callers open theirs so)
        // cannot serve what direct I/O refuses: the page cache's own
        // descriptor is opened anew, without it.
        // SAFETY: F_GETFL on a descriptor we own.
        let direct = unsafe { libc::fcntl(dup.as_raw_fd(), libc::F_GETFL) } & libc::O_DIRECT != 0;
        let buffered = match direct {
            false => dup,
            true => match crate::sys::open_file(&path, writable, false) {
                Ok(fd) => fd,
                Err(e) => {
                    tracing::warn!(path = %path.display(), "an O_DIRECT descriptor, not reopened through the page cache ({e}): unaligned memory will fail");
                    dup
                }
            },
        };
        // Named by the descriptor kept (`dup` may go).
        let path = PathBuf::from(format!("/proc/self/fd/{}", buffered.as_raw_fd()));
        KernelPlatform::from_parts(path, buffered, writable)
    }

    /// A namespace the kernel keeps, through its generic character device:
    /// NVMe commands built here, passed through io_uring (the kernel builds
    /// the PRPs and owns the queues).
    fn passthrough(path: &Path) -> Result<KernelPlatform> {
        let fd = crate::sys::open_file(path, true, false)?;
        let nsid = crate::sys::uring::nvme_namespace_id(fd.as_fd())?;
        let data = crate::sys::uring::nvme_identify_namespace(fd.as_fd(), nsid)?;
        let id = ugds_nvme::IdentifyNamespace::parse(&data);
        let bs = match (id.block_size(), id.lba_format()) {
            (Some(bs), Some(f)) if f.ms == 0 => bs,
            _ => return Err(Error::Unsupported(format!("{}: metadata or an unusable LBA format", path.display()))),
        };
        let size = id.nsze.checked_mul(bs as u64).ok_or_else(|| Error::InvalidArgument("namespace size".into()))?;
        write_back_block_device(path);
        let ctrl = crate::sys::uring::nvme_identify_controller(fd.as_fd())?;
        let mdts = ugds_nvme::IdentifyController::parse(&ctrl).max_transfer_bytes(crate::sys::PAGE_SIZE);
        // The kernel's own limits on one request (they can be below MDTS:
        // a DMA mapping limit, the segment count), from the namespace's
        // block device when it has one.
        let limit = kernel_request_limit(path);
        tracing::debug!(path = %path.display(), ?mdts, ?limit, "passthrough limits");
        let mdts = match (mdts, limit) {
            (Some(m), Some(l)) => Some(m.min(l)),
            (m, l) => m.or(l),
        };
        let vectors = (0..VECTORS).map(|_| OnceLock::new()).collect();
        Ok(KernelPlatform {
            path: path.to_path_buf(),
            direct: None,
            buffered: fd,
            direct_align: (1, 1),
            size,
            writable: true,
            passthrough: Some((nsid, bs, mdts)),
            vectors,
            devices: DeviceWindows::default(),
            hosts: RwLock::new(BTreeMap::new()),
            slots: Mutex::new(HostSlots::new()),
            host_epoch: AtomicU64::new(0),
            no_cachestat: AtomicBool::new(false),
            buffer_source: OnceLock::new(),
        })
    }

    /// For a namespace's generic character device: its namespace id, LBA
    /// size and the controller's largest transfer (MDTS), if it sets one
    /// (commands go through as NVMe commands).
    pub fn passthrough_namespace(&self) -> Option<(u32, u32, Option<usize>)> {
        self.passthrough
    }

    fn from_parts(path: PathBuf, buffered: OwnedFd, writable: bool) -> Result<KernelPlatform> {
        let size = crate::sys::file_size(buffered.as_fd())?;
        load_block_map(buffered.as_fd());
        let direct = match crate::sys::open_file(&path, writable, true) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::info!(path = %path.display(), "no direct I/O on this file ({e}); the page cache serves it");
                None
            }
        };
        let direct_align = direct
            .as_ref()
            .and_then(|d| direct_io_alignment(d.as_fd()))
            .unwrap_or((DEFAULT_DIRECT_ALIGN, DEFAULT_DIRECT_ALIGN));
        let vectors = (0..VECTORS).map(|_| OnceLock::new()).collect();
        Ok(KernelPlatform {
            path,
            direct,
            buffered,
            direct_align,
            size,
            writable,
            passthrough: None,
            vectors,
            devices: DeviceWindows::default(),
            hosts: RwLock::new(BTreeMap::new()),
            slots: Mutex::new(HostSlots::new()),
            host_epoch: AtomicU64::new(0),
            no_cachestat: AtomicBool::new(false),
            buffer_source: OnceLock::new(),
        })
    }

    /// The GPU memory at `addr` (an address this platform mapped it at)
    /// for `len` bytes: its device address and runtime. `None` when `addr`
    /// is not GPU memory, or the range runs past the mapping.
    pub fn device_at(&self, addr: u64, len: usize) -> Option<(u64, Arc<dyn DeviceRuntime>)> {
        self.devices.at(addr, len)
    }

    /// The registered host buffer holding `addr..addr + len`, if it has a
    /// slot in the rings' registered-buffer tables.
    pub fn host_buffer(&self, addr: usize, len: usize) -> Option<FixedHost> {
        let hosts = self.hosts.read().recover();
        let (&start, r) = hosts.range(..=addr).next_back()?;
        (addr + len <= start + r.len).then_some((r.slot, r.generation, start as *mut u8, r.len))
    }

    /// Makes slot `index` of `ring`'s registered-buffer table hold
    /// generation `generation` of the `len` bytes at `addr`: registered
    /// once in this handle's buffer source and the table copied from there
    /// where the kernel can (the first use on each further ring then pins
    /// nothing), else registered by `ring` itself. False where neither
    /// could; operations on the memory then name no buffer.
    ///
    /// # Safety
    /// As for [`Ring::fixed_buffer`].
    pub unsafe fn fixed_buffer(&self, ring: &mut Ring, index: u16, generation: u32, addr: *mut u8, len: usize) -> bool {
        if ring.fixed_generation(index) == generation {
            return true;
        }
        if fixed_copies() {
            if let Some(source) = self.buffer_source() {
                let mut source = source.lock().recover();
                // SAFETY: the caller's contract; the source releases the
                // slot when the memory is unmapped (`unmap_host`).
                if !unsafe { source.fixed_buffer(index, generation, addr, len) } {
                    // Not registered by the ring either: a slot of its own
                    // would be emptied by its next copy, under operations
                    // staged to use it.
                    return false;
                }
                if ring.copy_fixed_from(&source) {
                    return true;
                }
            }
        }
        // SAFETY: the caller's contract.
        unsafe { ring.fixed_buffer(index, generation, addr, len) }
    }

    /// Registers the `len` bytes at `addr` as generation `generation` of
    /// slot `index` in this handle's buffer source only, where rings copy
    /// their tables from it: the first use on a ring then copies the table
    /// and pins nothing ([`fixed_buffer`](Self::fixed_buffer)). False where
    /// there is no source or the kernel refused.
    ///
    /// # Safety
    /// As for [`Ring::fixed_buffer`].
    pub unsafe fn hold_fixed(&self, index: u16, generation: u32, addr: *mut u8, len: usize) -> bool {
        let Some(source) = self.buffer_source().filter(|_| fixed_copies()) else { return false };
        // SAFETY: the caller's contract.
        unsafe { source.lock().recover().fixed_buffer(index, generation, addr, len) }
    }

    /// The ring this handle's registered buffers are pinned in, made at
    /// the first call.
    fn buffer_source(&self) -> Option<&Mutex<Ring>> {
        self.buffer_source
            .get_or_init(|| match Ring::buffer_source() {
                Ok(r) => Some(Mutex::new(r)),
                Err(e) => {
                    tracing::debug!("no ring to hold registered buffers ({e}): each ring registers its own");
                    None
                }
            })
            .as_ref()
    }

    /// Changes each time registered host memory is unmapped.
    pub fn host_epoch(&self) -> u64 {
        self.host_epoch.load(Ordering::Acquire)
    }

    /// The generation each host slot names now (0: free), from slot
    /// `BOUNCE_BUFFERS` on.
    pub fn host_slot_generations(&self) -> Box<[u32]> {
        self.slots.lock().recover().generation.clone()
    }

    /// The file's path (for a descriptor, its `/proc/self/fd` name).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its size in bytes when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// A regular file's size now, after extending it to `at_least` bytes
    /// (a hole) where it is shorter and was opened for writing; `None`:
    /// not a regular file (a block device or namespace keeps its size).
    pub fn grow(&self, at_least: u64) -> Result<Option<u64>> {
        let meta = std::fs::File::from(self.buffered.try_clone().map_err(|e| Error::io("dup", e))?);
        let m = meta.metadata().map_err(|e| Error::io("fstat", e))?;
        if !m.file_type().is_file() {
            return Ok(None);
        }
        if m.len() >= at_least || !self.writable {
            return Ok(Some(m.len()));
        }
        // Only ever longer: `set_len` from two threads that both saw the
        // old size would otherwise cut what the other added.
        let _one = GROW.lock().recover();
        let now = meta.metadata().map_err(|e| Error::io("fstat", e))?.len();
        if now < at_least {
            meta.set_len(at_least).map_err(|e| Error::io("ftruncate", e))?;
        }
        Ok(Some(now.max(at_least)))
    }

    /// Whether it was opened for writing.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The descriptor for direct I/O, when the file takes it.
    pub fn direct_fd(&self) -> Option<BorrowedFd<'_>> {
        self.direct.as_ref().map(|d| d.as_fd())
    }

    /// How many pages of the file from `off` for `len` bytes are in the
    /// page cache, asked without reading (so without starting readahead);
    /// `None` where the kernel cannot say (before Linux 6.5).
    pub fn cached_pages(&self, off: u64, len: u64) -> Option<u64> {
        if self.no_cachestat.load(Ordering::Relaxed) {
            return None;
        }
        let n = crate::sys::uring::cached_pages(self.buffered.as_fd(), off, len);
        if n.is_none() {
            self.no_cachestat.store(true, Ordering::Relaxed);
        }
        n
    }

    /// The descriptor through the page cache.
    pub fn buffered_fd(&self) -> BorrowedFd<'_> {
        self.buffered.as_fd()
    }

    /// Memory and offset/size alignment that direct I/O needs.
    pub fn direct_alignment(&self) -> (u32, u32) {
        self.direct_align
    }
}

/// The largest request the kernel takes on the namespace behind the generic
/// character device `path` (`/dev/ngXnY`): its block device's
/// `max_hw_sectors_kb`, and `max_segments` pages less one (a buffer that
/// does not start on a page spans one more).
fn kernel_request_limit(path: &Path) -> Option<usize> {
    let name = path.file_name()?.to_str()?.strip_prefix("ng")?;
    let queue = format!("/sys/block/nvme{name}/queue");
    let read = |f: &str| std::fs::read_to_string(format!("{queue}/{f}")).ok()?.trim().parse::<usize>().ok();
    let bytes = read("max_hw_sectors_kb")? * 1024;
    let segments = read("max_segments").map_or(usize::MAX, |s| s.saturating_sub(1) * PAGE_SIZE);
    Some(bytes.min(segments).max(PAGE_SIZE))
}

/// A regular file's block map is read at open, not by its first read:
/// after the page cache was dropped, the first direct read of a file whose
/// extents do not fit its inode waited for the file system to read them,
/// inside the `io_uring_enter` that submitted it (seen on this project's
/// development VM, ext4 on virtio: 2.6 ms against 30 us for the next ones;
/// `docs/benchmarks.md`).
///
/// Anything else (a block device, a file system without extents) refuses
/// the request, which costs nothing.
fn load_block_map(fd: BorrowedFd<'_>) {
    let started = std::time::Instant::now();
    match crate::sys::load_extent_map(fd) {
        Ok(n) => tracing::debug!(extents = n, us = started.elapsed().as_micros() as u64, "block map read"),
        Err(e) => tracing::debug!("block map not read ({e})"),
    }
}

/// Passthrough commands bypass the page cache of the namespace's block
/// device: pages written there and not yet on the disk would land after
/// this handle's writes and undo them. Seen in a QEMU guest: a process's
/// buffered writes to `/dev/nvme0n1` went to the disk from a kernel worker
/// after it had exited (its io_uring ring, which held the device open, is
/// torn down later), over the next process's passthrough writes. So they
/// are written back (and waited for) before the handle is used. Writes
/// through that page cache while the handle is open are not ordered with
/// its commands, as buffered and `O_DIRECT` writes on two files are not.
fn write_back_block_device(path: &Path) {
    let Some(block) = namespace_block_device(path) else { return };
    let done = crate::sys::open_file(&block, false, false).and_then(|fd| crate::sys::write_back_cache(fd.as_fd()));
    match done {
        Ok(()) => tracing::debug!(block = %block.display(), "block device's dirty pages written back"),
        // Said once per process (a user given the generic device but not
        // the block device meets it at every open).
        Err(e) if !WRITE_BACK_WARNED.swap(true, Ordering::Relaxed) => tracing::warn!(
            block = %block.display(),
            "could not write back the block device's page cache ({e}): writes made through it may land after this handle's"
        ),
        Err(e) => tracing::debug!(block = %block.display(), "block device's page cache not written back ({e})"),
    }
}

/// Whether [`write_back_block_device`] has warned in this process.
static WRITE_BACK_WARNED: AtomicBool = AtomicBool::new(false);

/// The block device of the namespace behind the generic character device
/// `path` (`/dev/ngXnY`: `/dev/nvmeXnY`, checked against sysfs), if there
/// is one.
fn namespace_block_device(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    // A link (`/dev/disk/by-id/...`) names the device by its target.
    let real = std::fs::canonicalize(path).ok()?;
    let name = real.file_name()?.to_str()?.strip_prefix("ng")?;
    let numbers = std::fs::read_to_string(format!("/sys/block/nvme{name}/dev")).ok()?;
    let (maj, min) = numbers.trim().split_once(':')?;
    let block = PathBuf::from(format!("/dev/nvme{name}"));
    let m = std::fs::metadata(&block).ok()?;
    let same = m.file_type().is_block_device()
        && libc::major(m.rdev()).to_string() == maj
        && libc::minor(m.rdev()).to_string() == min;
    same.then_some(block)
}

/// The kernel's zone model of the block device behind `path` (a block
/// device, a partition of one, or an NVMe namespace's generic character
/// device): `none`, `host-aware` or `host-managed`; `None` for a file.
fn zone_model(path: &Path) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).ok()?;
    let (maj, min) = (libc::major(m.rdev()), libc::minor(m.rdev()));
    let read = |p: String| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    if m.file_type().is_block_device() {
        let dev = format!("/sys/dev/block/{maj}:{min}");
        // A partition's queue is its disk's.
        read(format!("{dev}/queue/zoned")).or_else(|| read(format!("{dev}/../queue/zoned")))
    } else if is_nvme_generic(path) {
        let name = path.file_name()?.to_str()?.strip_prefix("ng")?;
        read(format!("/sys/block/nvme{name}/queue/zoned"))
    } else {
        None
    }
}

/// Refuses a host-managed zoned device (an NVMe Zoned Namespace, an SMR
/// disk): its writes must go to each zone's write pointer, which plain
/// block I/O at any offset does not.
fn refuse_zoned(path: &Path) -> Result<()> {
    match zone_model(path).as_deref() {
        Some("host-managed") => Err(Error::Unsupported(format!(
            "{} is a zoned device (host-managed: writes only at each zone's write pointer); ugds moves plain blocks",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// Whether `path` is an NVMe namespace's generic character device.
fn is_nvme_generic(path: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(m) = std::fs::metadata(path) else { return false };
    if !m.file_type().is_char_device() {
        return false;
    }
    let (maj, min) = (libc::major(m.rdev()), libc::minor(m.rdev()));
    std::fs::read_link(format!("/sys/dev/char/{maj}:{min}/subsystem"))
        .is_ok_and(|p| p.file_name().is_some_and(|n| n == "nvme-generic"))
}

impl Platform for KernelPlatform {
    fn describe(&self) -> String {
        if let Some((nsid, bs, _)) = self.passthrough {
            return format!(
                "{} through the kernel (io_uring NVMe passthrough, namespace {nsid}, {bs}-byte blocks)",
                self.path.display()
            );
        }
        let how = if self.direct.is_some() { "O_DIRECT where aligned, else the page cache" } else { "the page cache" };
        format!("{} through the kernel (io_uring, {how})", self.path.display())
    }

    /// There are no registers: CSTS reads as a ready controller (so the
    /// engine's health checks pass), everything else as zero.
    fn read32(&self, off: usize) -> u32 {
        if off == regs::CSTS {
            1
        } else {
            0
        }
    }

    unsafe fn write32(&self, _off: usize, _val: u32) {}

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        DmaBuffer::anonymous(len)
    }

    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        let span = HostMapping::span(vaddr, len)?;
        // A slot in the rings' registered-buffer tables, where one is free:
        // the memory is pinned below, and each ring takes it into its table
        // when it first uses it.
        if span.1 <= FIXED_BUFFER_MAX {
            let mut s = self.slots.lock().recover();
            if let Some(slot) = s.free.pop() {
                s.next_generation = s.next_generation.checked_add(1).unwrap_or(2);
                let generation = s.next_generation;
                s.generation[(slot - BOUNCE_BUFFERS) as usize] = generation;
                let r = HostRange { len: span.1, slot, generation };
                // Faulted in and pinned here, at registration, as other
                // platforms pin, so that the first read pays nothing for
                // it (64 MiB not yet touched: 6-90 ms seen in the first 4
                // KiB read on the development machine; a ring's
                // registration of 64 MiB: 0.16 ms). Faulted in first:
                // pinning faults pages in one by one, several times slower.
                // Pinned in the buffer source, whose table the rings copy,
                // where the kernel copies tables; else each ring pins it
                // at its first use.
                self.hosts.write().recover().insert(span.0, r);
                drop(s);
                let base = span.0 as *mut u8;
                // SAFETY: the caller's contract: `len` bytes at `vaddr` are
                // mapped for the registration's life; `unmap_host`
                // releases the slot. (A ring that meets the memory first
                // registers it in the source itself, under the same lock.)
                unsafe {
                    crate::sys::populate(base, span.1);
                    self.hold_fixed(slot, generation, base, span.1);
                }
            }
        }
        // SAFETY: the kernel path names memory by its own address (the
        // kernel reaches it through the process's page tables).
        Ok(unsafe { HostMapping::contiguous(vaddr, span, span.0 as u64) })
    }

    unsafe fn map_device(&self, mem: &DeviceMemory) -> Result<HostMapping> {
        Ok(self.devices.map(mem))
    }

    fn copies_device_memory(&self) -> bool {
        true
    }

    unsafe fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        if self.devices.unmap(mapping) {
            return Ok(());
        }
        if let Some(r) = self.hosts.write().recover().remove(&(mapping.cookie as usize)) {
            let mut s = self.slots.lock().recover();
            s.generation[(r.slot - BOUNCE_BUFFERS) as usize] = 0;
            if let Some(Some(source)) = self.buffer_source.get() {
                source.lock().recover().release_fixed(r.slot);
            }
            s.free.push(r.slot);
            self.host_epoch.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }

    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>> {
        let Some(cell) = self.vectors.get(vector as usize) else { return Ok(None) };
        if cell.get().is_none() {
            // Two first callers may both make one; the one kept is the
            // one every caller gets.
            let _ = cell.set(EventFd::new()?);
        }
        Ok(cell.get())
    }

    fn interrupt_vectors(&self) -> u16 {
        self.vectors.len() as u16
    }
}

const _: () = assert!(PAGE_SIZE == 4096);
