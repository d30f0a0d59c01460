//! What a queue pair knows of each command on the device, indexed by CID.
//!
//! One entry per command identifier: who is credited with its completion
//! (the [`Owner`]), the PRP-list page it borrows, and when a timeout check
//! first found it outstanding. The entry lives from submission until the
//! completion naming its CID (and generation) is consumed, or until the
//! queue's commands are forgotten after a reset. The request tables above
//! (synchronous slots, a lent queue's requests, a batch context's requests)
//! hold only what belongs to a request as a whole: how many of its commands
//! are pending, its first error, its hold on the buffer. A transport may
//! keep more per command in the same entry (`X`: the kernel path keeps the
//! operation, to resume a partial transfer).

use super::trace::{Histogram, Trace, TraceEvent};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds_nvme::cid::NotAllocated;
use ugds_nvme::{Cid, CidTable, Sqe};

/// Who a command's completion is credited to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Owner {
    /// A synchronous request's slot on a shared queue pair.
    Sync(u32),
    /// A request of a batch context (or of a stream engine, or of a shared
    /// lent queue, which are batch contexts).
    Batch {
        /// The context.
        ctx: u32,
        /// The request within it.
        req: u32,
    },
    /// A request of the queue pair's only user: a lent queue, the admin
    /// queue, a test.
    Own(u32),
}

/// One command on the device.
#[derive(Clone, Copy, Debug)]
pub struct Tracked<X = ()> {
    /// Who is credited with the completion.
    pub owner: Owner,
    /// The PRP-list page it borrows from the queue's pool.
    pub prp_page: Option<u16>,
    /// When a timeout check first found it outstanding: stamped by the
    /// check, not at submission, so that no command pays a clock read.
    pub seen: Option<Instant>,
    /// What the transport keeps besides.
    pub extra: X,
}

impl<X: Default> Default for Tracked<X> {
    fn default() -> Tracked<X> {
        Tracked { owner: Owner::Own(0), prp_page: None, seen: None, extra: X::default() }
    }
}

/// The commands of one queue pair; see the module docs.
pub struct Tracker<X = ()> {
    /// The entries, one per CID slot, in the table that hands out CIDs.
    cids: CidTable<Tracked<X>>,
    /// The command lifecycle trace, when the handle asked for one.
    trace: Option<Box<Trace>>,
}

impl<X: Copy + Default> Tracker<X> {
    /// A tracker for up to `capacity` commands at once.
    pub fn new(capacity: u16) -> Tracker<X> {
        Tracker { cids: CidTable::new(capacity), trace: None }
    }

    /// Traces the last `depth` commands from now on, timed from `base`,
    /// their latencies counted into `latency` (see [`super::trace`]).
    pub fn enable_trace(&mut self, depth: usize, base: Instant, latency: Arc<Histogram>) {
        self.trace = Some(Box::new(Trace::new(depth, self.cids.capacity() as usize, base, latency)));
    }

    /// Notes the entry of command `cid` as staged, when traced.
    #[inline(always)]
    pub fn staged(&mut self, cid: Cid, sqe: &Sqe) {
        if let Some(t) = &mut self.trace {
            // Only what the trace keeps: handing it the entry's address
            // would keep the entry in memory on every queue's path.
            let (op, cdw10, cdw11, cdw12) = (sqe.opcode(), sqe.cdw10, sqe.cdw11, sqe.cdw12);
            t.staged(self.cids.index(cid), op, cdw10 as u64 | (cdw11 as u64) << 32, (cdw12 & 0xffff) + 1);
        }
    }

    /// The traced commands (see [`Trace::events`]); `None` when not traced.
    pub fn trace_events(&self) -> Option<Vec<TraceEvent>> {
        let t = self.trace.as_ref()?;
        Some(t.events(self.cids.outstanding_iter().map(|(c, i, _)| (c, i))))
    }

    /// The table slot of `cid`, whatever its generation: a transport may
    /// keep memory per slot (an NVMe/RDMA queue's capsule and data area),
    /// which a command holds from `begin` until its `end`.
    #[inline]
    pub fn slot(&self, cid: Cid) -> usize {
        self.cids.index(cid)
    }

    /// Commands it can hold at once.
    pub fn capacity(&self) -> u16 {
        self.cids.capacity()
    }

