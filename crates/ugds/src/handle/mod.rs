//! A handle: one controller and one of its namespaces, with the queues
//! that serve it.
//!
//! The controller's I/O queue pairs are split between a pool shared by
//! synchronous callers (chosen round-robin; several requests may be
//! outstanding on each) and queue pairs lent whole to [`IoQueue`](crate::IoQueue)s.
//!
//! Lifetime rules. Every call that may reach the device holds an in-flight
//! reference on the handle, and on the buffer it uses. A handle is closed
//! only when none remain ([`Handle::close`] with a [`Drain`] mode says how
//! long to wait); a buffer is deregistered only when none remain on it. A
//! command that times out wedges the handle: every later call fails with
//! [`Error::Wedged`], and the queues, DMA memory and buffer references the
//! stuck command holds are kept until [`Drain::ForceAfterReset`] has reset
//! the controller, after which the device can no longer reach them. A
//! wedged handle that is dropped without that leaks them on purpose.

mod api;
mod inflight;
mod options;
mod scheduler;
mod shared;
mod vectored;

use crate::mode::{Depth, ModeRequest};
pub use crate::publish::{QueueInfo, QueueLatency, QueueRole, QueueStats, QueueTrace};
pub use api::Handle;
pub use options::{trapping_hypervisor, Drain, HandleOptions, HandleState, MAX_TRACE};
pub use scheduler::{Placement, Priority};
pub(crate) use shared::DriverInner;
use ugds_platform::Recover;
pub(crate) use vectored::check_segments;
pub use vectored::{Segment, MAX_SEGMENTS};

use crate::engine::batch::BatchQueue;
use crate::engine::chunk::{Chunk, Chunker};
use crate::engine::hold::Hold;
use crate::engine::stats::QueueCounters;
use crate::engine::sync::{Cmd, Failure, Pacing, SyncQueue};
use crate::engine::trace::TraceEvent;
use crate::engine::{Completion, Controller, ControllerInfo, NamespaceInfo, QueuePair};
use crate::registry::{BufGuard, BufferToken, Recent};
use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ugds_nvme::{prp, Cid, Lba, Nsid, NvmOpcode, Sqe};
use ugds_platform::sys::PAGE_SIZE;
use ugds_platform::Platform;
use ugds_platform::{Error, Result};

/// How long a timed-out request is given to complete after its Abort.
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// How [`HandleInner::escalate`] ended.
pub(crate) enum Escalation {
    /// The late commands came back (aborted, or completed after all).
    Settled,
    /// Some did not: why (a timeout, or a controller gone or fatal).
    Stuck(Error),
}

/// A thread that serves a handle's batch queue for a layer above (the
/// stream engine, [`crate::stream`]). The handle holds it, without knowing
/// its type, and stops it before it deletes the queues.
pub(crate) trait QueueService: std::any::Any + Send {
    /// Stops it (nothing is in flight: the handle checked).
    fn stop(&mut self);
}

const OPEN: u8 = 0;
const WEDGED: u8 = 1;
const CLOSING: u8 = 2;
const CLOSED: u8 = 3;

pub(crate) struct HandleInner {
    pub id: u64,
    driver: Arc<DriverInner>,
    ns: NamespaceInfo,
    /// The namespace's size in bytes now: `ns.capacity()`, more once a
    /// file on the kernel path grew (`grow`).
    capacity: AtomicU64,
    sync: ManuallyDrop<Box<[Arc<SyncQueue>]>>,
    /// Places synchronous requests and paces the large ones.
    pub sched: scheduler::Scheduler,
    /// Vectored requests may go as one SGL command (the options allow it
    /// and the controller takes SGLs).
    pub sgl: bool,
    /// Where the synchronous queues without a vector start, when the mode
    /// both polls and sleeps: requests planned to poll go to them, the
    /// others to the queues before.
    pub polled_from: Option<usize>,
    pool: ManuallyDrop<Mutex<Vec<QueuePair>>>,
    /// The batch queues; the first also carries stream-ordered I/O (and is
    /// the synchronous queue when the controller granted one).
    batch: ManuallyDrop<Vec<Arc<BatchQueue>>>,
    /// What serves stream-ordered operations on the first batch queue
    /// (the stream layer's engine).
    service: Mutex<Option<Box<dyn QueueService>>>,
    ctrl: ManuallyDrop<Controller>,
    state: AtomicU8,
    pub(crate) inflight: inflight::Inflight,
    quarantine: Mutex<Vec<Hold>>,
    /// Registrations of staging blocks, by host address (see
    /// [`staging_token`](Self::staging_token)).
    staging: Mutex<std::collections::HashMap<usize, BufferToken>>,
    pub opts: HandleOptions,
    /// Set once the controller can no longer reach the queues' memory.
    released: std::sync::atomic::AtomicBool,
    async_queues: usize,
    queues: Vec<QueueInfo>,
    /// Each queue's counters, in the order of `queues`.
    counters: Vec<Arc<QueueCounters>>,
    /// Publishes them to a file, when asked to (stopped at teardown).
    publisher: Mutex<Option<crate::publish::Publisher>>,
}

