//! The emulated controller's thread: registers, queues, commands.

use super::{EmuConfig, Fault, FaultAction, FaultTarget, IovaTable, Shared};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds_nvme::cmd::{cns, feature, log_page, DsmRange};
use ugds_nvme::identify::{IdentifyController, IdentifyNamespace, LbaFormat};
use ugds_nvme::regs::{self, Aqa, Cc, Csts};
use ugds_nvme::ring::Ring;
use ugds_nvme::status::{command_specific as cs, generic};
use ugds_nvme::{prp, AdminOpcode, Iova, NvmOpcode, Sqe, Status, IDENTIFY_LEN};
use ugds_platform::device::DeviceRuntime;
use ugds_platform::dma::DmaRegion;
use ugds_platform::sys::{self, Anonymous};
use ugds_platform::{Error, Result};

/// Commands taken from one submission queue per sweep, so that one busy
/// queue cannot starve the others (round-robin arbitration, burst 64).
const SQ_BURST: u32 = 64;

/// Outstanding Asynchronous Event Requests accepted (Identify ACL/AERL: 4).
const AER_LIMIT: usize = 4;

pub(super) struct Namespace {
    block_size: u32,
    blocks: u64,
    store: Store,
}

enum Store {
    Memory(Anonymous),
    File(File),
    /// Opened with O_DIRECT: transfers go through page-aligned memory only.
    DirectFile(File),
}

impl Namespace {
    pub(super) fn open_all(cfg: &EmuConfig) -> Result<Vec<Namespace>> {
        cfg.namespaces
            .iter()
            .map(|n| {
                let bytes = n.blocks * n.block_size as u64;
                let store = match &n.backing {
                    super::Backing::Memory => Store::Memory(Anonymous::new(bytes as usize)?),
                    super::Backing::File(p) | super::Backing::DirectFile(p) => {
                        let direct = matches!(n.backing, super::Backing::DirectFile(_));
                        let f = OpenOptions::new()
                            .read(true)
                            .write(true)
                            .create(true)
                            .truncate(false)
                            .custom_flags(if direct { libc::O_DIRECT } else { 0 })
                            .open(p)
                            .map_err(|e| Error::io("open namespace backing file", e))?;
                        let len = f.metadata().map_err(|e| Error::io("stat backing file", e))?.len();
                        if len < bytes {
                            f.set_len(bytes).map_err(|e| Error::io("extend backing file", e))?;
                        }
                        if direct {
                            Store::DirectFile(f)
                        } else {
                            Store::File(f)
                        }
                    }
                    super::Backing::Descriptor(fd) => {
                        let f = File::from(
                            fd.0.try_clone().map_err(|e| Error::io("duplicate the namespace's descriptor", e))?,
                        );
                        let len = f.metadata().map_err(|e| Error::io("stat backing file", e))?.len();
                        if len < bytes {
                            return Err(Error::InvalidArgument(format!(
                                "the file holds {len} bytes, fewer than the namespace's {bytes}"
                            )));
                        }
                        // SAFETY: F_GETFL on a descriptor we own.
                        let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
                        if flags >= 0 && flags & libc::O_DIRECT != 0 {
                            Store::DirectFile(f)
                        } else {
                            Store::File(f)
                        }
                    }
                };
                Ok(Namespace { block_size: n.block_size, blocks: n.blocks, store })
            })
            .collect()
    }

    /// Copies `len` bytes at byte `off` of the namespace to `dst`.
    ///
    /// # Safety
    /// `dst..dst+len` is host memory the controller may write.
    unsafe fn read_into(&self, off: u64, dst: *mut u8, len: usize) -> std::io::Result<()> {
        match &self.store {
            // SAFETY: the namespace holds `blocks * block_size` bytes and the
            // caller checked the range; dst is valid per this fn's contract.
            Store::Memory(m) => unsafe {
                std::ptr::copy_nonoverlapping(m.as_ptr().add(off as usize), dst, len);
                Ok(())
            },
            // SAFETY: per this fn's contract.
            Store::File(f) | Store::DirectFile(f) => unsafe { sys::pread_raw(f.as_raw_fd(), dst, len, off) },
        }
    }

    /// Copies `len` bytes from `src` to byte `off` of the namespace.
    ///
    /// # Safety
    /// `src..src+len` is host memory the controller may read.
    unsafe fn write_from(&self, off: u64, src: *const u8, len: usize) -> std::io::Result<()> {
        match &self.store {
            // SAFETY: as for `read_into`.
            Store::Memory(m) => unsafe {
                std::ptr::copy_nonoverlapping(src, m.as_ptr().add(off as usize), len);
                Ok(())
            },
            // SAFETY: per this fn's contract.
            Store::File(f) | Store::DirectFile(f) => unsafe { sys::pwrite_raw(f.as_raw_fd(), src, len, off) },
        }
    }

    fn zero(&self, off: u64, len: u64) -> std::io::Result<()> {
        match &self.store {
            // SAFETY: the range was checked against the namespace size.
            Store::Memory(m) => unsafe {
                std::ptr::write_bytes(m.as_ptr().add(off as usize), 0, len as usize);
                Ok(())
            },
            Store::File(f) | Store::DirectFile(f) => {
                // Page-aligned zeros, as O_DIRECT needs.
                let zeros = Anonymous::new(1 << 16).map_err(std::io::Error::other)?;
                // SAFETY: a fresh, zeroed mapping of 64 KiB.
                let zeros = unsafe { std::slice::from_raw_parts(zeros.as_ptr(), 1 << 16) };
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(zeros.len() as u64) as usize;
                    std::os::unix::fs::FileExt::write_all_at(f, &zeros[..n], off + done)?;
                    done += n as u64;
                }
                Ok(())
            }
        }
    }

    fn flush(&self) {
        if let Store::File(f) | Store::DirectFile(f) = &self.store {
            let _ = f.sync_data();
        }
    }

    fn identify(&self) -> IdentifyNamespace {
        let lbaf = vec![LbaFormat { ms: 0, lbads: 9, rp: 0 }, LbaFormat { ms: 0, lbads: 12, rp: 0 }];
        IdentifyNamespace {
            nsze: self.blocks,
            ncap: self.blocks,
            nuse: self.blocks,
            nlbaf: 1,
            flbas: if self.block_size == 4096 { 1 } else { 0 },
            lbaf,
        }
    }
}

struct Sq {
    iova: u64,
    ring: Ring,
    head: u32,
    cqid: u16,
    /// Host view of the ring; valid while the IOVA table version matches.
    mem: Option<DmaRegion>,
    /// The last tail doorbell value seen, to count a bad value once.
    last_tail: u32,
}

struct Cq {
    iova: u64,
    ring: Ring,
    tail: u32,
    phase: bool,
    iv: u16,
    ien: bool,
    mem: Option<DmaRegion>,
    pending: VecDeque<Completion>,
    /// Entries posted since the last interrupt.
    fresh: bool,
    last_head: u32,
}

#[derive(Clone, Copy)]
struct Completion {
    sqid: u16,
    cid: u16,
    dw0: u32,
    status: Status,
    /// A broken controller's completion: what it reports (see `Lie`).
    lie: Lie,
}

/// How a completion entry is posted wrong (fault injection).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Lie {
    #[default]
    None,
    /// This SQ head instead of the real one.
    SqHead(u16),
    /// The new phase tag over the slot's stale fields; the real entry is
    /// never seen (it lands in the slot the host already consumed).
    EarlyPhase,
}

struct Delayed {
    due: Instant,
    seq: u64,
    c: Completion,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(o.due, o.seq))
    }
}

