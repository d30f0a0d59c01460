//! A queue pair of any transport: a controller's (rings in memory,
//! doorbell registers), the kernel path's (an io_uring ring), or an
//! NVMe/TCP connection's. The engine
//! above (synchronous queues, batch contexts, lent queues) uses this type
//! and does not know which.

use super::qpair::{CqView, Full, NvmeQueue, Owner};
use super::rdma::RdmaIoQueue;
use super::stats::QueueCounters;
use super::tcp::TcpQueue;
use super::uring::UringQueue;
use std::time::Duration;
use ugds_nvme::prp::PrpPlan;
use ugds_nvme::{Cid, Cqe, Qid, Sqe};

/// A queue pair; see the module docs.
#[derive(Debug)]
#[non_exhaustive]
// Made once per queue pair and kept in its queue's state: a box would add a
// pointer chase to every command of one transport to save bytes.
#[allow(clippy::large_enum_variant)]
pub enum QueuePair {
    /// A controller's.
    Nvme(NvmeQueue),
    /// The kernel path's.
    Uring(UringQueue),
    /// An NVMe/TCP connection's.
    Tcp(TcpQueue),
    /// An NVMe/RDMA connection's.
    Rdma(RdmaIoQueue),
}

impl From<RdmaIoQueue> for QueuePair {
    fn from(q: RdmaIoQueue) -> QueuePair {
        QueuePair::Rdma(q)
    }
}

impl From<TcpQueue> for QueuePair {
    fn from(q: TcpQueue) -> QueuePair {
        QueuePair::Tcp(q)
    }
}

impl From<NvmeQueue> for QueuePair {
    fn from(q: NvmeQueue) -> QueuePair {
        QueuePair::Nvme(q)
    }
}

impl From<UringQueue> for QueuePair {
    fn from(q: UringQueue) -> QueuePair {
        QueuePair::Uring(q)
    }
}

impl QueuePair {
    /// Queue identifier.
    pub fn qid(&self) -> Qid {
        match self {
            QueuePair::Nvme(q) => q.qid(),
            QueuePair::Uring(q) => q.qid(),
            QueuePair::Tcp(q) => q.qid(),
            QueuePair::Rdma(q) => q.qid(),
        }
    }

    /// Entries per ring.
    pub fn entries(&self) -> u16 {
        match self {
            QueuePair::Nvme(q) => q.entries(),
            QueuePair::Uring(q) => q.entries(),
            QueuePair::Tcp(q) => q.entries(),
            QueuePair::Rdma(q) => q.entries(),
        }
    }

    /// The interrupt vector of its completions, when it has one.
    pub fn vector(&self) -> Option<u16> {
        match self {
            QueuePair::Nvme(q) => q.vector(),
            QueuePair::Uring(q) => q.vector(),
            QueuePair::Tcp(q) => q.vector(),
            QueuePair::Rdma(q) => q.vector(),
        }
    }

    /// Commands that may be submitted now without waiting for completions.
    #[inline]
    pub fn free_slots(&self) -> usize {
        match self {
            QueuePair::Nvme(q) => q.free_slots(),
            QueuePair::Uring(q) => q.free_slots(),
            QueuePair::Tcp(q) => q.free_slots(),
            QueuePair::Rdma(q) => q.free_slots(),
        }
    }

    /// Whether its completions report bytes not moved in DW0 (the kernel
    /// path: a read that met the end of the file).
    pub fn reports_short(&self) -> bool {
        matches!(self, QueuePair::Uring(_))
    }

    /// Size of the PRP-list page pool (the kernel path needs none: as many
    /// as it has command identifiers).
    pub fn prp_pool_size(&self) -> usize {
        match self {
            QueuePair::Nvme(q) => q.prp_pool_size(),
            QueuePair::Uring(q) => q.entries() as usize - 1,
            QueuePair::Tcp(q) => q.entries() as usize - 1,
            QueuePair::Rdma(q) => q.entries() as usize - 1,
        }
    }

    /// Commands submitted and not yet completed.
    #[inline]
    pub fn outstanding(&self) -> usize {
        match self {
            QueuePair::Nvme(q) => q.outstanding(),
            QueuePair::Uring(q) => q.outstanding(),
            QueuePair::Tcp(q) => q.outstanding(),
            QueuePair::Rdma(q) => q.outstanding(),
        }
    }

    /// Completions that named no command in flight (or, on a controller,
    /// an SQ head outside the ring).
    pub fn protocol_errors(&self) -> u64 {
        match self {
            QueuePair::Nvme(q) => q.protocol_errors(),
            QueuePair::Uring(q) => q.protocol_errors(),
            QueuePair::Tcp(q) => q.protocol_errors(),
            QueuePair::Rdma(q) => q.protocol_errors(),
        }
    }

