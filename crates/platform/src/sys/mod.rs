//! Every system call the library makes, in one place.

pub mod dl;
pub mod rdma_cm;
pub mod shared;
pub(crate) mod ugds_drv;
pub mod unix;
pub mod uring;
pub mod verbs;
pub(crate) mod vfio;

use crate::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::time::Duration;

/// The host page size; DMA memory is handed out in these units.
pub const PAGE_SIZE: usize = 4096;

/// Anonymous, zeroed, page-aligned memory, released on drop.
pub struct Anonymous {
    ptr: NonNull<u8>,
    len: usize,
}

impl std::fmt::Debug for Anonymous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Anonymous").finish_non_exhaustive()
    }
}

// SAFETY: the mapping is plain memory owned by this value; moving or sharing
// the owner between threads is fine, accesses go through raw pointers.
unsafe impl Send for Anonymous {}
// SAFETY: as above; `&Anonymous` only hands out raw pointers.
unsafe impl Sync for Anonymous {}

impl Anonymous {
    /// Maps `len` bytes (rounded up to pages), zeroed.
    pub fn new(len: usize) -> Result<Anonymous> {
        Anonymous::map(len, 0)
    }

    /// As [`new`](Self::new), with every page faulted in now (for memory
    /// used on the I/O path, so that first use pays no page faults).
    pub fn populated(len: usize) -> Result<Anonymous> {
        Anonymous::map(len, libc::MAP_POPULATE)
    }

    /// As [`new`](Self::new) (with every page faulted in now when
    /// `populate`), for I/O buffers of 2 MiB and more: aligned to 2 MiB and
    /// advised for transparent huge pages (`MADV_HUGEPAGE`, which the
    /// kernel may decline). A read with `O_DIRECT` into such memory pins a
    /// few huge pages instead of a page per 4 KiB, and its pieces are
    /// physically contiguous (measured on the kernel path: 1 and 16 MiB
    /// reads 20-35% faster into such a buffer than into plain pages;
    /// docs/benchmarks.md). Smaller lengths get [`new`](Self::new)'s pages.
    pub fn huge(len: usize, populate: bool) -> Result<Anonymous> {
        const HUGE: usize = 2 << 20;
        if len < HUGE {
            return Anonymous::map(len, if populate { libc::MAP_POPULATE } else { 0 });
        }
        let len = len.next_multiple_of(PAGE_SIZE);
        let span = len + HUGE;
        // SAFETY: a fresh private anonymous mapping touches no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::os("mmap"));
        }
        let (start, aligned) = (p as usize, (p as usize).next_multiple_of(HUGE));
        // SAFETY: the parts of our own fresh mapping before and after the
        // aligned `len` bytes, which nothing refers to; then advice on
        // those `len` bytes.
        unsafe {
            if aligned > start {
                libc::munmap(p, aligned - start);
            }
            let tail = start + span - (aligned + len);
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            // Advice only: without transparent huge pages the memory is
            // plain pages, as `new` gives.
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        let mem = Anonymous { ptr: NonNull::new(aligned as *mut u8).expect("mmap returned null"), len };
        if populate {
            // SAFETY: zeroed memory of ours: writing zeros changes no byte,
            // and faults each page in (a huge page at its first byte).
            unsafe {
                for off in (0..len).step_by(PAGE_SIZE) {
                    mem.as_ptr().add(off).write_volatile(0);
                }
            }
        }
        Ok(mem)
    }