/// What executing a command produced.
enum Outcome {
    /// Post this completion now (or at `due`).
    Done { status: Status, dw0: u32, due: Option<Instant> },
    /// No completion (an Asynchronous Event Request being held, a lost one).
    None,
}

fn done(status: Status) -> Outcome {
    Outcome::Done { status, dw0: 0, due: None }
}

fn ok(dw0: u32) -> Outcome {
    Outcome::Done { status: Status::SUCCESS, dw0, due: None }
}

pub(super) struct Controller {
    shared: Arc<Shared>,
    cfg: EmuConfig,
    ns: Arc<Vec<Namespace>>,
    /// I/O workers, when configured (file-backed namespaces only).
    workers: Option<Workers>,
    /// The thread that moves data to and from GPU memory, started at the
    /// first such command. The GPU runtime's copies may wait (CUDA holds a
    /// process-wide lock while some calls wait for the device), and the
    /// controller goes on with other commands meanwhile, as a real one's
    /// DMA engines do; the I/O a GPU stream waits on is among them.
    gpu_copies: Option<Workers>,
    /// Segment lists the workers gave back, reused for the next jobs.
    spare_segs: Vec<Vec<DataSeg>>,
    /// Whether the submission queue being swept holds more commands after
    /// the one executing (a lone command with nothing in flight is run on
    /// this thread: handing it to a worker only adds a wake-up).
    more_in_sweep: bool,
    cc: u32,
    enabled: bool,
    fatal: bool,
    page_size: usize,
    sqs: Vec<Option<Sq>>,
    cqs: Vec<Option<Cq>>,
    granted: (u16, u16),
    aers: usize,
    delayed: BinaryHeap<Reverse<Delayed>>,
    seq: u64,
    busy_until: Instant,
    table_version: u64,
    segs: Vec<(u64, usize)>,
    /// Translated data segments: address, length, and the GPU runtime when
    /// the address is device memory.
    host_segs: Vec<DataSeg>,
    /// Page-aligned bounce buffer between the namespace and GPU memory
    /// (or host memory, for an O_DIRECT file).
    staging: Option<Bounce>,
    /// Completions of the current sweep, posted at its end (in reverse
    /// with `reverse_completions`).
    held: Vec<Completion>,
    /// Completions to post again (fault injection), each before the next
    /// command of its submission queue completes.
    duplicates: Vec<Completion>,
    /// Counters of the current sweep, published before its completions.
    local: Local,
}

/// Hot counters, accumulated per sweep and published in one go.
#[derive(Default)]
struct Local {
    commands: u64,
    reads: u64,
    writes: u64,
    bytes_read: u64,
    bytes_written: u64,
}

impl Controller {
    pub(super) fn new(shared: Arc<Shared>, cfg: EmuConfig, ns: Vec<Namespace>) -> Controller {
        let nq = cfg.max_io_queues as usize + 1;
        let granted = (cfg.max_io_queues, cfg.max_io_queues);
        let ns = Arc::new(ns);
        let workers = (cfg.io_workers > 0 && !cfg.null && cfg.latency.is_none())
            .then(|| Workers::start(cfg.io_workers, "io", &shared, &ns));
        Controller {
            shared,
            cfg,
            ns,
            workers,
            gpu_copies: None,
            spare_segs: Vec::new(),
            more_in_sweep: false,
            cc: 0,
            enabled: false,
            fatal: false,
            page_size: 4096,
            sqs: (0..nq).map(|_| None).collect(),
            cqs: (0..nq).map(|_| None).collect(),
            granted,
            aers: 0,
            delayed: BinaryHeap::new(),
            seq: 0,
            busy_until: Instant::now(),
            table_version: u64::MAX,
            segs: Vec::with_capacity(520),
            host_segs: Vec::with_capacity(520),
            staging: None,
            held: Vec::with_capacity(SQ_BURST as usize),
            duplicates: Vec::new(),
            local: Local::default(),
        }
    }

