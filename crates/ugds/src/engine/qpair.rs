//! One controller queue pair (or the admin queue pair): a submission ring,
//! a completion ring, and a tracker per command identifier.
//!
//! Which command a completion ends, who is credited with it and which
//! PRP-list page it frees is the [`Tracker`]'s, indexed by CID.
//!
//! Used through `&mut self`: one thread at a time, which the compiler checks
//! (SPDK's rule for a qpair). Submission and completion are separate steps,
//! as in Linux and SPDK: [`NvmeQueue::submit`] copies an entry into the ring
//! and advances the tail; [`NvmeQueue::ring_sq_doorbell`] tells the
//! controller, once for however many entries were staged;
//! [`NvmeQueue::process_completions`] consumes new entries and reports the
//! new CQ head: once per sweep on an interrupt-driven queue, lazily on a
//! polled one (see [`NvmeQueue::report_cq_head`]).

use super::stats::{QueueCounters, Staged};
use crate::engine::transport::Transport;
use std::sync::Arc;
use ugds_nvme::prp::PrpPlan;
use ugds_nvme::ring::{CqCursor, Ring};
use ugds_nvme::sgl;
use ugds_nvme::{regs, Cid, Cqe, Qid, Sqe};
use ugds_platform::barrier;
use ugds_platform::dma::DmaBuffer;
use ugds_platform::sys::PAGE_SIZE;
use ugds_platform::Platform;
use ugds_platform::{Error, Result};

pub use super::cq_view::CqView;
pub use super::tracker::{Owner, Tracker};

/// This queue's slots in the shadow doorbell and EventIdx pages.
struct Shadow {
    pages: Arc<DmaBuffer>,
    /// Offsets of the SQ tail and CQ head entries; the EventIdx page's
    /// entries are at the same offsets plus `PAGE_SIZE`.
    sq: usize,
    cq: usize,
}

impl Shadow {
    /// Publishes `new` as the doorbell value at `off` and says whether the
    /// controller also needs the MMIO write (Linux's
    /// `nvme_dbbuf_update_and_check_event`).
    #[inline]
    fn update(&self, off: usize, new: u32) -> bool {
        let old = self.pages.read_u32(off);
        // Release: the queue entries are visible before the new value.
        self.pages.store_u32_release(off, new);
        // The controller writes EventIdx, then reads the shadow value; we
        // write the shadow value, then read EventIdx. Each side's store must
        // be visible before its load: a full fence (mfence on x86-64).
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let event = self.pages.load_u32_acquire(PAGE_SIZE + off);
        regs::dbbuf_need_event(event as u16, new as u16, old as u16)
    }
}

/// SGL descriptors one list page holds: the most Data Blocks a command
/// built by [`NvmeQueue::submit_sgl`] may have.
pub const SGL_PER_PAGE: usize = PAGE_SIZE / ugds_nvme::sgl::DESCRIPTOR_LEN;

/// What kept a command from being staged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// No free submission queue slot.
    Sq,
    /// No free command identifier.
    Cid,
    /// No free PRP-list page (only commands spanning more than two pages need one).
    PrpPages,
}

impl From<Full> for Error {
    fn from(_: Full) -> Error {
        Error::QueueFull
    }
}

/// A controller's queue pair as the host sees it (NVMe over PCIe: rings
/// in memory, doorbell registers). The fields are grouped by role for the
/// reader; Rust chooses the layout (no `repr`), so nothing here is placed
/// for the cache.
pub struct NvmeQueue {
    // Submission.
    sq: DmaBuffer,
    sq_ring: Ring,
    sq_tail: u32,
    /// The tail value the controller was last told.
    last_sq_tail: u32,
    /// The controller's SQ head as last reported in a CQE.
    sq_head: u32,
    /// The commands on the device, by CID.
    tracker: Tracker,
    /// Commands staged, counted here and published at the doorbell.
    staged: Staged,
    /// What this queue pair has done (read by its handle).
    counters: Arc<QueueCounters>,
    /// Pre-mapped PRP-list pages; a command that needs a list borrows one
    /// until its completion is consumed.
    prp_pages: DmaBuffer,
    prp_free: Vec<u16>,

    // Completion.
    cq: Arc<DmaBuffer>,
    cq_ring: Ring,
    cursor: CqCursor,
    /// Completions consumed but not yet reported through the CQ head
    /// doorbell, and how many may wait (0 on interrupt-driven queues: every
    /// sweep is reported).
    cq_unreported: u32,
    cq_lazy: u32,

