//! What a command becomes on the ring: its operation, resumed after a
//! partial transfer, and how its errno reads as an NVMe status.

use crate::engine::bounce::Bounce;
use ugds_nvme::status::{generic, media};
use ugds_nvme::{NvmOpcode, Status};
use ugds_platform::sys::uring::{NvmeUringCmd, Op};

/// Registered file indexes: the `O_DIRECT` descriptor (the buffered one
/// again when the file takes no direct I/O), and the buffered one.
pub(super) const DIRECT: u32 = 0;
pub(super) const BUFFERED: u32 = 1;

/// `FALLOC_FL_KEEP_SIZE | FALLOC_FL_ZERO_RANGE`.
const ZERO_RANGE: i32 = 0x01 | 0x10;

pub(super) use generic::{CAPACITY_EXCEEDED, NAMESPACE_WRITE_PROTECTED as WRITE_PROTECTED};

/// What a command is, for the ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Kind {
    #[default]
    Read,
    Write,
    Sync,
    Zero,
    /// Refused at submission with this status (sct << 8 | sc); completes
    /// through a no-op.
    Refused(u16),
}

/// What the queue keeps of each command besides the tracker's entry: the
/// operation, to resume it after a partial transfer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Transfer {
    pub(super) kind: Kind,
    pub(super) file: u32,
    pub(super) addr: usize,
    pub(super) len: u32,
    pub(super) offset: u64,
    /// Bytes moved so far.
    pub(super) done: u32,
    /// GPU memory the data goes to or comes from (`addr` is then a bounce
    /// buffer, `bounce`), or 0.
    pub(super) device: u64,
    pub(super) bounce: Option<Bounce>,
    /// The bounce buffer's slot in this ring's registered-buffer table,
    /// once the ring holds it there.
    pub(super) fixed: Option<u16>,
    /// NVMe passthrough: the namespace (0: a file) and log2 of its LBA size.
    pub(super) nsid: u32,
    pub(super) lba_shift: u8,
    /// A read tried in the page cache without waiting (`CachePolicy::Auto`);
    /// cleared when it falls back to the disk.
    pub(super) nowait: bool,
    /// A cached read run by the kernel's io-wq workers (`IOSQE_ASYNC`; see
    /// `UringQueue::place`).
    pub(super) offload: bool,
    /// Passthrough resubmissions after EFAULT (see `process_completions`),
    /// and when the first EFAULT came.
    pub(super) faults: u8,
    pub(super) first_fault: Option<std::time::Instant>,
}

impl Transfer {
    /// Whether what is left of it (memory, file offset) is aligned as
    /// `direct` (the file's `O_DIRECT` alignment, if it takes direct I/O)
    /// needs.
    pub(super) fn rest_aligned(&self, direct: Option<(usize, u64)>) -> bool {
        direct.is_some_and(|(mem, off)| {
            (self.addr + self.done as usize) % mem == 0 && (self.offset + self.done as u64) % off == 0
        })
    }

    /// The operation for what is left of it.
    pub(super) fn op(&self) -> Op {
        if self.nsid != 0 {
            return self.nvme_op();
        }
        let (addr, len, offset) =
            (self.addr + self.done as usize, self.len - self.done, self.offset + self.done as u64);
        match self.kind {
            Kind::Read => Op::Read {
                file: self.file,
                addr: addr as *mut u8,
                len,
                offset,
                buffer: self.fixed,
                nowait: self.nowait,
                offload: self.offload && self.nowait,
            },
            Kind::Write => Op::Write { file: self.file, addr: addr as *const u8, len, offset, buffer: self.fixed },
            Kind::Sync => Op::Sync { file: BUFFERED, data_only: true },
            Kind::Zero => Op::Allocate { file: BUFFERED, mode: ZERO_RANGE, offset, len: len as u64 },
            Kind::Refused(_) => Op::Nop,
        }
    }
}

impl Transfer {
    /// The NVMe command that passes this transfer through (whole: the
    /// kernel moves all of it or fails it).
    fn nvme_op(&self) -> Op {
        let slba = self.offset >> self.lba_shift;
        let nlb = (self.len as u64 >> self.lba_shift).max(1) as u32 - 1;
        let rw = |opcode: u8| NvmeUringCmd {
            opcode,
            nsid: self.nsid,
            addr: self.addr as u64,
            data_len: self.len,
            cdw10: slba as u32,
            cdw11: (slba >> 32) as u32,
            cdw12: nlb,
            ..Default::default()
        };
        let cmd = match self.kind {
            Kind::Read => rw(NvmOpcode::Read as u8),
            Kind::Write => rw(NvmOpcode::Write as u8),
            Kind::Sync => NvmeUringCmd { opcode: NvmOpcode::Flush as u8, nsid: self.nsid, ..Default::default() },
            Kind::Zero => NvmeUringCmd { addr: 0, data_len: 0, ..rw(NvmOpcode::WriteZeroes as u8) },
            Kind::Refused(_) => return Op::Nop,
        };
        Op::Nvme { file: DIRECT, cmd }
    }
}

/// Faults in every page of `len` bytes at `addr`, for writing with `write`.
///
/// # Safety
/// The range must be mapped memory no one else accesses meanwhile.
pub(super) unsafe fn fault_in(addr: usize, len: usize, write: bool) {
    let page = ugds_platform::sys::PAGE_SIZE;
    let mut p = addr;
    while p < addr + len {
        let b = p as *mut u8;
        // SAFETY: within the range (the caller's contract).
        unsafe {
            let v = b.read_volatile();
            if write {
                b.write_volatile(v);
            }
        }
        p = (p & !(page - 1)) + page;
    }
}

/// A command refused at submission with `s`.
pub(super) fn refused(s: Status) -> Transfer {
    Transfer { kind: refusal(s), ..Default::default() }
}

pub(super) fn refusal(s: Status) -> Kind {
    Kind::Refused((s.sct as u16) << 8 | s.sc as u16)
}

/// How a command that reached the kernel ended, as an NVMe status.
pub(super) fn status_of(kind: Kind, errno: i32) -> Status {
    match errno {
        libc::ENOSPC | libc::EDQUOT => Status::generic(CAPACITY_EXCEEDED),
        libc::EROFS | libc::EBADF | libc::EACCES | libc::EPERM => Status::generic(WRITE_PROTECTED),
        libc::EINVAL | libc::EOPNOTSUPP => Status::generic(generic::INVALID_FIELD),
        libc::EFBIG => Status::generic(generic::LBA_OUT_OF_RANGE),
        libc::EIO if kind == Kind::Read => Status::new(ugds_nvme::status::sct::MEDIA, media::UNRECOVERED_READ_ERROR),
        libc::EIO => Status::new(ugds_nvme::status::sct::MEDIA, media::WRITE_FAULT),
        // Any other errno as a vendor-specific status whose code is the
        // errno (so the error message names it).
        _ => {
            tracing::warn!(errno, ?kind, "kernel-path command failed: {}", std::io::Error::from_raw_os_error(errno));
            Status::new(ugds_nvme::status::sct::VENDOR, errno.clamp(1, 255) as u8)
        }
    }
}
