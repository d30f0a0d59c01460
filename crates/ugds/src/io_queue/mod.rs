//! A queue pair lent to one thread for asynchronous I/O.
//!
//! Submit many requests, ring once, then poll for completions: the way to
//! keep a deep queue full from one thread. Requests of any size are split
//! into commands as for synchronous I/O; a request is admitted only when all
//! its commands fit, so a full queue is reported as [`Error::QueueFull`]
//! before anything is staged.
//!
//! On a handle with no queue pair to lend (the controller granted too few;
//! with one, every caller shares it), an `IoQueue` is a context on the
//! handle's batch queue instead ([`IoQueue::is_shared`]): the same calls, with each submission
//! rung at once, completions found by whoever reaps the shared queue, and
//! a submission that finds the shared queue full waiting for room (up to
//! the handle's timeout) rather than failing.

mod requests;
#[cfg(test)]
mod tests;

use crate::engine::batch::Prepared;
use crate::engine::chunk::Chunk;
use crate::engine::transport::Transport;
use crate::engine::{BatchEvent, Completion, Owner, QueuePair};
use crate::handle::{Escalation, Handle, HandleInner};
use crate::registry::BufferToken;
use requests::{complete, start, Buffers, Claim, Requests, Small};
use std::time::Duration;
use ugds_nvme::{prp, Cid, Lba, Nsid, NvmOpcode, PrpPlan, Sqe};
use ugds_platform::sys::PAGE_SIZE;
use ugds_platform::{Error, Result};

/// When to look for late requests: by the clock, read on every 16th poll
/// that found nothing and every 1024th that found something (the clock
/// is not read per completion), and after a wait that timed out. A look
/// is due a tenth of the handle's timeout after the last, so that a
/// stalled queue's requests fail within about 1.2 timeouts however the
/// caller polls or waits.
struct LateCheck {
    polls: u32,
    /// A wait slept to its end: read the clock at the next poll.
    now: bool,
    next: std::time::Instant,
}

impl LateCheck {
    fn new() -> LateCheck {
        LateCheck { polls: 0, now: false, next: std::time::Instant::now() }
    }

    /// Whether a look is due (the handle's `timeout` given), after a poll
    /// that found `done` completions.
    #[inline(always)]
    fn due(&mut self, done: usize, timeout: impl FnOnce() -> Duration) -> bool {
        self.polls = self.polls.wrapping_add(1);
        let mask = if done == 0 { 15 } else { 1023 };
        if self.polls & mask != 0 && !self.now {
            return false;
        }
        self.look(timeout())
    }

    #[cold]
    fn look(&mut self, timeout: Duration) -> bool {
        self.now = false;
        let now = std::time::Instant::now();
        if now < self.next {
            return false;
        }
        self.next = now + (timeout / 10).clamp(Duration::from_millis(1), Duration::from_secs(1));
        true
    }
}

/// A queue pair for one thread's asynchronous I/O; see the module docs.
/// Holds an in-flight reference on its handle while it exists.
pub struct IoQueue<'h> {
    handle: &'h Handle,
    small: Small,
    qp: Option<QueuePair>,
    /// A lent queue's requests (empty on a shared queue).
    reqs: Requests,
    late: LateCheck,
    dead: bool,
    /// The buffer the last request used, and the hold on it.
    bufs: Buffers,
    /// A context on the shared batch queue, when no queue pair was lent.
    shared: Option<Shared>,
    /// The handle's in-flight stripe this queue holds until its drop.
    stripe: usize,
}

impl std::fmt::Debug for IoQueue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoQueue")
            .field("outstanding", &self.outstanding())
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

/// An [`IoQueue`]'s context on a batch queue.
struct Shared {
    /// Which of the handle's batch queues.
    queue: usize,
    ctx: u32,
    depth: usize,
    /// Requests submitted and not yet reported.
    outstanding: usize,
    /// One submission's request (no allocation on submit).
    scratch: Vec<Prepared>,
    events: Vec<BatchEvent>,
}

