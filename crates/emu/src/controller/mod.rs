//! The emulated controller's thread: registers, queues, commands.

mod admin;
mod commands;
mod completion;
mod data;
mod namespace;
mod state;

use completion::{Completion, Delayed, Lie};
use data::*;
pub(super) use namespace::Namespace;
use namespace::Store;
use ugds_platform::Recover;

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
use ugds_nvme::{prp, sgl, AdminOpcode, Iova, NvmOpcode, Sqe, Status, IDENTIFY_LEN};
use ugds_platform::device::DeviceRuntime;
use ugds_platform::dma::DmaRegion;
use ugds_platform::sys::shared::futex_wait;
use ugds_platform::sys::{self, Anonymous};
use ugds_platform::{Error, Result};

/// Commands taken from one submission queue per sweep, so that one busy
/// queue cannot starve the others (round-robin arbitration, burst 64).
const SQ_BURST: u32 = 64;

/// Outstanding Asynchronous Event Requests accepted (Identify ACL/AERL: 4).
const AER_LIMIT: usize = 4;

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
    /// Commands of each submission queue on the workers or the GPU copy
    /// thread, not yet collected.
    sq_jobs: Vec<u32>,
    /// Delete I/O Submission Queue commands waiting for those: (the
    /// deleted queue, the admin command's identifier).
    deleting: Vec<(usize, u16)>,
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
            sq_jobs: vec![0; nq],
            deleting: Vec::new(),
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
            // Sleep. Announce it, then look once more: a register write made
            // before the driver saw `sleeping` is found by this step, one
            // made after it comes with a wake (see `Shared::wake`).
            self.shared.sleeping().store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if !self.shared.stop.load(Ordering::Acquire) && !self.step() {
                let timeout = self
                    .delayed
                    .peek()
                    .map_or(Duration::from_secs(1), |d| d.0.due.saturating_duration_since(Instant::now()));
                futex_wait(self.shared.sleeping(), 1, timeout);
            }
            self.shared.sleeping().store(0, Ordering::Relaxed);
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
        self.shared.registers()[off / 4].load(Ordering::Acquire)
    }

    fn set_reg(&self, off: usize, v: u32) {
        self.shared.registers()[off / 4].store(v, Ordering::Release);
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
        let table = shared.iova.read().recover();
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
        if let Err(s) = self.walk_data(table, sqe, len).and_then(|()| self.translate_segs(table)) {
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
        self.sq_jobs[qid as usize] += 1;
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
                let done = std::mem::take(&mut *w.done.lock().recover());
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
            let n = &mut self.sq_jobs[job.c.sqid as usize];
            *n = n.saturating_sub(1);
            self.held.push(job.c);
        }
        // A deleted queue's last command stopped moving data: its delete
        // completes (after the command's own completion, which goes
        // nowhere now).
        if !self.deleting.is_empty() {
            let (sq_jobs, held) = (&self.sq_jobs, &mut self.held);
            self.deleting.retain(|&(qid, cid)| {
                let waiting = sq_jobs[qid] != 0;
                if !waiting {
                    held.push(Completion { sqid: 0, cid, dw0: 0, status: Status::SUCCESS, lie: Lie::None });
                }
                waiting
            });
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
        let mut faults = self.shared.faults.lock().recover();
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
}