    /// Shadow doorbells, when the controller offers Doorbell Buffer Config.
    dbbuf: Option<Shadow>,

    // Identity and doorbells (the doorbell offsets and the platform are
    // used at every doorbell write).
    qid: Qid,
    sq_db: usize,
    cq_db: usize,
    platform: Arc<dyn Platform>,
    vector: Option<u16>,
    protocol_errors: u64,
}

impl NvmeQueue {
    /// Allocates the rings and PRP pages of a queue pair with `entries`
    /// entries per ring and one PRP-list page per possible command. The
    /// caller creates it on the controller.
    pub fn new(
        platform: Arc<dyn Platform>,
        qid: Qid,
        entries: u16,
        dstrd: u8,
        vector: Option<u16>,
    ) -> Result<NvmeQueue> {
        NvmeQueue::with_prp_pages(platform, qid, entries, dstrd, vector, entries.saturating_sub(1))
    }

    /// As [`new`](Self::new), with a pool of `prp_pages` PRP-list pages:
    /// fewer than the queue's depth bounds the multi-page commands in
    /// flight (the batch queue's pool).
    pub fn with_prp_pages(
        platform: Arc<dyn Platform>,
        qid: Qid,
        entries: u16,
        dstrd: u8,
        vector: Option<u16>,
        prp_pages: u16,
    ) -> Result<NvmeQueue> {
        if entries < 2 {
            return Err(Error::InvalidArgument(format!("queue of {entries} entries")));
        }
        let sq = platform.alloc_dma(entries as usize * Sqe::SIZE)?;
        let cq = Arc::new(platform.alloc_dma(entries as usize * Cqe::SIZE)?);
        // At most entries - 1 commands can be outstanding on the SQ at once,
        // so that many CIDs are all a queue can use.
        let ncids = entries - 1;
        let npages = prp_pages.clamp(1, ncids);
        let prp_pages = platform.alloc_dma(npages as usize * PAGE_SIZE)?;
        Ok(NvmeQueue {
            sq,
            sq_ring: Ring::new(entries as u32),
            sq_tail: 0,
            last_sq_tail: 0,
            sq_head: 0,
            tracker: Tracker::new(ncids),
            staged: Staged::default(),
            counters: Arc::default(),
            prp_pages,
            prp_free: (0..npages).rev().collect(),
            dbbuf: None,
            cq,
            cq_ring: Ring::new(entries as u32),
            cursor: CqCursor::default(),
            cq_unreported: 0,
            // A polled queue reports its head every quarter ring: the
            // controller only needs room to post (see `report_cq_head`).
            cq_lazy: if vector.is_none() { entries as u32 / 4 } else { 0 },
            qid,
            sq_db: regs::sq_tail_doorbell(qid.0, dstrd),
            cq_db: regs::cq_head_doorbell(qid.0, dstrd),
            platform,
            vector,
            protocol_errors: 0,
        })
    }

    /// Uses shadow doorbells in `pages` (shadow page, then EventIdx page)
    /// for this queue from now on.
    pub fn use_shadow_doorbells(&mut self, pages: Arc<DmaBuffer>) {
        let base = regs::DOORBELL_BASE;
        let (sq, cq) = (self.sq_db - base, self.cq_db - base);
        if cq + 4 > PAGE_SIZE || pages.len() < 2 * PAGE_SIZE {
            return; // beyond one page of doorbells: MMIO only
        }
        // Start the shadow entries at the values the controller has.
        pages.store_u32_release(sq, self.last_sq_tail);
        pages.store_u32_release(cq, self.cursor.head);
        self.dbbuf = Some(Shadow { pages, sq, cq });
    }

    /// Whether this queue uses shadow doorbells.
    #[cfg_attr(not(feature = "engine-internals"), allow(dead_code))]
    pub fn shadow_doorbells(&self) -> bool {
        self.dbbuf.is_some()
    }

    /// Controller address of the SQ ring.
    pub fn sq_iova(&self) -> u64 {
        self.sq.iova(0)
    }

    /// Controller address of the CQ ring.
    pub fn cq_iova(&self) -> u64 {
        self.cq.iova(0)
    }

    /// PRP-list pages not lent to a command.
    #[cfg_attr(not(feature = "engine-internals"), allow(dead_code))]
    pub fn free_prp_pages(&self) -> usize {
        self.prp_free.len()
    }

