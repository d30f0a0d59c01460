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
//! class from a process-wide pool. The copies between bounce buffer and
//! device are started, never waited for, under the queue's lock: a read's
//! copy starts when the kernel's part completes and the command completes
//! when the runtime says the copy is done; a write's copy from the device
//! starts at submission and the command goes to the ring when it is done.
//! So the kernel reads the next commands of a request while earlier ones
//! are copied, a large request moves at about the slower of the disk and
//! the copy engine, and no thread waits for the device while it holds the
//! queue. Waiters poll while copies are in flight (an interrupt-driven
//! ring's eventfd says nothing about them; see [`UringQueue::cq_view`]).
//! Bounce buffers are pinned once and kept for the process (unpinning waits
//! for the device).

mod copy;
mod options;
pub use options::{CachePolicy, KernelRing};
mod transfer;

use super::bounce::{self, Bounce};
use super::qpair::{CqView, Full, Owner};
use super::stats::{QueueCounters, Staged};
use super::tracker::Tracker;
use crate::engine::transport::Transport;
use copy::Copying;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
pub use transfer::Transfer;
use transfer::{fault_in, refusal, refused, status_of, Kind, BUFFERED, DIRECT, WRITE_PROTECTED};
use ugds_nvme::status::generic;
use ugds_nvme::{Cid, Cqe, NvmOpcode, Qid, Sqe, Status};
use ugds_platform::kernel::{KernelPlatform, DEVICE_IOVA_BASE};
use ugds_platform::sys::uring::{Ring, BOUNCE_BUFFERS};
use ugds_platform::sys::EventFd;
use ugds_platform::{Error, Result};

/// A ring on a kernel-path file; see the module docs.
/// How long after its first EFAULT a passthrough command is still faulted
/// in and resubmitted (see `process_completions`).
const EFAULT_RETRY_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

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
    /// GPU reads whose bytes are on their way to the device, in the order
    /// their copies were started (each runtime finishes its copies in order).
    landing: VecDeque<Copying>,
    /// GPU writes whose bytes are on their way from the device; each goes
    /// to the ring when they are here.
    staging: VecDeque<Copying>,
    /// `landing` and `staging` together, for waiters without the lock.
    copies: Arc<AtomicU32>,
    /// The platform's host epoch this ring's registered slots reflect.
    host_epoch: u64,
    /// Commands staged, counted here and published at the doorbell.
    staged: Staged,
    /// What this ring has done (read by its handle).
    counters: Arc<QueueCounters>,
    /// Whether reads and writes go through the page cache.
    cache: CachePolicy,
    /// `Auto`: reads in a row that found nothing cached, and reads since
    /// the last attempt once that passed [`CACHE_MISSES`].
    cache_misses: u32,
    cache_skipped: u32,
    /// `Auto`: reads in a row that the page cache served, and reads placed
    /// (for the canaries; see [`place`](Self::place)).
    cache_hit_run: u32,
    cache_placed: u32,
    /// The file refused a read without waiting: the cache is not tried.
    cache_unsupported: bool,
    /// Cached reads into GPU memory of [`OFFLOAD_MIN`] and more go to the
    /// kernel's workers ([`offload_cached_reads`]).
    offload: bool,
}

/// `CachePolicy::Auto`: after this many reads in a row found nothing in the
/// page cache, only every this many-th read tries it (without `cachestat`).
const CACHE_MISSES: u32 = 16;

/// `CachePolicy::Auto`: after this many reads in a row the page cache
/// served, reads try it without asking first, but for one in
/// [`CACHE_CANARY`].
const CACHE_HOT_RUN: u32 = 16;

/// `CachePolicy::Auto`: while reads try the page cache without asking,
/// one in this many asks first, so that a workload turning cold meets at
/// most this many less one tries that miss (each of which starts the
/// kernel's readahead on the disk the direct reads then wait for).
const CACHE_CANARY: u32 = 8;

/// The smallest cached read into GPU memory that [`offload_cached_reads`]
/// hands to the kernel's workers: below it a worker's wake-up costs more
/// than the copy.
const OFFLOAD_MIN: usize = 256 << 10;