    /// Every outstanding command of `owner`.
    pub fn outstanding_cids_of(&self, owner: Owner) -> Vec<Cid> {
        match self {
            QueuePair::Nvme(q) => q.outstanding_cids_of(owner),
            QueuePair::Uring(q) => {
                q.tracker_ref().outstanding_commands().filter(|(_, t)| t.owner == owner).map(|(c, _)| c).collect()
            }
            QueuePair::Tcp(q) => {
                q.tracker_ref().outstanding_commands().filter(|(_, t)| t.owner == owner).map(|(c, _)| c).collect()
            }
            QueuePair::Rdma(q) => {
                q.tracker_ref().outstanding_commands().filter(|(_, t)| t.owner == owner).map(|(c, _)| c).collect()
            }
        }
    }

    /// One outstanding command of `owner`, for error reports.
    pub fn outstanding_cid_of(&self, owner: Owner) -> Option<Cid> {
        match self {
            QueuePair::Nvme(q) => q.outstanding_cid_of(owner),
            QueuePair::Uring(q) => {
                q.tracker_ref().outstanding_commands().find(|(_, t)| t.owner == owner).map(|(c, _)| c)
            }
            QueuePair::Tcp(q) => q.tracker_ref().outstanding_commands().find(|(_, t)| t.owner == owner).map(|(c, _)| c),
            QueuePair::Rdma(q) => {
                q.tracker_ref().outstanding_commands().find(|(_, t)| t.owner == owner).map(|(c, _)| c)
            }
        }
    }

    /// Outstanding commands a timeout check first found more than `limit`
    /// ago, with their owners.
    pub fn late_commands(&mut self, limit: Duration) -> Vec<(Cid, Owner)> {
        match self {
            QueuePair::Nvme(q) => q.late_commands(limit),
            QueuePair::Uring(q) => Self::late_of(q.tracker(), limit),
            QueuePair::Tcp(q) => Self::late_of(q.tracker(), limit),
            QueuePair::Rdma(q) => Self::late_of(q.tracker(), limit),
        }
    }

    fn late_of<X: Copy + Default>(t: &mut super::tracker::Tracker<X>, limit: Duration) -> Vec<(Cid, Owner)> {
        if t.outstanding() == 0 {
            return Vec::new();
        }
        t.late(std::time::Instant::now(), limit)
    }

    /// Stages `sqe` with its data; not seen by the device (or the kernel)
    /// until [`ring_sq_doorbell`](Self::ring_sq_doorbell).
    #[inline]
    pub fn submit(&mut self, sqe: Sqe, data: Option<PrpPlan<'_>>, owner: Owner) -> Result<Cid, Full> {
        self.stage(sqe, data, owner)
    }

