//! The batch queue: one deep queue pair per handle, shared by batch
//! contexts (and the stream engine), kept apart from the synchronous queues
//! when the controller grants two or more; on a controller that grants one,
//! the synchronous queue pair itself (its completions are credited by tag to
//! either side, whoever reaps them).
//!
//! A context is a preallocated table of requests and of completion events;
//! submitting stages every command of every request and rings the doorbell
//! once. Multi-page commands borrow a page from the queue's PRP-list pool
//! until their completion is consumed. When the submission queue, the
//! command identifiers or the pool run out in the middle of a batch, what is
//! staged is rung, completions are reaped (for every context), and staging
//! continues; the lock is released while waiting. Completions may arrive in
//! any order; each is credited to its request by the queue pair's tracker
//! ([`Owner::Batch`]), and a request is an event once all its commands are
//! back. A request is late when a command of it was found outstanding by
//! timeout checks spanning more than the timeout (the tracker's stamps).

use super::chunk::Chunker;
pub use super::contexts::{BatchEvent, BatchStatus, RequestStats};
use super::contexts::{Ctx, Req};
use super::hold::Hold;
use super::qpair::Full;
use super::requests::RequestTable;
use super::sync::{State, SyncQueue};
use super::tracker::Owner;
use std::collections::VecDeque;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};
use ugds_nvme::sgl::Piece;
use ugds_nvme::{Cid, Lba, Nsid, NvmOpcode, Sqe};
use ugds_platform::{Error, Result};

/// One request of a submission, validated: its commands, the controller
/// addresses of its buffer's pages, and its hold on the buffer.
pub(crate) struct Prepared {
    pub op: NvmOpcode,
    pub cookie: u64,
    pub len: usize,
    pub chunks: Chunker,
    pub pages: Arc<[u64]>,
    /// A vectored request's further pieces, in order (empty otherwise: no
    /// allocation).
    pub more: Vec<(Chunker, Arc<[u64]>)>,
    pub hold: Hold,
    /// All its pieces go as one command with an SGL (checked to fit).
    pub sgl: bool,
}

impl Prepared {
    /// The commands the request takes.
    pub fn commands(&self) -> usize {
        if self.sgl {
            return 1;
        }
        self.chunks.commands() + self.more.iter().map(|(c, _)| c.commands()).sum::<usize>()
    }
}

/// The SGL pieces of a request's (chunker, pages) parts: each chunker's
/// whole range in its pages.
pub(crate) fn pieces<'a>(parts: impl Iterator<Item = (&'a Chunker, &'a [u64])>) -> Vec<Piece<'a>> {
    parts
        .map(|(c, pages)| {
            let (_, data_off, len) = c.range();
            Piece { pages, offset: data_off, len }
        })
        .collect()
}

/// The queue pair batch contexts use, and the contexts.
pub struct BatchQueue {
    q: Arc<SyncQueue>,
    shared: bool,
    nsid: Nsid,
    timeout: Duration,
}

impl std::fmt::Debug for BatchQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchQueue").field("shared", &self.shared).field("nsid", &self.nsid).finish_non_exhaustive()
    }
}

fn owner(ctx: u32, req: u32) -> Owner {
    Owner::Batch { ctx, req }
}

impl BatchQueue {
    /// Batch contexts on `q`: a deep queue pair of their own, or (`shared`)
    /// the synchronous queue pair of a controller that grants only one.
    pub(crate) fn new(q: Arc<SyncQueue>, shared: bool, nsid: u32, timeout: Duration) -> BatchQueue {
        BatchQueue { q, shared, nsid: Nsid(nsid), timeout }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.q.lock()
    }

    /// Whether a completion waits on the queue pair (no lock taken): a
    /// waiter need not take the lock to look until one does, but for the
    /// events another context's look credited to it.
    #[inline]
    pub(crate) fn completion_waiting(&self) -> bool {
        self.q.completion_waiting()
    }

