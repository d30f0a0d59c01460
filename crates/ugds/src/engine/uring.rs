//! The kernel path's queue: an io_uring ring standing where a controller's
//! queue pair stands, so that every API above (synchronous, lent queues,
//! batches, stream-ordered I/O) runs on it unchanged.
//!
//! The engine hands it the same commands it hands a controller: a Read or
//! Write of blocks at an LBA with its PRPs, a Flush, a Write Zeroes. The
//! kernel path's platform maps user memory at its own address, so PRP1 is
//! the virtual address of the command's first byte, and a command's data is
//! contiguous there. Each command becomes one io_uring operation on the
//! file: through the `O_DIRECT` descriptor when the memory, offset and size
//! are aligned as the file needs, else through the page cache (cuFile's
//! compatibility mode does the same). Completions come back as NVMe
//! completion entries, with the errno mapped to the nearest NVMe status
//! (ENOSPC to Capacity Exceeded, a write to a read-only file to Namespace
//! Write Protected, EFBIG or a write that makes no progress to LBA Out of
//! Range, EIO to a media error, any other errno to a vendor-specific status
//! whose code is the errno). A read that
//! meets the end of the file completes successfully with the bytes it did
//! not move in DW0 (which a controller leaves zero for a Read), so that a
//! read across the end returns the bytes there were, as `pread` and cuFile
//! do. A transfer the kernel did in part (a short read or write, EINTR,
//! EAGAIN) is resubmitted for the rest under the same CID; one that
//! `O_DIRECT` refused (EINVAL) goes through the page cache instead.
//!
//! A command on GPU memory (the platform maps it above
//! [`DEVICE_IOVA_BASE`]) borrows a pinned host bounce buffer of its size
//! class from a process-wide pool: a read lands there and is copied to the
//! device when it completes, a write is copied from the device before it is
//! submitted. The reaper copies one command's data while the kernel reads
//! the next ones, so a large request moves at about the slower of the disk
//! and the copy engine. Bounce buffers are pinned once and kept for the
//! process (unpinning waits for the device).

use super::kernel::KernelRing;
use super::qpair::{CqView, Full, Owner};
use super::tracker::Tracker;
use crate::{Error, Result};
use std::sync::Arc;
use std::sync::Mutex;
use ugds_nvme::status::{generic, media};
use ugds_nvme::{Cid, Cqe, NvmOpcode, Qid, Sqe, Status};
use ugds_platform::kernel::{KernelPlatform, DEVICE_IOVA_BASE};
use ugds_platform::sys::uring::{NvmeUringCmd, Op, Ring};
use ugds_platform::sys::EventFd;

/// Registered file indexes: the `O_DIRECT` descriptor (the buffered one
/// again when the file takes no direct I/O), and the buffered one.
const DIRECT: u32 = 0;
const BUFFERED: u32 = 1;

/// `FALLOC_FL_KEEP_SIZE | FALLOC_FL_ZERO_RANGE`.
const ZERO_RANGE: i32 = 0x01 | 0x10;

use generic::{CAPACITY_EXCEEDED, NAMESPACE_WRITE_PROTECTED as WRITE_PROTECTED};

/// What a command is, for the ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Kind {
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
    kind: Kind,
    file: u32,
    addr: usize,
    len: u32,
    offset: u64,
    /// Bytes moved so far.
    done: u32,
    /// GPU memory the data goes to or comes from (`addr` is then a bounce
    /// buffer of size class `class`), or 0.
    device: u64,
    class: u8,
    /// NVMe passthrough: the namespace (0: a file) and log2 of its LBA size.
    nsid: u32,
    lba_shift: u8,
    /// Passthrough resubmissions after EFAULT (see `process_completions`).
    faults: u8,
}

/// Smallest and largest bounce buffer: 4 KiB << class, class 0..=8.
const BOUNCE_CLASSES: usize = 9;

/// Pinned host bounce buffers, by size class, free for any queue. Taken
/// and given back on the GPU path only.
static BOUNCE: Mutex<[Vec<usize>; BOUNCE_CLASSES]> = Mutex::new([const { Vec::new() }; BOUNCE_CLASSES]);

