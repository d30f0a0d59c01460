//! Stream-ordered I/O on GPU streams.
//!
//! For each operation, a host function is launched on the stream; it binds
//! the late values and hands the I/O to the handle's stream engine, then
//! returns at once. Behind it the stream waits on the GPU side
//! (`cuStreamWaitValue32` / `hipStreamWaitValue32`, "greater or equal") for
//! a word in device-mapped host memory, which the operation's signal sets
//! to the operation's sequence number once the bytes moved are written. So
//! the runtime's callback thread is never held for an I/O, and many
//! streams progress at once. Where stream memory operations are not
//! supported, the host function waits for the signal itself (logged once).
//!
//! Streams belong to the caller, who may destroy one as soon as its work is
//! enqueued. So ugds never touches a stream except to enqueue an operation:
//! not to synchronize it at drop, not to learn whether it is done. After
//! each wait the stream itself writes the sequence number into a second
//! word ("passed"); a [`GpuStream`]'s words go back to their pool only when
//! that word shows the GPU has passed its last wait, and until then they
//! stay where they are (see [`WordPool`]).
//!
//! Staging: where the controller reaches device memory only through the
//! runtime's copies (the emulated controller), an I/O that a stream waits on
//! must not need the runtime to complete: the CUDA driver serializes its
//! calls under a process-wide lock, and calls such as `cuStreamCreate` or
//! `cuMemFree` hold it while they wait for the device, which waits for the
//! I/O. So such operations move their data through a staging block of
//! device-mapped host memory ([`StageLease`]): the controller reads or
//! writes the block like any host buffer, and the stream itself copies
//! between the block and the caller's memory with a small kernel, before
//! the I/O (writes) or after its wait (reads). The kernel reads its
//! addresses and length from the block's header when it runs, so sizes and
//! offsets bound late by the stream work as they do without staging.

use crate::stream::{Stream, StreamCounters, StreamService, StreamSignal};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};
use ugds_platform::Recover;
use ugds_platform::{Error, Result};
mod reach;
mod staging;
#[cfg(test)]
mod tests;
mod words;

use reach::{Action, Points};
pub(crate) use staging::{StageLease, StageMark, StagePool, MAX_PIECES, STAGE_MAX};
pub(crate) use words::WordPool;
use words::{Slot, BUDGET_PATIENCE};
// For the runtimes' backends (none without the `gpu` feature).
#[cfg_attr(not(feature = "gpu"), allow(unused_imports))]
pub(crate) use {staging::STAGE_HEADER, words::WORD_PAGE};

/// How a GPU stream waits for an operation's I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamWait {
    /// The stream waits on the GPU for a completion word; the callback
    /// returns at once. Falls back to [`BlockingCallback`](Self::BlockingCallback)
    /// where the device cannot wait on memory.
    DeviceSide,
    /// The host callback waits for the I/O (what the existing uGDS does for
    /// every operation; here only a fallback).
    BlockingCallback,
}

/// What a GPU runtime provides for [`GpuStream`].
pub(crate) trait StreamBackend: Send + Sync {
    /// Allocates [`WORD_PAGE`] bytes of device-mapped host memory, never
    /// freed: (host address, device address).
    fn alloc_page(&self) -> Result<(usize, u64)>;
    /// The pool of words for streams of this backend's context.
    fn pool(&self) -> &Mutex<WordPool>;
    /// Launches `f(data)` on `stream` in stream order.
    fn launch_host_fn(&self, stream: usize, f: unsafe extern "C" fn(*mut c_void), data: *mut c_void) -> Result<()>;
    /// Makes `stream` wait until the word at `addr` is at least `value`
    /// (cyclically). `Ok(false)`: not supported here.
    fn wait_value32(&self, stream: usize, addr: u64, value: u32) -> Result<bool>;
    /// Makes `stream` write `value` to the word at `addr` when it gets
    /// there. `Ok(false)`: not supported here.
    fn write_value32(&self, stream: usize, addr: u64, value: u32) -> Result<bool>;
    /// Waits until all work on `stream` is done.
    fn synchronize(&self, stream: usize) -> Result<()>;
    /// "CUDA" or "HIP".
    fn name(&self) -> &'static str;
    /// The runtime's context these streams belong to (0: unknown).
    fn context(&self) -> usize {
        0
    }
    /// Allocates `len` bytes of device-mapped host memory for staging,
    /// never freed: (host address, device address).
    fn alloc_stage(&self, _len: usize) -> Result<(usize, u64)> {
        Err(Error::Unsupported(format!("staging through {} streams", self.name())))
    }
    /// The pool of staging blocks, where staging is supported.
    fn stage_pool(&self) -> Option<&Mutex<StagePool>> {
        None
    }
    /// The staging block at device address `dev` is lent to an operation
    /// that moves up to `bytes` through it (a hint for its copies' launch).
    fn stage_lent(&self, _dev: u64, _bytes: usize) {}
    /// Launches the staging copy kernel on `stream` for the block whose
    /// header is at device address `header`.
    fn launch_copy(&self, _stream: usize, _header: u64) -> Result<()> {
        Err(Error::Unsupported(format!("staging through {} streams", self.name())))
    }
}