    /// The queue pair underneath.
    pub(crate) fn queue(&self) -> &Arc<SyncQueue> {
        &self.q
    }

    /// Whether the queue pair is shared with synchronous I/O.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Consumes every completion on the queue pair, crediting batch
    /// contexts and synchronous requests alike.
    pub(crate) fn reap(&self, st: &mut State) -> usize {
        self.q.reap_all(st)
    }

    /// Entries of the queue, and pages of its PRP-list pool.
    pub fn geometry(&self) -> (usize, usize) {
        let st = self.lock();
        (st.qp.entries() as usize, st.qp.prp_pool_size())
    }

    /// Contexts open on this queue.
    pub(crate) fn contexts(&self) -> usize {
        self.lock().batch.ctxs.iter().filter(|c| c.is_some()).count()
    }

    /// A context for up to `capacity` outstanding requests; all its memory
    /// is allocated here, none on submission.
    pub fn open_context(&self, capacity: usize) -> u32 {
        let ctx = Ctx {
            stats: RequestStats::default(),
            reqs: RequestTable::filled(capacity as u32, || Req {
                cookie: 0,
                pending: 0,
                len: 0,
                short: 0,
                status: None,
                op: NvmOpcode::Read,
                hold: None,
            }),
            slots: Vec::with_capacity(capacity),
            done: VecDeque::with_capacity(capacity),
            inflight: 0,
            canceled: false,
        };
        let mut ctx = ctx;
        // Touch the event queue's memory now, so the first batch does not
        // pay its page faults.
        for _ in 0..capacity {
            ctx.done.push_back(BatchEvent { cookie: 0, status: BatchStatus::Complete, result: Ok(0) });
        }
        ctx.done.clear();
        ctx.slots.extend(0..capacity as u32);
        ctx.slots.clear();
        let mut st = self.lock();
        match st.batch.ctxs.iter().position(|c| c.is_none()) {
            Some(i) => {
                st.batch.ctxs[i] = Some(ctx);
                i as u32
            }
            None => {
                st.batch.ctxs.push(Some(ctx));
                st.batch.ctxs.len() as u32 - 1
            }
        }
    }

    /// Drops a context with nothing in flight. Returns the buffer references
    /// of requests still in flight (to quarantine) when the context is stuck.
    pub(crate) fn close_context(&self, ctx: u32) -> Vec<Hold> {
        let mut st = self.lock();
        let Some(c) = st.batch.ctxs.get_mut(ctx as usize).and_then(|c| c.take()) else { return Vec::new() };
        c.reqs.into_values().filter_map(|mut r| if r.pending > 0 { r.hold.take() } else { None }).collect()
    }

    /// What the requests of `ctx` have done.
    pub fn context_stats(&self, ctx: u32) -> RequestStats {
        let st = self.lock();
        let mut s = st.batch.ctxs[ctx as usize].as_ref().map_or_else(RequestStats::default, |c| c.stats);
        s.in_flight = s.submitted - s.ended;
        s
    }

    /// Requests of `ctx` submitted and not yet collected.
    pub fn outstanding(&self, ctx: u32) -> usize {
        let st = self.lock();
        st.batch.ctxs[ctx as usize].as_ref().map_or(0, |c| c.inflight + c.done.len())
    }

    /// Requests of `ctx` still on the device.
    pub fn inflight(&self, ctx: u32) -> usize {
        let st = self.lock();
        st.batch.ctxs[ctx as usize].as_ref().map_or(0, |c| c.inflight)
    }

    /// Free request slots in `ctx`.
    pub fn room(&self, ctx: u32) -> usize {
        let st = self.lock();
        st.batch.ctxs[ctx as usize].as_ref().map_or(0, |c| c.reqs.free_len())
    }

