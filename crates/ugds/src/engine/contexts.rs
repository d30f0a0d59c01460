//! What batch contexts keep: their requests, their finished events and
//! their counts ([`BatchTable`]), in the queue pair's state so that whoever
//! reaps a completion credits it ([`BatchTable::credit`]). The batch queue
//! ([`super::batch`]) fills them; the synchronous queue's reaper
//! ([`super::sync`]) credits them.

use super::hold::Hold;
use super::requests::RequestTable;
use std::collections::VecDeque;
use ugds_nvme::{NvmOpcode, Status};
use ugds_platform::{Error, Result};

/// How a batch request ended (cuFile's `CUfileStatus_t`, less the states a
/// finished event cannot have).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchStatus {
    /// Every command completed successfully.
    Complete,
    /// A command completed with an error status.
    Failed,
    /// Canceled before it reached the device, or aborted by it.
    Canceled,
    /// The device did not complete it in time (the handle is now wedged).
    Timeout,
}

impl BatchStatus {
    /// "complete", "failed", "canceled" or "timeout".
    pub fn name(self) -> &'static str {
        match self {
            BatchStatus::Complete => "complete",
            BatchStatus::Failed => "failed",
            BatchStatus::Canceled => "canceled",
            BatchStatus::Timeout => "timeout",
        }
    }
}

/// A finished batch request.
#[derive(Debug)]
pub struct BatchEvent {
    /// The caller's cookie.
    pub cookie: u64,
    /// How it ended.
    pub status: BatchStatus,
    /// Bytes moved, or why not.
    pub result: Result<usize>,
}

pub(super) struct Req {
    pub(super) cookie: u64,
    pub(super) pending: u32,
    pub(super) len: usize,
    /// Bytes not moved (a read that met the end of a kernel-path file).
    pub(super) short: usize,
    pub(super) status: Option<u16>,
    pub(super) op: NvmOpcode,
    pub(super) hold: Option<Hold>,
}

/// What one batch context's requests have done ([`Batch::stats`](crate::Batch::stats)).
/// Counted under the queue pair's lock as requests are submitted and end;
/// `in_flight` is `submitted - ended`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestStats {
    /// Requests submitted.
    pub submitted: u64,
    /// Requests that ended, whatever their status (their events are ready).
    pub ended: u64,
    /// Requests submitted and not yet ended.
    pub in_flight: u64,
    /// Bytes the requests that succeeded read.
    pub bytes_read: u64,
    /// Bytes the requests that succeeded wrote.
    pub bytes_written: u64,
    /// Requests that failed with an error status (aborted ones apart).
    pub errors: u64,
    /// Requests aborted at the context's cancellation.
    pub canceled: u64,
    /// Requests reported timed out.
    pub timeouts: u64,
}

pub(super) struct Ctx {
    /// What its requests have done.
    pub(super) stats: RequestStats,
    pub(super) reqs: RequestTable<Req>,
    /// Scratch for one submission's request slots (no allocation on submit).
    pub(super) slots: Vec<u32>,
    pub(super) done: VecDeque<BatchEvent>,
    /// Requests submitted whose event is not yet in `done`.
    pub(super) inflight: usize,
    pub(super) canceled: bool,
}

/// The batch contexts of a queue pair, kept in the queue pair's state so
/// that whoever reaps its completions credits them.
#[derive(Default)]
pub(crate) struct BatchTable {
    pub(super) ctxs: Vec<Option<Ctx>>,
}

impl BatchTable {
    /// Credits one completion to request `ri` of context `ci`; `short`
    /// bytes of it were not moved.
    pub(crate) fn credit(&mut self, ci: u32, ri: u32, cqe: &ugds_nvme::Cqe, short: u32) {
        let (ci, ri) = (ci as usize, ri as usize);
        let Some(Some(c)) = self.ctxs.get_mut(ci) else { return };
        let r = &mut c.reqs[ri as u32];
        if r.pending == 0 {
            return; // timed out and reported already; the late completion is dropped
        }
        if !cqe.status().is_success() && r.status.is_none() {
            r.status = Some(cqe.status);
        }
        r.short += short as usize;
        r.pending -= 1;
        if r.pending == 0 {
            r.hold = None;
            let op = if r.op == NvmOpcode::Read { "Read" } else { "Write" };
            let s = &mut c.stats;
            s.ended += 1;
            let event = match r.status {
                None => {
                    let moved = r.len.saturating_sub(r.short);
                    match r.op {
                        NvmOpcode::Read => s.bytes_read += moved as u64,
                        _ => s.bytes_written += moved as u64,
                    }
                    BatchEvent { cookie: r.cookie, status: BatchStatus::Complete, result: Ok(moved) }
                }
                Some(f) => {
                    let status = Status::from_field(f);
                    let aborted = status.sct == 0 && status.sc == ugds_nvme::status::generic::ABORT_REQUESTED;
                    if aborted {
                        s.canceled += 1;
                    } else {
                        s.errors += 1;
                    }
                    BatchEvent {
                        cookie: r.cookie,
                        status: if aborted { BatchStatus::Canceled } else { BatchStatus::Failed },
                        result: Err(Error::Nvme { op, status }),
                    }
                }
            };
            c.done.push_back(event);
            c.reqs.release(ri as u32);
            c.inflight -= 1;
        }
    }
}