impl Handle {
    /// Lends a queue pair for asynchronous submission from one thread.
    /// Refused with [`Error::Busy`] when every lendable queue is out. On a
    /// handle that has none to lend (the controller granted too few), a
    /// context on the batch queue instead ([`IoQueue::is_shared`]), or
    /// [`Error::Unsupported`] without a batch queue.
    pub fn io_queue(&self) -> Result<IoQueue<'_>> {
        IoQueue::new(self)
    }
}

impl<'h> IoQueue<'h> {
    pub(crate) fn new(handle: &'h Handle) -> Result<IoQueue<'h>> {
        let h = &*handle.inner;
        let r = h.enter()?;
        let Some(qp) = h.take_async_queue() else {
            if h.lendable_queues() == 0 && h.batch_queue().is_ok() {
                let depth = h.batch_queue()?.geometry().0 - 1;
                let (queue, ctx) = h.queues().open_batch_context(depth)?;
                return Ok(IoQueue {
                    stripe: r.keep(),
                    handle,
                    small: Small::of(h, true),
                    qp: None,
                    reqs: Requests::with_capacity(0),
                    late: LateCheck::new(),
                    dead: false,
                    bufs: Buffers::default(),
                    shared: Some(Shared {
                        queue,
                        ctx,
                        depth,
                        outstanding: 0,
                        scratch: Vec::with_capacity(1),
                        events: Vec::with_capacity(depth),
                    }),
                });
            }
            if h.lendable_queues() == 0 {
                // Not busy: there never was one to lend.
                let batch = h.queues().batch_queues();
                return Err(Error::Unsupported(format!(
                    "no I/O queue pair to lend: the controller granted {} I/O queue pair(s), taken by {} \
                     synchronous and {} batch queue(s) (ask for async_queues with a controller that grants \
                     more, or use the synchronous{} calls)",
                    h.controller_queues(),
                    h.queues().sync.len(),
                    batch,
                    if batch > 0 { ", batch or stream-ordered" } else { "" }
                )));
            }
            return Err(Error::Busy { what: "I/O queue pool (every lendable queue is lent)", inflight: 0 });
        };
        let n = qp.free_slots();
        Ok(IoQueue {
            // The reference lives as long as the IoQueue: released in Drop.
            stripe: r.keep(),
            handle,
            small: Small::of(h, false),
            qp: Some(qp),
            reqs: Requests::with_capacity(n),
            late: LateCheck::new(),
            dead: false,
            bufs: Buffers::default(),
            shared: None,
        })
    }

    /// Whether this is a context on the handle's batch queue, shared with
    /// other callers, rather than a queue pair of its own (see the module
    /// docs).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Whether this queue was given up on (a request stuck past the
    /// handle's timeout): it takes no more requests.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead
    }

    /// Commands that may be outstanding at once.
    pub fn depth(&self) -> usize {
        match (&self.qp, &self.shared) {
            (Some(q), _) => q.entries() as usize - 1,
            (None, Some(s)) => s.depth,
            (None, None) => 0,
        }
    }

    /// Requests submitted and not yet reported by [`poll`](Self::poll).
    pub fn outstanding(&self) -> usize {
        match &self.shared {
            Some(sh) => sh.outstanding,
            None => self.reqs.in_use(),
        }
    }

    /// This queue pair's last commands when the handle traces
    /// ([`HandleOptions::trace`](crate::HandleOptions::trace)): completed
    /// ones oldest first, then those outstanding. `None` when not traced, or
    /// for a context on the shared batch queue (whose trace is the batch
    /// queue's, in [`Handle::trace`]).
    pub fn trace(&self) -> Option<Vec<crate::engine::trace::TraceEvent>> {
        self.qp.as_ref()?.trace_events()
    }

    /// Stages a read of `size` bytes at `file_offset` into `buf` at
    /// `buf_offset`; `tag` comes back with its completion.
    #[inline]
    pub fn submit_read(
        &mut self,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        tag: u64,
    ) -> Result<()> {
        self.submit(NvmOpcode::Read, buf, size, file_offset, buf_offset, tag)
    }

    /// Stages a write; see [`submit_read`](Self::submit_read).
    #[inline]
    pub fn submit_write(
        &mut self,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        tag: u64,
    ) -> Result<()> {
        self.submit(NvmOpcode::Write, buf, size, file_offset, buf_offset, tag)
    }