    /// Stages `sqe` (its CID and, with `data`, its PRPs filled in here) in the
    /// submission ring. Not visible to the controller until
    /// [`ring_sq_doorbell`](Self::ring_sq_doorbell).
    #[inline]
    pub fn submit(&mut self, sqe: Sqe, data: Option<PrpPlan<'_>>, owner: Owner) -> Result<Cid, Full> {
        self.stage(sqe, data, owner)
    }

    /// As [`submit`](Self::submit), inlined into the caller.
    #[inline(always)]
    pub fn stage(&mut self, mut sqe: Sqe, data: Option<PrpPlan<'_>>, owner: Owner) -> Result<Cid, Full> {
        let list = matches!(data, Some(PrpPlan::List { .. }));
        self.room(list)?;
        // A page from the pool, held by this command until its completion
        // is consumed: no other command can overwrite it while the
        // controller may still read it.
        let page = if list { self.prp_free.pop() } else { None };
        let cid = self.tracker.begin(owner, page).expect("a CID is free");
        match data {
            None => {}
            Some(PrpPlan::One { prp1 }) => sqe.prp1 = prp1,
            Some(PrpPlan::Two { prp1, prp2 }) => {
                sqe.prp1 = prp1;
                sqe.prp2 = prp2;
            }
            Some(PrpPlan::List { prp1, entries }) => {
                let page = page.expect("taken above") as usize * PAGE_SIZE;
                for (i, &e) in entries.iter().enumerate() {
                    self.prp_pages.write_u64(page + i * 8, e);
                }
                sqe.prp1 = prp1;
                sqe.prp2 = self.prp_pages.iova(page);
            }
        }
        self.post(cid, sqe);
        Ok(cid)
    }

    /// Whether a command can be staged now (with a list page if `list`).
    #[inline(always)]
    fn room(&mut self, list: bool) -> Result<(), Full> {
        if self.sq_ring.is_full(self.sq_head, self.sq_tail) {
            return Err(Full::Sq);
        }
        // Every command in flight must find a free CQ slot when it
        // completes: consumed entries not yet reported still count as used.
        if self.cq_unreported > 0
            && self.cq_unreported as usize + self.tracker.outstanding() + 1 >= self.cq_ring.size() as usize
        {
            self.report_cq_head();
        }
        if list && self.prp_free.is_empty() {
            return Err(Full::PrpPages);
        }
        if self.tracker.is_full() {
            return Err(Full::Cid);
        }
        Ok(())
    }

    /// Writes the entry of command `cid` at the tail (the doorbell is rung
    /// later, once for all staged).
    #[inline(always)]
    fn post(&mut self, cid: Cid, mut sqe: Sqe) {
        // Counted from the entry before it is written (read after, its
        // fields would be kept in memory for it).
        self.staged.add(sqe.opcode(), sqe.nlb());
        self.tracker.staged(cid, &sqe);
        sqe.set_cid(cid);
        self.sq.write_sqe(self.sq_tail as usize * Sqe::SIZE, &sqe);
        self.sq_tail = self.sq_ring.next(self.sq_tail);
    }