impl HandleInner {
    pub fn new(id: u64, driver: Arc<DriverInner>, ctrl: Controller, opts: HandleOptions) -> Result<HandleInner> {
        let info = ctrl.info().clone();
        let why = |n: u32| info.skipped.iter().find(|s| s.0 == n).map(|s| s.1.clone());
        let ns = match opts.nsid {
            Some(n) => *info.namespaces.iter().find(|x| x.nsid == n).ok_or_else(|| match why(n) {
                Some(why) => Error::Unsupported(format!("namespace {n}: {why}")),
                None => Error::InvalidArgument(format!("namespace {n} is not active on this controller")),
            })?,
            None => *info.namespaces.first().ok_or_else(|| {
                let whys: Vec<String> = info.skipped.iter().map(|(n, w)| format!("namespace {n}: {w}")).collect();
                Error::Unsupported(if whys.is_empty() {
                    "controller has no usable namespace".into()
                } else {
                    format!("controller has no usable namespace ({})", whys.join("; "))
                })
            })?,
        };
        if let Some(e) = &opts.env_error {
            return Err(Error::InvalidArgument(e.clone()));
        }
        if opts.trace > MAX_TRACE {
            return Err(Error::InvalidArgument(format!(
                "a trace of {} commands per queue (at most {MAX_TRACE})",
                opts.trace
            )));
        }
        // Traces count from the handle's opening.
        let opened = Instant::now();
        let granted = info.io_queues.max(1);
        // Batch queues of their own while one is left for synchronous I/O.
        let nbatch = if granted >= 2 { opts.batch_queues_wanted().min(granted - 1) } else { 0 };
        let avail = granted - nbatch;
        // A mode that both polls and sleeps gets synchronous queues of each
        // kind (where the controller grants them): a queue with a vector
        // interrupts on every completion, polled or not, which costs the
        // CPU the polling was for (as Linux keeps poll queues apart).
        let split = opts.split_sync();
        let nsleep = opts.sync_queues.clamp(1, avail);
        let npoll = if split { nsleep.min(avail - nsleep) } else { 0 };
        let nsync = nsleep + npoll;
        let nasync = opts.async_queues.min(avail - nsync);
        let platform = ctrl.platform().clone();
        let vectors = platform.interrupt_vectors();
        // Vector 0 is the admin queue's; queue `qid` gets vector `qid`
        // while there are enough. Beyond that synchronous queues share
        // vectors 1.. round robin (vector 0 when it is the only one), as
        // Linux shares them; a lendable queue without a vector of its own
        // polls (its owner waits alone, it cannot share).
        // A mode that may sleep on interrupts needs them on the synchronous queues.
        let mode_sleeps = opts.mode.as_ref().is_some_and(|m| m.interrupts());
        let completion_of = |lent: bool| if mode_sleeps && !lent { Completion::Interrupt } else { opts.completion };
        let vector_for = |qid: u16, lent: bool| match completion_of(lent) {
            Completion::Interrupt if qid < vectors => Some(qid),
            Completion::Interrupt if vectors == 0 => {
                tracing::warn!(qid, "the platform has no interrupt vectors; the queue polls");
                None
            }
            Completion::Interrupt if lent => {
                tracing::info!(qid, "no interrupt vector left for this lendable queue; it polls");
                None
            }
            Completion::Interrupt => Some(if vectors > 1 { 1 + (qid - 1) % (vectors - 1) } else { 0 }),
            Completion::Poll => None,
        };
        // One queue pair for everything: deep enough for batches too.
        let shared_batch = opts.batch_queue && nbatch == 0;
        let mut created: Vec<QueuePair> = Vec::new();
        let depth = if shared_batch { opts.queue_depth.max(opts.batch_depth) } else { opts.queue_depth }.max(2);
        // Queue ids: the synchronous pool, then the batch queues, then the
        // lendable ones. Batch queues always poll (as in the paper).
        let is_batch = |qid: u16| qid > nsync && qid <= nsync + nbatch;
        for qid in 1..=nsync + nbatch + nasync {
            let made = if is_batch(qid) {
                ctrl.create_io_qpair_with(qid, opts.batch_depth.max(2), None, opts.batch_prp_pages)
            } else {
                let polled = qid > nsleep && qid <= nsync;
                ctrl.create_io_qpair(qid, depth, if polled { None } else { vector_for(qid, qid > nsync) })
            };
            match made {
                Ok(qp) => created.push(qp),
                Err(e) => {
                    for qp in &created {
                        let _ = ctrl.delete_io_qpair(qp);
                    }
                    let _ = ctrl.shutdown();
                    return Err(e);
                }
            }
        }
        if opts.trace > 0 {
            for qp in &mut created {
                qp.enable_trace(opts.trace, opened);
            }
        }
        let mut queues: Vec<QueueInfo> = created
            .iter()
            .map(|qp| {
                let qid = qp.qid().0;
                let role = match qid {
                    q if q <= nsync => QueueRole::Sync,
                    q if is_batch(q) => QueueRole::Batch,
                    _ => QueueRole::Lendable,
                };
                QueueInfo { qid, role, vector: qp.vector(), entries: qp.entries(), vector_shared_with: 0 }
            })
            .collect();
        let counters: Vec<Arc<QueueCounters>> = created.iter().map(|qp| qp.counters().clone()).collect();
        for i in 0..queues.len() {
            let v = queues[i].vector;
            if v.is_some() {
                queues[i].vector_shared_with = queues.iter().filter(|o| o.vector == v).count() as u16 - 1;
            }
        }
        let mut rest: Vec<QueuePair> = created.split_off(nsync as usize);
        let pool = rest.split_off(nbatch as usize);
        let mut sync: Vec<Arc<SyncQueue>> = Vec::with_capacity(created.len());
        let mut unwrapped = created.into_iter();
        for qp in unwrapped.by_ref() {
            match SyncQueue::new(qp, platform.clone()) {
                Ok(q) => sync.push(Arc::new(q)),
                Err(e) => {
                    // No I/O was issued: delete what was created and stop.
                    for q in &sync {
                        q.with_qp(|qp| ctrl.delete_io_qpair(qp)).ok();
                    }
                    for qp in unwrapped.chain(rest).chain(pool) {
                        ctrl.delete_io_qpair(&qp).ok();
                    }
                    let _ = ctrl.shutdown();
                    return Err(e);
                }
            }
        }
        for q in &sync {
            let siblings: Box<[_]> = sync
                .iter()
                .filter(|o| !Arc::ptr_eq(o, q) && o.vector().is_some() && o.vector() == q.vector())
                .map(Arc::downgrade)
                .collect();
            if !siblings.is_empty() {
                q.set_siblings(siblings);
            }
        }
        let sync: Box<[Arc<SyncQueue>]> = sync.into();
        let mut batch: Vec<(Arc<SyncQueue>, bool)> = rest
            .into_iter()
            .map(|qp| {
                let q = SyncQueue::new(qp, platform.clone()).expect("a queue without a vector needs no eventfd");
                (Arc::new(q), false)
            })
            .collect();
        if batch.is_empty() && shared_batch {
            tracing::info!("one I/O queue pair: batch and stream-ordered I/O share it with synchronous I/O");
            batch.push((sync[0].clone(), true));
        }
        let batch: Vec<Arc<BatchQueue>> =
            batch.into_iter().map(|(q, shared)| Arc::new(BatchQueue::new(q, shared, ns.nsid, opts.timeout))).collect();
        Ok(HandleInner {
            id,
            driver,
            ns,
            capacity: AtomicU64::new(ns.capacity()),
            sync: ManuallyDrop::new(sync),
            sched: scheduler::Scheduler::new(opts.placement, opts.chunk_bytes, info.max_transfer),
            polled_from: (npoll > 0).then_some(nsleep as usize),
            sgl: opts.sgl && ugds_nvme::sgl::supported(info.identify.sgls),
            async_queues: pool.len(),
            publisher: Mutex::new(None),
            queues,
            counters,
            pool: ManuallyDrop::new(Mutex::new(pool)),
            batch: ManuallyDrop::new(batch),
            service: Mutex::new(None),
            ctrl: ManuallyDrop::new(ctrl),
            state: AtomicU8::new(OPEN),
            inflight: inflight::Inflight::default(),
            quarantine: Mutex::new(Vec::new()),
            staging: Mutex::default(),
            opts,
            released: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn platform(&self) -> &Arc<dyn Platform> {
        self.ctrl.platform()
    }

    pub fn ns_nsid(&self) -> u32 {
        self.ns.nsid
    }

    /// Whether `bytes` fit one command (MDTS, and the 16-bit block count).
    pub fn fits_one_command(&self, bytes: usize) -> bool {
        self.ctrl.info().max_transfer.is_none_or(|m| bytes <= m) && bytes / self.ns.block_size as usize <= 1 << 16
    }

    /// Whether a vectored request of `total` bytes in `pieces` goes as one
    /// command with an SGL: the handle may, it fits one command, and its
    /// descriptors one page.
    pub fn one_sgl(&self, total: usize, pieces: &[ugds_nvme::sgl::Piece<'_>]) -> bool {
        use crate::engine::qpair::SGL_PER_PAGE;
        self.sgl
            && self.fits_one_command(total)
            && ugds_nvme::sgl::describe(pieces, PAGE_SIZE, SGL_PER_PAGE, |_, _| {}).is_ok()
    }

    /// Bytes usable on the namespace.
    pub fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Kernel path, a regular file: extends it to `at_least` bytes where it
    /// is shorter, and makes the capacity its size now (rounded up to a
    /// block: the last block's bytes past the end read as a short read).
    pub fn grow(&self, at_least: u64) -> Result<u64> {
        let crate::engine::Controller::Kernel(k) = &*self.ctrl else {
            return Err(Error::Unsupported("only a file on the kernel path grows".into()));
        };
        let Some(size) = k.file().grow(at_least)? else {
            return Err(Error::Unsupported("a block device or namespace does not grow".into()));
        };
        let bs = self.ns.block_size as u64;
        self.capacity.fetch_max(size.div_ceil(bs) * bs, Ordering::Relaxed);
        Ok(self.capacity())
    }

    /// The namespace's block size in bytes.
    pub fn block_size(&self) -> usize {
        self.ns.block_size as usize
    }

    /// Takes an in-flight reference if the handle is open.
    pub fn enter(&self) -> Result<InflightRef<'_>> {
        let stripe = self.inflight.add();
        match self.state.load(Ordering::SeqCst) {
            OPEN => Ok(InflightRef(self, stripe)),
            s => {
                self.inflight.sub(stripe);
                Err(if s == WEDGED { Error::Wedged } else { Error::Closed })
            }
        }
    }

    /// Checks a namespace range and returns the block size.
    pub fn check_range(&self, size: usize, file_offset: u64) -> Result<usize> {
        let bs = self.ns.block_size as u64;
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        // Block sizes are powers of two (2^LBADS): masks, not division.
        if file_offset & (bs - 1) != 0 {
            return Err(Error::Misaligned { what: "file offset", value: file_offset, alignment: bs });
        }
        if size as u64 & (bs - 1) != 0 {
            return Err(Error::Misaligned { what: "size", value: size as u64, alignment: bs });
        }
        let cap = self.capacity();
        if file_offset.checked_add(size as u64).is_none_or(|e| e > cap) {
            return Err(Error::OutOfRange { offset: file_offset, len: size as u64, capacity: cap });
        }
        Ok(bs as usize)
    }

    /// Validates a data request fully and takes the buffer reference
    /// through the caller's [`Recent`] entry, which then holds the buffer's
    /// page addresses; no command is issued when this fails.
    #[inline(always)]
    pub fn prepare_recent(
        &self,
        recent: &mut Option<Recent>,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
    ) -> Result<(BufGuard, usize)> {
        self.check_range(size, file_offset)?;
        let guard = self.driver.registry.acquire_recent(recent, self.id, buf, buf_offset as u64, size as u64)?;
        let data_off = self.data_offset(guard.entry().base, buf_offset)?;
        Ok((guard, data_off))
    }

    /// Where a transfer at `buf_offset` into the buffer at `base` starts
    /// within its first page; refuses an address PRPs cannot name (not
    /// dword-aligned).
    #[inline(always)]
    pub fn data_offset(&self, base: usize, buf_offset: usize) -> Result<usize> {
        let data_off = base % PAGE_SIZE + buf_offset;
        if data_off % 4 != 0 {
            return Err(Error::Misaligned { what: "buffer address", value: (base + buf_offset) as u64, alignment: 4 });
        }
        Ok(data_off)
    }

    /// The registration of a staging block of stream-ordered I/O (see
    /// `gpu::stream`), made at its first use on this handle and kept until
    /// the handle closes: for this handle only, found only by its token.
    /// Never made or removed on the completion path.
    pub fn staging_token(&self, base: *mut u8, len: usize) -> Result<BufferToken> {
        let mut map = self.staging.lock().recover();
        if let Some(t) = map.get(&(base as usize)) {
            return Ok(*t);
        }
        let me = [(self.id, self.platform().clone())];
        let t = self.driver.registry.insert(base as usize, len, None, &me, crate::registry::Visibility::Private)?;
        map.insert(base as usize, t);
        Ok(t)
    }

    /// Removes the staging registrations (nothing is in flight); one that
    /// a timed-out command still holds stays.
    fn release_staging(&self) {
        let mut map = self.staging.lock().recover();
        map.retain(|_, t| self.driver.registry.remove(t).is_err());
    }

    /// The synchronous queue for the next request, as the scheduler places it.
    #[inline]
    pub fn next_sync_queue(&self) -> &SyncQueue {
        self.sched.pick(&self.sync)
    }

    /// Runs `cmds`, one synchronous request of `size` bytes and class
    /// `prio`, on the queue the scheduler picks and paced as it says (and as
    /// the handle's mode plans it, if it has one); the queue and the
    /// outcome (for [`finish`](Self::finish)).
    #[inline(always)]
    pub fn run_scheduled<'a>(
        &self,
        cmds: impl Iterator<Item = Cmd<'a>>,
        name: &'static str,
        write: bool,
        prio: Priority,
        size: usize,
    ) -> (&SyncQueue, std::result::Result<u64, Failure>) {
        let Some(mode) = self.opts.mode.as_deref() else {
            return self.run_planned(cmds, name, prio, size, Depth::Scheduler, self.opts.completion);
        };
        let req = ModeRequest { bytes: size, write, priority: prio };
        let plan = mode.plan(&req);
        let start = plan.measure.then(Instant::now);
        let (q, r) = self.run_planned(cmds, name, plan.priority, size, plan.depth, plan.completion);
        if let (Some(start), Ok(_)) = (start, &r) {
            mode.observe(&req, &plan, start.elapsed());
        }
        (q, r)
    }

    #[inline(always)]
    fn run_planned<'a>(
        &self,
        cmds: impl Iterator<Item = Cmd<'a>>,
        name: &'static str,
        prio: Priority,
        size: usize,
        depth: Depth,
        completion: Completion,
    ) -> (&SyncQueue, std::result::Result<u64, Failure>) {
        // Once it has made room, a request keeps doing so (see the scheduler).
        let yielded = Cell::new(false);
        let yield_now = || {
            yielded.get() || {
                let y = self.sched.yields(prio, &self.sync);
                yielded.set(y);
                y
            }
        };
        let pacing = self.sched.pacing_at(prio, size, depth, &yield_now);
        let queues = match (self.polled_from, completion) {
            (Some(i), Completion::Poll) => &self.sync[i..],
            (Some(i), _) => &self.sync[..i],
            (None, _) => &self.sync[..],
        };
        let q = self.sched.pick(queues);
        let r = q.execute(cmds, name, completion, self.opts.timeout, pacing);
        if prio == Priority::Critical {
            self.sched.critical_done();
        }
        (q, r)
    }

    pub fn chunker(&self, file_offset: u64, data_off: usize, size: usize) -> Chunker {
        Chunker::new(file_offset, data_off, size, self.ns.block_size as usize, PAGE_SIZE, self.ctrl.info().max_transfer)
    }

    /// As [`wedge`](Self::wedge), for a stuck command whose buffer
    /// reference is kept elsewhere (or that has none).
    pub fn wedge_holding_nothing(&self) {
        self.wedge(None::<Hold>);
    }

    /// A command stuck on the device: refuse everything from now on and
    /// keep what it holds.
    pub fn wedge<G: Into<Hold>>(&self, guards: impl IntoIterator<Item = G>) {
        let first = self.state.swap(WEDGED, Ordering::SeqCst) != WEDGED;
        self.quarantine.lock().recover().extend(guards.into_iter().map(Into::into));
        if first && self.opts.trace > 0 {
            self.log_trace("wedged");
        }
    }

    /// Starts what serves the first batch queue for another layer (the
    /// stream engine, at open, so that the first stream operation pays
    /// nothing for it); nothing without a batch queue.
    pub fn start_service(
        self: &Arc<Self>,
        start: impl FnOnce(Arc<BatchQueue>, std::sync::Weak<HandleInner>) -> Result<Box<dyn QueueService>>,
    ) -> Result<()> {
        if let Some(b) = self.batch.first() {
            let s = start(b.clone(), Arc::downgrade(self))?;
            *self.service.lock().recover() = Some(s);
        }
        Ok(())
    }

    /// What serves the first batch queue, if anything does.
    pub fn service(&self) -> Option<std::sync::MutexGuard<'_, Option<Box<dyn QueueService>>>> {
        let g = self.service.lock().recover();
        g.is_some().then_some(g)
    }

