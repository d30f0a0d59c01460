//! Requests past their deadline: the escalation Linux's `nvme_timeout`
//! makes (a last look, CSTS, Abort, a grace period), and the wedge of the
//! handle when a command still does not come back.

use super::HandleInner;
use crate::engine::batch::BatchQueue;
use crate::engine::hold::Hold;
use crate::engine::sync::{Failure, SyncQueue};
use crate::registry::BufGuard;
use std::time::{Duration, Instant};
use ugds_nvme::{Cid, Sqe};
use ugds_platform::{Error, Result};

/// How long a timed-out request is given to complete after its Abort.
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// How [`HandleInner::escalate`] ended.
pub(crate) enum Escalation {
    /// The late commands came back (aborted, or completed after all).
    Settled,
    /// Some did not: why (a timeout, or a controller gone or fatal).
    Stuck(Error),
}

impl HandleInner {
    /// The end of a synchronous request. A late one is escalated as Linux's
    /// `nvme_timeout` does, after the queue's last look and the CSTS check:
    /// Abort each of its commands, and give the controller a moment to
    /// complete them. Only a request that still does not come back wedges
    /// the handle, with its buffer reference quarantined.
    pub fn finish(
        &self,
        q: &SyncQueue,
        r: std::result::Result<u64, Failure>,
        op: &'static str,
        guard: impl IntoIterator<Item = BufGuard>,
    ) -> Result<u64> {
        match r {
            Ok(short) => Ok(short),
            Err(Failure::Error(e)) => Err(e),
            Err(Failure::Stuck(e)) => {
                self.wedge(guard);
                Err(e)
            }
            Err(Failure::Late { error, slot }) => {
                let cids = q.outstanding_cids(slot);
                let mut res = None;
                match self.escalate(op, q.qid(), &cids, || {
                    res = q.settle_once(slot, op);
                    res.is_some()
                }) {
                    // It came back: aborted (an NVMe error, Command Abort
                    // Requested) or completed after all (then it succeeded).
                    Escalation::Settled => res.expect("settled"),
                    Escalation::Stuck(e) => {
                        self.wedge(guard);
                        Err(if matches!(e, Error::Timeout { .. }) { error } else { e })
                    }
                }
            }
        }
    }

    /// The one escalation of a request past its deadline, in the order of
    /// Linux's `nvme_timeout`, for synchronous requests, lent queues,
    /// batches and stream-ordered I/O alike: look at the queue once more
    /// (`settled` reaps it and says whether the late commands are all
    /// back), check CSTS (a controller that is gone or fatal will complete
    /// nothing), send Abort for each late command still on the device, and
    /// give the controller [`ABORT_GRACE`] to complete them. `Stuck`: some
    /// did not come back; the caller wedges the handle, keeping what they hold.
    pub fn escalate(&self, op: &'static str, qid: u16, cids: &[Cid], mut settled: impl FnMut() -> bool) -> Escalation {
        if settled() {
            return Escalation::Settled;
        }
        if let Some(c) = self.queues.counters_of(qid) {
            c.timeouts.add_shared(cids.len() as u64);
        }
        let csts = self.queues.ctrl.csts();
        if csts.is_gone() {
            return Escalation::Stuck(Error::DeviceGone);
        }
        if csts.cfs() {
            return Escalation::Stuck(Error::ControllerFatal);
        }
        for &cid in cids {
            match self.queues.ctrl.admin_command(Sqe::abort(Cid(0), ugds_nvme::Qid(qid), cid), "Abort") {
                Ok(c) if c.dw0 & 1 == 0 => tracing::warn!(qid, cid = cid.0, "{op}: aborted"),
                Ok(_) => tracing::warn!(qid, cid = cid.0, "{op}: the controller did not abort it"),
                Err(e) => tracing::warn!(qid, cid = cid.0, "{op}: Abort failed: {e}"),
            }
        }
        let deadline = Instant::now() + ABORT_GRACE;
        loop {
            if settled() {
                return Escalation::Settled;
            }
            if Instant::now() > deadline {
                tracing::error!(qid, "{op} did not complete after Abort; wedging the handle");
                return Escalation::Stuck(Error::Timeout { qid, cid: cids.first().copied(), after: self.opts.timeout });
            }
            std::thread::yield_now();
        }
    }

    /// The late requests of a batch context (or a stream engine's, or a
    /// shared IoQueue's) through [`escalate`](Self::escalate): `Settled`
    /// leaves nothing to do (aborted requests come back as events with
    /// their status); otherwise the late ones are reported timed out and
    /// their holds returned, for the caller to wedge the handle with.
    pub fn expire_batch(&self, q: &BatchQueue, ctx: u32) -> Vec<Hold> {
        let late = q.late(ctx);
        if late.is_empty() {
            return Vec::new();
        }
        let cids: Vec<Cid> = late.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        let settled = || {
            q.reap_now();
            late.iter().all(|&(r, _)| !q.in_flight(ctx, r))
        };
        match self.escalate("batch I/O", q.qid(), &cids, settled) {
            Escalation::Settled => Vec::new(),
            Escalation::Stuck(_) => q.expire(ctx),
        }
    }
}
