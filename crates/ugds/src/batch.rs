//! Batch I/O: many independent requests submitted at once, completed in any
//! order, collected by cookie (cuFile's `cuFileBatchIO*`).
//!
//! A [`Batch`] is a context on its handle's deep batch queue, set up with
//! the most requests it may have outstanding; everything it needs is
//! allocated then. It keeps its handle open (closing the handle is refused
//! with [`Error::Busy`] while a batch exists). Cancelling or dropping it with
//! requests on the device waits for them; if the device never answers, the
//! handle is wedged and the buffers those requests use stay registered.

use crate::engine::batch::{BatchQueue, Prepared, RequestStats};
use crate::engine::hold::Hold;
use crate::engine::BatchEvent;
use crate::handle::Segment;
use crate::handle::{Handle, HandleInner};
use crate::registry::{BufferToken, Recent};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds_nvme::{Cid, NvmOpcode, Qid, Sqe};
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// Direction of a batch request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchOp {
    /// Namespace to buffer.
    Read,
    /// Buffer to namespace.
    Write,
}

/// One request of a batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchIo {
    /// Direction.
    pub op: BatchOp,
    /// The registered buffer.
    pub buf: BufferToken,
    /// Bytes.
    pub size: usize,
    /// Byte offset in the namespace.
    pub file_offset: u64,
    /// Byte offset in the buffer.
    pub buf_offset: usize,
    /// Comes back with the request's event.
    pub cookie: u64,
}

/// A vectored request of a batch ([`Batch::submit_vectored`]).
#[derive(Clone, Copy, Debug)]
pub struct BatchIov<'a> {
    /// Direction.
    pub op: BatchOp,
    /// The buffer pieces, in the order of the range.
    pub segments: &'a [Segment<'a>],
    /// Byte offset of the range in the namespace.
    pub file_offset: u64,
    /// Comes back with the request's event.
    pub cookie: u64,
}

/// A waiting caller looks (takes the shared queue's lock, reaps, takes
/// its events) when a completion waits on the ring, and on every this many
/// spins otherwise: another context's look may have reaped this one's
/// completions and left their events for it. Spinning callers of several
/// contexts then do not queue on the lock for nothing.
pub(crate) const LOOK_EVERY: u32 = 16;

/// A batch context; see the module docs.
pub struct Batch {
    handle: Arc<HandleInner>,
    /// Which of the handle's batch queues the context is on.
    queue: usize,
    ctx: u32,
    capacity: usize,
    stuck: bool,
    /// The handle's in-flight stripe this context holds until its drop.
    stripe: usize,
    /// Scratch for a submission's validated requests (no allocation on
    /// submit), and the buffer the last submission used (its registry entry
    /// looked up again only when another buffer comes).
    scratch: std::sync::Mutex<(Vec<Prepared>, Option<Recent>)>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("queue", &self.queue)
            .field("ctx", &self.ctx)
            .field("capacity", &self.capacity)
            .field("stuck", &self.stuck)
            .finish_non_exhaustive()
    }
}

impl Handle {
    /// Sets up a batch context for up to `capacity` outstanding requests.
    pub fn batch(&self, capacity: usize) -> Result<Batch> {
        Batch::new(self.inner.clone(), capacity)
    }
}

impl Batch {
    /// The largest capacity a batch context may have (its bookkeeping is
    /// allocated up front: a few MiB at this size).
    pub const MAX_CAPACITY: usize = 65536;

    pub(crate) fn new(handle: Arc<HandleInner>, capacity: usize) -> Result<Batch> {
        if capacity == 0 || capacity > Batch::MAX_CAPACITY {
            return Err(Error::InvalidArgument(format!(
                "a batch context's capacity is 1 to {}, not {capacity}",
                Batch::MAX_CAPACITY
            )));
        }
        let r = handle.enter()?;
        let (queue, ctx) = handle.queues().open_batch_context(capacity)?;
        // The in-flight reference lives as long as the context (released in Drop).
        let stripe = r.keep();
        let mut scratch = Vec::with_capacity(capacity);
        touch(&mut scratch);
        Ok(Batch {
            handle,
            queue,
            ctx,
            capacity,
            stuck: false,
            stripe,
            scratch: std::sync::Mutex::new((scratch, None)),
        })
    }

    fn queue(&self) -> &BatchQueue {
        self.handle.queues().batch_queue_at(self.queue)
    }

    /// The most requests this context may have outstanding.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Requests submitted whose events have not been collected.
    pub fn outstanding(&self) -> usize {
        self.queue().outstanding(self.ctx)
    }

    /// What this context's requests have done since it opened: submitted,
    /// ended (and how: bytes moved by those that succeeded, errors,
    /// cancellations, timeouts), in flight.
    pub fn stats(&self) -> RequestStats {
        self.queue().context_stats(self.ctx)
    }