    fn map(len: usize, extra: libc::c_int) -> Result<Anonymous> {
        let len = len.max(1).next_multiple_of(PAGE_SIZE);
        // SAFETY: a fresh private anonymous mapping touches no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::os("mmap"));
        }
        Ok(Anonymous { ptr: NonNull::new(p.cast()).expect("mmap returned null"), len })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for Anonymous {
    fn drop(&mut self) {
        // SAFETY: we own the mapping and nothing refers to it after drop.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Faults in every page of `len` bytes at `addr` now (`MADV_POPULATE_WRITE`,
/// Linux 5.14; `MADV_POPULATE_READ` where the memory is not writable),
/// without changing a byte: what pinning the range for a device's writes
/// would fault in anyway, paid here instead. False where the kernel did
/// not (an older kernel, memory it cannot populate): the pages then fault
/// in at their first use.
///
/// # Safety
/// `len` bytes at `addr` are mapped memory of this process.
pub unsafe fn populate(addr: *mut u8, len: usize) -> bool {
    // SAFETY: advice on the caller's mapped range; it changes no content.
    unsafe {
        libc::madvise(addr.cast(), len, libc::MADV_POPULATE_WRITE) == 0
            || libc::madvise(addr.cast(), len, libc::MADV_POPULATE_READ) == 0
    }
}

/// Starts reading into the page cache, without waiting, every loadable
/// segment of the object (the program or a shared library) whose code
/// holds `addr`; returns the bytes asked for (0 where no object holds it).
///
/// A process that starts with its binary out of the page cache otherwise
/// faults its code in a few pages at a time, each fault a read from the
/// disk, as it first runs it: what a library calls once, before its first
/// set-up, so that those faults find the pages read or on their way.
pub fn prefetch_object(addr: usize) -> usize {
    struct Find {
        addr: usize,
        advised: usize,
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: dl_iterate_phdr hands a valid entry for the call, and
        // `data` is the `Find` passed below.
        let (info, find) = unsafe { (&*info, &mut *data.cast::<Find>()) };
        let phdrs: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() {
            &[]
        } else {
            // SAFETY: the object's program headers, `dlpi_phnum` of them.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
        };
        let base = info.dlpi_addr as usize;
        let loads = || phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
        let holds = loads().any(|p| {
            let start = base + p.p_vaddr as usize;
            p.p_flags & libc::PF_X != 0 && (start..start + p.p_memsz as usize).contains(&find.addr)
        });
        if !holds {
            return 0;
        }
        for p in loads() {
            let start = (base + p.p_vaddr as usize) & !(PAGE_SIZE - 1);
            let end = base + p.p_vaddr as usize + p.p_filesz as usize;
            // SAFETY: one of this object's loaded segments, mapped while it
            // is loaded; the advice changes no content.
            if unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_WILLNEED) } == 0 {
                find.advised += end - start;
            }
        }
        1
    }
    let mut find = Find { addr, advised: 0 };
    // SAFETY: the callback reads the entries it is given and writes `find`,
    // which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut find as *mut Find).cast()) };
    find.advised
}

/// A shared read-write mapping of `len` bytes of a device file at `offset`
/// (a BAR, or DMA memory a kernel driver lends); `what` names it in errors.
pub(crate) fn mmap_shared(fd: &OwnedFd, len: usize, offset: u64, what: &'static str) -> Result<NonNull<u8>> {
    // SAFETY: a new shared mapping of a device file; no existing memory is
    // affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::os(what));
    }
    Ok(NonNull::new(p.cast()).expect("mmap is not null"))
}

