//! A queue pair of any transport: a controller's (rings in memory,
//! doorbell registers), the kernel path's (an io_uring ring), or an
//! NVMe/TCP connection's. The engine
//! above (synchronous queues, batch contexts, lent queues) uses this type
//! and does not know which.

use super::qpair::{CqView, Full, NvmeQueue, Owner};
use super::rdma::RdmaIoQueue;
use super::stats::QueueCounters;
use super::tcp::TcpQueue;
use super::transport::Transport;
use super::uring::UringQueue;
use std::sync::Arc;
use std::time::Duration;
use ugds_nvme::prp::PrpPlan;
use ugds_nvme::{Cid, Cqe, Qid, Sqe};

/// The one `match` over the transports: `$q` bound to the variant's queue.
macro_rules! each {
    ($self:expr, $q:ident => $e:expr) => {
        match $self {
            QueuePair::Nvme($q) => $e,
            QueuePair::Uring($q) => $e,
            QueuePair::Tcp($q) => $e,
            QueuePair::Rdma($q) => $e,
        }
    };
}

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
        each!(self, q => q.qid())
    }

    /// Entries per ring.
    pub fn entries(&self) -> u16 {
        each!(self, q => q.entries())
    }

    /// The interrupt vector of its completions, when it has one.
    pub fn vector(&self) -> Option<u16> {
        each!(self, q => q.vector())
    }

    /// Commands that may be submitted now without waiting for completions.
    #[inline]
    pub fn free_slots(&self) -> usize {
        each!(self, q => q.free_slots())
    }

    /// Whether its completions report bytes not moved in DW0 (the kernel
    /// path: a read that met the end of the file).
    pub fn reports_short(&self) -> bool {
        matches!(self, QueuePair::Uring(_))
    }

    /// Size of the PRP-list page pool.
    pub fn prp_pool_size(&self) -> usize {
        each!(self, q => q.prp_pool_size())
    }

    /// Commands submitted and not yet completed.
    #[inline]
    pub fn outstanding(&self) -> usize {
        each!(self, q => q.outstanding())
    }

    /// Completions that named no command in flight (or, on a controller,
    /// an SQ head outside the ring).
    pub fn protocol_errors(&self) -> u64 {
        each!(self, q => q.protocol_errors())
    }

    /// Every outstanding command of `owner`.
    pub fn outstanding_cids_of(&self, owner: Owner) -> Vec<Cid> {
        each!(self, q => q.outstanding_cids_of(owner))
    }

    /// One outstanding command of `owner`, for error reports.
    pub fn outstanding_cid_of(&self, owner: Owner) -> Option<Cid> {
        each!(self, q => q.outstanding_cid_of(owner))
    }

    /// Outstanding commands a timeout check first found more than `limit`
    /// ago, with their owners.
    pub fn late_commands(&mut self, limit: Duration) -> Vec<(Cid, Owner)> {
        each!(self, q => q.late_commands(limit))
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
    /// NVMe/TCP, NVMe/RDMA): out of line, so that a controller's inlined
    /// path carries none of their code.
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
        let latency = Arc::new(super::trace::Histogram::default());
        let _ = self.counters().latency.set(latency.clone());
        each!(self, q => q.tracker_mut().enable_trace(depth, base, latency))
    }

    /// The traced commands; `None` when not traced.
    pub fn trace_events(&self) -> Option<Vec<super::trace::TraceEvent>> {
        each!(self, q => q.tracker().trace_events())
    }

    /// What this queue pair has done.
    pub fn counters(&self) -> &Arc<QueueCounters> {
        each!(self, q => q.counters())
    }

    /// Tells the device (or the kernel) about every entry staged since the
    /// last call.
    #[inline]
    pub fn ring_sq_doorbell(&mut self) {
        each!(self, q => q.ring_sq_doorbell())
    }

    /// A lock-free view of the completion ring (see [`CqView`]).
    pub fn cq_view(&self) -> CqView {
        each!(self, q => q.cq_view())
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
        each!(self, q => q.completion_pending())
    }

    /// Consumes up to `max` completions, calling `f(owner, cqe)` for each.
    #[inline]
    pub fn process_completions(&mut self, max: usize, f: impl FnMut(Owner, &Cqe)) -> usize {
        each!(self, q => q.process_completions(max, f))
    }

    /// Forgets every outstanding command: only when none can complete.
    pub fn forget_outstanding(&mut self) -> usize {
        each!(self, q => q.forget_outstanding())
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