    #[inline(always)]
    fn submit(
        &mut self,
        op: NvmOpcode,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        tag: u64,
    ) -> Result<()> {
        let h = &*self.handle.inner;
        // This queue holds an in-flight reference, so the handle cannot be
        // closed under it; it can be wedged.
        if self.dead || h.is_wedged() {
            return Err(Error::Wedged);
        }
        // A page or less is one command (MDTS is at least a page): the
        // common case, kept free of the chunking a larger request needs.
        // Empty, larger, and every request on a shared queue go the other way.
        let small = self.small;
        if size.wrapping_sub(1) >= small.max {
            return self.submit_many(op, buf, size, file_offset, buf_offset, tag);
        }
        let data_off = buf.base % PAGE_SIZE + buf_offset;
        if !small.valid(size, file_offset, data_off) {
            return Err(refuse_small(h, size, file_offset, buf, buf_offset));
        }
        let Some(qp) = self.qp.as_mut() else { unreachable!("a queue of its own when not shared") };
        let claim = self.bufs.claim(h, buf, buf_offset as u64, size as u64)?;
        // One page or two: as two entries, the second 0 when unused (what
        // One means on the wire), so that staging branches on nothing.
        let Some((prp1, prp2)) = prp::pair(self.bufs.pages(&claim), PAGE_SIZE, data_off, size) else {
            unreachable!("a range within the registration lies within its pages")
        };
        let plan = PrpPlan::Two { prp1, prp2 };
        let idx = self.reqs.next();
        let shift = small.block_shift;
        let lba = Lba(file_offset >> shift);
        let sqe = Sqe::rw(op, Cid(0), Nsid(small.nsid), lba, (size >> shift) as u32, 0, 0);
        if qp.stage(sqe, Some(plan), Owner::Own(idx)).is_err() {
            self.bufs.release(claim);
            return Err(Error::QueueFull);
        }
        start(&mut self.reqs, idx, tag, 1, size, op, claim);
        Ok(())
    }

    /// A request of more than one command, or any request on a shared
    /// queue.
    #[inline(never)]
    fn submit_many(
        &mut self,
        op: NvmOpcode,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        tag: u64,
    ) -> Result<()> {
        let h = &*self.handle.inner;
        if self.shared.is_some() {
            return self.submit_shared(op, buf, size, file_offset, buf_offset, tag);
        }
        // Everything that can refuse the request comes before the claim on
        // its buffer, which is the last step that can fail.
        h.check_range(size, file_offset)?;
        let data_off = h.data_offset(buf.base, buf_offset)?;
        let chunks = h.chunker(file_offset, data_off, size);
        let n = chunks.commands();
        let Some(qp) = self.qp.as_mut() else { unreachable!("a queue of its own when not shared") };
        if n > qp.free_slots() {
            return Err(self.refuse(size, n));
        }
        let claim = self.bufs.claim(h, buf, buf_offset as u64, size as u64)?;
        let pages = self.bufs.pages(&claim);
        let idx = self.reqs.next();
        let nsid = Nsid(h.ns_nsid());
        let sqe = |c: &Chunk| Sqe::rw(op, Cid(0), nsid, Lba(c.slba), c.nlb, 0, 0);
        // Cannot fail: the range was checked against the registration and
        // the room in the queue above.
        for c in chunks {
            let plan = prp::plan(pages, PAGE_SIZE, c.data_off, c.len).expect("validated range plans");
            qp.submit(sqe(&c), Some(plan), Owner::Own(idx)).expect("room checked above");
        }
        start(&mut self.reqs, idx, tag, n as u32, size, op, claim);
        Ok(())
    }

    /// Why a request that needs `n` commands is not staged: more than the
    /// queue holds, or more than it has free now.
    #[cold]
    fn refuse(&self, size: usize, n: usize) -> Error {
        if n > self.depth() {
            Error::InvalidArgument(format!(
                "request of {size} bytes needs {n} commands; this queue holds {} at most",
                self.depth()
            ))
        } else {
            Error::QueueFull
        }
    }