    pub fn registry(&self) -> &crate::registry::Registry {
        &self.driver.registry
    }

    /// Whether `other` was opened by the same driver (shares its
    /// registrations).
    pub fn same_driver(&self, other: &HandleInner) -> bool {
        Arc::ptr_eq(&self.driver, &other.driver)
    }

    #[inline]
    pub fn is_wedged(&self) -> bool {
        self.state.load(Ordering::SeqCst) == WEDGED
    }

    fn stop_service(&self) {
        if let Some(mut s) = self.service.lock().recover().take() {
            s.stop();
        }
    }

    /// The (first) batch queue, or why there is none.
    pub fn batch_queue(&self) -> Result<&BatchQueue> {
        self.batch.first().map(|b| &**b).ok_or_else(|| {
            Error::Unsupported(format!(
                "no batch queue: batch_queue is off in this handle's options (the controller granted {} I/O queue pair(s))",
                self.ctrl.info().io_queues
            ))
        })
    }

    /// How many batch queues there are.
    pub fn batch_queues(&self) -> usize {
        self.batch.len()
    }

    /// The batch queues that are queue pairs of their own (not the
    /// synchronous one shared).
    pub fn batch_queues_own(&self) -> impl Iterator<Item = &BatchQueue> {
        self.batch.iter().filter(|b| !b.is_shared()).map(|b| &**b)
    }