    /// Stages and rings every command of `reqs` (validated by the caller),
    /// ringing, reaping and waiting without the lock when the queue or the
    /// PRP pool runs out. Returns the doorbell writes made.
    pub(crate) fn submit(&self, ctx: u32, reqs: &mut Vec<Prepared>) -> Result<usize> {
        let mut doorbells = 0;
        let mut st = self.lock();
        // Slots first, so that the whole submission is admitted or refused.
        let mut slots = {
            let Some(c) = st.batch.ctxs[ctx as usize].as_mut() else { return Err(Error::Closed) };
            std::mem::take(&mut c.slots)
        };
        slots.clear();
        {
            let Some(c) = st.batch.ctxs[ctx as usize].as_mut() else { return Err(Error::Closed) };
            if c.canceled {
                c.slots = slots;
                return Err(Error::Canceled);
            }
            if reqs.len() > c.reqs.free_len() {
                c.slots = slots;
                return Err(Error::CapacityExceeded {
                    capacity: c.reqs.len(),
                    requested: reqs.len(),
                    outstanding: c.reqs.len() - c.reqs.free_len(),
                });
            }
            for p in reqs.iter() {
                let i = c.reqs.take().expect("room checked");
                let commands = p.commands() as u32;
                c.reqs[i] = Req {
                    cookie: p.cookie,
                    pending: commands,
                    len: p.len,
                    short: 0,
                    status: None,
                    op: p.op,
                    hold: None,
                };
                c.inflight += 1;
                c.stats.submitted += 1;
                slots.push(i);
            }
        }
        let mut waited_since: Option<Instant> = None;
        for (p, &slot) in reqs.drain(..).zip(&slots) {
            let Prepared { op, len, chunks, pages, more, hold, sgl, .. } = p;
            st.batch.ctxs[ctx as usize].as_mut().expect("open").reqs[slot].hold = Some(hold);
            if sgl {
                // One command: an SGL of every piece.
                let parts = std::iter::once((&chunks, &pages[..])).chain(more.iter().map(|(c, p)| (c, &p[..])));
                let pieces = pieces(parts);
                let (slba, _, _) = chunks.range();
                let blocks = (len >> chunks.block_shift()) as u32;
                let sqe = Sqe::rw(op, Cid(0), self.nsid, Lba(slba), blocks, 0, 0);
                st = self.stage(st, &mut waited_since, &mut doorbells, |st| {
                    st.qp.submit_sgl(sqe, &pieces, owner(ctx, slot))
                })?;
                continue;
            }
            st = self.stage_chunks(st, &mut waited_since, &mut doorbells, op, chunks, &pages, owner(ctx, slot))?;
            for (chunks, pages) in more {
                st = self.stage_chunks(st, &mut waited_since, &mut doorbells, op, chunks, &pages, owner(ctx, slot))?;
            }
        }
        st.qp.ring_sq_doorbell();
        if let Some(c) = st.batch.ctxs[ctx as usize].as_mut() {
            c.slots = slots;
        }
        Ok(doorbells + 1)
    }