/// Whether cached reads into GPU memory of [`OFFLOAD_MIN`] and more run on
/// the kernel's io-wq workers (`IOSQE_ASYNC`) rather than inline in the
/// submitting thread's `io_uring_enter`. Inline, the 32 commands of a 16
/// MiB read copy the page cache one after another on one CPU while their
/// bounce buffers go to the device behind them; on the workers the page
/// cache copies run side by side. On the 16-core H100 VM (docs/benchmarks.md)
/// cached 16 MiB reads into GPU memory went from 3963-5729 to 6923-7401
/// MiB/s; reads into host memory of 1 and 4 MiB lost 15% (and 16 MiB
/// went either way), so they stay inline. On a 2-core VM the workers
/// compete with the caller, so only with 8 CPUs or more;
/// `UGDS_CACHED_READ_WORKERS=on` or `off` decides instead (read once;
/// another value fails every queue's creation, so the handle's open).
fn offload_cached_reads() -> Result<bool> {
    static ON: std::sync::OnceLock<std::result::Result<bool, String>> = std::sync::OnceLock::new();
    ON.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        cached_read_workers(std::env::var("UGDS_CACHED_READ_WORKERS").ok().as_deref(), cpus)
    })
    .clone()
    .map_err(Error::InvalidArgument)
}