    /// Batch queue `i` (see [`open_batch_context`](Self::open_batch_context)).
    pub fn batch_queue_at(&self, i: usize) -> &BatchQueue {
        &self.batch[i]
    }

    /// Opens a batch context of `capacity` requests on the batch queue with
    /// the fewest contexts (the first on a tie: the stream engine's context
    /// counts). Returns the queue's index and the context.
    pub fn open_batch_context(&self, capacity: usize) -> Result<(usize, u32)> {
        self.batch_queue()?;
        let i = (0..self.batch.len()).min_by_key(|&i| self.batch[i].contexts()).expect("at least one");
        Ok((i, self.batch[i].open_context(capacity)))
    }

    /// Runs an admin command.
    pub fn admin(&self, sqe: Sqe, op: &'static str) -> Result<ugds_nvme::Cqe> {
        self.ctrl.admin_command(sqe, op)
    }

    /// The end of a synchronous request. A late one is escalated as Linux's
    /// `nvme_timeout` does, after the queue's last look and the CSTS check:
    /// Abort each of its commands, and give the controller a moment to
    /// complete them. Only a request that still does not come back wedges
    /// the handle, with its buffer reference quarantined.
    pub fn finish(
        &self,
        q: &SyncQueue,
        r: std::result::Result<u64, Failure>,
        op: &'static str,
        guard: impl IntoIterator<Item = BufGuard>,
    ) -> Result<u64> {
        match r {
            Ok(short) => Ok(short),
            Err(Failure::Error(e)) => Err(e),
            Err(Failure::Stuck(e)) => {
                self.wedge(guard);
                Err(e)
            }
            Err(Failure::Late { error, slot }) => {
                let cids = q.outstanding_cids(slot);
                let mut res = None;
                match self.escalate(op, q.qid(), &cids, || {
                    res = q.settle_once(slot, op);
                    res.is_some()
                }) {
                    // It came back: aborted (an NVMe error, Command Abort
                    // Requested) or completed after all (then it succeeded).
                    Escalation::Settled => res.expect("settled"),
                    Escalation::Stuck(e) => {
                        self.wedge(guard);
                        Err(if matches!(e, Error::Timeout { .. }) { error } else { e })
                    }
                }
            }
        }
    }