    /// As [`submit`](Self::submit), for a command whose data is `pieces`
    /// described by an SGL (the controller takes SGLs: Identify's SGLS):
    /// SGL1 is one Data Block when one suffices, else a Last Segment of the
    /// Data Block descriptors written into the command's list page. The
    /// caller has checked that they fit one page ([`SGL_PER_PAGE`]).
    pub fn submit_sgl(&mut self, mut sqe: Sqe, pieces: &[sgl::Piece<'_>], owner: Owner) -> Result<Cid, Full> {
        let n = sgl::describe(pieces, PAGE_SIZE, SGL_PER_PAGE, |_, _| {}).expect("checked by the caller");
        self.room(n > 1)?;
        let page = if n > 1 { self.prp_free.pop() } else { None };
        let cid = self.tracker.begin(owner, page).expect("a CID is free");
        let sgl1 = match page {
            None => {
                let mut one = None;
                let _ = sgl::describe(pieces, PAGE_SIZE, 1, |_, d| one = Some(d));
                one.expect("one descriptor")
            }
            Some(p) => {
                let base = p as usize * PAGE_SIZE;
                let pages = &mut self.prp_pages;
                let _ = sgl::describe(pieces, PAGE_SIZE, SGL_PER_PAGE, |i, d| {
                    let b = d.to_bytes();
                    let at = base + i * sgl::DESCRIPTOR_LEN;
                    pages.write_u64(at, u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")));
                    pages.write_u64(at + 8, u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")));
                });
                sgl::Descriptor::last_segment(self.prp_pages.iova(base), n)
            }
        };
        (sqe.prp1, sqe.prp2) = sgl1.to_dptr();
        sqe.cdw0 = (sqe.cdw0 & !(3 << 14)) | sgl::PSDT_SGL << 14;
        self.post(cid, sqe);
        Ok(cid)
    }

    /// Where the next completion will appear: (head, expected phase).
    pub fn cq_cursor(&self) -> (u32, bool) {
        (self.cursor.head, self.cursor.phase)
    }

    /// Frees the SQ slots a completion's SQ head says the controller has
    /// fetched. SQ slots are freed by how far the controller has fetched,
    /// not by which commands completed. The head only moves forward, and
    /// never past the tail it was told: anything else would free slots the
    /// controller has not fetched, and is refused.
    #[inline(always)]
    fn take_sq_head(&mut self, sqhd: u16) {
        let (h, head, tail) = (sqhd as u32, self.sq_head, self.last_sq_tail);
        // In [head, tail] in ring order (wrapped: [head, size) or [0, tail]).
        let fetched =
            if head <= tail { h >= head && h <= tail } else { h >= head && h < self.sq_ring.size() || h <= tail };
        if fetched {
            self.sq_head = h;
        } else {
            self.bad_sq_head(sqhd);
        }
    }

    /// A completion whose SQ head lies outside what was submitted (kept
    /// off the reaping loop, which then has registers to spare).
    #[cold]
    #[inline(never)]
    fn bad_sq_head(&mut self, sqhd: u16) {
        self.protocol_errors += 1;
        tracing::error!(
            qid = self.qid.0,
            sqhd,
            head = self.sq_head,
            tail = self.last_sq_tail,
            "completion with an SQ head outside what was submitted; ignored"
        );
    }

    /// A completion naming no outstanding command.
    #[cold]
    #[inline(never)]
    fn bad_completion(&mut self, e: ugds_nvme::cid::NotAllocated) {
        self.protocol_errors += 1;
        tracing::error!(qid = self.qid.0, "completion ignored: {e}");
    }

    /// Tells the controller how far the completion queue has been consumed.
    ///
    /// A polled queue does this lazily (every quarter ring, and before a
    /// submission could leave a completion without a free slot), saving a
    /// doorbell write per sweep: the controller needs the head only to know
    /// the ring has room, and the invariant `unreported + in flight <
    /// entries` keeps room for every command in flight. Interrupt-driven
    /// queues report every sweep.
    pub fn report_cq_head(&mut self) {
        if self.cq_unreported == 0 {
            return;
        }
        barrier::consumed_before_doorbell();
        let mmio = match &self.dbbuf {
            Some(s) => s.update(s.cq, self.cursor.head),
            None => true,
        };
        if mmio {
            // SAFETY: frees completion slots of this queue's own ring.
            unsafe { self.platform.write32(self.cq_db, self.cursor.head) };
            self.counters.doorbell_writes.add(1);
        }
        self.cq_unreported = 0;
    }
}

#[cfg(test)]
impl NvmeQueue {
    /// The rings, for a device the tests play (`engine::fake`).
    pub(crate) fn rings(&self) -> (&DmaBuffer, &Arc<DmaBuffer>) {
        (&self.sq, &self.cq)
    }
}

impl std::fmt::Debug for NvmeQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeQueue")
            .field("qid", &self.qid.0)
            .field("entries", &self.sq_ring.size())
            .field("sq_tail", &self.sq_tail)
            .field("sq_head", &self.sq_head)
            .field("cq_head", &self.cursor.head)
            .field("phase", &self.cursor.phase)
            .field("outstanding", &self.tracker.outstanding())
            .finish()
    }
}

impl Transport for NvmeQueue {
    type Extra = ();

    /// Queue identifier.
    fn qid(&self) -> Qid {
        self.qid
    }

    /// Entries per ring.
    fn entries(&self) -> u16 {
        self.sq_ring.size() as u16
    }

    /// The interrupt vector of the CQ, when it has one.
    fn vector(&self) -> Option<u16> {
        self.vector
    }