/// [`offload_cached_reads`] from `UGDS_CACHED_READ_WORKERS` (its value, if
/// set) and the CPUs there are.
fn cached_read_workers(value: Option<&str>, cpus: usize) -> std::result::Result<bool, String> {
    match value {
        None | Some("") => Ok(cpus >= 8),
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(v) => Err(format!("UGDS_CACHED_READ_WORKERS={v:?}: on or off")),
    }
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
        let offload = offload_cached_reads()?;
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
            landing: VecDeque::new(),
            staging: VecDeque::new(),
            copies: Arc::new(AtomicU32::new(0)),
            host_epoch: 0,
            staged: Staged::default(),
            counters: Arc::default(),
            cache: CachePolicy::Direct,
            cache_misses: 0,
            cache_skipped: 0,
            cache_hit_run: 0,
            cache_placed: 0,
            cache_unsupported: false,
            offload,
        })
    }

    /// Sets whether reads and writes go through the page cache (a ring
    /// passed through has none: ignored there).
    pub fn set_cache_policy(&mut self, cache: CachePolicy) {
        self.cache = cache;
    }

    /// Where a read or write on the file goes under the cache policy:
    /// `Buffered` through the page cache; `Auto` reads first in it without
    /// waiting where it holds some of the range.
    ///
    /// `Auto` asks the kernel what is cached (`cachestat`) before it tries:
    /// a read that fails without waiting still starts the kernel's
    /// readahead, which competes with the direct reads for the disk (seen:
    /// a batch of 128 fresh 4 KiB reads after cached ones took twice as
    /// long). While reads keep hitting ([`CACHE_HOT_RUN`] in a row) they
    /// try without asking, the system call saved, but for one in
    /// [`CACHE_CANARY`], whose answer ends the run when the data has gone
    /// cold.
    fn place(&mut self, t: &mut Transfer) {
        if t.nsid != 0 || !matches!(t.kind, Kind::Read | Kind::Write) {
            return;
        }
        match self.cache {
            CachePolicy::Buffered => t.file = BUFFERED,
            CachePolicy::Auto if t.kind == Kind::Read && t.file == DIRECT && !self.cache_unsupported => {
                self.cache_placed = self.cache_placed.wrapping_add(1);
                let blind = self.cache_hit_run >= CACHE_HOT_RUN && self.cache_placed % CACHE_CANARY != 0;
                if !blind {
                    let (off, left) = (t.offset + t.done as u64, (t.len - t.done) as u64);
                    match self.platform.cached_pages(off, left) {
                        Some(n) if n > 0 => {}
                        Some(_) => {
                            self.cache_hit_run = 0;
                            self.cache_misses = self.cache_misses.saturating_add(1);
                            self.counters.cache_misses.add(1);
                            return;
                        }
                        // No cachestat (Linux before 6.5): after a run of
                        // misses, only every CACHE_MISSES-th read tries.
                        None if self.cache_misses >= CACHE_MISSES => {
                            self.cache_skipped += 1;
                            if self.cache_skipped % CACHE_MISSES != 0 {
                                return;
                            }
                        }
                        None => {}
                    }
                }
                t.file = BUFFERED;
                t.nowait = true;
                t.offload = self.offload && t.device != 0 && t.len as usize >= OFFLOAD_MIN;
            }
            _ => {}
        }
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
                let (host, device, bounce) = if addr >= DEVICE_IOVA_BASE {
                    match self.bounce_for(addr, len as usize) {
                        Ok(b) => (b.addr, addr, Some(b)),
                        Err(s) => return refused(s),
                    }
                } else {
                    (addr as usize, 0, None)
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
                    bounce,
                    fixed: None,
                    nsid: 0,
                    lba_shift: 0,
                    nowait: false,
                    offload: false,
                    faults: 0,
                    first_fault: None,
                }
            }
            NvmOpcode::Flush => Transfer { kind: Kind::Sync, ..Default::default() },
            NvmOpcode::WriteZeroes => Transfer { kind: Kind::Zero, len: len as u32, offset, ..Default::default() },
            _ => refused(Status::generic(generic::INVALID_OPCODE)),
        }
    }

    /// A bounce buffer for a command on the GPU memory mapped at `iova`.
    fn bounce_for(&self, iova: u64, len: usize) -> std::result::Result<Bounce, Status> {
        let Some((_, runtime)) = self.platform.device_at(iova, len) else {
            return Err(Status::generic(generic::DATA_TRANSFER_ERROR));
        };
        bounce::take(len, &*runtime).map_err(|e| {
            tracing::error!("no bounce buffer for a GPU transfer: {e}");
            Status::generic(generic::INTERNAL_ERROR)
        })
    }

    /// Stages a command (its data at `addr`, PRP1 of its plan). Not seen by
    /// the kernel until [`ring_sq_doorbell`](Self::ring_sq_doorbell); a
    /// write from GPU memory not before its bytes are copied off the device
    /// (see [`process_completions`](Self::process_completions)).
    pub fn submit(&mut self, sqe: Sqe, addr: Option<u64>, owner: Owner) -> std::result::Result<Cid, Full> {
        if self.tracker.is_full() {
            return Err(Full::Cid);
        }
        let mut t = self.transfer(&sqe, addr);
        self.place(&mut t);
        if let Some(b @ Bounce { index: Some(i), .. }) = t.bounce {
            // SAFETY: bounce slabs are mapped for the process's life and
            // their slot numbers are theirs alone (generation 1).
            if unsafe { self.platform.fixed_buffer(&mut self.ring, i, 1, b.slab.0 as *mut u8, b.slab.1) } {
                t.fixed = Some(i);
            }
        } else if t.device == 0 && t.nsid == 0 && matches!(t.kind, Kind::Read | Kind::Write) {
            t.fixed = self.fixed_host(t.addr, t.len as usize);
        }
        if t.kind == Kind::Write && t.device != 0 {
            match self.start_copy_from_device(&t) {
                Ok((ticket, runtime)) => {
                    let cid = self.tracker.begin_with(owner, None, t).expect("a CID is free");
                    self.staging.push_back(Copying { cid, ticket, runtime, short: 0 });
                    self.copies.fetch_add(1, Ordering::Release);
                    self.staged.add(sqe.opcode(), sqe.nlb());
                    self.tracker.staged(cid, &sqe);
                    return Ok(cid);
                }
                Err(e) => {
                    // Completes with the error (the bounce buffer goes back then).
                    tracing::error!("copy from GPU memory for a write failed: {e}");
                    t.kind = refusal(Status::generic(generic::DATA_TRANSFER_ERROR));
                }
            }
        }
        let cid = self.tracker.begin_with(owner, None, t).expect("a CID is free");
        // SAFETY: the memory is the registered buffer's (or the command's
        // bounce buffer), which the request holds until this command's
        // completion is consumed.
        if !unsafe { self.ring.push(t.op(), cid.0 as u64) } {
            self.tracker.undo(cid).expect("just begun");
            if let Some(b) = t.bounce {
                bounce::give(b);
            }
            return Err(Full::Sq);
        }
        self.staged.add(sqe.opcode(), sqe.nlb());
        self.tracker.staged(cid, &sqe);
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

    /// The registered-buffer slot of the caller's host memory at
    /// `addr..addr + len`, registered with this ring if it was not yet;
    /// first, slots of memory no longer registered are released.
    fn fixed_host(&mut self, addr: usize, len: usize) -> Option<u16> {
        let epoch = self.platform.host_epoch();
        if epoch != self.host_epoch {
            self.host_epoch = epoch;
            let now = self.platform.host_slot_generations();
            for (i, &g) in now.iter().enumerate() {
                let slot = BOUNCE_BUFFERS + i as u16;
                let held = self.ring.fixed_generation(slot);
                if held != 0 && held != g {
                    self.ring.release_fixed(slot);
                }
            }
        }
        let (slot, generation, base, blen) = self.platform.host_buffer(addr, len)?;
        // SAFETY: the registration maps the memory until it is unmapped,
        // which the registry refuses while I/O on it is in flight; a
        // generation names one registration.
        unsafe { self.platform.fixed_buffer(&mut self.ring, slot, generation, base, blen) }.then_some(slot)
    }

    fn cqe(&self, cid: Cid, status: Status, short: u32) -> Cqe {
        Cqe { dw0: short, dw1: 0, sqhd: 0, sqid: self.qid.0, cid: cid.0, status: status.to_field(false) }
    }
}