/// A non-blocking eventfd: interrupts arrive on it as counter increments.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new eventfd with counter zero.
    pub fn new() -> Result<EventFd> {
        use rustix::event::{eventfd, EventfdFlags};
        eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
            .map(EventFd)
            .map_err(|e| Error::io("eventfd", e.into()))
    }

    /// An eventfd another process made and passed over a socket (an
    /// attached process's interrupt vectors). Nothing checks that it is
    /// one: what is not reads and polls as never signalled.
    pub fn from_fd(fd: OwnedFd) -> EventFd {
        EventFd(fd)
    }

    /// Adds one to the counter (what an interrupt does).
    pub fn signal(&self) {
        // Cannot fail short of a counter at its maximum (2^64 - 2 signals
        // unread), which a reader drains first.
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    /// Reads and clears the counter; 0 when nothing was pending.
    pub fn drain(&self) -> u64 {
        let mut v = [0u8; 8];
        match rustix::io::read(&self.0, &mut v) {
            Ok(8) => u64::from_ne_bytes(v),
            _ => 0,
        }
    }

    /// Waits until the counter is non-zero or `timeout` passes; true when
    /// signalled. Interrupted waits return false (callers re-check anyway).
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut p = [rustix::event::PollFd::new(&self.0, rustix::event::PollFlags::IN)];
        poll(&mut p, timeout) && p[0].revents().contains(rustix::event::PollFlags::IN)
    }

    /// Waits until this counter or `other`'s is non-zero, or `timeout`
    /// passes; which of the two were signalled. Interrupted waits report
    /// neither (callers re-check anyway).
    pub fn wait_either(&self, other: &EventFd, timeout: Duration) -> (bool, bool) {
        use rustix::event::{PollFd, PollFlags};
        let mut p = [PollFd::new(&self.0, PollFlags::IN), PollFd::new(&other.0, PollFlags::IN)];
        if !poll(&mut p, timeout) {
            return (false, false);
        }
        (p[0].revents().contains(PollFlags::IN), p[1].revents().contains(PollFlags::IN))
    }

    /// Waits until any of `fds` is non-zero or `timeout` passes; which
    /// were signalled, by index. Interrupted waits report none (callers
    /// re-check anyway).
    pub fn wait_any(fds: &[&EventFd], timeout: Duration) -> Vec<usize> {
        use rustix::event::{PollFd, PollFlags};
        let mut p: Vec<PollFd<'_>> = fds.iter().map(|e| PollFd::new(&e.0, PollFlags::IN)).collect();
        if !poll(&mut p, timeout) {
            return Vec::new();
        }
        p.iter().enumerate().filter(|(_, p)| p.revents().contains(PollFlags::IN)).map(|(i, _)| i).collect()
    }

    /// The descriptor, borrowed.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.0)
    }

    /// The raw descriptor.
    pub fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// `poll` for up to `timeout`: whether any descriptor is ready (an
/// interrupted or failed wait says none).
fn poll(fds: &mut [rustix::event::PollFd<'_>], timeout: Duration) -> bool {
    let ts = rustix::event::Timespec { tv_sec: timeout.as_secs() as _, tv_nsec: timeout.subsec_nanos() as _ };
    matches!(rustix::event::poll(fds, Some(&ts)), Ok(n) if n > 0)
}

/// `pread` straight into memory that may be device-visible: no Rust
/// reference to the destination is formed. Reads past the end of the file
/// leave zeros (the tail is zero-filled).
///
/// # Safety
/// `dst..dst+len` must be valid for writes and not accessed by anyone else
/// for the duration of the call.
pub unsafe fn pread_raw(fd: RawFd, dst: *mut u8, len: usize, offset: u64) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: the caller guarantees dst..dst+len is writable.
        let n = unsafe { libc::pread(fd, dst.add(done).cast(), len - done, (offset + done as u64) as libc::off_t) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            // SAFETY: as above; the rest of the range lies past end of file.
            unsafe { std::ptr::write_bytes(dst.add(done), 0, len - done) };
            return Ok(());
        }
        done += n as usize;
    }
    Ok(())
}

/// `pwrite` straight from memory that may be device-visible.
///
/// # Safety
/// `src..src+len` must be valid for reads for the duration of the call.
pub unsafe fn pwrite_raw(fd: RawFd, src: *const u8, len: usize, offset: u64) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: the caller guarantees src..src+len is readable.
        let n = unsafe { libc::pwrite(fd, src.add(done).cast(), len - done, (offset + done as u64) as libc::off_t) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

/// Opens a file for reading (and writing, with `write`), with `O_DIRECT`
/// when `direct`; close-on-exec.
pub fn open_file(path: &std::path::Path, write: bool, direct: bool) -> Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(write);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path).map(OwnedFd::from).map_err(|e| Error::io(format!("open {}", path.display()), e))
}