    /// Commands on the device.
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.cids.outstanding()
    }

    /// Whether a command identifier is free.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.cids.outstanding() == self.cids.capacity() as usize
    }

    /// Starts tracking a command: its CID, or `None` when every one is taken.
    #[inline]
    pub fn begin(&mut self, owner: Owner, prp_page: Option<u16>) -> Option<Cid> {
        self.begin_with(owner, prp_page, X::default())
    }

    /// As [`begin`](Self::begin), with the transport's `extra`.
    #[inline(always)]
    pub fn begin_with(&mut self, owner: Owner, prp_page: Option<u16>, extra: X) -> Option<Cid> {
        self.cids.alloc(Tracked { owner, prp_page, seen: None, extra })
    }

    /// The entry of an outstanding command; `None` when no command with
    /// that CID and generation is outstanding.
    #[inline]
    pub fn get_mut(&mut self, cid: Cid) -> Option<&mut Tracked<X>> {
        self.cids.get_mut(cid)
    }

    /// Ends a command whose completion names `cid` with status field
    /// `status` (a completion entry's, phase tag ignored): its entry, or an
    /// error when no command with that CID and generation is outstanding (a
    /// duplicate, a stale generation, a CID never handed out).
    #[inline]
    pub fn end(&mut self, cid: Cid, status: u16) -> Result<Tracked<X>, NotAllocated> {
        let t = *self.cids.free(cid)?;
        self.completed(cid, status);
        Ok(t)
    }

    /// Notes command `cid` as completed with status field `status`, when
    /// traced.
    #[inline(always)]
    fn completed(&mut self, cid: Cid, status: u16) {
        if let Some(t) = &mut self.trace {
            t.completed(self.cids.index(cid), cid, status);
        }
    }

    /// Takes back a command begun but never given to the device (not
    /// traced).
    pub fn undo(&mut self, cid: Cid) -> Result<Tracked<X>, NotAllocated> {
        self.cids.free(cid).map(std::mem::take)
    }

    /// Every outstanding command.
    pub fn outstanding_commands(&self) -> impl Iterator<Item = (Cid, &Tracked<X>)> + '_ {
        self.cids.outstanding_iter().map(|(c, _, t)| (c, t))
    }

    /// Outstanding commands first seen by a check more than `limit` ago;
    /// stamps those not seen before with `now`.
    pub fn late(&mut self, now: Instant, limit: Duration) -> Vec<(Cid, Owner)> {
        let mut late = Vec::new();
        for (cid, e) in self.cids.outstanding_iter_mut() {
            let seen = *e.seen.get_or_insert(now);
            if now.duration_since(seen) > limit {
                late.push((cid, e.owner));
            }
        }
        late
    }

    /// Forgets every outstanding command (after a reset or the queue's
    /// deletion, when no completion can come): the pages they held.
    pub fn forget_all(&mut self) -> Vec<u16> {
        let pages = self.outstanding_commands().filter_map(|(_, t)| t.prp_page).collect();
        self.cids.clear();
        pages
    }
}

impl<X> std::fmt::Debug for Tracker<X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker")
            .field("capacity", &self.cids.capacity())
            .field("outstanding", &self.cids.outstanding())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_from_begin_to_end() {
        let mut t: Tracker = Tracker::new(4);
        let a = t.begin(Owner::Sync(3), Some(7)).unwrap();
        let b = t.begin(Owner::Batch { ctx: 1, req: 2 }, None).unwrap();
        assert_eq!(t.outstanding(), 2);
        let e = t.end(a, 0).unwrap();
        assert_eq!((e.owner, e.prp_page), (Owner::Sync(3), Some(7)));
        assert!(t.end(a, 0).is_err(), "a duplicate completion ends nothing");
        assert_eq!(t.outstanding_commands().map(|(c, _)| c).collect::<Vec<_>>(), vec![b]);
    }

    #[test]
    fn a_reused_cid_is_not_ended_by_its_old_generation() {
        let mut t: Tracker = Tracker::new(1);
        let old = t.begin(Owner::Own(1), None).unwrap();
        t.end(old, 0).unwrap();
        let new = t.begin(Owner::Own(2), None).unwrap();
        assert_ne!(old, new);
        assert!(t.end(old, 0).is_err());
        assert_eq!(t.end(new, 0).unwrap().owner, Owner::Own(2));
    }

    #[test]
    fn full_when_every_cid_is_taken() {
        let mut t: Tracker = Tracker::new(2);
        t.begin(Owner::Own(0), None).unwrap();
        assert!(!t.is_full());
        t.begin(Owner::Own(1), None).unwrap();
        assert!(t.is_full());
        assert!(t.begin(Owner::Own(2), None).is_none());
    }

    #[test]
    fn late_counts_from_the_first_check() {
        let mut t: Tracker = Tracker::new(4);
        let a = t.begin(Owner::Own(0), None).unwrap();
        let t0 = Instant::now();
        assert!(t.late(t0, Duration::from_secs(1)).is_empty(), "stamped, not late");
        let b = t.begin(Owner::Own(1), None).unwrap();
        let later = t0 + Duration::from_secs(2);
        // a was stamped at t0 and is late; b is stamped now.
        assert_eq!(t.late(later, Duration::from_secs(1)), vec![(a, Owner::Own(0))]);
        assert_eq!(t.late(later + Duration::from_secs(2), Duration::from_secs(1)).len(), 2);
        t.end(a, 0).unwrap();
        assert_eq!(t.late(later + Duration::from_secs(2), Duration::from_secs(1)), vec![(b, Owner::Own(1))]);
    }

    #[test]
    fn the_transports_extra_lives_with_the_entry() {
        let mut t: Tracker<u32> = Tracker::new(2);
        let a = t.begin_with(Owner::Own(0), None, 7).unwrap();
        t.get_mut(a).unwrap().extra += 1;
        assert_eq!(t.end(a, 0).unwrap().extra, 8);
        assert!(t.get_mut(a).is_none(), "ended");
        let b = t.begin(Owner::Own(1), None).unwrap();
        assert_eq!(t.get_mut(b).unwrap().extra, 0, "a new entry starts from the default");
    }

    #[test]
    fn forgetting_returns_the_borrowed_pages() {
        let mut t: Tracker = Tracker::new(4);
        t.begin(Owner::Own(0), Some(1)).unwrap();
        t.begin(Owner::Own(1), None).unwrap();
        t.begin(Owner::Own(2), Some(3)).unwrap();
        let mut pages = t.forget_all();
        pages.sort();
        assert_eq!(pages, vec![1, 3]);
        assert_eq!(t.outstanding(), 0);
    }
}