impl Transport for UringQueue {
    type Extra = Transfer;

    /// Queue identifier.
    fn qid(&self) -> Qid {
        self.qid
    }

    /// Entries.
    fn entries(&self) -> u16 {
        self.entries
    }

    /// The eventfd vector completions are signalled on.
    fn vector(&self) -> Option<u16> {
        self.vector
    }

    /// Commands that may be submitted now.
    fn free_slots(&self) -> usize {
        self.tracker.capacity() as usize - self.tracker.outstanding()
    }

    /// Completions that named no command in flight.
    fn protocol_errors(&self) -> u64 {
        self.protocol_errors
    }

    /// The commands in flight, for the queue pair's queries.
    fn tracker_mut(&mut self) -> &mut Tracker<Transfer> {
        &mut self.tracker
    }

    /// The tracker, read only.
    fn tracker(&self) -> &Tracker<Transfer> {
        &self.tracker
    }

    /// What this ring has done.
    fn counters(&self) -> &Arc<QueueCounters> {
        &self.counters
    }

    /// A view for waiting without the lock: a polled ring is always worth
    /// a look (the kernel's tail is behind the ring's lock); an
    /// interrupt-driven one is while copies to or from the GPU are in
    /// flight (nothing signals their end), else its eventfd says when.
    fn cq_view(&self) -> CqView {
        CqView::kernel(self.vector.is_none(), self.copies.clone())
    }

    /// Whether a completion is waiting (or a copy to or from the GPU is
    /// in flight, which only a look finishes).
    fn completion_pending(&mut self) -> bool {
        !self.landing.is_empty() || !self.staging.is_empty() || self.ring.completion_pending()
    }