    /// The one escalation of a request past its deadline, in the order of
    /// Linux's `nvme_timeout`, for synchronous requests, lent queues,
    /// batches and stream-ordered I/O alike: look at the queue once more
    /// (`settled` reaps it and says whether the late commands are all
    /// back), check CSTS (a controller that is gone or fatal will complete
    /// nothing), send Abort for each late command still on the device, and
    /// give the controller [`ABORT_GRACE`] to complete them. `Stuck`: some
    /// did not come back; the caller wedges the handle, keeping what they hold.
    /// The counters of I/O queue `qid`.
    pub fn counters_of(&self, qid: u16) -> Option<&Arc<QueueCounters>> {
        self.queues.iter().position(|q| q.qid == qid).map(|i| &self.counters[i])
    }

    /// What each I/O queue pair has done.
    pub fn queue_stats(&self) -> Vec<QueueStats> {
        crate::publish::queue_stats(&self.queues, &self.counters, self.ns.block_size as u64)
    }

    /// Each traced queue pair's latencies (none when not traced).
    pub fn queue_latency(&self) -> Vec<QueueLatency> {
        let with = |(q, c): (&QueueInfo, &Arc<QueueCounters>)| {
            let h = c.latency.get()?;
            Some(QueueLatency { qid: q.qid, role: q.role, latency: h.snapshot() })
        };
        self.queues.iter().zip(&self.counters).filter_map(with).collect()
    }