/// A GPU stream (CUDA or HIP) that ugds places operations in; see
/// [`Handle::read_async`](crate::Handle::read_async). The stream stays the
/// caller's: dropping this neither waits for nor touches it, and the caller
/// may destroy the stream once its operations are enqueued.
pub struct GpuStream {
    backend: Arc<dyn StreamBackend>,
    raw: usize,
    slot: Slot,
    /// Operations enqueued and not yet reached (device-side waiting).
    points: Arc<Points>,
    wait: StreamWait,
    /// Held while launching, so that numbers reach the stream in order.
    seq: Mutex<Seq>,
    timing: Arc<Timing>,
    counters: Arc<StreamCounters>,
    service: Mutex<StreamService>,
}

impl std::fmt::Debug for GpuStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuStream").field("raw", &self.raw).field("wait", &self.wait).finish_non_exhaustive()
    }
}

/// A stream's sequence numbers.
struct Seq {
    /// Number of the last operation launched.
    last: u32,
    /// The last value the GPU was asked to write to `passed`; `None` while
    /// the GPU has never been given the slot.
    passed: Option<u32>,
    /// A wait was enqueued without its `passed` write: the slot can never
    /// be known free, and is kept for the process's life.
    lost: bool,
}

/// When the last signal was set, and the gaps from a signal to the next
/// operation's start, for [`GpuStream::gaps`].
#[derive(Default)]
struct Timing {
    /// Nanoseconds since `EPOCH` of the last signal; 0 before the first.
    last_signal: AtomicU64,
    gap_sum_ns: AtomicU64,
    gaps: AtomicU64,
    /// Start of the running operation, and the sum of operations' times
    /// from start to signal.
    last_start: AtomicU64,
    busy_sum_ns: AtomicU64,
    ops: AtomicU64,
}

impl Timing {
    fn started(&self) {
        let now = now_ns();
        let last = self.last_signal.swap(0, Ordering::Relaxed);
        if last != 0 {
            self.gap_sum_ns.fetch_add(now.saturating_sub(last), Ordering::Relaxed);
            self.gaps.fetch_add(1, Ordering::Relaxed);
        }
        self.last_start.store(now, Ordering::Relaxed);
    }

    fn signalled(&self) {
        let now = now_ns();
        let start = self.last_start.load(Ordering::Relaxed);
        self.busy_sum_ns.fetch_add(now.saturating_sub(start), Ordering::Relaxed);
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.last_signal.store(now, Ordering::Relaxed);
    }
}

static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

static FALLBACK_LOGGED: Once = Once::new();

