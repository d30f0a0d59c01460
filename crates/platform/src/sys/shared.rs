//! Memory two processes share (a memfd mapped in each), and the futex
//! that wakes a thread of one from the other.

use super::PAGE_SIZE;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A memfd mapped shared, zeroed, page-aligned; unmapped on drop (the
/// memory lives on while another process maps it or holds the descriptor).
///
/// Every live mapping made by [`SharedMemory::new`] is listed process-wide,
/// so that a later registration of any part of it can be passed to another
/// process by descriptor ([`SharedMemory::find`]).
pub struct SharedMemory {
    fd: Arc<OwnedFd>,
    ptr: NonNull<u8>,
    len: usize,
    /// The mapping starts this far into the file.
    offset: u64,
    listed: bool,
}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemory").field("len", &self.len).field("offset", &self.offset).finish_non_exhaustive()
    }
}

// SAFETY: the mapping is plain memory owned by this value; accesses go
// through raw pointers or atomics.
unsafe impl Send for SharedMemory {}
// SAFETY: as above.
unsafe impl Sync for SharedMemory {}

/// Set once this process attaches to a controller another process owns:
/// from then on ugds's host buffers are shared memory.
static SHARING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether host buffers are made shareable (see [`share_host_buffers`]).
pub fn sharing() -> bool {
    SHARING.load(std::sync::atomic::Ordering::Relaxed)
}

/// Makes every host buffer allocated from now on shared memory, which an
/// owner of a controller can map for its device.
pub fn share_host_buffers() {
    SHARING.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Live mappings made by `SharedMemory::new`: start address -> (length, file).
static LISTED: Mutex<BTreeMap<usize, (usize, Arc<OwnedFd>)>> = Mutex::new(BTreeMap::new());

/// Part of a listed mapping: its file, and where the part starts in it.
#[derive(Debug, Clone)]
pub struct SharedSpan {
    /// The memfd behind the memory.
    pub fd: Arc<OwnedFd>,
    /// Offset of the span's first page in the file.
    pub offset: u64,
}

impl SharedMemory {
    /// `len` bytes (rounded up to pages) of a new memfd, mapped.
    pub fn new(len: usize) -> Result<SharedMemory> {
        let len = len.max(1).next_multiple_of(PAGE_SIZE);
        // SAFETY: creates a descriptor; touches no memory.
        let raw = unsafe { libc::memfd_create(c"ugds-shared".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(Error::os("memfd_create"));
        }
        // SAFETY: `raw` is a descriptor we just made and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sizes the file behind our own descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(Error::os("ftruncate of a memfd"));
        }
        // Sealed at its size: a process it is shared with may rely on
        // every page staying (a shrink would fault the other's accesses).
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on our own descriptor.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(Error::os("seal a memfd"));
        }
        let mut m = SharedMemory::map(Arc::new(fd), 0, len)?;
        m.listed = true;
        LISTED.lock().unwrap_or_else(|p| p.into_inner()).insert(m.ptr.as_ptr() as usize, (len, m.fd.clone()));
        Ok(m)
    }

    /// Maps `len` bytes at page-aligned `offset` of a file another process
    /// shared; refuses a range the file does not hold, and a file not
    /// sealed against shrinking (its pages could vanish under us).
    pub fn from_fd(fd: Arc<OwnedFd>, offset: u64, len: usize) -> Result<SharedMemory> {
        // SAFETY: fcntl on a descriptor we hold.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(Error::InvalidArgument(
                "a shared file must be a memfd sealed against shrinking (F_SEAL_SHRINK)".into(),
            ));
        }
        if len == 0 || len % PAGE_SIZE != 0 || offset % PAGE_SIZE as u64 != 0 {
            return Err(Error::InvalidArgument(format!(
                "a shared range must be whole pages (offset {offset:#x}, {len} bytes)"
            )));
        }
        let size = super::file_size(fd.as_fd())?;
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes at {offset:#x} lie beyond the shared file's {size} bytes"
            )));
        }
        SharedMemory::map(fd, offset, len)
    }

    fn map(fd: Arc<OwnedFd>, offset: u64, len: usize) -> Result<SharedMemory> {
        let ptr = super::mmap_shared(&fd, len, offset, "mmap of shared memory")?;
        Ok(SharedMemory { fd, ptr, len, offset, listed: false })
    }

    /// The file and offset behind `len` bytes at `vaddr`, when they lie in
    /// one live mapping made by [`new`](Self::new) in this process.
    pub fn find(vaddr: usize, len: usize) -> Option<SharedSpan> {
        let listed = LISTED.lock().unwrap_or_else(|p| p.into_inner());
        let (&start, (mlen, fd)) = listed.range(..=vaddr).next_back()?;
        let end = vaddr.checked_add(len)?;
        (end <= start + mlen)
            .then(|| SharedSpan { fd: fd.clone(), offset: ((vaddr - start) & !(PAGE_SIZE - 1)) as u64 })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The file behind the mapping.
    pub fn fd(&self) -> &Arc<OwnedFd> {
        &self.fd
    }

    /// The descriptor, borrowed.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The 32-bit word at byte `off`, for atomics both processes use.
    pub fn word(&self, off: usize) -> Option<&AtomicU32> {
        if off % 4 != 0 || off.checked_add(4)? > self.len {
            return None;
        }
        // SAFETY: in bounds and aligned (the mapping is page-aligned); the
        // mapping lives as long as `self`, and every access to shared
        // words goes through atomics.
        Some(unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() })
    }

    /// The mapping as `len / 4` atomic words.
    pub fn words(&self) -> &[AtomicU32] {
        // SAFETY: as in `word`, for the whole mapping.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<AtomicU32>(), self.len / 4) }
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        if self.listed {
            LISTED.lock().unwrap_or_else(|p| p.into_inner()).remove(&(self.ptr.as_ptr() as usize));
        }
        // SAFETY: we own the mapping; nothing refers to it after drop.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Waits while `word` holds `expected`, at most `timeout` (a futex any
/// process mapping the word can wake: not private). Returns on a wake, a
/// changed value, a signal or the timeout; callers re-check.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as _, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: FUTEX_WAIT reads the word at a valid address; the timespec
    // lives across the call.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec);
    }
}