/// The size of a file, or of a block device (`BLKGETSIZE64`). The file
/// position, which a caller's descriptor may share, is left alone.
pub fn file_size(fd: std::os::fd::BorrowedFd<'_>) -> Result<u64> {
    // SAFETY: all zeroes is a valid `stat` (plain integers).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat fills `st` for a descriptor the caller keeps open.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(Error::os("fstat"));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFBLK {
        return Ok(st.st_size as u64);
    }
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272; // _IOR(0x12, 114, size_t)
    let mut bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 to the pointer given.
    if unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64, &mut bytes) } != 0 {
        return Err(Error::os("ioctl(BLKGETSIZE64)"));
    }
    Ok(bytes)
}

/// Writes back the dirty page-cache pages of a descriptor's file or block
/// device and waits for them, and for writeback already under way
/// (`sync_file_range`: no cache flush on the device, which ordering
/// against later writes does not need).
pub fn write_back_cache(fd: std::os::fd::BorrowedFd<'_>) -> Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: sync_file_range names the descriptor's file only; offset 0
    // and length 0 cover all of it.
    if unsafe { libc::sync_file_range(fd.as_raw_fd(), 0, 0, flags) } != 0 {
        return Err(Error::os("sync_file_range"));
    }
    Ok(())
}

/// Asks the file system for a regular file's extents (`FS_IOC_FIEMAP`
/// counting them, none copied out), which reads its block map from the
/// disk where it is not cached: how many extents it has. `Unsupported`
/// where the file system does not map extents (tmpfs, many network file
/// systems).
pub fn load_extent_map(fd: std::os::fd::BorrowedFd<'_>) -> Result<u32> {
    /// `struct fiemap` without its extent array.
    #[repr(C)]
    #[derive(Default)]
    struct Fiemap {
        start: u64,
        length: u64,
        flags: u32,
        mapped_extents: u32,
        extent_count: u32,
        reserved: u32,
    }
    /// `_IOWR('f', 11, struct fiemap)`.
    const FS_IOC_FIEMAP: libc::c_ulong = 0xc020_660b;
    let mut m = Fiemap { length: u64::MAX, ..Default::default() };
    // SAFETY: FS_IOC_FIEMAP reads and writes one `struct fiemap`; with
    // `extent_count` 0 it writes no extent array after it.
    if unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FIEMAP, &mut m as *mut Fiemap) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::ENOTTY) => Error::Unsupported("FS_IOC_FIEMAP".into()),
            _ => Error::io("ioctl(FS_IOC_FIEMAP)", e),
        });
    }
    Ok(m.mapped_extents)
}

/// How a descriptor was opened: `O_RDONLY`, `O_WRONLY` or `O_RDWR`.
pub fn access_mode(fd: std::os::fd::BorrowedFd<'_>) -> Result<i32> {
    // SAFETY: F_GETFL reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(Error::os("fcntl(F_GETFL)"));
    }
    Ok(flags & libc::O_ACCMODE)
}