impl GpuStream {
    pub(crate) fn new(backend: Arc<dyn StreamBackend>, raw: usize, wait: StreamWait) -> Result<GpuStream> {
        let slot = backend.pool().lock().recover().take(&*backend)?;
        let timing = Arc::new(Timing::default());
        let seq = Mutex::new(Seq { last: 0, passed: None, lost: false });
        let points = Points::new(slot);
        let mut s = GpuStream {
            backend,
            raw,
            slot,
            points,
            wait,
            seq,
            timing,
            counters: Arc::default(),
            service: Mutex::default(),
        };
        if wait == StreamWait::DeviceSide {
            // The word is 0, so waiting for >= 0 passes at once: a probe of
            // both memory operations, which also makes `passed` 0.
            let seq = s.seq.get_mut().recover();
            let supported = match s.backend.wait_value32(raw, slot.dev, 0)? {
                false => false,
                true => {
                    seq.passed = Some(0);
                    let w = s.backend.write_value32(raw, slot.dev + 4, 0);
                    seq.lost = !matches!(w, Ok(true));
                    w?
                }
            };
            if !supported {
                FALLBACK_LOGGED.call_once(|| {
                    tracing::warn!(
                        "{}: stream memory operations are not supported; stream-ordered I/O \
                         blocks the runtime's callback thread for each I/O",
                        s.backend.name()
                    )
                });
                s.wait = StreamWait::BlockingCallback;
            }
        }
        Ok(s)
    }

    /// How this stream waits for I/O.
    pub fn wait_mode(&self) -> StreamWait {
        self.wait
    }

    /// The runtime's stream handle.
    pub fn raw(&self) -> *mut c_void {
        self.raw as *mut c_void
    }

    /// Waits until all work on the stream is done.
    pub fn synchronize(&self) -> Result<()> {
        let r = self.backend.synchronize(self.raw);
        self.timing.last_signal.store(0, Ordering::Relaxed);
        r
    }

    /// Where a stream's time went, for operations queued back to back:
    /// `(operations, mean time from start to signal, mean time from one
    /// operation's signal to the next one's start)`. The second is the
    /// hand-off (the GPU seeing the word, the runtime running the next host
    /// function); gaps across a [`synchronize`](Self::synchronize) are not
    /// counted.
    pub fn timing(&self) -> (u64, Duration, Duration) {
        let t = &self.timing;
        let (ops, gaps) = (t.ops.load(Ordering::Relaxed), t.gaps.load(Ordering::Relaxed));
        let busy = t.busy_sum_ns.load(Ordering::Relaxed).checked_div(ops).unwrap_or(0);
        let gap = t.gap_sum_ns.load(Ordering::Relaxed).checked_div(gaps).unwrap_or(0);
        (ops, Duration::from_nanos(busy), Duration::from_nanos(gap))
    }

    /// The completion word's value: the last point whose host part is done
    /// (device-side waiting only). Each operation is a point, a staged
    /// write two (its binding, then its I/O).
    pub fn completed(&self) -> u32 {
        self.slot.done().load(Ordering::Acquire)
    }

    /// The sequence number of the last operation whose wait the GPU has
    /// passed (`u32::MAX` before the first probe).
    pub fn passed(&self) -> u32 {
        self.slot.passed().load(Ordering::Acquire)
    }
}

/// What `launch_op` enqueues: a binding and the copies after it (staged
/// writes), the operation, the copies after its wait, and what frees its
/// staging blocks.
#[allow(clippy::type_complexity)]
struct Launch<'a> {
    pre: Option<(Box<dyn FnOnce() + Send>, Vec<u64>)>,
    op: Box<dyn FnOnce(StreamSignal) + Send>,
    after: &'a [u64],
    /// Each copy in `after` waits for its own piece of the I/O (the
    /// operation's signal progresses through them) instead of all of it.
    piecewise: bool,
    mark: Option<&'a StageMark>,
}

struct HostCall {
    timing: Arc<Timing>,
    op: Box<dyn FnOnce(StreamSignal) + Send>,
    signal: StreamSignal,
    /// Set in blocking mode: the callback waits on it.
    gate: Option<Arc<(Mutex<bool>, Condvar)>>,
}

unsafe extern "C" fn host_call(data: *mut c_void) {
    // SAFETY: boxed by `launch`, launched once, run once.
    let call = unsafe { Box::from_raw(data as *mut HostCall) };
    let HostCall { timing, op, signal, gate } = *call;
    timing.started();
    // A panic must not unwind into the runtime; the signal, dropped while
    // unwinding, still lets the stream go on.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || op(signal))).is_err() {
        tracing::error!("stream operation panicked");
    }
    if let Some(g) = gate {
        let mut done = g.0.lock().recover();
        while !*done {
            done = g.1.wait(done).recover();
        }
    }
}

