//! The trait every transport's queue pair implements (a controller's, the
//! kernel path's, NVMe/TCP's, NVMe/RDMA's); [`super::queue::QueuePair`] is
//! the enum over them that the engine uses.

use super::cq_view::CqView;
use super::stats::QueueCounters;
use super::tracker::{Owner, Tracker};
use std::sync::Arc;
use std::time::Duration;
use ugds_nvme::{Cid, Cqe, Qid};

/// What a queue pair of every transport does: the calls [`QueuePair`]
/// forwards, each to the one implementation of its variant (a `match`, no
/// vtable: static dispatch). What a transport adds of its own (a
/// controller's SGLs, shadow doorbells, CQ cursor) stays on its type.
pub trait Transport {
    /// What the tracker keeps beside each command's owner (a copying
    /// transport's transfer).
    type Extra: Copy + Default;

    /// Queue identifier.
    fn qid(&self) -> Qid;
    /// Entries per ring.
    fn entries(&self) -> u16;
    /// The interrupt vector of its completions, when it has one.
    fn vector(&self) -> Option<u16>;
    /// Commands that may be submitted now without waiting for completions.
    fn free_slots(&self) -> usize;
    /// Completions that named no command in flight (or, on a controller,
    /// an SQ head outside the ring).
    fn protocol_errors(&self) -> u64;
    /// The command tracker (CIDs, owners, traces, deadlines).
    fn tracker(&self) -> &Tracker<Self::Extra>;
    /// The command tracker, to change.
    fn tracker_mut(&mut self) -> &mut Tracker<Self::Extra>;
    /// What this queue pair has done.
    fn counters(&self) -> &Arc<QueueCounters>;
    /// A lock-free view of the completion ring (see [`CqView`]).
    fn cq_view(&self) -> CqView;
    /// Whether a new completion is waiting.
    fn completion_pending(&mut self) -> bool;
    /// Consumes up to `max` completions, calling `f(owner, cqe)` for each.
    fn process_completions(&mut self, max: usize, f: impl FnMut(Owner, &Cqe)) -> usize;
    /// Tells the device (or the kernel, or the target) about every entry
    /// staged since the last call.
    fn ring_sq_doorbell(&mut self);
    /// Forgets every outstanding command: only when none can complete.
    fn forget_outstanding(&mut self) -> usize;

    /// Commands submitted and not yet completed.
    #[inline]
    fn outstanding(&self) -> usize {
        self.tracker().outstanding()
    }

    /// Size of the PRP-list page pool (a transport that copies needs none:
    /// as many as it has command identifiers).
    fn prp_pool_size(&self) -> usize {
        self.entries() as usize - 1
    }

    /// Every outstanding command of `owner`.
    fn outstanding_cids_of(&self, owner: Owner) -> Vec<Cid> {
        self.tracker().outstanding_commands().filter(|(_, t)| t.owner == owner).map(|(c, _)| c).collect()
    }

    /// One outstanding command of `owner`, for error reports.
    fn outstanding_cid_of(&self, owner: Owner) -> Option<Cid> {
        self.tracker().outstanding_commands().find(|(_, t)| t.owner == owner).map(|(c, _)| c)
    }

    /// Outstanding commands a timeout check first found more than `limit`
    /// ago, with their owners (see [`Tracker::late`]).
    fn late_commands(&mut self, limit: Duration) -> Vec<(Cid, Owner)> {
        if self.outstanding() == 0 {
            return Vec::new();
        }
        self.tracker_mut().late(std::time::Instant::now(), limit)
    }
}