    /// The traces of the queue pairs that can be looked at now: the
    /// synchronous and batch queues (`wait`: waiting for their locks, else
    /// skipping those held) and the lendable ones not lent out.
    pub fn trace(&self, wait: bool) -> Vec<QueueTrace> {
        if self.opts.trace == 0 {
            return Vec::new();
        }
        let role_of = |qid: u16| self.queues.iter().find(|q| q.qid == qid).map_or(QueueRole::Sync, |q| q.role);
        let look = |q: &SyncQueue| {
            let f = |qp: &mut QueuePair| (qp.qid().0, qp.trace_events());
            if wait {
                Some(q.with_qp(f))
            } else {
                q.try_with_qp(f)
            }
        };
        let batch: Vec<Arc<SyncQueue>> = self.batch_queues_own().map(|b| b.queue().clone()).collect();
        let mut out: Vec<(u16, Option<Vec<TraceEvent>>)> =
            self.sync.iter().chain(&batch).filter_map(|q| look(q)).collect();
        if let Ok(pool) = self.pool.try_lock() {
            out.extend(pool.iter().map(|qp| (qp.qid().0, qp.trace_events())));
        }
        out.sort_by_key(|(qid, _)| *qid);
        out.into_iter()
            .filter_map(|(qid, events)| Some(QueueTrace { qid, role: role_of(qid), events: events? }))
            .collect()
    }