/// The host function that binds a staged operation's values.
///
/// # Safety
/// `data` is the `Box<Box<dyn FnOnce()>>` that `launch_op` leaked for this
/// launch; the runtime calls this once.
unsafe extern "C" fn host_bind(data: *mut c_void) {
    // SAFETY: boxed by `launch_op`, launched once, run once.
    let f = unsafe { Box::from_raw(data as *mut Box<dyn FnOnce() + Send>) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!("stream operation panicked while binding its values");
    }
}

/// The host function that writes `passed` in blocking mode.
///
/// # Safety
/// `data` is the `Box<(Slot, u32)>` that `launch_op` leaked for this
/// launch; the runtime calls this once.
unsafe extern "C" fn host_passed(data: *mut c_void) {
    // SAFETY: boxed by `launch_op`, launched once, run once.
    let (slot, value) = *unsafe { Box::from_raw(data as *mut (Slot, u32)) };
    // Release: pairs with the sweeps' Acquire loads of `passed`.
    slot.passed().store(value, Ordering::Release);
}

impl Stream for GpuStream {
    fn launch(&self, op: Box<dyn FnOnce(StreamSignal) + Send>) -> Result<()> {
        self.launch_op(Launch { pre: None, op, after: &[], piecewise: false, mark: None })
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn counters(&self) -> Option<Arc<StreamCounters>> {
        Some(self.counters.clone())
    }

    fn service(&self) -> StreamService {
        self.service.lock().recover().clone()
    }
}

impl GpuStream {
    /// What the stream-ordered requests placed on this stream have done
    /// (see [`StreamCounters`]).
    pub fn stats(&self) -> crate::engine::batch::RequestStats {
        self.counters.snapshot()
    }

    /// Sets how the stream engines serve this stream's operations enqueued
    /// from now on (see [`StreamService`]).
    pub fn set_service(&self, service: StreamService) {
        *self.service.lock().recover() = service;
    }

    /// The runtime context of this stream (0: unknown).
    pub(crate) fn context(&self) -> usize {
        self.backend.context()
    }

    /// Lends a staging block of at least `want` data bytes (at most
    /// [`STAGE_MAX`]) for the operation that `mark` will name, or says why
    /// staging is not available on this stream.
    pub(crate) fn stage(&self, want: usize, mark: &StageMark) -> Result<StageLease> {
        let pool = self
            .backend
            .stage_pool()
            .ok_or_else(|| Error::Unsupported(format!("staging through {} streams", self.backend.name())))?;
        StageLease::lend(pool, &self.backend, want.min(STAGE_MAX), mark)
    }

    /// Enqueues a staged operation: `bind` as a host function, the copies
    /// into staging blocks (headers `before`), the operation and its wait,
    /// then the copies out of staging blocks (headers `after`); with
    /// `piecewise`, each of those after a wait of its own, released by the
    /// operation's signal's progress (device-side waiting only). With no
    /// copies before, `bind` runs in the operation's host function. `mark`
    /// is set to what frees the operation's blocks. Where a copy after the
    /// operation cannot be enqueued, the operation does not run (its I/O is
    /// not issued, its result not written) and the call fails.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_staged(
        &self,
        bind: Box<dyn FnOnce() + Send>,
        op: Box<dyn FnOnce(StreamSignal) + Send>,
        before: Vec<u64>,
        after: &[u64],
        piecewise: bool,
        mark: &StageMark,
    ) -> Result<()> {
        let (pre, op): (_, Box<dyn FnOnce(StreamSignal) + Send>) = if before.is_empty() {
            (
                None,
                Box::new(move |sig| {
                    bind();
                    op(sig)
                }),
            )
        } else {
            (Some((bind, before)), op)
        };
        self.launch_op(Launch { pre, op, after, piecewise, mark: Some(mark) })
    }

    /// Enqueues `pre` (a binding and the copies after it), the operation,
    /// its wait, the copies in `after`, and the `passed` write; sets `mark`
    /// to that write first.
    fn launch_op(&self, l: Launch<'_>) -> Result<()> {
        let mut seq = self.seq.lock().recover();
        match self.wait {
            StreamWait::DeviceSide => self.launch_reached(&mut seq, l),
            StreamWait::BlockingCallback => self.launch_blocking(&mut seq, l),
        }
    }