    /// Commands that may be submitted now without waiting for completions
    /// (commands needing a PRP list are also bounded by [`free_prp_pages`](Self::free_prp_pages)).
    fn free_slots(&self) -> usize {
        (self.sq_ring.free(self.sq_head, self.sq_tail) as usize)
            .min(self.tracker.capacity() as usize - self.tracker.outstanding())
    }

    /// Completions that named a CID nobody held, or an SQ head outside the ring.
    fn protocol_errors(&self) -> u64 {
        self.protocol_errors
    }

    /// The commands on the device.
    fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// The commands on the device, to change how they are traced.
    fn tracker_mut(&mut self) -> &mut Tracker {
        &mut self.tracker
    }

    /// What this queue pair has done.
    fn counters(&self) -> &Arc<QueueCounters> {
        &self.counters
    }

    /// A lock-free view of the completion ring (see [`CqView`]).
    fn cq_view(&self) -> CqView {
        CqView::ring(self.cq.clone(), self.cq_ring.size())
    }

    /// Whether a new completion entry is waiting (a peek at the phase tag).
    #[inline]
    fn completion_pending(&mut self) -> bool {
        let dw3 = self.cq.load_u32_acquire(self.cursor.head as usize * Cqe::SIZE + 12);
        (dw3 >> 16) & 1 == self.cursor.phase as u32
    }

    /// Consumes up to `max` new completion entries, calling `f(owner, cqe)` for
    /// each, and reports the CQ head (see [`report_cq_head`](Self::report_cq_head)).
    /// Returns how many.
    #[inline]
    fn process_completions(&mut self, max: usize, mut f: impl FnMut(Owner, &Cqe)) -> usize {
        let (mut n, mut done, mut failed) = (0, 0, 0);
        let mut sqhd = 0;
        while n < max {
            // The phase tag is the truth: an entry is new when its phase
            // matches the one we expect at this position.
            let Some(cqe) = self.cq.take_cqe(self.cursor.head as usize, self.cursor.phase) else { break };
            self.cursor.advance(self.cq_ring);
            n += 1;
            // The newest entry's SQ head says all the earlier ones say and
            // more: only the last of the round is taken (below).
            sqhd = cqe.sqhd;
            match self.tracker.end(Cid(cqe.cid), cqe.status) {
                Ok(t) => {
                    if let Some(page) = t.prp_page {
                        self.prp_free.push(page);
                    }
                    done += 1;
                    failed += !cqe.is_success() as u64;
                    f(t.owner, &cqe)
                }
                Err(e) => self.bad_completion(e),
            }
        }
        if n > 0 {
            self.take_sq_head(sqhd);
            self.counters.completed.add(done);
            self.counters.errors.add(failed);
            self.cq_unreported += n as u32;
            if self.cq_unreported > self.cq_lazy
                || self.cq_unreported as usize + self.tracker.outstanding() + 1 >= self.cq_ring.size() as usize
            {
                self.report_cq_head();
            }
        }
        n
    }

    /// Tells the controller about every entry staged since the last call:
    /// one doorbell write however many there are.
    #[inline]
    fn ring_sq_doorbell(&mut self) {
        if self.sq_tail != self.last_sq_tail {
            // The SQEs and PRP lists written above must be visible before
            // the controller, woken by the doorbell, fetches them.
            barrier::dma_wmb();
            let mmio = match &self.dbbuf {
                Some(s) => s.update(s.sq, self.sq_tail),
                None => true,
            };
            if mmio {
                // SAFETY: every entry up to the tail names memory the
                // requests that staged them hold until their completions.
                unsafe { self.platform.write32(self.sq_db, self.sq_tail) };
                self.counters.doorbell_writes.add(1);
            }
            self.last_sq_tail = self.sq_tail;
            self.staged.publish(&self.counters);
        }
    }

    /// Forgets every outstanding command: only after the controller was
    /// reset or the queue deleted, when no completion for them can come.
    fn forget_outstanding(&mut self) -> usize {
        self.cq_unreported = 0;
        let n = self.tracker.outstanding();
        let pages = self.tracker.forget_all();
        self.prp_free.extend(pages);
        n
    }

    /// Size of the PRP-list page pool.
    fn prp_pool_size(&self) -> usize {
        self.prp_pages.len() / PAGE_SIZE
    }
}

#[cfg(test)]
mod tests {
    //! The queue pair against a device played by the test (`engine::fake`):
    //! it fetches the submission ring where the queue's doorbell says, and
    //! posts completions where and in what order it likes, with the phase
    //! tag a controller would write, so that the rings wrap and the phase
    //! flips.
    use super::*;
    use crate::engine::fake::{read, Device, Doorbells};