/// Wakes one waiter on `word` in any process.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_second_mapping_of_the_file_sees_the_first_ones_writes() {
        let a = SharedMemory::new(3 * PAGE_SIZE).unwrap();
        a.word(PAGE_SIZE + 8).unwrap().store(0xdead_beef, Ordering::Release);
        let b = SharedMemory::from_fd(a.fd().clone(), PAGE_SIZE as u64, PAGE_SIZE).unwrap();
        assert_eq!(b.word(8).unwrap().load(Ordering::Acquire), 0xdead_beef);
        assert!(b.word(PAGE_SIZE).is_none() && b.word(3).is_none());
    }

    #[test]
    fn a_file_that_could_shrink_is_refused() {
        // SAFETY: creates a descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC)) };
        // SAFETY: sizes our own descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE_SIZE as libc::off_t) }, 0);
        assert!(matches!(SharedMemory::from_fd(Arc::new(fd), 0, PAGE_SIZE), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn ranges_the_file_does_not_hold_are_refused() {
        let a = SharedMemory::new(PAGE_SIZE).unwrap();
        assert!(SharedMemory::from_fd(a.fd().clone(), 0, 2 * PAGE_SIZE).is_err());
        assert!(SharedMemory::from_fd(a.fd().clone(), 1, PAGE_SIZE).is_err());
        assert!(SharedMemory::from_fd(a.fd().clone(), !4095u64, PAGE_SIZE).is_err());
    }

    #[test]
    fn find_names_the_file_and_page_of_a_listed_range_only() {
        let a = SharedMemory::new(4 * PAGE_SIZE).unwrap();
        let base = a.as_ptr() as usize;
        let s = SharedMemory::find(base + PAGE_SIZE + 100, 2 * PAGE_SIZE).unwrap();
        assert_eq!(s.offset, PAGE_SIZE as u64);
        assert!(Arc::ptr_eq(&s.fd, a.fd()));
        assert!(SharedMemory::find(base + PAGE_SIZE, 4 * PAGE_SIZE).is_none(), "runs past the end");
        let heap = [0u8; 64];
        assert!(SharedMemory::find(heap.as_ptr() as usize, 64).is_none());
        drop(a);
        assert!(SharedMemory::find(base, 1).is_none(), "unlisted once dropped");
    }

    #[test]
    fn a_futex_wait_returns_when_woken() {
        let m = Arc::new(SharedMemory::new(PAGE_SIZE).unwrap());
        m.word(0).unwrap().store(1, Ordering::SeqCst);
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            while m2.word(0).unwrap().load(Ordering::SeqCst) == 1 {
                futex_wait(m2.word(0).unwrap(), 1, Duration::from_secs(5));
            }
        });
        m.word(0).unwrap().store(0, Ordering::SeqCst);
        futex_wake(m.word(0).unwrap());
        t.join().unwrap();
    }
}