    /// The device-side form (see `reach`): each host part is a point the
    /// stream announces in `reach` and then waits for in `done`.
    fn launch_reached(&self, seq: &mut Seq, l: Launch<'_>) -> Result<()> {
        let Launch { pre, op, after, piecewise, mark } = l;
        let run = seq.last.wrapping_add(1 + pre.is_some() as u32);
        let pieces = if piecewise { after.len().max(1) as u32 } else { 1 };
        let last = run.wrapping_add(pieces - 1);
        if let Some(m) = mark {
            // Before anything is enqueued: the operation's I/O may complete
            // and give its blocks back before this call returns. Should the
            // `passed` write not be enqueued, the value never comes and
            // the blocks stay out of use.
            let _ = m.0.set((self.slot, last));
        }
        self.reserve_wait(last);
        if let Some((bind, copies)) = pre {
            let point = seq.last.wrapping_add(1);
            self.enqueue_point(seq, point)?;
            self.points.post(point, Action::Bind(bind));
            if let Err(e) = copies.iter().try_for_each(|&h| self.backend.launch_copy(self.raw, h)) {
                // The binding runs and finds no operation after it; the
                // blocks stay out of use.
                self.close_points(seq);
                return Err(e);
            }
        }
        self.enqueue_point(seq, run)?;
        // The copies out, each piece's after its own wait.
        let copied = after.iter().enumerate().try_for_each(|(i, &h)| {
            if piecewise && i > 0 {
                self.enqueue_wait(seq, run.wrapping_add(i as u32))?;
            }
            self.backend.launch_copy(self.raw, h)
        });
        let op = match copied {
            Ok(()) => op,
            // Not every copy is on the stream, so the data would not all
            // arrive: the operation is dropped unrun (its blocks stay out
            // of use), and its signal lets the stream past all its points.
            Err(_) => {
                seq.last = last;
                Box::new(move |signal: StreamSignal| {
                    drop(op);
                    drop(signal);
                })
            }
        };
        // Handed over once its waits are enqueued: the dispatcher runs it
        // when it sees `reach` at `run`, whenever it looks.
        self.points.post(run, Action::Run { timing: self.timing.clone(), op, pieces });
        // The `passed` write goes in after a failed copy too, so that the
        // stream's words stay reusable.
        self.close_points(seq);
        copied
    }

    /// Enqueues the wait for `done` to reach `point`, a later point of the
    /// operation whose `reach` write is enqueued.
    fn enqueue_wait(&self, seq: &mut Seq, point: u32) -> Result<()> {
        match self.backend.wait_value32(self.raw, self.slot.dev, point) {
            Ok(true) => {
                seq.last = point;
                Ok(())
            }
            r => {
                // As in `enqueue_point`: the slot is kept for good.
                seq.lost = true;
                r?;
                Err(Error::Unsupported("stream wait on memory".into()))
            }
        }
    }

    /// Enqueues the write of `point` to `reach` and the wait for `done` to
    /// reach it; the caller then posts the point's action. On failure
    /// nothing of this point runs.
    fn enqueue_point(&self, seq: &mut Seq, point: u32) -> Result<()> {
        match self.backend.write_value32(self.raw, self.slot.reach_dev(), point) {
            Ok(true) => {}
            r => {
                // Nothing of this point is enqueued; an earlier point of
                // the same operation may be.
                self.unreserve_wait(seq.last);
                self.close_points(seq);
                r?;
                return Err(Error::Unsupported("stream write to memory".into()));
            }
        }
        seq.last = point;
        match self.backend.wait_value32(self.raw, self.slot.dev, point) {
            Ok(true) => {}
            r => {
                // The stream will write `reach` and go on without waiting;
                // no action is posted for the point. `done` may never get
                // here: the slot is kept for good.
                seq.lost = true;
                r?;
                return Err(Error::Unsupported("stream wait on memory".into()));
            }
        }
        Ok(())
    }

    /// Enqueues the `passed` write for the last point enqueued, if it is
    /// not enqueued yet; where it cannot be, the slot is kept for good.
    fn close_points(&self, seq: &mut Seq) {
        if seq.passed == Some(seq.last) || seq.lost {
            return;
        }
        match self.backend.write_value32(self.raw, self.slot.dev + 4, seq.last) {
            Ok(true) => seq.passed = Some(seq.last),
            _ => seq.lost = true,
        }
    }