/// A bounce buffer of at least `len` bytes (at most 1 MiB): from the pool,
/// or made and pinned by `runtime`. Its address and class.
fn bounce_take(len: usize, runtime: &dyn ugds_platform::device::DeviceRuntime) -> Result<(usize, u8)> {
    let class = (len.max(4096).next_power_of_two().trailing_zeros() - 12) as usize;
    if class >= BOUNCE_CLASSES {
        return Err(Error::InvalidArgument(format!("a command of {len} bytes (the kernel path's limit is 1 MiB)")));
    }
    if let Some(p) = BOUNCE.lock().unwrap_or_else(|p| p.into_inner())[class].pop() {
        return Ok((p, class as u8));
    }
    let mem = ugds_platform::sys::Anonymous::populated(4096 << class)?;
    let ptr = mem.as_ptr();
    // Kept for the process: the pool hands it out again, and unpinning
    // would wait for the device.
    std::mem::forget(mem);
    if !runtime.host_register(ptr, 4096 << class) {
        tracing::info!("bounce buffer not pinned: the runtime stages its copies");
    }
    Ok((ptr as usize, class as u8))
}

fn bounce_give(addr: usize, class: u8) {
    BOUNCE.lock().unwrap_or_else(|p| p.into_inner())[class as usize].push(addr);
}