    /// Consumes up to `max` completions, calling `f(owner, cqe)` for each
    /// command that finished; partial transfers are resubmitted. Returns
    /// how many commands finished.
    fn process_completions(&mut self, max: usize, mut f: impl FnMut(Owner, &Cqe)) -> usize {
        let (mut done, mut failed) = (0u64, 0u64);
        let mut f = |owner: Owner, cqe: &Cqe| {
            done += 1;
            failed += !cqe.status().is_success() as u64;
            f(owner, cqe)
        };
        let mut n = 0;
        if !self.landing.is_empty() || !self.staging.is_empty() {
            n += self.advance_copies(&mut f);
        }
        // A submission the kernel refused earlier (EAGAIN, EBUSY) goes now;
        // a device-polled ring finds its completions only by entering.
        if self.ring.polls_device() {
            self.staged.publish(&self.counters);
            self.counters.doorbell_writes.add(1);
            if let Err(e) = self.ring.submit() {
                tracing::error!(qid = self.qid.0, "io_uring enter failed: {e}");
            }
        } else {
            self.ring_sq_doorbell();
        }
        let (tracker, retry, qid, errors) = (&mut self.tracker, &mut self.retry, self.qid, &mut self.protocol_errors);
        let (landing, copies) = (&mut self.landing, &self.copies);
        let direct = self.direct;
        let buffered_only = direct.is_none();
        let platform = &self.platform;
        let (misses, skipped, hit_run) = (&mut self.cache_misses, &mut self.cache_skipped, &mut self.cache_hit_run);
        let unsupported = &mut self.cache_unsupported;
        let counters = &self.counters;
        self.ring.reap(max.saturating_sub(n), |user_data, res, _dw0| {
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
                (Kind::Read, r) if t.nowait && (r == -libc::EAGAIN || r == -libc::EOPNOTSUPP || r == -libc::EINVAL) => {
                    if r == -libc::EAGAIN {
                        // Not in the page cache.
                        *hit_run = 0;
                        *misses = misses.saturating_add(1);
                        counters.cache_misses.add(1);
                    } else {
                        // The file takes no RWF_NOWAIT (tmpfs before Linux
                        // 6.x, some network filesystems): this ring stops
                        // trying.
                        *unsupported = true;
                    }
                    // From the disk, directly where what is left is aligned.
                    t.nowait = false;
                    t.file = if t.rest_aligned(direct) { DIRECT } else { BUFFERED };
                    retry.push(cid);
                    return;
                }
                (_, r) if r == -libc::EINTR || r == -libc::EAGAIN => {
                    retry.push(cid);
                    return;
                }
                // Seen from passthrough on Linux 6.12 (QEMU guest): EFAULT
                // for buffer pages not yet faulted in (the kernel's
                // non-blocking first attempt does not fault them, and does
                // not retry). The pages are faulted in here and the command
                // resubmitted: three times, and then for as long as the
                // first EFAULT is under a second old (once in a CI run, three
                // quick retries of 4 reads in a batch of 256 all met EFAULT
                // again: a transient state of the pages, gone on a rerun).
                (k, r)
                    if r == -libc::EFAULT
                        && t.nsid != 0
                        && t.faults < u8::MAX
                        && (t.faults < 3 || t.first_fault.is_some_and(|f| f.elapsed() < EFAULT_RETRY_WINDOW)) =>
                {
                    t.faults += 1;
                    t.first_fault.get_or_insert_with(std::time::Instant::now);
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
                    if t.nowait {
                        *misses = 0;
                        *skipped = 0;
                        *hit_run = hit_run.saturating_add(1);
                        counters.cache_hits.add(1);
                    }
                    t.done += r as u32;
                    if t.done < t.len {
                        // A partial transfer: the rest through the page
                        // cache when it is no longer aligned for O_DIRECT.
                        if t.file == DIRECT && !t.rest_aligned(direct) {
                            t.file = BUFFERED;
                        }
                        retry.push(cid);
                        return;
                    }
                    Status::SUCCESS
                }
                _ => Status::SUCCESS,
            };
            let mut status = status;
            if t.device != 0 && t.kind == Kind::Read && status.is_success() && t.done > 0 {
                // On to the device; completes when the copy is done.
                match Self::start_copy_to_device(platform, t) {
                    Ok((ticket, runtime)) => {
                        landing.push_back(Copying { cid, ticket, runtime, short });
                        copies.fetch_add(1, Ordering::Release);
                        return;
                    }
                    Err(e) => {
                        tracing::error!("copy of a read to GPU memory failed: {e}");
                        status = Status::generic(generic::DATA_TRANSFER_ERROR);
                    }
                }
            }
            let e = tracker.end(cid, status.to_field(false)).expect("outstanding");
            if e.extra.device != 0 {
                if let Some(b) = e.extra.bounce {
                    bounce::give(b);
                }
            }
            let cqe = Cqe { dw0: short, dw1: 0, sqhd: 0, sqid: qid.0, cid: cid.0, status: status.to_field(false) };
            f(e.owner, &cqe);
            n += 1;
        });
        if !self.retry.is_empty() {
            let mut pushed = 0;
            for i in 0..self.retry.len() {
                let cid = self.retry[i];
                let op = self.tracker.get_mut(cid).expect("outstanding").extra.op();
                // SAFETY: as at submission; the command still holds its memory.
                if !unsafe { self.ring.push(op, cid.0 as u64) } {
                    // The ring is full of staged entries: hand them over.
                    self.ring_sq_doorbell();
                    // SAFETY: as above.
                    if !unsafe { self.ring.push(op, cid.0 as u64) } {
                        // The next slot still holds a passthrough command in
                        // flight (see `Ring::push`): the rest go at a later
                        // look, after its completion.
                        break;
                    }
                }
                pushed += 1;
            }
            self.retry.drain(..pushed);
            self.ring_sq_doorbell();
        }
        self.counters.completed.add(done);
        self.counters.errors.add(failed);
        n
    }

    /// Hands the staged operations to the kernel (one `io_uring_enter`).
    fn ring_sq_doorbell(&mut self) {
        self.staged.publish(&self.counters);
        if self.ring.staged() > 0 {
            self.counters.doorbell_writes.add(1);
            if let Err(e) = self.ring.submit() {
                tracing::error!(qid = self.qid.0, "io_uring submission failed: {e}; retried at the next look");
            }
        }
    }

    /// Forgets every command: only when none can complete any more (the
    /// ring is being dropped). Copies to or from GPU memory still running
    /// are waited for (up to 10 s each; a copy engine that does not finish
    /// then is left its bounce buffer), since the memory goes back to its
    /// owner after this.
    fn forget_outstanding(&mut self) -> usize {
        let n = self.tracker.outstanding();
        for c in self.landing.drain(..).chain(self.staging.drain(..)) {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while matches!(c.runtime.copy_finished(c.ticket), Ok(false)) {
                if std::time::Instant::now() > deadline {
                    tracing::error!(cid = c.cid.0, "a copy to or from GPU memory did not finish in 10 s");
                    break;
                }
                std::thread::yield_now();
            }
        }
        self.copies.store(0, Ordering::Release);
        self.tracker.forget_all();
        n
    }
}

#[cfg(test)]
mod tests;