    /// The blocking form: host functions that wait for the I/O themselves.
    fn launch_blocking(&self, seq: &mut Seq, l: Launch<'_>) -> Result<()> {
        // Pieces are all copied after the whole operation here.
        let Launch { pre, op, after, piecewise: _, mark } = l;
        let next = seq.last.wrapping_add(1);
        if let Some(m) = mark {
            let _ = m.0.set((self.slot, next));
        }
        if let Some((bind, copies)) = pre {
            let data = Box::into_raw(Box::new(bind)) as *mut c_void;
            if let Err(e) = self.backend.launch_host_fn(self.raw, host_bind, data) {
                // SAFETY: not launched: still ours.
                drop(unsafe { Box::from_raw(data as *mut Box<dyn FnOnce() + Send>) });
                return Err(e);
            }
            // A copy not enqueued: the binding runs and finds no operation
            // after it; the blocks stay out of use.
            copies.iter().try_for_each(|&h| self.backend.launch_copy(self.raw, h))?;
        }
        let timing = self.timing.clone();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (g, t) = (gate.clone(), timing.clone());
        let signal = StreamSignal::new(move || {
            t.signalled();
            *g.0.lock().recover() = true;
            g.1.notify_all();
        });
        let data = Box::into_raw(Box::new(HostCall { timing, op, signal, gate: Some(gate) })) as *mut c_void;
        if let Err(e) = self.backend.launch_host_fn(self.raw, host_call, data) {
            // SAFETY: not launched: still ours. Dropping it sets the signal,
            // which nothing waits for.
            drop(unsafe { Box::from_raw(data as *mut HostCall) });
            return Err(e);
        }
        seq.last = next;
        if mark.is_some() {
            // Blocking mode has no memory operations: the copies after the
            // operation are followed by a host function that writes
            // `passed`, and the slot is kept until it has.
            let copied = after.iter().try_for_each(|&h| self.backend.launch_copy(self.raw, h));
            let data = Box::into_raw(Box::new((self.slot, next))) as *mut c_void;
            if let Err(e) = self.backend.launch_host_fn(self.raw, host_passed, data) {
                // SAFETY: not launched: still ours.
                drop(unsafe { Box::from_raw(data as *mut (Slot, u32)) });
                seq.lost = true;
                return Err(e);
            }
            seq.passed = Some(next);
            copied?;
        }
        Ok(())
    }

    /// Takes a place among the context's streams waiting on the device
    /// for this stream's wait on `value`, waiting on the host (no driver
    /// lock held) while [`words::MAX_PENDING_WAITS`] other streams wait or
    /// this one is [`words::MAX_STREAM_DEPTH`] points ahead of the GPU. The GPU moves
    /// on its own, so the wait spins, yielding, before it sleeps.
    fn reserve_wait(&self, value: u32) {
        let deadline = Instant::now() + BUDGET_PATIENCE;
        let mut tries = 0u32;
        loop {
            let mut pool = self.backend.pool().lock().recover();
            if pool.try_reserve(self.slot, value) {
                return;
            }
            if Instant::now() >= deadline {
                pool.force_reserve(self.slot, value);
                return;
            }
            drop(pool);
            tries += 1;
            if tries < 2000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Gives back this stream's place for waits after `last` (none of
    /// them was enqueued).
    fn unreserve_wait(&self, last: u32) {
        let mut pool = self.backend.pool().lock().recover();
        let slot = self.slot;
        pool.pending.retain_mut(|(s, v)| {
            if *s == slot {
                *v = last;
                return !words::has_passed(s, last);
            }
            true
        });
    }
}

impl Drop for GpuStream {
    fn drop(&mut self) {
        let seq = self.seq.get_mut().recover();
        let mut pool = self.backend.pool().lock().recover();
        match (seq.lost, seq.passed) {
            (true, _) => tracing::warn!(
                "{}: an operation was enqueued without its wait or its completion write; its word is kept",
                self.backend.name()
            ),
            // The GPU never read the slot.
            (false, None) => pool.free.push(self.slot),
            // Freed by the next sweep that finds the GPU past its last wait.
            (false, Some(last)) => pool.retired.push((self.slot, last)),
        }
    }
}