    /// Submits `ios`: all are validated first (bad input submits none), then
    /// every command is staged and the doorbell rung once (more often only
    /// when the queue or the PRP-page pool fills mid-batch). Returns the
    /// number of doorbell writes it took.
    pub fn submit(&self, ios: &[BatchIo]) -> Result<usize> {
        let h = &*self.handle;
        self.submit_prepared(ios.len(), |reqs, recent| {
            for io in ios {
                let (guard, data_off) = h.prepare_recent(recent, &io.buf, io.size, io.file_offset, io.buf_offset)?;
                reqs.push(Prepared {
                    op: if io.op == BatchOp::Read { NvmOpcode::Read } else { NvmOpcode::Write },
                    cookie: io.cookie,
                    len: io.size,
                    chunks: h.chunker(io.file_offset, data_off, io.size),
                    pages: recent.as_ref().expect("filled by prepare_recent").shared_pages(),
                    more: Vec::new(),
                    hold: guard.into(),
                    sgl: false,
                });
            }
            Ok(())
        })
    }

    /// Submits vectored requests (each one range of the namespace to or
    /// from several buffer segments; see [`Handle::readv`]) as
    /// [`submit`](Self::submit) does requests: all are validated first, a
    /// bad segment list refused with nothing submitted; each completes as
    /// one event.
    pub fn submit_vectored(&self, ios: &[BatchIov<'_>]) -> Result<usize> {
        let h = &*self.handle;
        self.submit_prepared(ios.len(), |reqs, _| {
            for io in ios {
                let read = io.op == BatchOp::Read;
                let total = crate::handle::check_segments(io.segments, h.block_size(), read)?;
                h.check_range(total, io.file_offset)?;
                let mut holds = Vec::with_capacity(io.segments.len());
                let mut pieces = Vec::with_capacity(io.segments.len());
                let mut at = io.file_offset;
                for s in io.segments {
                    let mut recent = None;
                    let (guard, data_off) = h.prepare_recent(&mut recent, s.buf, s.len, at, s.offset)?;
                    holds.push(guard.into());
                    let pages = recent.as_ref().expect("filled by prepare_recent").shared_pages();
                    pieces.push((h.chunker(at, data_off, s.len), pages));
                    at += s.len as u64;
                }
                let sgl = h.one_sgl(total, &crate::engine::batch::pieces(pieces.iter().map(|(c, p)| (c, &p[..]))));
                let mut pieces = pieces.into_iter();
                let (chunks, pages) = pieces.next().expect("at least one segment");
                reqs.push(Prepared {
                    op: if read { NvmOpcode::Read } else { NvmOpcode::Write },
                    cookie: io.cookie,
                    len: total,
                    chunks,
                    pages,
                    more: pieces.collect(),
                    hold: Hold::many(holds),
                    sgl,
                });
            }
            Ok(())
        })
    }

    /// Validates a submission of `n` requests into the scratch list (`fill`),
    /// then hands them to the batch queue (a submission that finds no room
    /// within the timeout wedges the handle). A refused submission keeps
    /// none of them: their claims on the buffers go at once.
    fn submit_prepared(
        &self,
        n: usize,
        fill: impl FnOnce(&mut Vec<Prepared>, &mut Option<Recent>) -> Result<()>,
    ) -> Result<usize> {
        if n == 0 {
            return Err(Error::InvalidArgument("empty batch".into()));
        }
        let _in = self.handle.enter()?;
        // Room in the context (and its not being canceled) is checked by the
        // queue's submission, under the lock it takes anyway: a refused
        // submission drops the claims taken below with the scratch list.
        let mut scratch = self.scratch.lock().recover();
        let (reqs, recent) = &mut *scratch;
        reqs.clear();
        let r = fill(reqs, recent).and_then(|()| match self.queue().submit(self.ctx, reqs) {
            Err(e @ Error::Timeout { .. }) => {
                self.handle.wedge_holding_nothing();
                Err(e)
            }
            r => r,
        });
        reqs.clear();
        r
    }

    /// Collects finished requests into `out`: waits until at least `min_nr`
    /// are available or `timeout` passes (`None`: no limit), and takes at
    /// most `max`. Returns how many were added. A request the device does
    /// not complete within the handle's timeout is reported with
    /// [`BatchStatus::Timeout`](crate::BatchStatus::Timeout), and the handle is wedged.
    pub fn get_status(
        &self,
        min_nr: usize,
        max: usize,
        timeout: Option<Duration>,
        out: &mut Vec<BatchEvent>,
    ) -> Result<usize> {
        if min_nr > max {
            return Err(Error::InvalidArgument(format!("min_nr {min_nr} is more than max {max}")));
        }
        let start = Instant::now();
        let mut got = 0;
        let mut spins = 0u32;
        loop {
            let (n, remaining) = if spins % LOOK_EVERY == 0 || self.completion_waiting() {
                self.look(max - got, out)
            } else {
                (0, usize::MAX)
            };
            got += n;
            if got >= min_nr || got == max || remaining == 0 {
                // Enough, or nothing left that could complete.
                return Ok(got);
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                if timeout.is_some_and(|t| start.elapsed() >= t) {
                    return Ok(got);
                }
                self.expire_late();
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Whether a completion waits on the context's queue pair (no lock
    /// taken; see [`LOOK_EVERY`] for the events another context's look
    /// takes for this one).
    #[inline]
    pub(crate) fn completion_waiting(&self) -> bool {
        self.queue().completion_waiting()
    }

    /// One look without waiting: moves up to `max` ended requests' events
    /// into `out`, reaping first. Returns how many were moved and how many
    /// requests remain (on the device or not yet collected).
    pub(crate) fn look(&self, max: usize, out: &mut Vec<BatchEvent>) -> (usize, usize) {
        self.queue().collect(self.ctx, max, out)
    }

    /// Ends the requests late on the device as timed out (their memory is
    /// kept: the handle wedges), so that a wait on them ends.
    pub(crate) fn expire_late(&self) {
        let expired = self.handle.expire_batch(self.queue(), self.ctx);
        if !expired.is_empty() {
            self.handle.wedge(expired);
        }
    }

    /// Cancels the context: no more submissions; commands on the device are
    /// asked to abort (best effort: a controller may finish them anyway),
    /// then waited for, up to the handle's timeout. Their events stay
    /// collectable. Memory the device may still write is never released:
    /// if a command does not come back the handle is wedged.
    pub fn cancel(&self) -> Result<()> {
        let q = self.queue();
        for (qid, cid) in q.cancel(self.ctx) {
            let _ = self.handle.admin(Sqe::abort(Cid(0), Qid(qid), cid), "Abort");
        }
        self.wait_idle()
    }

    fn wait_idle(&self) -> Result<()> {
        let q = self.queue();
        let mut spins = 0u32;
        while q.inflight(self.ctx) > 0 {
            // Reap without taking this context's events away from the caller.
            q.reap(&mut q.lock());
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                let expired = self.handle.expire_batch(q, self.ctx);
                if !expired.is_empty() {
                    self.handle.wedge(expired);
                    return Err(Error::Wedged);
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// Writes the spare capacity of `v` once, so that its pages are faulted in
/// at set-up rather than on the first submission.
fn touch<T>(v: &mut Vec<T>) {
    for slot in v.spare_capacity_mut() {
        *slot = std::mem::MaybeUninit::zeroed();
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if !self.stuck && self.cancel().is_err() {
            self.stuck = true;
        }
        let q = self.queue();
        let left = q.close_context(self.ctx);
        if !left.is_empty() {
            self.handle.wedge(left);
        }
        self.handle.life.inflight.sub(self.stripe);
    }
}

/// A batch context on a handle ([`Batch`]) or on a volume
/// ([`VolumeBatch`](crate::VolumeBatch)), for code that takes either (the
/// C and Python bindings). Each method is the type's own.
pub trait BatchContext: Send + Sync {
    /// The most requests the context may have outstanding.
    fn capacity(&self) -> usize;
    /// Requests submitted whose events have not been collected.
    fn outstanding(&self) -> usize;
    /// Submits `ios`, all checked first; returns the doorbell writes.
    fn submit(&self, ios: &[BatchIo]) -> Result<usize>;
    /// Submits vectored requests, all checked first; returns the doorbell writes.
    fn submit_vectored(&self, ios: &[BatchIov<'_>]) -> Result<usize>;
    /// Collects at least `min_nr` (or until `timeout`) and at most `max` events.
    fn get_status(
        &self,
        min_nr: usize,
        max: usize,
        timeout: Option<Duration>,
        out: &mut Vec<BatchEvent>,
    ) -> Result<usize>;
    /// Cancels the context's requests and waits for the device.
    fn cancel(&self) -> Result<()>;
    /// What the context's requests have done.
    fn stats(&self) -> RequestStats;
}

/// Implements [`BatchContext`] for a type with the same inherent methods.
macro_rules! batch_context {
    ($t:ty) => {
        impl BatchContext for $t {
            fn capacity(&self) -> usize {
                <$t>::capacity(self)
            }
            fn outstanding(&self) -> usize {
                <$t>::outstanding(self)
            }
            fn submit(&self, ios: &[BatchIo]) -> Result<usize> {
                <$t>::submit(self, ios)
            }
            fn submit_vectored(&self, ios: &[BatchIov<'_>]) -> Result<usize> {
                <$t>::submit_vectored(self, ios)
            }
            fn get_status(
                &self,
                min_nr: usize,
                max: usize,
                timeout: Option<Duration>,
                out: &mut Vec<BatchEvent>,
            ) -> Result<usize> {
                <$t>::get_status(self, min_nr, max, timeout, out)
            }
            fn cancel(&self) -> Result<()> {
                <$t>::cancel(self)
            }
            fn stats(&self) -> RequestStats {
                <$t>::stats(self)
            }
        }
    };
}

pub(crate) use batch_context;

batch_context!(Batch);