    /// Writes the traces to the log (a wedged handle's last commands).
    fn log_trace(&self, why: &str) {
        for t in self.trace(false) {
            tracing::error!(qid = t.qid, "{why}: the queue's last {} commands:", t.events.len());
            for e in &t.events {
                tracing::error!(qid = t.qid, "  {e}");
            }
        }
    }

    /// Starts publishing the queue statistics when the options ask for it.
    pub fn start_publishing(&self) -> Result<()> {
        let Some(dir) = self.opts.stats_dir.as_ref() else { return Ok(()) };
        let p = crate::publish::Publisher::start(
            dir,
            self.id,
            self.queues.clone(),
            self.counters.clone(),
            self.ns.block_size as u64,
        )
        .map_err(|e| Error::Platform(format!("publishing statistics to {}: {e}", dir.display())))?;
        *self.publisher.lock().recover() = Some(p);
        Ok(())
    }

    pub fn escalate(&self, op: &'static str, qid: u16, cids: &[Cid], mut settled: impl FnMut() -> bool) -> Escalation {
        if settled() {
            return Escalation::Settled;
        }
        if let Some(c) = self.counters_of(qid) {
            c.timeouts.add_shared(cids.len() as u64);
        }
        let csts = self.ctrl.csts();
        if csts.is_gone() {
            return Escalation::Stuck(Error::DeviceGone);
        }
        if csts.cfs() {
            return Escalation::Stuck(Error::ControllerFatal);
        }
        for &cid in cids {
            match self.ctrl.admin_command(Sqe::abort(Cid(0), ugds_nvme::Qid(qid), cid), "Abort") {
                Ok(c) if c.dw0 & 1 == 0 => tracing::warn!(qid, cid = cid.0, "{op}: aborted"),
                Ok(_) => tracing::warn!(qid, cid = cid.0, "{op}: the controller did not abort it"),
                Err(e) => tracing::warn!(qid, cid = cid.0, "{op}: Abort failed: {e}"),
            }
        }
        let deadline = Instant::now() + ABORT_GRACE;
        loop {
            if settled() {
                return Escalation::Settled;
            }
            if Instant::now() > deadline {
                tracing::error!(qid, "{op} did not complete after Abort; wedging the handle");
                return Escalation::Stuck(Error::Timeout { qid, cid: cids.first().copied(), after: self.opts.timeout });
            }
            std::thread::yield_now();
        }
    }

    /// The late requests of a batch context (or a stream engine's, or a
    /// shared IoQueue's) through [`escalate`](Self::escalate): `Settled`
    /// leaves nothing to do (aborted requests come back as events with
    /// their status); otherwise the late ones are reported timed out and
    /// their holds returned, for the caller to wedge the handle with.
    pub fn expire_batch(&self, q: &BatchQueue, ctx: u32) -> Vec<Hold> {
        let late = q.late(ctx);
        if late.is_empty() {
            return Vec::new();
        }
        let cids: Vec<Cid> = late.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        let settled = || {
            q.reap_now();
            late.iter().all(|&(r, _)| !q.in_flight(ctx, r))
        };
        match self.escalate("batch I/O", q.qid(), &cids, settled) {
            Escalation::Settled => Vec::new(),
            Escalation::Stuck(_) => q.expire(ctx),
        }
    }

    /// Queue pairs this handle can lend (see [`Handle::io_queue`]).
    pub fn lendable_queues(&self) -> usize {
        self.async_queues
    }

    /// I/O queue pairs the controller granted.
    pub fn controller_queues(&self) -> u16 {
        self.ctrl.info().io_queues
    }

    /// Synchronous queue pairs.
    pub fn sync_queues(&self) -> usize {
        self.sync.len()
    }

    pub fn take_async_queue(&self) -> Option<QueuePair> {
        self.pool.lock().recover().pop()
    }

    pub fn return_async_queue(&self, qp: QueuePair) {
        self.pool.lock().recover().push(qp);
    }

    fn unmap_buffers(&self) {
        let mut handles = self.driver.handles.lock().recover();
        handles.retain(|(id, _)| *id != self.id);
        let _ = self.driver.registry.for_each(|e| {
            e.unmap_for(self.id);
            Ok(())
        });
    }