    /// Stages `sqe` with its data as an SGL (see
    /// [`NvmeQueue::submit_sgl`](super::qpair::NvmeQueue::submit_sgl)): only
    /// on a controller whose Identify says it takes SGLs, which the kernel
    /// path's never does.
    pub fn submit_sgl(&mut self, sqe: Sqe, pieces: &[ugds_nvme::sgl::Piece<'_>], owner: Owner) -> Result<Cid, Full> {
        match self {
            QueuePair::Nvme(q) => q.submit_sgl(sqe, pieces, owner),
            QueuePair::Uring(_) | QueuePair::Tcp(_) | QueuePair::Rdma(_) => {
                unreachable!("the kernel path and fabrics controllers report no SGL support")
            }
        }
    }

    /// As [`submit`](Self::submit), inlined into the caller: for a request
    /// path that stages one command per request (a lent queue's page-sized
    /// reads and writes), where the call and the plan passed through memory
    /// cost more than the staging.
    #[inline(always)]
    pub fn stage(&mut self, sqe: Sqe, data: Option<PrpPlan<'_>>, owner: Owner) -> Result<Cid, Full> {
        match self {
            QueuePair::Nvme(q) => q.stage(sqe, data, owner),
            _ => self.stage_copying(sqe, data, owner),
        }
    }

    /// [`stage`](Self::stage) on a transport that copies (the kernel path,
    /// NVMe/TCP): out of line, so that a controller's inlined path carries
    /// none of their code.
    #[inline(never)]
    fn stage_copying(&mut self, sqe: Sqe, data: Option<PrpPlan<'_>>, owner: Owner) -> Result<Cid, Full> {
        match self {
            QueuePair::Nvme(q) => q.stage(sqe, data, owner),
            QueuePair::Uring(q) => q.submit(sqe, data.map(first_address), owner),
            QueuePair::Tcp(q) => q.submit(sqe, data.map(first_address), owner),
            QueuePair::Rdma(q) => q.submit(sqe, data.map(first_address), owner),
        }
    }

    /// Traces the last `depth` commands from now on, timed from `base`
    /// (see [`super::trace`]).
    pub fn enable_trace(&mut self, depth: usize, base: std::time::Instant) {
        let latency = std::sync::Arc::new(super::trace::Histogram::default());
        let _ = self.counters().latency.set(latency.clone());
        match self {
            QueuePair::Nvme(q) => q.tracker_mut().enable_trace(depth, base, latency),
            QueuePair::Uring(q) => q.tracker().enable_trace(depth, base, latency),
            QueuePair::Tcp(q) => q.tracker().enable_trace(depth, base, latency),
            QueuePair::Rdma(q) => q.tracker().enable_trace(depth, base, latency),
        }
    }

    /// The traced commands; `None` when not traced.
    pub fn trace_events(&self) -> Option<Vec<super::trace::TraceEvent>> {
        match self {
            QueuePair::Nvme(q) => q.tracker().trace_events(),
            QueuePair::Uring(q) => q.tracker_ref().trace_events(),
            QueuePair::Tcp(q) => q.tracker_ref().trace_events(),
            QueuePair::Rdma(q) => q.tracker_ref().trace_events(),
        }
    }

    /// What this queue pair has done.
    pub fn counters(&self) -> &std::sync::Arc<QueueCounters> {
        match self {
            QueuePair::Nvme(q) => q.counters(),
            QueuePair::Uring(q) => q.counters(),
            QueuePair::Tcp(q) => q.counters(),
            QueuePair::Rdma(q) => q.counters(),
        }
    }

    /// Tells the device (or the kernel) about every entry staged since the
    /// last call.
    #[inline]
    pub fn ring_sq_doorbell(&mut self) {
        match self {
            QueuePair::Nvme(q) => q.ring_sq_doorbell(),
            QueuePair::Uring(q) => q.ring_sq_doorbell(),
            QueuePair::Tcp(q) => q.ring_sq_doorbell(),
            QueuePair::Rdma(q) => q.ring_sq_doorbell(),
        }
    }

    /// A lock-free view of the completion ring (see [`CqView`]).
    pub fn cq_view(&self) -> CqView {
        match self {
            QueuePair::Nvme(q) => q.cq_view(),
            QueuePair::Uring(q) => q.cq_view(),
            QueuePair::Tcp(q) => q.cq_view(),
            QueuePair::Rdma(q) => q.cq_view(),
        }
    }

    /// Where the next completion will appear: (head, expected phase); the
    /// kernel path's view does not read it.
    pub fn cq_cursor(&self) -> (u32, bool) {
        match self {
            QueuePair::Nvme(q) => q.cq_cursor(),
            QueuePair::Uring(_) | QueuePair::Tcp(_) | QueuePair::Rdma(_) => (0, false),
        }
    }

    /// Whether a new completion is waiting.
    #[inline]
    pub fn completion_pending(&mut self) -> bool {
        match self {
            QueuePair::Nvme(q) => q.completion_pending(),
            QueuePair::Uring(q) => q.completion_pending(),
            QueuePair::Tcp(q) => q.completion_pending(),
            QueuePair::Rdma(q) => q.completion_pending(),
        }
    }

    /// Consumes up to `max` completions, calling `f(owner, cqe)` for each.
    #[inline]
    pub fn process_completions(&mut self, max: usize, f: impl FnMut(Owner, &Cqe)) -> usize {
        match self {
            QueuePair::Nvme(q) => q.process_completions(max, f),
            QueuePair::Uring(q) => q.process_completions(max, f),
            QueuePair::Tcp(q) => q.process_completions(max, f),
            QueuePair::Rdma(q) => q.process_completions(max, f),
        }
    }

    /// Forgets every outstanding command: only when none can complete.
    pub fn forget_outstanding(&mut self) -> usize {
        match self {
            QueuePair::Nvme(q) => q.forget_outstanding(),
            QueuePair::Uring(q) => q.forget_outstanding(),
            QueuePair::Tcp(q) => q.forget_outstanding(),
            QueuePair::Rdma(q) => q.forget_outstanding(),
        }
    }

    /// Whether it uses shadow doorbells.
    #[cfg_attr(not(feature = "engine-internals"), allow(dead_code))]
    pub fn shadow_doorbells(&self) -> bool {
        matches!(self, QueuePair::Nvme(q) if q.shadow_doorbells())
    }
}

/// Where a command's data starts: its first PRP entry. The transports that
/// copy (the kernel path, NVMe/TCP) map memory so that a command's data is
/// contiguous from there.
#[inline(always)]
fn first_address(p: PrpPlan<'_>) -> u64 {
    match p {
        PrpPlan::One { prp1 } | PrpPlan::Two { prp1, .. } | PrpPlan::List { prp1, .. } => prp1,
    }
}
