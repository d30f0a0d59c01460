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
mod escalate;
mod inflight;
mod life;
mod options;
mod queues;
mod scheduler;
mod shared;
mod vectored;

use crate::mode::{Depth, ModeRequest};
pub use crate::publish::{QueueInfo, QueueLatency, QueueRole, QueueStats, QueueTrace};
pub use api::Handle;
pub(crate) use escalate::Escalation;
pub use options::{trapping_hypervisor, Drain, HandleOptions, HandleState, MAX_TRACE};
pub use scheduler::{Placement, Priority};
pub(crate) use shared::DriverInner;
use ugds_platform::Recover;
pub(crate) use vectored::check_segments;
pub use vectored::{Segment, MAX_SEGMENTS};

use crate::engine::batch::BatchQueue;
use crate::engine::chunk::{Chunk, Chunker};
use crate::engine::hold::Hold;
use crate::engine::sync::{Cmd, Failure, Pacing, SyncQueue};
use crate::engine::{Completion, Controller, ControllerInfo, NamespaceInfo, QueuePair};
use crate::registry::{BufGuard, BufferToken, Recent};
use life::{Closing, Life};
use queues::Queues;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use ugds_nvme::{prp, Cid, Lba, Nsid, NvmOpcode, Sqe};
use ugds_platform::sys::PAGE_SIZE;
use ugds_platform::Platform;
use ugds_platform::{Error, Result};

/// A thread that serves a handle's batch queue for a layer above (the
/// stream engine, [`crate::stream`]). The handle holds it, without knowing
/// its type, and stops it before it deletes the queues.
pub(crate) trait QueueService: std::any::Any + Send {
    /// Stops it (nothing is in flight: the handle checked).
    fn stop(&mut self);
}