    /// Stages a command per chunk of `chunks`, on `pages`, as [`stage`](Self::stage) does.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn stage_chunks<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        waited_since: &mut Option<Instant>,
        doorbells: &mut usize,
        op: NvmOpcode,
        chunks: Chunker,
        pages: &[u64],
        owner: Owner,
    ) -> Result<MutexGuard<'a, State>> {
        for ch in chunks {
            let plan = ugds_nvme::prp::plan(pages, ugds_platform::sys::PAGE_SIZE, ch.data_off, ch.len)
                .expect("validated range plans");
            let sqe = Sqe::rw(op, Cid(0), self.nsid, Lba(ch.slba), ch.nlb, 0, 0);
            st = self.stage(st, waited_since, doorbells, |st| st.qp.submit(sqe, Some(plan), owner))?;
        }
        Ok(st)
    }

    /// Stages one command with `submit`; while the queue is full, rings
    /// what is staged, reaps and lets others in, until the timeout.
    fn stage<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        waited_since: &mut Option<Instant>,
        doorbells: &mut usize,
        mut submit: impl FnMut(&mut State) -> std::result::Result<Cid, Full>,
    ) -> Result<MutexGuard<'a, State>> {
        loop {
            match submit(&mut st) {
                Ok(_) => {
                    *waited_since = None;
                    return Ok(st);
                }
                Err(full) => {
                    // Ring what is staged, reap, and let others in while
                    // the device works.
                    if st.qp.outstanding() > 0 {
                        st.qp.ring_sq_doorbell();
                        *doorbells += 1;
                    }
                    drop(st);
                    std::hint::spin_loop();
                    st = self.lock();
                    if self.reap(&mut st) == 0 {
                        let since = *waited_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > self.timeout {
                            tracing::error!(?full, "batch submission found no room within the timeout");
                            return Err(Error::Timeout { qid: st.qp.qid().0, cid: None, after: self.timeout });
                        }
                    } else {
                        *waited_since = None;
                    }
                }
            }
        }
    }

    /// Moves up to `max` finished events of `ctx` into `out`, reaping first.
    /// Returns how many were moved and how many of the context's requests
    /// remain (on the device or not yet collected).
    pub(crate) fn collect(&self, ctx: u32, max: usize, out: &mut Vec<BatchEvent>) -> (usize, usize) {
        let mut st = self.lock();
        self.reap(&mut st);
        let c = st.batch.ctxs[ctx as usize].as_mut().expect("open context");
        let n = max.min(c.done.len());
        out.extend(c.done.drain(..n));
        (n, c.inflight + c.done.len())
    }

    /// The queue's id.
    pub fn qid(&self) -> u16 {
        self.lock().qp.qid().0
    }

    /// Consumes every completion now (crediting every context).
    pub(crate) fn reap_now(&self) {
        let mut st = self.lock();
        self.reap(&mut st);
    }

    /// Requests of `ctx` with a command late on the device (see the
    /// module docs), with the CIDs of their commands there.
    pub(crate) fn late(&self, ctx: u32) -> Vec<(u32, Vec<Cid>)> {
        let mut st = self.lock();
        self.reap(&mut st);
        let late = Self::late_requests(&mut st, ctx, self.timeout);
        late.into_iter().map(|i| (i, st.qp.outstanding_cids_of(owner(ctx, i)))).collect()
    }

    /// The requests of `ctx` that the tracker finds late, each once.
    fn late_requests(st: &mut State, ctx: u32, timeout: Duration) -> Vec<u32> {
        let mut late: Vec<u32> = st
            .qp
            .late_commands(timeout)
            .into_iter()
            .filter_map(|(_, o)| match o {
                Owner::Batch { ctx: c, req } if c == ctx => Some(req),
                _ => None,
            })
            .collect();
        late.sort_unstable();
        late.dedup();
        late
    }

    /// Whether request `req` of `ctx` still has commands on the device.
    pub(crate) fn in_flight(&self, ctx: u32, req: u32) -> bool {
        let st = self.lock();
        st.batch.ctxs[ctx as usize].as_ref().is_some_and(|c| c.reqs[req].pending > 0)
    }

    /// Requests of `ctx` late on the device: reported as timed out, and
    /// their buffer references returned (to quarantine). Empty when none.
    pub(crate) fn expire(&self, ctx: u32) -> Vec<Hold> {
        let mut st = self.lock();
        self.reap(&mut st);
        let qid = st.qp.qid().0;
        let timeout = self.timeout;
        let late = Self::late_requests(&mut st, ctx, timeout);
        let mut guards = Vec::new();
        for i in late {
            let cid = st.qp.outstanding_cid_of(owner(ctx, i));
            let c = st.batch.ctxs[ctx as usize].as_mut().expect("open context");
            let r = &mut c.reqs[i];
            if r.pending == 0 {
                continue;
            }
            r.pending = 0;
            guards.extend(r.hold.take());
            c.stats.ended += 1;
            c.stats.timeouts += 1;
            c.done.push_back(BatchEvent {
                cookie: r.cookie,
                status: BatchStatus::Timeout,
                result: Err(Error::Timeout { qid, cid, after: timeout }),
            });
            c.inflight -= 1;
            // Not freed: a late completion may still name it.
            c.reqs.retire(i);
        }
        guards
    }

    /// Marks `ctx` canceled (no more submissions) and returns the CIDs of
    /// its commands on the device, for the caller to abort.
    pub(crate) fn cancel(&self, ctx: u32) -> Vec<(u16, Cid)> {
        let mut st = self.lock();
        let qid = st.qp.qid().0;
        let c = st.batch.ctxs[ctx as usize].as_mut().expect("open context");
        c.canceled = true;
        let live: Vec<u32> = c.reqs.iter_mut().filter(|(_, r)| r.pending > 0).map(|(i, _)| i).collect();
        let mut cids = Vec::new();
        for i in live {
            // Every command of the request: scan the queue's outstanding CIDs.
            cids.extend(st.qp.outstanding_cids_of(owner(ctx, i)).into_iter().map(|c| (qid, c)));
        }
        cids
    }

    /// Forgets every command on the device: only after a controller reset.
    pub(crate) fn forget_outstanding(&self) {
        let mut st = self.lock();
        st.qp.forget_outstanding();
        for c in st.batch.ctxs.iter_mut().flatten() {
            for (_, r) in c.reqs.iter_mut() {
                // Ended by the reset (no event comes for it).
                c.stats.ended += (r.pending > 0) as u64;
                r.pending = 0;
                r.hold = None;
            }
            // No completion can name any of them now: timed-out ones too
            // are free again.
            c.reqs.reset();
            c.inflight = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    //! Batch contexts against a device the test plays (`engine::fake`):
    //! requests of several commands, completed out of order, one command
    //! failed, two contexts on one queue pair.
    use super::*;
    use crate::engine::fake::{Device, Doorbells};
    use crate::engine::hold::Inflight;
    use crate::engine::qpair::NvmeQueue;
    use crate::engine::queue::QueuePair;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use ugds_nvme::Qid;
    use ugds_platform::sys::PAGE_SIZE;

    /// Counts the holds of the requests in flight.
    #[derive(Default)]
    struct Holds(AtomicUsize);

    impl Inflight for Holds {
        fn release(&self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A read of `len` bytes at byte `at`, in commands of at most 4 KiB.
    fn read(holds: &Arc<Holds>, cookie: u64, at: u64, len: usize) -> Prepared {
        holds.0.fetch_add(1, Ordering::Relaxed);
        let pages: Arc<[u64]> = (0..len.div_ceil(PAGE_SIZE)).map(|i| 0x10_0000 + (i * PAGE_SIZE) as u64).collect();
        Prepared {
            op: NvmOpcode::Read,
            cookie,
            len,
            chunks: Chunker::new(at, 0, len, 512, PAGE_SIZE, Some(4096)),
            pages,
            more: Vec::new(),
            hold: Hold::new(holds.clone()),
            sgl: false,
        }
    }

    #[test]
    fn requests_of_several_commands_end_when_their_last_completes() {
        let bells = Arc::new(Doorbells::default());
        let qp = NvmeQueue::new(bells.clone(), Qid(1), 8, 0, None).unwrap();
        let mut dev = Device::of(&qp);
        let q = Arc::new(SyncQueue::new(QueuePair::Nvme(qp), bells.clone()).unwrap());
        let b = BatchQueue::new(q, false, 1, Duration::from_secs(10));
        let holds = Arc::new(Holds::default());
        let (c1, c2) = (b.open_context(4), b.open_context(4));
        for round in 0..5u64 {
            // Context 1: 8 KiB (two commands) and 4 KiB; context 2: 12 KiB
            // (three), whose middle command the device fails.
            let mut one = vec![read(&holds, 10 + round, 0, 8192), read(&holds, 20 + round, 65536, 4096)];
            let mut two = vec![read(&holds, 30 + round, 1 << 20, 12288)];
            // One doorbell write for each submission, whatever its commands.
            assert_eq!(b.submit(c1, &mut one).unwrap(), 1);
            assert_eq!(b.submit(c2, &mut two).unwrap(), 1);
            let sqes = dev.fetch_sqes(bells.sq_tail(1).expect("rung"));
            assert_eq!(sqes.len(), 6, "round {round}: every command on the device");
            // Last fetched first; the 12 KiB read's second block of commands fails.
            for s in sqes.iter().rev() {
                let status = if s.slba().0 == (1 << 20) / 512 + 8 { 0x80 } else { 0 };
                dev.post(s.cid().0, dev.sq_head, status);
            }
            let mut ev = Vec::new();
            let (n, left) = b.collect(c1, 8, &mut ev);
            assert_eq!((n, left), (2, 0), "round {round}");
            let mut got: Vec<_> = ev.iter().map(|e| (e.cookie, e.status, e.result.as_ref().ok().copied())).collect();
            got.sort_by_key(|g| g.0);
            assert_eq!(
                got,
                vec![(10 + round, BatchStatus::Complete, Some(8192)), (20 + round, BatchStatus::Complete, Some(4096))]
            );
            ev.clear();
            assert_eq!(b.collect(c2, 8, &mut ev), (1, 0), "round {round}");
            assert_eq!((ev[0].cookie, ev[0].status), (30 + round, BatchStatus::Failed));
            assert!(matches!(&ev[0].result, Err(Error::Nvme { status, .. }) if status.sc == 0x80));
            assert_eq!(holds.0.load(Ordering::Relaxed), 0, "round {round}: every request's hold let go");
        }
        let _ = b.close_context(c1);
        let _ = b.close_context(c2);
    }

    #[test]
    fn a_timed_out_request_keeps_its_slot_until_the_reset_frees_it() {
        let bells = Arc::new(Doorbells::default());
        let qp = NvmeQueue::new(bells.clone(), Qid(1), 8, 0, None).unwrap();
        let mut dev = Device::of(&qp);
        let q = Arc::new(SyncQueue::new(QueuePair::Nvme(qp), bells.clone()).unwrap());
        // A zero timeout: late at the second look that finds them.
        let b = BatchQueue::new(q, false, 1, Duration::ZERO);
        let holds = Arc::new(Holds::default());
        let c = b.open_context(2);
        b.submit(c, &mut vec![read(&holds, 1, 0, 4096), read(&holds, 2, 4096, 4096)]).unwrap();
        let sqes = dev.fetch_sqes(bells.sq_tail(1).expect("rung"));
        let mut guards = Vec::new();
        for _ in 0..1000 {
            guards.extend(b.expire(c));
            if guards.len() == 2 {
                break;
            }
        }
        assert_eq!(guards.len(), 2, "both requests reported timed out, their holds handed back");
        drop(guards);
        let mut ev = Vec::new();
        assert_eq!(b.collect(c, 8, &mut ev).0, 2);
        assert!(ev.iter().all(|e| e.status == BatchStatus::Timeout));
        assert_eq!(b.room(c), 0, "a late completion may still name their slots");
        assert!(matches!(
            b.submit(c, &mut vec![read(&holds, 3, 0, 4096)]),
            Err(Error::CapacityExceeded { capacity: 2, requested: 1, .. })
        ));
        // A late completion is dropped, and frees nothing.
        dev.post(sqes[0].cid().0, dev.sq_head, 0);
        ev.clear();
        assert_eq!(b.collect(c, 8, &mut ev).0, 0);
        assert_eq!(b.room(c), 0);
        // After a reset no completion can come: the context is whole again.
        b.forget_outstanding();
        assert_eq!(b.room(c), 2);
        let _ = b.close_context(c);
    }
}
