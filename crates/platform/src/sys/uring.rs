//! io_uring, for the kernel path: one ring per queue, the file's
//! descriptors registered (fixed files), and the four operations the
//! kernel path needs.

use super::EventFd;
use crate::{Error, Result};
use io_uring::{opcode, types, IoUring};
use std::os::fd::{AsRawFd, BorrowedFd};

/// One operation on a registered file (`file` is its index in the
/// registration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Reads `len` bytes at `offset` into `addr`.
    Read {
        /// Registered file index.
        file: u32,
        /// Destination.
        addr: *mut u8,
        /// Bytes.
        len: u32,
        /// File offset.
        offset: u64,
    },
    /// Writes `len` bytes from `addr` at `offset`.
    Write {
        /// Registered file index.
        file: u32,
        /// Source.
        addr: *const u8,
        /// Bytes.
        len: u32,
        /// File offset.
        offset: u64,
    },
    /// `fdatasync` (or `fsync` without `data_only`).
    Sync {
        /// Registered file index.
        file: u32,
        /// Data (and what is needed to read it back) only.
        data_only: bool,
    },
    /// Nothing (completes with 0): stands for a command refused at
    /// submission, so that its refusal arrives as a completion.
    Nop,
    /// `fallocate` with `mode` over `len` bytes at `offset`.
    Allocate {
        /// Registered file index.
        file: u32,
        /// `FALLOC_FL_*` flags.
        mode: i32,
        /// File offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

/// An io_uring instance.
pub struct Ring {
    ring: IoUring,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("entries", &self.ring.params().sq_entries()).finish_non_exhaustive()
    }
}

impl Ring {
    /// A ring of `entries` submission entries (twice as many completion
    /// entries), with `files` registered as fixed files 0, 1, ...
    pub fn new(entries: u32, files: &[BorrowedFd<'_>]) -> Result<Ring> {
        let ring = IoUring::builder().build(entries).map_err(|e| Error::io("io_uring_setup", e))?;
        let fds: Vec<i32> = files.iter().map(|f| f.as_raw_fd()).collect();
        ring.submitter().register_files(&fds).map_err(|e| Error::io("io_uring_register(files)", e))?;
        Ok(Ring { ring })
    }

    /// Signals `efd` for every completion posted from now on.
    pub fn register_eventfd(&self, efd: &EventFd) -> Result<()> {
        self.ring.submitter().register_eventfd(efd.as_raw_fd()).map_err(|e| Error::io("io_uring_register(eventfd)", e))
    }

    /// Submission entries.
    pub fn entries(&self) -> u32 {
        self.ring.params().sq_entries()
    }

    /// Stages `op` with `user_data`; false when the submission ring is full.
    ///
    /// # Safety
    ///
    /// The memory `op` names must stay valid (and, for reads, not be used
    /// otherwise) until its completion is reaped.
    pub unsafe fn push(&mut self, op: Op, user_data: u64) -> bool {
        let entry = match op {
            Op::Read { file, addr, len, offset } => {
                opcode::Read::new(types::Fixed(file), addr, len).offset(offset).build()
            }
            Op::Write { file, addr, len, offset } => {
                opcode::Write::new(types::Fixed(file), addr, len).offset(offset).build()
            }
            Op::Sync { file, data_only } => {
                let flags = if data_only { types::FsyncFlags::DATASYNC } else { types::FsyncFlags::empty() };
                opcode::Fsync::new(types::Fixed(file)).flags(flags).build()
            }
            Op::Nop => opcode::Nop::new().build(),
            Op::Allocate { file, mode, offset, len } => {
                opcode::Fallocate::new(types::Fixed(file), len).offset(offset).mode(mode).build()
            }
        };
        // SAFETY: the caller keeps the memory valid until the completion
        // (this function's contract); the file is registered.
        unsafe { self.ring.submission().push(&entry.user_data(user_data)).is_ok() }
    }

    /// Tells the kernel about the staged entries (one `io_uring_enter`);
    /// how many it took. EINTR, EAGAIN and EBUSY take none: try again later.
    pub fn submit(&self) -> Result<usize> {
        match self.ring.submit() {
            Ok(n) => Ok(n),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => Ok(0),
            Err(e) => Err(Error::io("io_uring_enter", e)),
        }
    }

    /// Entries staged and not yet taken by the kernel.
    pub fn staged(&mut self) -> usize {
        self.ring.submission().len()
    }

    /// Consumes up to `max` completions, calling `f(user_data, result)`;
    /// how many.
    pub fn reap(&mut self, max: usize, mut f: impl FnMut(u64, i32)) -> usize {
        let mut n = 0;
        let mut cq = self.ring.completion();
        while n < max {
            let Some(c) = cq.next() else { break };
            f(c.user_data(), c.result());
            n += 1;
        }
        n
    }

    /// Whether a completion is waiting.
    pub fn completion_pending(&mut self) -> bool {
        !self.ring.completion().is_empty()
    }
}

/// How a file can take direct I/O: the alignment of memory and of file
/// offsets and sizes (`statx`'s `STATX_DIOALIGN`, Linux 6.1), or `None`
/// when it cannot (or the kernel does not say).
pub fn direct_io_alignment(fd: BorrowedFd<'_>) -> Option<(u32, u32)> {
    // SAFETY: all zeroes is a valid `statx` (plain integers).
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx fills `st`; the empty path with AT_EMPTY_PATH names
    // `fd` itself.
    let r = unsafe { libc::statx(fd.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut st) };
    if r != 0 || st.stx_mask & libc::STATX_DIOALIGN == 0 || st.stx_dio_mem_align == 0 {
        return None;
    }
    Some((st.stx_dio_mem_align, st.stx_dio_offset_align))
}