    #[cold]
    fn submit_shared(
        &mut self,
        op: NvmOpcode,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        tag: u64,
    ) -> Result<()> {
        let h = &*self.handle.inner;
        let (guard, data_off) = h.prepare_recent(&mut self.bufs.recent, buf, size, file_offset, buf_offset)?;
        let chunks = h.chunker(file_offset, data_off, size);
        let pages = self.bufs.recent.as_ref().expect("filled by prepare_recent").shared_pages();
        let p =
            Prepared { op, cookie: tag, len: size, chunks, pages, more: Vec::new(), hold: guard.into(), sgl: false };
        let sh = self.shared.as_mut().expect("shared");
        let n = p.commands();
        if n > sh.depth {
            return Err(Error::InvalidArgument(format!(
                "request of {} bytes needs {n} commands; this queue holds {} at most",
                p.len, sh.depth
            )));
        }
        let q = h.queues().batch_queue_at(sh.queue);
        if q.room(sh.ctx) == 0 {
            return Err(Error::QueueFull);
        }
        sh.scratch.clear();
        sh.scratch.push(p);
        let r = q.submit(sh.ctx, &mut sh.scratch);
        // A refused request keeps no claim on its buffer.
        sh.scratch.clear();
        match r {
            Ok(_) => {
                sh.outstanding += 1;
                Ok(())
            }
            Err(e @ Error::Timeout { .. }) => {
                self.dead = true;
                h.wedge_holding_nothing();
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether requests of these sizes, at these namespace offsets and
    /// data offsets into their first page, would all be staged now: `Ok(false)`
    /// when the queue has no room for them yet, an error when they need
    /// more than the queue holds at all. A volume's queue asks before it
    /// stages any part of a request, so that a request is staged on every
    /// member or on none.
    pub(crate) fn admits(&self, reqs: impl Iterator<Item = (usize, u64, usize)>) -> Result<bool> {
        let h = &*self.handle.inner;
        let (mut commands, mut requests) = (0, 0);
        for (size, file_offset, data_off) in reqs {
            let n = if (1..=PAGE_SIZE).contains(&size) { 1 } else { h.chunker(file_offset, data_off, size).commands() };
            if n > self.depth() {
                return Err(self.refuse(size, n));
            }
            commands += n;
            requests += 1;
        }
        let (need, unit) = if self.shared.is_some() { (requests, "requests") } else { (commands, "commands") };
        if need > self.depth() {
            return Err(Error::InvalidArgument(format!(
                "the request's pieces on this member need {need} {unit}; its queue holds {} at most",
                self.depth()
            )));
        }
        Ok(match (&self.qp, &self.shared) {
            (Some(q), _) => commands <= q.free_slots(),
            (None, Some(sh)) => requests <= h.queues().batch_queue_at(sh.queue).room(sh.ctx),
            (None, None) => false,
        })
    }

    /// What [`wait`](Self::wait) would block on: the queue's interrupt
    /// when it completes by interrupt and no completion waits already;
    /// `None` when there is nothing to wait for (polling, or a
    /// completion is there).
    pub(crate) fn interrupt(&mut self) -> Option<&'h ugds_platform::sys::EventFd> {
        let handle: &'h Handle = self.handle;
        let h = &*handle.inner;
        if h.opts.completion != Completion::Interrupt {
            return None;
        }
        let v = self.qp.as_ref()?.vector()?;
        if self.qp.as_mut().is_some_and(|q| q.completion_pending()) {
            return None;
        }
        h.platform().interrupt(v).ok().flatten()
    }

    /// Counts an interrupt [`interrupt`](Self::interrupt)'s descriptor
    /// delivered.
    pub(crate) fn count_interrupt(&self) {
        if let Some(q) = self.qp.as_ref() {
            q.counters().interrupts.add_shared(1);
        }
    }

    /// Tells the controller about everything staged: one doorbell write.
    /// (A shared queue rang at each submission.)
    pub fn ring(&mut self) {
        if let Some(qp) = self.qp.as_mut() {
            qp.ring_sq_doorbell();
        }
    }

    #[cold]
    fn poll_shared(&mut self, f: &mut impl FnMut(u64, Result<usize>)) -> usize {
        let h = &*self.handle.inner;
        let sh = self.shared.as_mut().expect("shared");
        let q = h.queues().batch_queue_at(sh.queue);
        sh.events.clear();
        let (n, _) = q.collect(sh.ctx, usize::MAX, &mut sh.events);
        for e in sh.events.drain(..) {
            f(e.cookie, e.result);
        }
        sh.outstanding -= n;
        if sh.outstanding > 0 && self.late.due(n, || h.opts.timeout) {
            let expired = h.expire_batch(q, sh.ctx);
            if !expired.is_empty() {
                // Reported as timed-out events at the next poll.
                self.dead = true;
                h.wedge(expired);
            }
        }
        n
    }

    /// Rings for anything staged, then reports up to `max` completed
    /// requests as `f(tag, bytes or error)`. Returns how many were reported,
    /// those that failed (a timeout among them) included: a caller that
    /// polls until its count is met always gets there.
    pub fn poll(&mut self, max: usize, mut f: impl FnMut(u64, Result<usize>)) -> usize {
        if self.qp.is_none() {
            return if self.shared.is_some() { self.poll_shared(&mut f) } else { 0 };
        }
        self.ring();
        let mut done = self.reap(&mut f);
        let _ = max; // every completion found is reported: a CQE cannot be consumed twice
        if self.reqs.in_use() > 0 && self.late.due(done, || self.handle.inner.opts.timeout) {
            done += self.check_timeouts(&mut f);
        }
        done
    }

    /// Consumes every completion on the lent queue and reports the
    /// requests that finished. Returns how many (the entries they freed).
    #[inline]
    fn reap(&mut self, f: &mut impl FnMut(u64, Result<usize>)) -> usize {
        let (reqs, bufs) = (&mut self.reqs, &mut self.bufs);
        let before = reqs.in_use();
        // One closure per transport, each inlined into its reaping loop (a
        // closure shared by both is not: measured, about 20 instructions a
        // completion); only the kernel path's completions report bytes short.
        match self.qp.as_mut() {
            None => return 0,
            Some(QueuePair::Nvme(q)) => {
                q.process_completions(usize::MAX, |owner, cqe| complete(reqs, bufs, f, owner, cqe, false))
            }
            Some(QueuePair::Uring(q)) => {
                q.process_completions(usize::MAX, |owner, cqe| complete(reqs, bufs, f, owner, cqe, true))
            }
            Some(QueuePair::Tcp(q)) => {
                q.process_completions(usize::MAX, |owner, cqe| complete(reqs, bufs, f, owner, cqe, false))
            }
            Some(QueuePair::Rdma(q)) => {
                q.process_completions(usize::MAX, |owner, cqe| complete(reqs, bufs, f, owner, cqe, false))
            }
        };
        before - self.reqs.in_use()
    }

    /// A wait on this queue's interrupt slept to its end: the next poll
    /// looks for late requests.
    pub(crate) fn waited_in_vain(&mut self) {
        self.late.now = true;
    }

    /// Blocks until a completion may be waiting (interrupt mode) or returns
    /// at once (polling mode): call [`poll`](Self::poll) after it.
    pub fn wait(&mut self, timeout: Duration) {
        if let Some(efd) = self.interrupt() {
            if efd.wait(timeout) {
                efd.drain();
                self.count_interrupt();
            } else {
                self.waited_in_vain();
            }
        }
    }

    /// A request is late once a command of it has been outstanding for the
    /// handle's timeout since a check first saw it (the tracker's stamps):
    /// between the timeout and the timeout plus two check intervals after
    /// its submission. Returns how many requests it reported (completed
    /// while it looked again, aborted, or failed as stuck).
    fn check_timeouts(&mut self, f: &mut impl FnMut(u64, Result<usize>)) -> usize {
        let h = &*self.handle.inner;
        let limit = h.opts.timeout;
        let Some(qp) = self.qp.as_mut() else { return 0 };
        // A controller known gone: everything outstanding is late now.
        let late_after = if h.queues().ctrl.platform().gone() { Duration::ZERO } else { limit };
        let late_cmds = qp.late_commands(late_after);
        if late_cmds.is_empty() {
            return 0;
        }
        let qid = qp.qid().0;
        // The handle's one escalation: look again, CSTS, Abort, a grace
        // period. Requests that come back are reported with their status
        // (an aborted one as an NVMe error) and the queue goes on.
        let mut late: Vec<u32> = late_cmds
            .iter()
            .filter_map(|&(_, o)| match o {
                Owner::Own(i) => Some(i),
                _ => None,
            })
            .collect();
        late.sort_unstable();
        late.dedup();
        let cids: Vec<ugds_nvme::Cid> = late_cmds.iter().map(|&(c, _)| c).collect();
        let handle: &Handle = self.handle;
        let mut reported = 0;
        let stuck = match handle.inner.escalate("I/O", qid, &cids, || {
            reported += self.reap(f);
            late.iter().all(|&i| self.reqs[i].pending == 0)
        }) {
            Escalation::Settled => return reported,
            Escalation::Stuck(e) => e,
        };
        // Stuck: report every outstanding request as failed with why, keep
        // their buffer references, wedge the handle. This queue pair is
        // never reused: it is forgotten on drop.
        let mut guards = Vec::new();
        let mut shared_hold = false;
        let mut ended = Vec::new();
        for (i, r) in self.reqs.iter_mut() {
            if r.pending > 0 {
                let cid = self.qp.as_ref().and_then(|q| q.outstanding_cid_of(Owner::Own(i)));
                tracing::error!(qid, ?cid, "asynchronous request stuck ({stuck}); wedging the handle");
                let e = match &stuck {
                    Error::Timeout { .. } => Error::Timeout { qid, cid, after: limit },
                    other => other.clone(),
                };
                f(r.tag, Err(e));
                reported += 1;
                match std::mem::replace(&mut r.claim, Claim::None) {
                    Claim::Own(own) => guards.push(own.0),
                    Claim::Shared => shared_hold = true,
                    Claim::None => {}
                }
                r.pending = 0;
                ended.push(i);
            }
        }
        // Reported, and never handed out again: this queue pair is dead.
        ended.into_iter().for_each(|i| self.reqs.retire(i));
        if shared_hold {
            guards.extend(self.bufs.held.take());
            self.bufs.users = 0;
        }
        self.dead = true;
        // This queue is the handle's to read no more: its own trace goes to
        // the log here (the handle logs the others').
        for e in self.trace().into_iter().flatten() {
            tracing::error!(qid, "wedged: lent queue's command {e}");
        }
        handle.inner.wedge(guards);
        reported
    }

    /// Polls until every request has completed, or the handle's timeout
    /// passes (which wedges it).
    pub fn drain(&mut self, mut f: impl FnMut(u64, Result<usize>)) -> Result<()> {
        while self.outstanding() > 0 {
            if self.dead && self.shared.is_none() {
                return Err(Error::Wedged);
            }
            if self.poll(usize::MAX, &mut f) == 0 {
                self.wait(Duration::from_millis(10));
                std::hint::spin_loop();
            }
        }
        if self.dead {
            Err(Error::Wedged)
        } else {
            Ok(())
        }
    }
}

impl Drop for IoQueue<'_> {
    fn drop(&mut self) {
        let _ = self.drain(|_, _| {});
        let h = &*self.handle.inner;
        if let Some(sh) = self.shared.take() {
            let q = h.queues().batch_queue_at(sh.queue);
            let left = q.close_context(sh.ctx);
            if !left.is_empty() {
                h.wedge(left);
            }
        }
        if let Some(qp) = self.qp.take() {
            if self.dead {
                // The controller may still use this queue: never reuse or
                // free it before a reset.
                std::mem::forget(qp);
            } else {
                h.return_async_queue(qp);
            }
        }
        h.life.inflight.sub(self.stripe);
    }
}

/// Why a request of a page or less failed [`Small::valid`]: the handle's
/// own checks say.
#[cold]
#[inline(never)]
fn refuse_small(h: &HandleInner, size: usize, file_offset: u64, buf: &BufferToken, buf_offset: usize) -> Error {
    match h.check_range(size, file_offset).and_then(|_| h.data_offset(buf.base, buf_offset)) {
        Err(e) => e,
        Ok(_) => unreachable!("the handle's checks refuse what Small::valid refuses"),
    }
}