pub(crate) struct HandleInner {
    pub id: u64,
    driver: Arc<DriverInner>,
    ns: NamespaceInfo,
    /// The namespace's size in bytes now: `ns.capacity()`, more once a
    /// file on the kernel path grew (`grow`).
    capacity: AtomicU64,
    /// Where this process's share of the namespace starts, in bytes (0
    /// unless attached to a controller whose namespaces are split between
    /// processes: the share then ends at `capacity`).
    floor: u64,
    /// The controller and the queue pairs.
    queues: Queues,
    /// Open, wedged, closing, closed; what is in flight; what stuck
    /// commands hold.
    pub(crate) life: Life,
    /// Places synchronous requests and paces the large ones.
    pub sched: scheduler::Scheduler,
    /// Vectored requests may go as one SGL command (the options allow it
    /// and the controller takes SGLs).
    pub sgl: bool,
    /// What serves stream-ordered operations on the first batch queue
    /// (the stream layer's engine).
    service: Mutex<Option<Box<dyn QueueService>>>,
    /// Registrations of staging blocks, by host address (see
    /// [`staging_token`](Self::staging_token)).
    staging: Mutex<std::collections::HashMap<usize, BufferToken>>,
    pub opts: HandleOptions,
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
        // An attached process's part of the namespace, when split.
        let (floor, end) = match ctrl.platform().remote_admin().map(|r| r.share()) {
            Some((part, parts)) if parts > 1 => {
                let blocks = ns.blocks / parts as u64;
                let bs = ns.block_size as u64;
                (part as u64 * blocks * bs, (part as u64 + 1) * blocks * bs)
            }
            _ => (0, ns.capacity()),
        };
        let queues = Queues::open(ctrl, &opts, ns.nsid)?;
        Ok(HandleInner {
            id,
            driver,
            ns,
            capacity: AtomicU64::new(end),
            floor,
            queues,
            life: Life::default(),
            sched: scheduler::Scheduler::new(opts.placement, opts.chunk_bytes, info.max_transfer),
            sgl: opts.sgl && ugds_nvme::sgl::supported(info.identify.sgls),
            publisher: Mutex::new(None),
            service: Mutex::new(None),
            staging: Mutex::default(),
            opts,
        })
    }

    pub fn platform(&self) -> &Arc<dyn Platform> {
        self.queues.ctrl.platform()
    }

    /// Whether its queues copy GPU memory through bounce buffers.
    pub fn bounces_device_memory(&self) -> bool {
        self.queues.ctrl.bounces_device_memory()
    }

    pub fn ns_nsid(&self) -> u32 {
        self.ns.nsid
    }

    /// Whether `bytes` fit one command (MDTS, and the 16-bit block count).
    pub fn fits_one_command(&self, bytes: usize) -> bool {
        self.queues.ctrl.info().max_transfer.is_none_or(|m| bytes <= m)
            && bytes / self.ns.block_size as usize <= 1 << 16
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

    /// Where this process's share of the namespace starts (see `floor`).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Kernel path, a regular file: extends it to `at_least` bytes where it
    /// is shorter, and makes the capacity its size now (rounded up to a
    /// block: the last block's bytes past the end read as a short read).
    pub fn grow(&self, at_least: u64) -> Result<u64> {
        let crate::engine::Controller::Kernel(k) = &*self.queues.ctrl else {
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
    #[inline]
    pub fn enter(&self) -> Result<InflightRef<'_>> {
        self.life.enter().map(|stripe| InflightRef(self, stripe))
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
        if file_offset < self.floor {
            return Err(Error::InvalidArgument(format!(
                "bytes {file_offset:#x}+{size:#x} lie outside this process's share {:#x}..{cap:#x} of the namespace",
                self.floor
            )));
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
        self.sched.pick(&self.queues.sync)
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
                let y = self.sched.yields(prio, &self.queues.sync);
                yielded.set(y);
                y
            }
        };
        let pacing = self.sched.pacing_at(prio, size, depth, &yield_now);
        let sync = &self.queues.sync;
        let queues = match (self.queues.polled_from, completion) {
            (Some(i), Completion::Poll) => &sync[i..],
            (Some(i), _) => &sync[..i],
            (None, _) => &sync[..],
        };
        let q = self.sched.pick(queues);
        let r = q.execute(cmds, name, completion, self.opts.timeout, pacing);
        if prio == Priority::Critical {
            self.sched.critical_done();
        }
        (q, r)
    }

    pub fn chunker(&self, file_offset: u64, data_off: usize, size: usize) -> Chunker {
        Chunker::new(
            file_offset,
            data_off,
            size,
            self.ns.block_size as usize,
            PAGE_SIZE,
            self.queues.ctrl.info().max_transfer,
        )
    }

    /// As [`wedge`](Self::wedge), for a stuck command whose buffer
    /// reference is kept elsewhere (or that has none).
    pub fn wedge_holding_nothing(&self) {
        self.wedge(None::<Hold>);
    }

    /// A command stuck on the device: refuse everything from now on and
    /// keep what it holds.
    pub fn wedge<G: Into<Hold>>(&self, guards: impl IntoIterator<Item = G>) {
        if self.life.wedge(guards) && self.opts.trace > 0 {
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
        if let Some(b) = self.queues.first_batch() {
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
        self.life.is_wedged()
    }

    fn stop_service(&self) {
        if let Some(mut s) = self.service.lock().recover().take() {
            s.stop();
        }
    }

    /// The handle's queue pairs.
    pub fn queues(&self) -> &Queues {
        &self.queues
    }

    /// The (first) batch queue, or why there is none.
    pub fn batch_queue(&self) -> Result<&BatchQueue> {
        self.queues.batch_queue()
    }

    /// Runs an admin command.
    pub fn admin(&self, sqe: Sqe, op: &'static str) -> Result<ugds_nvme::Cqe> {
        self.queues.ctrl.admin_command(sqe, op)
    }

    /// What each I/O queue pair has done.
    pub fn queue_stats(&self) -> Vec<QueueStats> {
        self.queues.stats(self.ns.block_size as u64)
    }

    /// The queue pairs' traces (none unless the options trace).
    pub fn trace(&self, wait: bool) -> Vec<QueueTrace> {
        if self.opts.trace == 0 {
            return Vec::new();
        }
        self.queues.trace(wait)
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
            self.queues.info.clone(),
            self.queues.counters.clone(),
            self.ns.block_size as u64,
        )
        .map_err(|e| Error::Platform(format!("publishing statistics to {}: {e}", dir.display())))?;
        *self.publisher.lock().recover() = Some(p);
        Ok(())
    }

    /// Queue pairs this handle can lend (see [`Handle::io_queue`]).
    pub fn lendable_queues(&self) -> usize {
        self.queues.lendable
    }

    /// I/O queue pairs the controller granted.
    pub fn controller_queues(&self) -> u16 {
        self.queues.ctrl.info().io_queues
    }

    pub fn take_async_queue(&self) -> Option<QueuePair> {
        self.queues.take_lendable()
    }

    pub fn return_async_queue(&self, qp: QueuePair) {
        self.queues.return_lendable(qp)
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
        if let Err(e) = self.queues.delete_and_stop() {
            // The controller did not confirm it stopped: keep everything.
            self.life.stuck();
            return Err(e);
        }
        self.release_staging();
        self.unmap_buffers();
        self.life.closed();
        Ok(())
    }

    /// A wedged handle's teardown after a controller reset: the disabled
    /// controller can reach nothing, so what stuck commands held goes too.
    fn force_teardown(&self) -> Result<()> {
        self.queues.disable_and_forget()?;
        self.stop_service();
        self.publisher.lock().recover().take();
        self.life.release_quarantine();
        self.release_staging();
        self.unmap_buffers();
        self.life.closed();
        Ok(())
    }

    pub fn close(&self, drain: Drain) -> Result<()> {
        match self.life.drain(drain)? {
            Closing::Idle => self.teardown(),
            Closing::Force => self.force_teardown(),
        }
    }
}

impl Drop for HandleInner {
    fn drop(&mut self) {
        if !self.queues.released() && self.life.is_open() {
            if let Err(e) = self.teardown() {
                tracing::error!("handle teardown at drop failed: {e}");
            }
        }
        // The queues go with the handle if the controller was stopped;
        // otherwise they leak (see `Queues`'s drop), and so does this.
        if !self.queues.released() {
            tracing::error!(
                handle = self.id,
                "dropping a wedged handle without a forced teardown: its queues, DMA memory and buffer references are leaked on purpose"
            );
            self.life.leak_quarantine();
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
        self.0.life.inflight.sub(self.1);
    }
}