    fn queue(entries: u16) -> (Arc<Doorbells>, NvmeQueue) {
        let bells = Arc::new(Doorbells::default());
        let q = NvmeQueue::new(bells.clone(), Qid(1), entries, 0, None).unwrap();
        (bells, q)
    }

    #[test]
    fn completions_out_of_order_across_wraps_reach_their_owners() {
        let (bells, mut q) = queue(4);
        let mut dev = Device::of(&q);
        let (sq_db, cq_db) = (regs::sq_tail_doorbell(1, 0), regs::cq_head_doorbell(1, 0));
        for round in 0..10u32 {
            // A full ring: three commands (one slot stays empty).
            for i in 0..3 {
                q.stage(read(i), None, Owner::Own(round * 3 + i as u32)).unwrap();
            }
            assert!(q.stage(read(9), None, Owner::Own(99)).is_err(), "round {round}: the ring is full");
            q.ring_sq_doorbell();
            let tail = bells.last(sq_db).expect("the tail was rung");
            assert_eq!(tail, (round * 3 + 3) % 4, "round {round}: the doorbell carries the tail");
            let cids = dev.fetch(tail);
            assert_eq!(cids.len(), 3);
            // Last fetched first; each completion says all three were fetched.
            for &cid in cids.iter().rev() {
                dev.post(cid, dev.sq_head, 0);
            }
            let mut owners = Vec::new();
            assert_eq!(q.process_completions(usize::MAX, |o, c| owners.push((o, c.is_success()))), 3);
            let want: Vec<_> = (0..3).rev().map(|i| (Owner::Own(round * 3 + i), true)).collect();
            assert_eq!(owners, want, "round {round}: each completion reaches its command's owner");
            assert_eq!(q.outstanding(), 0);
            // The entries of this pass are stale now: nothing more.
            assert_eq!(q.process_completions(usize::MAX, |_, _| panic!("a stale entry consumed")), 0);
            assert_eq!(bells.last(cq_db), Some(dev.cq_tail), "round {round}: the CQ head is reported");
        }
        assert_eq!(q.protocol_errors(), 0);
        assert_eq!(dev.cq_tail, 30 % 4, "the completion ring wrapped seven times");
    }

    #[test]
    fn a_completion_for_no_command_or_an_impossible_sq_head_is_counted_and_ignored() {
        let (bells, mut q) = queue(8);
        let mut dev = Device::of(&q);
        let cid = q.submit(read(0), None, Owner::Own(7)).unwrap();
        q.ring_sq_doorbell();
        let tail = bells.last(regs::sq_tail_doorbell(1, 0)).unwrap();
        assert_eq!(dev.fetch(tail), vec![cid.0]);
        // A CID never issued, then an SQ head past the tail, then the real one.
        dev.post(cid.0 ^ 0x40, dev.sq_head, 0);
        dev.post(cid.0, 5, 0);
        let mut owners = Vec::new();
        assert_eq!(q.process_completions(usize::MAX, |o, _| owners.push(o)), 2);
        assert_eq!(owners, vec![Owner::Own(7)], "only the issued command's completion reaches an owner");
        assert_eq!(q.protocol_errors(), 2, "both bad entries counted");
        // The same CID again: its command is no longer outstanding.
        dev.post(cid.0, dev.sq_head, 0);
        assert_eq!(q.process_completions(usize::MAX, |_, _| panic!("completed twice")), 1);
        assert_eq!(q.protocol_errors(), 3);
    }

    #[test]
    fn an_error_status_reaches_the_owner_and_frees_the_slot() {
        let (bells, mut q) = queue(2);
        let mut dev = Device::of(&q);
        for round in 0..5u32 {
            let cid = q.submit(read(round as u64), None, Owner::Own(round)).unwrap();
            q.ring_sq_doorbell();
            let tail = bells.last(regs::sq_tail_doorbell(1, 0)).unwrap();
            dev.fetch(tail);
            // Status: generic, LBA out of range (0x80).
            dev.post(cid.0, dev.sq_head, 0x80);
            let mut seen = None;
            assert_eq!(q.process_completions(1, |o, c| seen = Some((o, c.status().sc))), 1);
            assert_eq!(seen, Some((Owner::Own(round), 0x80)), "round {round}");
            assert_eq!(q.free_slots(), 1, "round {round}: the one slot is free again");
        }
    }
}