    pub(super) fn run(mut self) {
        let mut idle_since: Option<Instant> = None;
        let mut idle_spins = 0u32;
        loop {
            if self.shared.stop.load(Ordering::Acquire) {
                break;
            }
            if self.step() {
                idle_since = None;
                idle_spins = 0;
                continue;
            }
            idle_spins = idle_spins.wrapping_add(1);
            if idle_spins % 64 != 0 {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if now.duration_since(*idle_since.get_or_insert(now)) < self.cfg.spin {
                std::hint::spin_loop();
                continue;
            }
            // Park. Announce it, then look once more: a register write made
            // before the driver saw `sleeping` is found by this step, one
            // made after it comes with an unpark (see `Shared::wake`).
            self.shared.sleeping.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if !self.shared.stop.load(Ordering::Acquire) && !self.step() {
                let timeout = self
                    .delayed
                    .peek()
                    .map_or(Duration::from_secs(1), |d| d.0.due.saturating_duration_since(Instant::now()));
                std::thread::park_timeout(timeout);
            }
            self.shared.sleeping.store(false, Ordering::Relaxed);
            idle_since = None;
        }
        // The workers finish what they hold before the namespaces are flushed.
        drop(self.workers.take());
        drop(self.gpu_copies.take());
        for n in self.ns.iter() {
            n.flush();
        }
    }

    fn reg(&self, off: usize) -> u32 {
        self.shared.regs[off / 4].load(Ordering::Acquire)
    }

    fn set_reg(&self, off: usize, v: u32) {
        self.shared.regs[off / 4].store(v, Ordering::Release);
    }

    fn step(&mut self) -> bool {
        if self.shared.removed.load(Ordering::Acquire) {
            // Gone: nothing is fetched, completed or moved any more.
            return false;
        }
        let mut did = self.check_cc();
        if !self.enabled || self.fatal {
            return did;
        }
        let shared = self.shared.clone();
        let table = shared.iova.read().unwrap_or_else(|p| p.into_inner());
        if table.version != self.table_version {
            self.revalidate(&table);
            if self.fatal {
                return true;
            }
        }
        if !self.delayed.is_empty() {
            did |= self.release_due();
        }
        did |= self.collect_jobs();
        for qid in 0..self.cqs.len() {
            if self.cqs[qid].as_ref().is_some_and(|c| !c.pending.is_empty()) {
                did |= self.flush_cq(qid);
            }
        }
        for qid in 0..self.sqs.len() {
            if self.sqs[qid].is_some() {
                did |= self.process_sq(qid, &table);
            }
            if self.fatal || !self.enabled {
                break;
            }
        }
        self.raise_interrupts();
        did
    }

    // ---- controller state ----

    fn check_cc(&mut self) -> bool {
        let cc = self.reg(regs::CC);
        if cc == self.cc {
            return false;
        }
        let (old, new) = (Cc(self.cc), Cc(cc));
        self.cc = cc;
        if !old.en() && new.en() {
            self.enable(new);
        } else if old.en() && !new.en() {
            self.reset();
        }
        if new.en() && new.shn() != regs::shutdown::NONE && old.shn() == regs::shutdown::NONE {
            for n in self.ns.iter() {
                n.flush();
            }
            let csts = self.reg(regs::CSTS) & !(3 << 2);
            self.set_reg(regs::CSTS, csts | regs::shutdown::COMPLETE << 2);
        }
        true
    }

    fn enable(&mut self, cc: Cc) {
        let aqa = Aqa(self.reg(regs::AQA));
        let asq = self.reg(regs::ASQ) as u64 | (self.reg(regs::ASQ + 4) as u64) << 32;
        let acq = self.reg(regs::ACQ) as u64 | (self.reg(regs::ACQ + 4) as u64) << 32;
        self.page_size = 4096 << cc.mps().min(4);
        let ps = self.page_size as u64;
        let ok = cc.mps() <= 4
            && cc.css() == 0
            && aqa.asq_entries() >= 2
            && aqa.acq_entries() >= 2
            && asq % ps == 0
            && acq % ps == 0
            && asq != 0
            && acq != 0;
        if !ok {
            tracing::warn!(?cc, ?aqa, asq, acq, "emulator: invalid admin queue configuration at enable");
            self.set_fatal();
            return;
        }
        self.cqs[0] = Some(Cq {
            iova: acq,
            ring: Ring::new(aqa.acq_entries()),
            tail: 0,
            phase: true,
            iv: 0,
            ien: true,
            mem: None,
            pending: VecDeque::new(),
            fresh: false,
            last_head: 0,
        });
        self.sqs[0] =
            Some(Sq { iova: asq, ring: Ring::new(aqa.asq_entries()), head: 0, cqid: 0, mem: None, last_tail: 0 });
        self.set_reg(regs::DOORBELL_BASE, 0);
        self.set_reg(regs::cq_head_doorbell(0, 0), 0);
        self.table_version = u64::MAX;
        self.enabled = true;
        self.set_reg(regs::CSTS, Csts::RDY);
    }

    /// Controller reset: every queue and every command in flight is dropped,
    /// and nothing is touched in host memory after CSTS.RDY reads 0.
    fn reset(&mut self) {
        // No DMA after the controller is disabled: wait for the workers,
        // and drop what they finished (the queues go with the reset).
        for w in [self.workers.as_mut(), self.gpu_copies.as_mut()].into_iter().flatten() {
            w.drain();
        }
        for q in self.sqs.iter_mut() {
            *q = None;
        }
        for q in self.cqs.iter_mut() {
            *q = None;
        }
        self.delayed.clear();
        self.duplicates.clear();
        self.enabled = false;
        self.fatal = false;
        self.aers = 0;
        self.granted = (self.cfg.max_io_queues, self.cfg.max_io_queues);
        self.shared.stats.resets.fetch_add(1, Ordering::Relaxed);
        for n in self.ns.iter() {
            n.flush();
        }
        self.set_reg(regs::CSTS, 0);
    }

    fn set_fatal(&mut self) {
        self.fatal = true;
        let csts = self.reg(regs::CSTS);
        self.set_reg(regs::CSTS, csts | Csts::CFS);
    }

    /// Re-translates every queue's ring after the IOVA table changed. A
    /// queue whose memory was unmapped under it is a fatal DMA fault.
    fn revalidate(&mut self, table: &IovaTable) {
        self.table_version = table.version;
        let mut lost = false;
        for sq in self.sqs.iter_mut().flatten() {
            sq.mem = translate_region(table, sq.iova, sq.ring.size() as usize * Sqe::SIZE);
            lost |= sq.mem.is_none();
        }
        for cq in self.cqs.iter_mut().flatten() {
            cq.mem = translate_region(table, cq.iova, cq.ring.size() as usize * ugds_nvme::Cqe::SIZE);
            lost |= cq.mem.is_none();
        }
        if lost {
            tracing::warn!("emulator: queue memory unmapped while the queue exists");
            self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
            self.set_fatal();
        }
    }

    // ---- queues ----

    fn process_sq(&mut self, qid: usize, table: &IovaTable) -> bool {
        let tail = self.reg(regs::sq_tail_doorbell(qid as u16, 0));
        let mut n = 0;
        while n < SQ_BURST {
            let Some(sq) = self.sqs[qid].as_mut() else { break };
            if tail >= sq.ring.size() {
                if tail != sq.last_tail {
                    sq.last_tail = tail;
                    self.shared.stats.invalid_doorbells.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(qid, tail, "emulator: SQ tail doorbell outside the queue, ignored");
                }
                break;
            }
            sq.last_tail = tail;
            if sq.head == tail {
                break;
            }
            let cqid = sq.cqid as usize;
            if self.cqs[cqid].as_ref().is_some_and(|c| !c.pending.is_empty()) {
                break; // completion queue full: stop fetching until it drains
            }
            let Some(mem) = sq.mem.as_ref() else { break };
            let sqe = mem.read_sqe(sq.head as usize * Sqe::SIZE);
            sq.head = sq.ring.next(sq.head);
            self.more_in_sweep = sq.head != tail;
            n += 1;
            self.execute(qid as u16, sqe, table);
        }
        // Counters first: a host that sees a completion sees its counts.
        self.publish();
        let mut held = std::mem::take(&mut self.held);
        if self.cfg.reverse_completions && qid != 0 {
            held.reverse();
        }
        for c in held.drain(..) {
            self.complete(c);
        }
        self.held = held;
        n > 0
    }

    fn publish(&mut self) {
        let l = std::mem::take(&mut self.local);
        let st = &self.shared.stats;
        for (v, a) in [
            (l.commands, &st.commands),
            (l.reads, &st.reads),
            (l.writes, &st.writes),
            (l.bytes_read, &st.bytes_read),
            (l.bytes_written, &st.bytes_written),
        ] {
            if v != 0 {
                a.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    fn execute(&mut self, qid: u16, sqe: Sqe, table: &IovaTable) {
        self.local.commands += 1;
        if let Some(i) = self.duplicates.iter().position(|c| c.sqid == qid) {
            let c = self.duplicates.swap_remove(i);
            self.held.push(c);
        }
        let fault =
            if self.shared.faults_armed.load(Ordering::Acquire) { self.take_fault(qid, sqe.opcode()) } else { None };
        let outcome = match fault {
            Some(FaultAction::Status(s)) => done(s),
            Some(FaultAction::LoseCompletion) => {
                self.shared.stats.lost_completions.fetch_add(1, Ordering::Relaxed);
                Outcome::None
            }
            Some(FaultAction::Fatal) => {
                self.set_fatal();
                Outcome::None
            }
            Some(FaultAction::Duplicate) => {
                let o = self.run_command(qid, &sqe, table);
                if let Outcome::Done { status, dw0, .. } = o {
                    self.duplicates.push(Completion { sqid: qid, cid: sqe.cid().0, dw0, status, lie: Lie::None });
                }
                o
            }
            Some(FaultAction::ExtraCompletion(cid)) => {
                // A completion naming a command that is not in flight, then
                // the real one.
                let status = Status::SUCCESS;
                self.held.push(Completion { sqid: qid, cid, dw0: 0, status, lie: Lie::None });
                self.run_command(qid, &sqe, table)
            }
            Some(a @ (FaultAction::SqHead(_) | FaultAction::EarlyPhase)) => {
                let o = self.run_command(qid, &sqe, table);
                if let Outcome::Done { status, dw0, .. } = o {
                    let lie = match a {
                        FaultAction::SqHead(h) => Lie::SqHead(h),
                        _ => Lie::EarlyPhase,
                    };
                    self.held.push(Completion { sqid: qid, cid: sqe.cid().0, dw0, status, lie });
                }
                Outcome::None
            }
            Some(FaultAction::Stall(d)) => match self.run_command(qid, &sqe, table) {
                Outcome::Done { status, dw0, .. } => Outcome::Done { status, dw0, due: Some(Instant::now() + d) },
                Outcome::None => Outcome::None,
            },
            None if qid != 0 && (self.workers.is_some() || table.devices > 0) => {
                match self.dispatch(qid, &sqe, table) {
                    Some(outcome) => outcome,
                    None => self.run_command(qid, &sqe, table),
                }
            }
            None => self.run_command(qid, &sqe, table),
        };
        if let Outcome::Done { status, dw0, due } = outcome {
            let c = Completion { sqid: qid, cid: sqe.cid().0, dw0, status, lie: Lie::None };
            match due {
                Some(due) if due > Instant::now() => {
                    self.seq += 1;
                    self.delayed.push(Reverse(Delayed { due, seq: self.seq, c }));
                }
                _ => self.held.push(c),
            }
        }
    }

    /// Hands a valid read or write to a worker (`Some(Outcome::None)`: it
    /// completes when the worker is done): one on GPU memory to the GPU
    /// copy thread, one on a file-backed namespace to the I/O workers; or
    /// completes a bad one at once. `None`: run it on this thread.
    fn dispatch(&mut self, qid: u16, sqe: &Sqe, table: &IovaTable) -> Option<Outcome> {
        // A lone command with the workers idle runs here: handing it over
        // only adds a wake-up.
        let to_workers = self.workers.as_ref().is_some_and(|w| w.inflight > 0 || self.more_in_sweep);
        let gpu = table.devices > 0 && !self.cfg.null && self.cfg.latency.is_none();
        if !to_workers && !gpu {
            return None;
        }
        let op = NvmOpcode::from_u8(sqe.opcode()).filter(|o| matches!(o, NvmOpcode::Read | NvmOpcode::Write))?;
        let idx = sqe.nsid.checked_sub(1)? as usize;
        let ns = self.ns.get(idx)?;
        let file = !matches!(ns.store, Store::Memory(_));
        if !gpu && !file {
            return None;
        }
        let (bs, blocks) = (ns.block_size as u64, ns.blocks);
        let (slba, nlb) = (sqe.slba().0, sqe.nlb() as u64);
        if slba.checked_add(nlb).is_none_or(|e| e > blocks) {
            return Some(done(Status::generic(generic::LBA_OUT_OF_RANGE)));
        }
        let len = (nlb * bs) as usize;
        if self.cfg.mdts != 0 && len > 4096usize << self.cfg.mdts {
            return Some(done(Status::generic(generic::INVALID_FIELD)));
        }
        if let Err(s) = self.walk(table, sqe.prp1, sqe.prp2, len).and_then(|()| self.translate_segs(table)) {
            return Some(done(s));
        }
        // All of it on the GPU (a command mixing host and device memory runs
        // here, with the table held for its host part).
        let device = !self.host_segs.is_empty() && self.host_segs.iter().all(|s| s.2.is_some());
        let w = match (device && gpu, file && to_workers) {
            // GPU memory never moves on this thread: to the I/O workers
            // where there are some (they work in parallel), else to the GPU
            // copy thread.
            (true, _) if file && self.workers.is_some() => self.workers.as_mut().expect("checked"),
            (true, _) => {
                let (shared, ns) = (&self.shared, &self.ns);
                self.gpu_copies.get_or_insert_with(|| Workers::start(1, "gpu", shared, ns))
            }
            (false, true) => self.workers.as_mut().expect("to_workers says so"),
            // Host memory, here and now, with the segments just translated
            // (reached only while device memory is mapped: `gpu`, so no
            // latency model and no null namespace).
            (false, false) => {
                let ns = &self.ns[idx];
                // SAFETY: translated under `table`'s read lock, which the
                // caller (`step`) holds for the duration of the copy.
                if let Err(s) = unsafe { move_data(ns, op, slba * bs, &self.host_segs, &mut self.staging) } {
                    return Some(done(s));
                }
                self.count(op, len);
                return Some(done(Status::SUCCESS));
            }
        };
        let job = Job {
            c: Completion { sqid: qid, cid: sqe.cid().0, dw0: 0, status: Status::SUCCESS, lie: Lie::None },
            op,
            ns: idx,
            off: slba * bs,
            len,
            segs: std::mem::replace(&mut self.host_segs, self.spare_segs.pop().unwrap_or_default()),
        };
        w.inflight += 1;
        w.tx.as_ref().expect("workers live").send(job).expect("workers outlive the controller");
        Some(Outcome::None)
    }

    /// Counts a read or write that moved `len` bytes.
    fn count(&mut self, op: NvmOpcode, len: usize) {
        if op == NvmOpcode::Read {
            self.local.reads += 1;
            self.local.bytes_read += len as u64;
        } else {
            self.local.writes += 1;
            self.local.bytes_written += len as u64;
        }
    }

    /// Completes what the workers finished.
    fn collect_jobs(&mut self) -> bool {
        let mut jobs = Vec::new();
        for w in [self.workers.as_mut(), self.gpu_copies.as_mut()].into_iter().flatten() {
            if w.inflight > 0 {
                let done = std::mem::take(&mut *w.done.lock().unwrap_or_else(|p| p.into_inner()));
                w.inflight -= done.len();
                jobs.extend(done);
            }
        }
        if jobs.is_empty() {
            return false;
        }
        for mut job in jobs {
            job.segs.clear();
            self.spare_segs.push(job.segs);
            if job.c.status.is_success() {
                self.count(job.op, job.len);
            }
            self.held.push(job.c);
        }
        self.publish();
        let mut held = std::mem::take(&mut self.held);
        for c in held.drain(..) {
            self.complete(c);
        }
        self.held = held;
        true
    }

    fn take_fault(&mut self, qid: u16, opcode: u8) -> Option<FaultAction> {
        let mut faults = self.shared.faults.lock().unwrap_or_else(|p| p.into_inner());
        let hit = faults.iter_mut().position(|f: &mut Fault| {
            let matches = match f.target {
                FaultTarget::Io(op) => qid != 0 && op.is_none_or(|o| o == opcode),
                FaultTarget::Admin(op) => qid == 0 && op.is_none_or(|o| o == opcode),
            };
            if !matches || f.count == 0 {
                return false;
            }
            if f.skip > 0 {
                f.skip -= 1;
                return false;
            }
            true
        })?;
        let action = faults[hit].action;
        faults[hit].count -= 1;
        if faults[hit].count == 0 {
            faults.remove(hit);
        }
        self.shared.faults_armed.store(!faults.is_empty(), Ordering::Release);
        Some(action)
    }

    fn complete(&mut self, c: Completion) {
        let Some(sq) = self.sqs.get(c.sqid as usize).and_then(|q| q.as_ref()) else { return };
        let cqid = sq.cqid as usize;
        if let Some(cq) = self.cqs[cqid].as_mut() {
            cq.pending.push_back(c);
            self.flush_cq(cqid);
        }
    }

    /// Posts pending completions while the completion queue has room.
    fn flush_cq(&mut self, cqid: usize) -> bool {
        let head = self.reg(regs::cq_head_doorbell(cqid as u16, 0));
        let Some(cq) = self.cqs[cqid].as_mut() else { return false };
        if head >= cq.ring.size() {
            if head != cq.last_head {
                cq.last_head = head;
                self.shared.stats.invalid_doorbells.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(cqid, head, "emulator: CQ head doorbell outside the queue, ignored");
            }
            return false;
        }
        cq.last_head = head;
        let mut posted = false;
        while let Some(&c) = cq.pending.front() {
            if cq.ring.is_full(head, cq.tail) {
                break;
            }
            let Some(mem) = cq.mem.as_ref() else { break };
            let mut sqhd = self.sqs.get(c.sqid as usize).and_then(|s| s.as_ref()).map_or(0, |s| s.head);
            let off = cq.tail as usize * ugds_nvme::Cqe::SIZE;
            if let Lie::SqHead(h) = c.lie {
                sqhd = h as u32;
            }
            if c.lie == Lie::EarlyPhase {
                // Only the phase bit of the stale entry flips.
                let stale = mem.read_u32(off + 12);
                mem.store_u32_release(off + 12, stale & !(1 << 16) | (cq.phase as u32) << 16);
            } else {
                mem.write_u32(off, c.dw0);
                mem.write_u32(off + 4, 0);
                mem.write_u32(off + 8, sqhd | (c.sqid as u32) << 16);
                // The phase tag goes last, with release ordering: a host that
                // sees the new phase sees the fields above and the data moved.
                mem.store_u32_release(off + 12, c.cid as u32 | (c.status.to_field(cq.phase) as u32) << 16);
            }
            cq.tail += 1;
            if cq.tail == cq.ring.size() {
                cq.tail = 0;
                cq.phase = !cq.phase;
            }
            cq.pending.pop_front();
            cq.fresh = true;
            posted = true;
        }
        posted
    }

    fn release_due(&mut self) -> bool {
        let now = Instant::now();
        let mut did = false;
        while self.delayed.peek().is_some_and(|d| d.0.due <= now) {
            let d = self.delayed.pop().expect("peeked").0;
            self.complete(d.c);
            did = true;
        }
        did
    }

    fn raise_interrupts(&mut self) {
        for cq in self.cqs.iter_mut().flatten() {
            if cq.fresh {
                cq.fresh = false;
                if cq.ien {
                    if let Some(v) = self.shared.vectors.get(cq.iv as usize) {
                        v.signal();
                        self.shared.stats.interrupts.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    // ---- commands ----

    fn run_command(&mut self, qid: u16, sqe: &Sqe, table: &IovaTable) -> Outcome {
        if sqe.fuse() != 0 || sqe.psdt() != 0 {
            return done(Status::generic(generic::INVALID_FIELD));
        }
        if qid == 0 {
            self.admin(sqe, table)
        } else {
            self.io(sqe, table)
        }
    }

    fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        nsid.checked_sub(1).and_then(|i| self.ns.get(i as usize))
    }

    fn io(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let Some(op) = NvmOpcode::from_u8(sqe.opcode()) else {
            return done(Status::generic(generic::INVALID_OPCODE));
        };
        let Some(ns) = self.namespace(sqe.nsid) else {
            return done(Status::generic(generic::INVALID_NAMESPACE));
        };
        let bs = ns.block_size as u64;
        match op {
            NvmOpcode::Flush => {
                ns.flush();
                ok(0)
            }
            NvmOpcode::Read | NvmOpcode::Write => {
                let (slba, nlb) = (sqe.slba().0, sqe.nlb() as u64);
                if slba.checked_add(nlb).is_none_or(|e| e > ns.blocks) {
                    return done(Status::generic(generic::LBA_OUT_OF_RANGE));
                }
                let len = (nlb * bs) as usize;
                if self.cfg.mdts != 0 && len > 4096usize << self.cfg.mdts {
                    return done(Status::generic(generic::INVALID_FIELD));
                }
                if !self.cfg.null {
                    if let Err(s) = self.transfer(op, sqe, slba * bs, len, table) {
                        return done(s);
                    }
                }
                self.count(op, len);
                Outcome::Done { status: Status::SUCCESS, dw0: 0, due: self.model_due(len) }
            }
            NvmOpcode::WriteZeroes => {
                let (slba, nlb) = (sqe.slba().0, sqe.nlb() as u64);
                if slba.checked_add(nlb).is_none_or(|e| e > ns.blocks) {
                    return done(Status::generic(generic::LBA_OUT_OF_RANGE));
                }
                if !self.cfg.null && ns.zero(slba * bs, nlb * bs).is_err() {
                    return done(Status::new(2, ugds_nvme::status::media::WRITE_FAULT));
                }
                ok(0)
            }
            NvmOpcode::DatasetManagement => {
                let nr = (sqe.cdw10 & 0xff) as usize + 1;
                let raw = match self.dma_read(table, sqe.prp1, sqe.prp2, nr * 16) {
                    Ok(r) => r,
                    Err(s) => return done(s),
                };
                let ns = self.namespace(sqe.nsid).expect("checked above");
                let ranges: Vec<DsmRange> =
                    raw.chunks_exact(16).map(|c| DsmRange::from_bytes(c.try_into().expect("16 bytes"))).collect();
                if ranges.iter().any(|r| r.slba.checked_add(r.nlb as u64).is_none_or(|e| e > ns.blocks)) {
                    return done(Status::generic(generic::LBA_OUT_OF_RANGE));
                }
                // Deallocate: deallocated blocks read back as zeros here.
                if sqe.cdw11 & (1 << 2) != 0 && !self.cfg.null {
                    for r in &ranges {
                        if ns.zero(r.slba * bs, r.nlb as u64 * bs).is_err() {
                            return done(Status::new(2, ugds_nvme::status::media::WRITE_FAULT));
                        }
                    }
                }
                ok(0)
            }
        }
    }

    fn model_due(&mut self, len: usize) -> Option<Instant> {
        let m = self.cfg.latency?;
        let now = Instant::now();
        let xfer = if m.bytes_per_sec == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos((len as u128 * 1_000_000_000 / m.bytes_per_sec as u128) as u64)
        };
        self.busy_until = self.busy_until.max(now) + xfer;
        Some(self.busy_until + m.latency)
    }

    /// Walks the command's PRPs into `self.segs`; a fault names the status.
    fn walk(&mut self, table: &IovaTable, prp1: u64, prp2: u64, len: usize) -> Result<(), Status> {
        self.segs.clear();
        let segs = &mut self.segs;
        let read_list = |addr: u64, out: &mut [u64]| -> Result<(), ()> {
            let region = translate_region(table, addr, out.len() * 8).ok_or(())?;
            for (i, e) in out.iter_mut().enumerate() {
                *e = region.read_u64(i * 8);
            }
            Ok(())
        };
        match prp::walk(prp1, prp2, len, self.page_size, read_list, |a, l| segs.push((a, l))) {
            Ok(()) => Ok(()),
            Err(prp::WalkError::InvalidOffset { addr }) => {
                tracing::debug!(addr, "emulator: PRP with invalid offset");
                self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                Err(Status::generic(generic::INVALID_PRP_OFFSET))
            }
            Err(prp::WalkError::ListRead { addr, .. }) => {
                tracing::debug!(addr, "emulator: PRP list not mapped");
                self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                Err(Status::generic(generic::DATA_TRANSFER_ERROR))
            }
        }
    }

    /// Translates `self.segs` into host ranges, merging neighbours.
    fn translate_segs(&mut self, table: &IovaTable) -> Result<(), Status> {
        self.host_segs.clear();
        for &(iova, len) in &self.segs {
            let Some((addr, device)) = table.translate_data(iova, len) else {
                tracing::debug!(iova, len, "emulator: DMA to unmapped address");
                self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                return Err(Status::generic(generic::DATA_TRANSFER_ERROR));
            };
            match self.host_segs.last_mut() {
                Some((a, l, d)) if *a + *l == addr && same_target(d.as_ref(), device) => *l += len,
                _ => self.host_segs.push((addr, len, device.cloned())),
            }
        }
        Ok(())
    }

    /// Refuses device segments where only host memory is possible (data
    /// of admin commands).
    fn host_only(&self) -> Result<(), Status> {
        if self.host_segs.iter().any(|s| s.2.is_some()) {
            self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
            return Err(Status::generic(generic::DATA_TRANSFER_ERROR));
        }
        Ok(())
    }

    fn transfer(&mut self, op: NvmOpcode, sqe: &Sqe, ns_off: u64, len: usize, table: &IovaTable) -> Result<(), Status> {
        self.walk(table, sqe.prp1, sqe.prp2, len)?;
        self.translate_segs(table)?;
        let ns = &self.ns[(sqe.nsid - 1) as usize];
        // SAFETY: the segments were translated under `table`'s read lock,
        // which the caller holds for the duration of the copy.
        unsafe { move_data(ns, op, ns_off, &self.host_segs, &mut self.staging) }
    }

    fn dma_write(&mut self, table: &IovaTable, prp1: u64, prp2: u64, data: &[u8]) -> Result<(), Status> {
        self.walk(table, prp1, prp2, data.len())?;
        self.translate_segs(table)?;
        self.host_only()?;
        let mut done = 0;
        for &(host, l, _) in &self.host_segs {
            // SAFETY: a translated, mapped range (see `transfer`).
            unsafe { std::ptr::copy_nonoverlapping(data[done..].as_ptr(), host as *mut u8, l) };
            done += l;
        }
        Ok(())
    }

    fn dma_read(&mut self, table: &IovaTable, prp1: u64, prp2: u64, len: usize) -> Result<Vec<u8>, Status> {
        self.walk(table, prp1, prp2, len)?;
        self.translate_segs(table)?;
        self.host_only()?;
        let mut out = vec![0u8; len];
        let mut done = 0;
        for &(host, l, _) in &self.host_segs {
            // SAFETY: a translated, mapped range (see `transfer`).
            unsafe { std::ptr::copy_nonoverlapping(host as *const u8, out[done..].as_mut_ptr(), l) };
            done += l;
        }
        Ok(out)
    }

    fn admin(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let Some(op) = AdminOpcode::from_u8(sqe.opcode()) else {
            return done(Status::generic(generic::INVALID_OPCODE));
        };
        match op {
            AdminOpcode::Identify => self.identify(sqe, table),
            AdminOpcode::SetFeatures => self.set_features(sqe),
            AdminOpcode::GetFeatures => match (sqe.cdw10 & 0xff) as u8 {
                feature::NUMBER_OF_QUEUES => ok((self.granted.0 as u32 - 1) | (self.granted.1 as u32 - 1) << 16),
                _ => ok(0),
            },
            AdminOpcode::CreateIoCq => self.create_cq(sqe, table),
            AdminOpcode::CreateIoSq => self.create_sq(sqe, table),
            AdminOpcode::DeleteIoSq => self.delete_sq(sqe),
            AdminOpcode::DeleteIoCq => self.delete_cq(sqe),
            AdminOpcode::GetLogPage => self.get_log_page(sqe, table),
            AdminOpcode::Abort => self.abort(sqe),
            AdminOpcode::AsyncEventRequest => {
                if self.aers >= AER_LIMIT {
                    return done(Status::command_specific(0x05));
                }
                self.aers += 1;
                Outcome::None
            }
            AdminOpcode::DoorbellBufferConfig => done(Status::generic(generic::INVALID_OPCODE)),
        }
    }

    /// Abort (section 5.1): a command still held by the controller (stalled
    /// by fault injection or the latency model) completes at once with
    /// Command Abort Requested and dword 0 bit 0 clear. Anything else (done,
    /// or lost) is not aborted: bit 0 set, which a controller may always say.
    fn abort(&mut self, sqe: &Sqe) -> Outcome {
        let (sqid, cid) = ((sqe.cdw10 & 0xffff) as u16, (sqe.cdw10 >> 16) as u16);
        let all = std::mem::take(&mut self.delayed).into_vec();
        let (hit, rest): (Vec<_>, Vec<_>) = all.into_iter().partition(|d| d.0.c.sqid == sqid && d.0.c.cid == cid);
        self.delayed = rest.into_iter().collect();
        match hit.into_iter().next() {
            Some(d) => {
                self.complete(Completion { status: Status::generic(generic::ABORT_REQUESTED), dw0: 0, ..d.0.c });
                ok(0)
            }
            None => ok(1),
        }
    }

    fn identify(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let data: [u8; IDENTIFY_LEN] = match (sqe.cdw10 & 0xff) as u8 {
            cns::CONTROLLER => IdentifyController {
                vid: 0,
                ssvid: 0,
                sn: "UGDSEMU0001".into(),
                mn: "ugds emulated controller".into(),
                fr: env!("CARGO_PKG_VERSION").into(),
                mdts: self.cfg.lies.mdts.unwrap_or(self.cfg.mdts),
                cntlid: 1,
                ver: regs::Version::V1_4.0,
                oacs: 0,
                acl: 3,
                sqes: 0x66,
                cqes: 0x44,
                nn: self.ns.len() as u32,
                oncs: IdentifyController::ONCS_DSM | IdentifyController::ONCS_WRITE_ZEROES,
                vwc: 0,
            }
            .to_bytes(),
            cns::NAMESPACE => match self.namespace(sqe.nsid) {
                Some(ns) => {
                    let mut id = ns.identify();
                    let lies = self.cfg.lies;
                    if let Some(n) = lies.nsze {
                        (id.nsze, id.ncap, id.nuse) = (n, n, n);
                    }
                    if let Some(b) = lies.lbads {
                        let i = (id.flbas & 0xf) as usize;
                        id.lbaf[i].lbads = b;
                    }
                    if let Some(f) = lies.flbas {
                        id.flbas = f;
                    }
                    id.to_bytes()
                }
                None => return done(Status::generic(generic::INVALID_NAMESPACE)),
            },
            cns::ACTIVE_NS_LIST => {
                let mut b = [0u8; IDENTIFY_LEN];
                let ids = (1..=self.ns.len() as u32).filter(|&n| n > sqe.nsid);
                for (i, n) in ids.take(1024).enumerate() {
                    b[i * 4..i * 4 + 4].copy_from_slice(&n.to_le_bytes());
                }
                b
            }
            _ => return done(Status::generic(generic::INVALID_FIELD)),
        };
        match self.dma_write(table, sqe.prp1, sqe.prp2, &data) {
            Ok(()) => ok(0),
            Err(s) => done(s),
        }
    }

    fn io_queues_exist(&self) -> bool {
        self.sqs.iter().skip(1).any(|q| q.is_some()) || self.cqs.iter().skip(1).any(|q| q.is_some())
    }

    fn set_features(&mut self, sqe: &Sqe) -> Outcome {
        match (sqe.cdw10 & 0xff) as u8 {
            feature::NUMBER_OF_QUEUES => {
                if self.io_queues_exist() {
                    return done(Status::generic(generic::COMMAND_SEQUENCE_ERROR));
                }
                let (nsqr, ncqr) = (sqe.cdw11 & 0xffff, sqe.cdw11 >> 16);
                if nsqr == 0xffff || ncqr == 0xffff {
                    return done(Status::generic(generic::INVALID_FIELD));
                }
                let max = self.cfg.max_io_queues as u32;
                self.granted = ((nsqr + 1).min(max) as u16, (ncqr + 1).min(max) as u16);
                ok((self.granted.0 as u32 - 1) | (self.granted.1 as u32 - 1) << 16)
            }
            _ => ok(0),
        }
    }

    fn queue_args(&self, sqe: &Sqe, granted: u16) -> Result<(usize, Ring), Status> {
        let qid = (sqe.cdw10 & 0xffff) as usize;
        let entries = (sqe.cdw10 >> 16) + 1;
        if qid == 0 || qid > granted as usize {
            return Err(Status::command_specific(cs::INVALID_QID));
        }
        if entries < 2 || entries > self.cfg.mqes as u32 + 1 {
            return Err(Status::command_specific(cs::INVALID_QUEUE_SIZE));
        }
        if sqe.cdw11 & 1 == 0 {
            // CAP.CQR: queues must be physically contiguous.
            return Err(Status::generic(generic::INVALID_FIELD));
        }
        if sqe.prp1 % self.page_size as u64 != 0 {
            return Err(Status::generic(generic::INVALID_PRP_OFFSET));
        }
        Ok((qid, Ring::new(entries)))
    }

    fn create_cq(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let (qid, ring) = match self.queue_args(sqe, self.granted.1) {
            Ok(v) => v,
            Err(s) => return done(s),
        };
        if self.cqs[qid].is_some() {
            return done(Status::command_specific(cs::INVALID_QID));
        }
        let ien = sqe.cdw11 & 2 != 0;
        let iv = (sqe.cdw11 >> 16) as u16;
        if ien && iv as usize >= self.shared.vectors.len() {
            return done(Status::command_specific(cs::INVALID_INTERRUPT_VECTOR));
        }
        let Some(mem) = translate_region(table, sqe.prp1, ring.size() as usize * ugds_nvme::Cqe::SIZE) else {
            self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
            return done(Status::generic(generic::DATA_TRANSFER_ERROR));
        };
        self.set_reg(regs::cq_head_doorbell(qid as u16, 0), 0);
        self.cqs[qid] = Some(Cq {
            iova: sqe.prp1,
            ring,
            tail: 0,
            phase: true,
            iv,
            ien,
            mem: Some(mem),
            pending: VecDeque::new(),
            fresh: false,
            last_head: 0,
        });
        ok(0)
    }

    fn create_sq(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let (qid, ring) = match self.queue_args(sqe, self.granted.0) {
            Ok(v) => v,
            Err(s) => return done(s),
        };
        if self.sqs[qid].is_some() {
            return done(Status::command_specific(cs::INVALID_QID));
        }
        let cqid = (sqe.cdw11 >> 16) as u16;
        if cqid == 0 || self.cqs.get(cqid as usize).is_none_or(|c| c.is_none()) {
            return done(Status::command_specific(cs::INVALID_CQ));
        }
        let Some(mem) = translate_region(table, sqe.prp1, ring.size() as usize * Sqe::SIZE) else {
            self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
            return done(Status::generic(generic::DATA_TRANSFER_ERROR));
        };
        self.set_reg(regs::sq_tail_doorbell(qid as u16, 0), 0);
        self.sqs[qid] = Some(Sq { iova: sqe.prp1, ring, head: 0, cqid, mem: Some(mem), last_tail: 0 });
        ok(0)
    }

    fn delete_sq(&mut self, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xffff) as usize;
        if qid == 0 || self.sqs.get(qid).is_none_or(|q| q.is_none()) {
            return done(Status::command_specific(cs::INVALID_QID));
        }
        // Commands still held (stalled) complete as aborted before the
        // queue goes away.
        let held: Vec<Delayed> = {
            let all = std::mem::take(&mut self.delayed).into_vec();
            let (mine, rest): (Vec<_>, Vec<_>) = all.into_iter().partition(|d| d.0.c.sqid as usize == qid);
            self.delayed = rest.into_iter().collect();
            mine.into_iter().map(|d| d.0).collect()
        };
        for d in held {
            self.complete(Completion { status: Status::generic(generic::ABORTED_SQ_DELETION), ..d.c });
        }
        self.sqs[qid] = None;
        ok(0)
    }

    fn delete_cq(&mut self, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xffff) as usize;
        if qid == 0 || self.cqs.get(qid).is_none_or(|q| q.is_none()) {
            return done(Status::command_specific(cs::INVALID_QID));
        }
        if self.sqs.iter().flatten().any(|s| s.cqid as usize == qid) {
            return done(Status::command_specific(cs::INVALID_QUEUE_DELETION));
        }
        self.cqs[qid] = None;
        ok(0)
    }

    fn get_log_page(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let lid = (sqe.cdw10 & 0xff) as u8;
        let numd = (sqe.cdw10 >> 16) | (sqe.cdw11 & 0xffff) << 16;
        let len = ((numd as usize + 1) * 4).min(IDENTIFY_LEN);
        let mut page = vec![0u8; len.max(512)];
        match lid {
            log_page::ERROR_INFO => {}
            log_page::SMART => {
                let s = self.shared.stats.snapshot(&self.shared.driver_stats);
                // Data Units Read / Written are in thousands of 512-byte units.
                let put = |p: &mut [u8], off: usize, v: u64| p[off..off + 8].copy_from_slice(&v.to_le_bytes());
                put(&mut page, 32, s.bytes_read.div_ceil(512_000));
                put(&mut page, 48, s.bytes_written.div_ceil(512_000));
                put(&mut page, 64, s.reads);
                put(&mut page, 80, s.writes);
                page[3] = 100; // Available Spare
                page[4] = 10; // Available Spare Threshold
                page[1..3].copy_from_slice(&(273u16 + 25).to_le_bytes()); // Composite Temperature, K
            }
            _ => return done(Status::command_specific(cs::INVALID_LOG_PAGE)),
        }
        match self.dma_write(table, sqe.prp1, sqe.prp2, &page[..len]) {
            Ok(()) => ok(0),
            Err(s) => done(s),
        }
    }
}

fn translate_region(table: &IovaTable, iova: u64, len: usize) -> Option<DmaRegion> {
    let host = table.translate(iova, len)?;
    // SAFETY: the range lies in a live IOVA table entry. The controller uses
    // the region only under the table's read lock, and drops or re-translates
    // it whenever the table's version shows that an entry was removed.
    Some(unsafe { DmaRegion::new(host, len, Iova(iova)) })
}

/// A translated data segment: address, length, and the GPU runtime when the
/// address is device memory.
type DataSeg = (usize, usize, Option<Arc<dyn DeviceRuntime>>);

/// Moves a command's data between the namespace at byte `off` and the
/// translated segments `segs`.
///
/// # Safety
/// Every segment must stay mapped for the duration of the call (the caller
/// holds the IOVA table's read lock, which unmapping waits for).
unsafe fn move_data(
    ns: &Namespace,
    op: NvmOpcode,
    mut off: u64,
    segs: &[DataSeg],
    staging: &mut Option<Bounce>,
) -> Result<(), Status> {
    let direct = matches!(ns.store, Store::DirectFile(_));
    for (addr, l, device) in segs {
        let (addr, l) = (*addr, *l);
        let r = match device {
            None if direct => (|| {
                let buf = bounce(staging, l, None)?;
                // SAFETY: `addr..addr+l` is mapped (this fn's contract) and
                // `buf` is our own page-aligned memory of at least `l` bytes.
                unsafe {
                    if op == NvmOpcode::Read {
                        ns.read_into(off, buf.as_mut_ptr(), l)?;
                        std::ptr::copy_nonoverlapping(buf.as_ptr(), addr as *mut u8, l);
                    } else {
                        std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), l);
                        ns.write_from(off, buf.as_ptr(), l)?;
                    }
                }
                Ok(())
            })(),
            // SAFETY: `addr..addr+l` lies inside an IOVA table entry that
            // stays mapped for the duration of this copy (this fn's contract).
            None => unsafe {
                if op == NvmOpcode::Read {
                    ns.read_into(off, addr as *mut u8, l)
                } else {
                    ns.write_from(off, addr as *const u8, l)
                }
            },
            // GPU memory: through a bounce buffer and the copy engine,
            // standing in for the P2P DMA a real controller does.
            Some(rt) => (|| {
                let buf = bounce(staging, l, Some(rt))?;
                if op == NvmOpcode::Read {
                    // SAFETY: `buf` is our own memory of `l` bytes.
                    unsafe { ns.read_into(off, buf.as_mut_ptr(), l) }.and_then(|()| {
                        // SAFETY: `addr..addr+l` was translated through the
                        // IOVA table from a registered device mapping of
                        // `rt`, which stays mapped for this copy (this fn's
                        // contract).
                        unsafe { rt.copy_to_device(addr as u64, buf) }.map_err(std::io::Error::other)
                    })
                } else {
                    // SAFETY: as above.
                    unsafe { rt.copy_from_device(buf, addr as u64) }
                        .map_err(std::io::Error::other)
                        // SAFETY: as above.
                        .and_then(|()| unsafe { ns.write_from(off, buf.as_ptr(), l) })
                }
            })(),
        };
        if let Err(e) = r {
            tracing::debug!("emulator: data transfer failed: {e}");
            let sc = if op == NvmOpcode::Read {
                ugds_nvme::status::media::UNRECOVERED_READ_ERROR
            } else {
                ugds_nvme::status::media::WRITE_FAULT
            };
            return Err(Status::new(2, sc));
        }
        off += l as u64;
    }
    Ok(())
}

/// A read or write handed to an I/O worker, its PRPs already translated.
struct Job {
    c: Completion,
    op: NvmOpcode,
    ns: usize,
    off: u64,
    len: usize,
    segs: Vec<DataSeg>,
}

/// The I/O workers: a queue of jobs, and the finished ones for the
/// controller thread to complete.
struct Workers {
    tx: Option<std::sync::mpsc::Sender<Job>>,
    done: Arc<std::sync::Mutex<Vec<Job>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Jobs sent and not yet collected from `done`.
    inflight: usize,
}

impl Workers {
    /// `n` threads named `ugds-emu-{name}N`. A worker holds the IOVA table
    /// while it copies to or from host memory, so that unmapping waits for
    /// it; not for a job all on GPU memory (it touches no mapped host
    /// memory, and the runtime's copy may wait long), so registering and
    /// unmapping never wait for the GPU runtime.
    fn start(n: usize, name: &str, shared: &Arc<Shared>, ns: &Arc<Vec<Namespace>>) -> Workers {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let done = Arc::new(std::sync::Mutex::new(Vec::new()));
        let threads = (0..n)
            .filter_map(|i| {
                let (rx, done, shared, ns) = (rx.clone(), done.clone(), shared.clone(), ns.clone());
                std::thread::Builder::new()
                    .name(format!("ugds-emu-{name}{i}"))
                    .spawn(move || {
                        let mut staging = None;
                        loop {
                            let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                            let Ok(mut job) = job else { break };
                            {
                                // Held for the copy: unmapping waits for it.
                                let host = job.segs.iter().any(|s| s.2.is_none());
                                let _table = host.then(|| shared.iova.read().unwrap_or_else(|p| p.into_inner()));
                                // SAFETY: translated by the controller; the
                                // driver unmaps a buffer only after its
                                // commands completed, and a reset waits for
                                // every job first. Without the table held,
                                // every segment is device memory, reached
                                // only through the runtime it names.
                                let r = unsafe { move_data(&ns[job.ns], job.op, job.off, &job.segs, &mut staging) };
                                if let Err(s) = r {
                                    job.c.status = s;
                                }
                            }
                            done.lock().unwrap_or_else(|p| p.into_inner()).push(job);
                            shared.wake();
                        }
                    })
                    .ok()
            })
            .collect();
        Workers { tx: Some(tx), done, threads, inflight: 0 }
    }

    /// Waits until every job sent has finished.
    fn drain(&mut self) -> Vec<Job> {
        let mut all = Vec::new();
        while all.len() < self.inflight {
            all.append(&mut self.done.lock().unwrap_or_else(|p| p.into_inner()));
            if all.len() < self.inflight {
                std::thread::yield_now();
            }
        }
        self.inflight = 0;
        all
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn same_target(a: Option<&Arc<dyn DeviceRuntime>>, b: Option<&Arc<dyn DeviceRuntime>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

/// Page-aligned bounce memory, page-locked by a GPU runtime when it is used
/// for GPU transfers (so the copy engine reads and writes it directly).
struct Bounce {
    mem: std::mem::ManuallyDrop<Anonymous>,
    pinned_by: Option<Arc<dyn DeviceRuntime>>,
}

/// Pinned bounce memory no emulator uses now, kept for the next one and
/// never unpinned: `cuMemHostUnregister` waits for every stream of the
/// context while holding the CUDA driver's process-wide lock (measured on an
/// H200), so unpinning while a stream waits on an emulated I/O would block
/// the copy that I/O needs, in any context, until it timed out.
static PINNED_BOUNCE: std::sync::Mutex<Vec<(Anonymous, Arc<dyn DeviceRuntime>)>> = std::sync::Mutex::new(Vec::new());

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: taken once, here; `mem` is not used after.
        let mem = unsafe { std::mem::ManuallyDrop::take(&mut self.mem) };
        match self.pinned_by.take() {
            Some(rt) => PINNED_BOUNCE.lock().unwrap_or_else(|p| p.into_inner()).push((mem, rt)),
            None => drop(mem),
        }
    }
}

/// The first `len` bytes of the bounce buffer, grown (to a power of two, at
/// least 4 MiB) as needed and pinned by `rt` when given.
fn bounce<'a>(
    staging: &'a mut Option<Bounce>,
    len: usize,
    rt: Option<&Arc<dyn DeviceRuntime>>,
) -> std::io::Result<&'a mut [u8]> {
    let fits = staging.as_ref().is_some_and(|b| {
        b.mem.len() >= len
            && match (rt, &b.pinned_by) {
                (Some(r), Some(p)) => Arc::ptr_eq(r, p),
                (Some(_), None) => false,
                (None, _) => true,
            }
    });
    if !fits {
        let size = staging.as_ref().map_or(0, |b| b.mem.len()).max(len.next_power_of_two()).max(4 << 20);
        *staging = None;
        let parked = rt.and_then(|r| {
            let mut pool = PINNED_BOUNCE.lock().unwrap_or_else(|p| p.into_inner());
            let i = pool.iter().position(|(m, p)| m.len() >= size && Arc::ptr_eq(r, p))?;
            Some(pool.swap_remove(i))
        });
        *staging = Some(match parked {
            Some((mem, rt)) => Bounce { mem: std::mem::ManuallyDrop::new(mem), pinned_by: Some(rt) },
            None => {
                let mem = Anonymous::populated(size).map_err(std::io::Error::other)?;
                // Best effort: unpinned memory still works, only slower.
                let pinned_by = rt.filter(|r| r.host_register(mem.as_ptr(), size)).cloned();
                Bounce { mem: std::mem::ManuallyDrop::new(mem), pinned_by }
            }
        });
    }
    let b = staging.as_ref().expect("just set");
    // SAFETY: our own mapping of at least `len` bytes, borrowed mutably
    // through `staging`.
    Ok(unsafe { std::slice::from_raw_parts_mut(b.mem.as_ptr(), len) })
}