impl Transfer {
    /// The operation for what is left of it.
    fn op(&self) -> Op {
        if self.nsid != 0 {
            return self.nvme_op();
        }
        let (addr, len, offset) =
            (self.addr + self.done as usize, self.len - self.done, self.offset + self.done as u64);
        match self.kind {
            Kind::Read => Op::Read { file: self.file, addr: addr as *mut u8, len, offset },
            Kind::Write => Op::Write { file: self.file, addr: addr as *const u8, len, offset },
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
unsafe fn fault_in(addr: usize, len: usize, write: bool) {
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
fn refused(s: Status) -> Transfer {
    Transfer { kind: Kind::Refused((s.sct as u16) << 8 | s.sc as u16), ..Default::default() }
}

/// How a command that reached the kernel ended, as an NVMe status.
fn status_of(kind: Kind, errno: i32) -> Status {
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

/// A ring on a kernel-path file; see the module docs.
pub struct UringQueue {
    ring: Ring,
    tracker: Tracker<Transfer>,
    platform: Arc<KernelPlatform>,
    qid: Qid,
    entries: u16,
    vector: Option<u16>,
    block_size: u32,
    /// Alignment of memory and of offsets and sizes for `O_DIRECT` (none
    /// when the file takes no direct I/O).
    direct: Option<(usize, u64)>,
    /// Commands to resubmit after a partial transfer (reused: no
    /// allocation once grown).
    retry: Vec<Cid>,
    /// NVMe passthrough: the namespace id and log2 of its LBA size.
    passthrough: Option<(u32, u8)>,
    protocol_errors: u64,
}

impl std::fmt::Debug for UringQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringQueue")
            .field("qid", &self.qid.0)
            .field("entries", &self.entries)
            .field("outstanding", &self.tracker.outstanding())
            .finish_non_exhaustive()
    }
}

impl UringQueue {
    /// A ring of `entries` on `platform`'s file, completions signalled on
    /// `vector`'s eventfd when it has one.
    pub fn new(
        platform: Arc<KernelPlatform>,
        interrupt: Option<(u16, &EventFd)>,
        qid: u16,
        entries: u16,
        block_size: u32,
        mode: KernelRing,
    ) -> Result<UringQueue> {
        let entries = entries.clamp(2, 4096);
        let buffered = platform.buffered_fd();
        let direct_fd = platform.direct_fd();
        let passthrough = platform.passthrough_namespace().map(|(nsid, bs, _)| (nsid, bs.trailing_zeros() as u8));
        let files = [direct_fd.unwrap_or(buffered), buffered];
        let (sqpoll, iopoll) = (mode == KernelRing::SqPoll, mode == KernelRing::IoPoll);
        let ring = Ring::new(entries as u32, &files, passthrough.is_some(), sqpoll, iopoll)?;
        if let Some((_, efd)) = interrupt {
            ring.register_eventfd(efd)?;
        }
        let direct = direct_fd.map(|_| {
            let (mem, off) = platform.direct_alignment();
            (mem.max(1) as usize, off.max(1) as u64)
        });
        // As many commands as a controller's queue of `entries` holds.
        let tracker = Tracker::new(entries - 1);
        Ok(UringQueue {
            ring,
            tracker,
            platform,
            qid: Qid(qid),
            entries,
            vector: interrupt.map(|(v, _)| v),
            block_size,
            direct,
            retry: Vec::new(),
            passthrough,
            protocol_errors: 0,
        })
    }

    /// Queue identifier.
    pub fn qid(&self) -> Qid {
        self.qid
    }

    /// Entries.
    pub fn entries(&self) -> u16 {
        self.entries
    }

    /// The eventfd vector completions are signalled on.
    pub fn vector(&self) -> Option<u16> {
        self.vector
    }

    /// Commands that may be submitted now.
    pub fn free_slots(&self) -> usize {
        self.tracker.capacity() as usize - self.tracker.outstanding()
    }

    /// Commands on the ring.
    pub fn outstanding(&self) -> usize {
        self.tracker.outstanding()
    }

    /// Completions that named no command in flight.
    pub fn protocol_errors(&self) -> u64 {
        self.protocol_errors
    }

    /// The commands in flight, for the queue pair's queries.
    pub fn tracker(&mut self) -> &mut Tracker<Transfer> {
        &mut self.tracker
    }

    /// The tracker, read only.
    pub fn tracker_ref(&self) -> &Tracker<Transfer> {
        &self.tracker
    }

    /// What a command becomes on the ring.
    fn transfer(&self, sqe: &Sqe, addr: Option<u64>) -> Transfer {
        let Some(op) = NvmOpcode::from_u8(sqe.opcode()) else {
            return refused(Status::generic(generic::INVALID_OPCODE));
        };
        let bs = self.block_size as u64;
        let slba = sqe.cdw10 as u64 | (sqe.cdw11 as u64) << 32;
        let nlb = (sqe.cdw12 & 0xffff) as u64 + 1;
        let (offset, len) = (slba * bs, nlb * bs);
        let writes = matches!(op, NvmOpcode::Write | NvmOpcode::WriteZeroes);
        if writes && !self.platform.writable() {
            return refused(Status::generic(WRITE_PROTECTED));
        }
        let (nsid, lba_shift) = self.passthrough.unwrap_or((0, 0));
        let t = self.transfer_of(op, addr, offset, len);
        if matches!(t.kind, Kind::Refused(_)) {
            return t;
        }
        Transfer { nsid, lba_shift, ..t }
    }

    /// The transfer of a command, the namespace aside.
    fn transfer_of(&self, op: NvmOpcode, addr: Option<u64>, offset: u64, len: u64) -> Transfer {
        match op {
            NvmOpcode::Read | NvmOpcode::Write => {
                let Some(addr) = addr else { return refused(Status::generic(generic::INVALID_FIELD)) };
                let kind = if op == NvmOpcode::Read { Kind::Read } else { Kind::Write };
                let (host, device, class) = if addr >= DEVICE_IOVA_BASE {
                    match self.bounce_for(kind, addr, len as usize) {
                        Ok((host, class)) => (host, addr, class),
                        Err(s) => return refused(s),
                    }
                } else {
                    (addr as usize, 0, 0)
                };
                let aligned =
                    self.direct.is_some_and(|(mem, off)| host % mem == 0 && offset % off == 0 && len % off == 0);
                Transfer {
                    kind,
                    file: if aligned { DIRECT } else { BUFFERED },
                    addr: host,
                    len: len as u32,
                    offset,
                    done: 0,
                    device,
                    class,
                    nsid: 0,
                    lba_shift: 0,
                    faults: 0,
                }
            }
            NvmOpcode::Flush => Transfer { kind: Kind::Sync, ..Default::default() },
            NvmOpcode::WriteZeroes => Transfer { kind: Kind::Zero, len: len as u32, offset, ..Default::default() },
            _ => refused(Status::generic(generic::INVALID_OPCODE)),
        }
    }

    /// A bounce buffer for a command on the GPU memory mapped at `iova`:
    /// for a write, filled from the device now.
    fn bounce_for(&self, kind: Kind, iova: u64, len: usize) -> std::result::Result<(usize, u8), Status> {
        let transfer_error = Status::generic(generic::DATA_TRANSFER_ERROR);
        let Some((dev, runtime)) = self.platform.device_at(iova, len) else { return Err(transfer_error) };
        let (host, class) = bounce_take(len, &*runtime).map_err(|e| {
            tracing::error!("no bounce buffer for a GPU transfer: {e}");
            Status::generic(generic::INTERNAL_ERROR)
        })?;
        if kind == Kind::Write {
            // SAFETY: the bounce buffer is this command's alone, `len` bytes
            // of it (its class holds at least that); the device range lies
            // in registered GPU memory, held by the request.
            let dst = unsafe { std::slice::from_raw_parts_mut(host as *mut u8, len) };
            // SAFETY: as above.
            if let Err(e) = unsafe { runtime.copy_from_device(dst, dev) } {
                tracing::error!("copy from GPU memory for a write failed: {e}");
                bounce_give(host, class);
                return Err(transfer_error);
            }
        }
        Ok((host, class))
    }

    /// Stages a command (its data at `addr`, PRP1 of its plan). Not seen by
    /// the kernel until [`ring_sq_doorbell`](Self::ring_sq_doorbell).
    pub fn submit(&mut self, sqe: Sqe, addr: Option<u64>, owner: Owner) -> std::result::Result<Cid, Full> {
        if self.tracker.is_full() {
            return Err(Full::Cid);
        }
        let t = self.transfer(&sqe, addr);
        let cid = self.tracker.begin_with(owner, None, t).expect("a CID is free");
        // SAFETY: the memory is the registered buffer's, which the request
        // holds until this command's completion is consumed.
        if !unsafe { self.ring.push(t.op(), cid.0 as u64) } {
            self.tracker.end(cid).expect("just begun");
            return Err(Full::Sq);
        }
        Ok(cid)
    }

    /// One direct read of a block at offset 0 into memory of its own,
    /// waited for: whether this ring can read the file at all.
    pub fn probe(mut self) -> Result<()> {
        let (_, off_align) = self.platform.direct_alignment();
        let len = (off_align as usize).clamp(4096, 1 << 20);
        let mem = ugds_platform::sys::Anonymous::populated(len)?;
        let t = Transfer {
            kind: Kind::Read,
            file: DIRECT,
            addr: mem.as_ptr() as usize,
            len: len as u32,
            ..Default::default()
        };
        let op = match self.passthrough {
            Some((nsid, shift)) => Transfer { nsid, lba_shift: shift, ..t }.op(),
            None => t.op(),
        };
        // SAFETY: `mem` outlives the operation: this function waits for its
        // completion (or leaks `mem` if it does not come).
        if !unsafe { self.ring.push(op, 0) } {
            return Err(Error::QueueFull);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut got = None;
        while got.is_none() {
            self.ring.submit()?;
            self.ring.reap(1, |_, res, _| got = Some(res));
            if std::time::Instant::now() > deadline {
                std::mem::forget(mem);
                return Err(Error::Platform("no completion within 5 s".into()));
            }
        }
        match got.expect("set above") {
            r if r >= 0 => Ok(()),
            r => Err(Error::io("read", std::io::Error::from_raw_os_error(-r))),
        }
    }

    /// Hands the staged operations to the kernel (one `io_uring_enter`).
    pub fn ring_sq_doorbell(&mut self) {
        if self.ring.staged() > 0 {
            if let Err(e) = self.ring.submit() {
                tracing::error!(qid = self.qid.0, "io_uring submission failed: {e}; retried at the next look");
            }
        }
    }

    /// Whether a completion is waiting.
    pub fn completion_pending(&mut self) -> bool {
        self.ring.completion_pending()
    }

    /// A view for waiting without the lock: a polled ring is always worth
    /// a look (the kernel's tail is behind the ring's lock); an
    /// interrupt-driven one never is, and its eventfd says when.
    pub fn cq_view(&self) -> CqView {
        CqView::always(self.vector.is_none())
    }

    /// Consumes up to `max` completions, calling `f(owner, cqe)` for each
    /// command that finished; partial transfers are resubmitted. Returns
    /// how many commands finished.
    pub fn process_completions(&mut self, max: usize, mut f: impl FnMut(Owner, &Cqe)) -> usize {
        // A submission the kernel refused earlier (EAGAIN, EBUSY) goes now;
        // a device-polled ring finds its completions only by entering.
        if self.ring.polls_device() {
            if let Err(e) = self.ring.submit() {
                tracing::error!(qid = self.qid.0, "io_uring enter failed: {e}");
            }
        } else {
            self.ring_sq_doorbell();
        }
        let mut n = 0;
        let (tracker, retry, qid, errors) = (&mut self.tracker, &mut self.retry, self.qid, &mut self.protocol_errors);
        let direct = self.direct;
        let buffered_only = direct.is_none();
        let platform = &self.platform;
        self.ring.reap(max, |user_data, res, _dw0| {
            let cid = Cid(user_data as u16);
            let mut short = 0;
            let Some(e) = tracker.get_mut(cid) else {
                *errors += 1;
                tracing::error!(qid = qid.0, cid = cid.0, "io_uring completion for no command in flight; ignored");
                return;
            };
            let t = &mut e.extra;
            let status = match (t.kind, res) {
                (Kind::Refused(s), _) => Status::new((s >> 8) as u8, s as u8),
                // Passed through: the NVMe status, or -errno.
                (_, r) if t.nsid != 0 && r >= 0 => {
                    if r == 0 {
                        t.done = t.len;
                    }
                    Status::from_field((r as u16) << 1)
                }
                (_, r) if r == -libc::EINTR || r == -libc::EAGAIN => {
                    retry.push(cid);
                    return;
                }
                // Seen from passthrough on Linux 6.12 (QEMU guest): EFAULT
                // for buffer pages not yet faulted in (the kernel's
                // non-blocking first attempt does not fault them, and does
                // not retry). The pages are faulted in here and the command
                // resubmitted, up to three times.
                (k, r) if r == -libc::EFAULT && t.nsid != 0 && t.faults < 3 => {
                    t.faults += 1;
                    tracing::info!(
                        cid = cid.0,
                        "passthrough command failed with EFAULT; pages faulted in, resubmitted"
                    );
                    // SAFETY: the command's buffer is the registered memory
                    // its request holds, and nothing else uses it during
                    // the I/O (the API's contract); the kernel has finished
                    // with it (this completion). A read's pages are written
                    // back with their own bytes (a write fault), a write's
                    // only read.
                    unsafe { fault_in(t.addr, t.len as usize, k == Kind::Read) };
                    retry.push(cid);
                    return;
                }
                (Kind::Read | Kind::Write, r) if r == -libc::EINVAL && t.file == DIRECT && !buffered_only => {
                    // O_DIRECT refused this alignment after all.
                    t.file = BUFFERED;
                    retry.push(cid);
                    return;
                }
                (k, r) if r < 0 => status_of(k, -r),
                (Kind::Read, 0) => {
                    // The file ends inside the range: the read is short,
                    // and says by how much (DW0, see the module docs).
                    short = t.len - t.done;
                    Status::SUCCESS
                }
                (Kind::Write, 0) => {
                    // Nothing written and no error: the file cannot grow.
                    Status::generic(generic::LBA_OUT_OF_RANGE)
                }
                (Kind::Read | Kind::Write, r) => {
                    t.done += r as u32;
                    if t.done < t.len {
                        // A partial transfer: the rest through the page
                        // cache when it is no longer aligned for O_DIRECT.
                        let still_aligned = direct.is_some_and(|(mem, off)| {
                            (t.addr + t.done as usize) % mem == 0 && t.done as u64 % off == 0
                        });
                        if t.file == DIRECT && !still_aligned {
                            t.file = BUFFERED;
                        }
                        retry.push(cid);
                        return;
                    }
                    Status::SUCCESS
                }
                _ => Status::SUCCESS,
            };
            let e = tracker.end(cid).expect("outstanding");
            let status = match e.extra {
                t if t.device != 0 => finish_on_device(platform, &t, status),
                _ => status,
            };
            let cqe = Cqe { dw0: short, dw1: 0, sqhd: 0, sqid: qid.0, cid: cid.0, status: status.to_field(false) };
            f(e.owner, &cqe);
            n += 1;
        });
        if !self.retry.is_empty() {
            for cid in std::mem::take(&mut self.retry) {
                let op = self.tracker.get_mut(cid).expect("outstanding").extra.op();
                // SAFETY: as at submission; the command still holds its memory.
                while !unsafe { self.ring.push(op, cid.0 as u64) } {
                    // The ring is full of staged entries: hand them over.
                    self.ring_sq_doorbell();
                }
            }
            self.ring_sq_doorbell();
        }
        n
    }

    /// Forgets every command: only when none can complete any more (the
    /// ring is being dropped).
    pub fn forget_outstanding(&mut self) -> usize {
        let n = self.tracker.outstanding();
        self.tracker.forget_all();
        n
    }
}

/// The end of a command on GPU memory: a read's bytes copied on to the
/// device; the bounce buffer back to the pool.
fn finish_on_device(platform: &KernelPlatform, t: &Transfer, status: Status) -> Status {
    let mut status = status;
    if t.kind == Kind::Read && status.is_success() && t.done > 0 {
        let copied = platform.device_at(t.device, t.done as usize).map(|(dev, runtime)| {
            // SAFETY: the kernel is done with the bounce buffer (its
            // completion is consumed); `done` bytes of it were read.
            let src = unsafe { std::slice::from_raw_parts(t.addr as *const u8, t.done as usize) };
            // SAFETY: the range lies in registered GPU memory the request holds.
            unsafe { runtime.copy_to_device(dev, src) }
        });
        if !matches!(copied, Some(Ok(()))) {
            tracing::error!(?copied, "copy of a read to GPU memory failed");
            status = Status::generic(generic::DATA_TRANSFER_ERROR);
        }
    }
    bounce_give(t.addr, t.class);
    status
}