    /// Orderly teardown of an idle handle: queues deleted, controller shut
    /// down. Falls back to a disable (which also stops DMA) when the
    /// controller does not cooperate.
    fn teardown(&self) -> Result<()> {
        self.stop_service();
        self.publisher.lock().recover().take();
        let mut clean = true;
        for q in self.sync.iter() {
            clean &= q.with_qp(|qp| self.ctrl.delete_io_qpair(qp)).is_ok();
        }
        for qp in self.pool.lock().recover().iter() {
            clean &= self.ctrl.delete_io_qpair(qp).is_ok();
        }
        for b in self.batch_queues_own() {
            clean &= self.ctrl.delete_io_qpair(&b.lock().qp).is_ok();
        }
        let down = if clean { self.ctrl.shutdown() } else { self.ctrl.disable() };
        if let Err(e) = down.or_else(|_| self.ctrl.disable()) {
            // The controller did not confirm it stopped: keep everything.
            self.state.store(WEDGED, Ordering::SeqCst);
            return Err(e);
        }
        self.release_staging();
        self.unmap_buffers();
        self.released.store(true, Ordering::SeqCst);
        self.state.store(CLOSED, Ordering::SeqCst);
        Ok(())
    }

    fn force_teardown(&self) -> Result<()> {
        // CC.EN = 0 and CSTS.RDY = 0: the controller has stopped and dropped
        // every queue; nothing it held can be written any more.
        self.ctrl.disable()?;
        self.stop_service();
        self.publisher.lock().recover().take();
        for q in self.sync.iter() {
            q.with_qp(|qp| qp.forget_outstanding());
        }
        for b in self.batch.iter() {
            b.forget_outstanding();
        }
        self.quarantine.lock().recover().clear();
        self.release_staging();
        self.unmap_buffers();
        self.released.store(true, Ordering::SeqCst);
        self.state.store(CLOSED, Ordering::SeqCst);
        Ok(())
    }

    pub fn close(&self, drain: Drain) -> Result<()> {
        match self.state.load(Ordering::SeqCst) {
            CLOSED | CLOSING => return Err(Error::Closed),
            WEDGED if drain == Drain::ForceAfterReset => return self.force_teardown(),
            WEDGED => return Err(Error::Wedged),
            _ => {}
        }
        let deadline = match drain {
            Drain::NoWait | Drain::ForceAfterReset => Some(Instant::now()),
            Drain::Timeout(d) => Some(Instant::now() + d),
            Drain::Forever => None,
        };
        loop {
            if self.state.compare_exchange(OPEN, CLOSING, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                // Wedged meanwhile by an I/O that timed out.
                return self.close(drain);
            }
            let n = self.inflight.total();
            if n == 0 {
                break;
            }
            // Reopen while waiting, so that a refused close changes nothing.
            self.state.store(OPEN, Ordering::SeqCst);
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Busy { what: "handle", inflight: n });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.teardown()
    }
}

impl Drop for HandleInner {
    fn drop(&mut self) {
        if !self.released.load(Ordering::SeqCst) && self.state.load(Ordering::SeqCst) == OPEN {
            if let Err(e) = self.teardown() {
                tracing::error!("handle teardown at drop failed: {e}");
            }
        }
        if self.released.load(Ordering::SeqCst) {
            // SAFETY: each field is dropped exactly once, here, and never
            // used after; the controller can no longer reach their memory.
            unsafe {
                ManuallyDrop::drop(&mut self.sync);
                ManuallyDrop::drop(&mut self.pool);
                ManuallyDrop::drop(&mut self.batch);
                ManuallyDrop::drop(&mut self.ctrl);
            }
        } else {
            tracing::error!(
                handle = self.id,
                "dropping a wedged handle without a forced teardown: its queues, DMA memory and buffer references are leaked on purpose"
            );
            let q = std::mem::take(&mut *self.quarantine.lock().recover());
            std::mem::forget(q);
            self.unmap_buffers_leaving_quarantined();
        }
    }
}

impl HandleInner {
    /// On a leaked handle: keep the mappings of buffers a stuck command
    /// may still write (the device may DMA there), drop the others.
    fn unmap_buffers_leaving_quarantined(&self) {
        let mut handles = self.driver.handles.lock().recover();
        handles.retain(|(id, _)| *id != self.id);
        let _ = self.driver.registry.for_each(|e| {
            if e.inflight.load(Ordering::Acquire) == 0 {
                e.unmap_for(self.id);
            }
            Ok(())
        });
    }
}

/// An in-flight reference on a handle.
pub(crate) struct InflightRef<'a>(&'a HandleInner, usize);

impl InflightRef<'_> {
    /// Keeps the reference past this scope (a batch context, a lent
    /// queue): returns the stripe to hand to `inflight.sub` at its end.
    pub(crate) fn keep(self) -> usize {
        let stripe = self.1;
        std::mem::forget(self);
        stripe
    }
}

impl Drop for InflightRef<'_> {
    fn drop(&mut self) {
        self.0.inflight.sub(self.1);
    }
}