/// A dma-buf of `len` bytes made by udmabuf over a sealed memfd (a
/// stand-in for a device's dma-buf where there is none): the memfd and the
/// dma-buf. `Unsupported` where there is no `/dev/udmabuf`.
pub fn udmabuf(len: usize) -> Result<(OwnedFd, OwnedFd)> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain system calls on descriptors this function owns; each
    // is wrapped in an OwnedFd as soon as it exists.
    unsafe {
        let dev = libc::open(c"/dev/udmabuf".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if dev < 0 {
            return Err(Error::Unsupported(format!("/dev/udmabuf: {}", std::io::Error::last_os_error())));
        }
        let dev = OwnedFd::from_raw_fd(dev);
        let mfd = libc::memfd_create(c"ugds-udmabuf".as_ptr(), libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC);
        if mfd < 0 {
            return Err(Error::io("memfd_create", std::io::Error::last_os_error()));
        }
        let memfd = OwnedFd::from_raw_fd(mfd);
        if libc::ftruncate(mfd, len as libc::off_t) != 0
            || libc::fcntl(mfd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) != 0
        {
            return Err(Error::io("memfd size and seal", std::io::Error::last_os_error()));
        }
        #[repr(C)]
        struct Create {
            memfd: u32,
            flags: u32,
            offset: u64,
            size: u64,
        }
        // UDMABUF_FLAGS_CLOEXEC; UDMABUF_CREATE = _IOW('u', 0x42, struct udmabuf_create).
        let mut c = Create { memfd: mfd as u32, flags: 1, offset: 0, size: len as u64 };
        let buf = libc::ioctl(dev.as_raw_fd(), 0x4018_7542, &mut c as *mut Create);
        if buf < 0 {
            return Err(Error::io("UDMABUF_CREATE", std::io::Error::last_os_error()));
        }
        Ok((memfd, OwnedFd::from_raw_fd(buf)))
    }
}

/// Bytes of physical memory (`u64::MAX` where the system does not say).
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf reads a system value.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || size <= 0 {
        return u64::MAX;
    }
    (pages as u64).saturating_mul(size as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefetch_asks_for_the_object_holding_code_and_nothing_for_other_memory() {
        let here = prefetch_asks_for_the_object_holding_code_and_nothing_for_other_memory as fn() as usize;
        // This test binary's loadable segments: its code at least.
        assert!(prefetch_object(here) > 4096, "{}", prefetch_object(here));
        let heap = Box::new(0u64);
        assert_eq!(prefetch_object(&*heap as *const u64 as usize), 0, "heap memory is no object's code");
    }

    use super::*;

    #[test]
    fn anonymous_is_page_aligned_and_zeroed() {
        let a = Anonymous::new(10).unwrap();
        assert_eq!(a.len(), PAGE_SIZE);
        assert_eq!(a.as_ptr() as usize % PAGE_SIZE, 0);
        // SAFETY: the mapping is live and readable for its length.
        assert_eq!(unsafe { *a.as_ptr().add(100) }, 0);
    }

    #[test]
    fn huge_memory_is_aligned_to_2_mib_zeroed_and_exactly_its_length() {
        for (len, populate) in [(2 << 20, true), ((5 << 20) + 4096, false), (8192, true)] {
            let a = Anonymous::huge(len, populate).unwrap();
            assert_eq!(a.len(), len.next_multiple_of(PAGE_SIZE));
            let align = if len >= 2 << 20 { 2 << 20 } else { PAGE_SIZE };
            assert_eq!(a.as_ptr() as usize % align, 0, "{len}");
            // SAFETY: the mapping is live and readable for its length.
            unsafe {
                assert_eq!(*a.as_ptr().add(len - 1), 0);
                a.as_ptr().add(len - 1).write(7);
            }
            // The trimmed ends are unmapped: the mapping is its length, no more.
            let page_after = a.as_ptr() as usize + a.len();
            // SAFETY: mincore only asks about the range; ENOMEM says unmapped.
            let r = unsafe { libc::mincore(page_after as *mut libc::c_void, PAGE_SIZE, [0u8; 1].as_mut_ptr()) };
            if len >= 2 << 20 {
                assert_eq!(r, -1, "{len}: the tail past the buffer stays mapped");
            }
        }
    }

    #[test]
    fn eventfd_counts_and_drains() {
        let e = EventFd::new().unwrap();
        assert!(!e.wait(Duration::from_millis(1)));
        e.signal();
        e.signal();
        assert!(e.wait(Duration::from_millis(1)));
        assert_eq!(e.drain(), 2);
        assert_eq!(e.drain(), 0);
    }
}
