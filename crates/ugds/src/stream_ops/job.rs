//! A stream operation between its enqueue and its completion, as the
//! stream engine runs it: its requests with their values bound, where their
//! results go, its staging blocks, and the handle it keeps alive.

use crate::engine::batch::Prepared;
use crate::gpu::StageLease;
use crate::handle::{HandleInner, Priority};
use crate::mode::{Mode, ModeRequest, Plan};
use crate::registry::{BufGuard, BufferToken};
use crate::stream::io::Sink;
use crate::stream::{StreamCounters, StreamSignal};
use std::sync::Arc;
use ugds_platform::Error;

/// What a stream's service decided for one operation.
#[derive(Clone, Debug)]
pub(super) struct JobService {
    pub(super) class: Priority,
    /// The engine may nap while only such operations are in flight.
    pub(super) naps: bool,
    /// Tell the mode the operation's time.
    pub(super) observe: Option<Box<Observe>>,
}

/// A mode to tell an operation's time, with what it was told at enqueue.
type Observe = (Arc<dyn Mode>, ModeRequest, Plan);

impl Default for JobService {
    fn default() -> Self {
        JobService { class: Priority::Normal, naps: false, observe: None }
    }
}

/// Which requests of a job are done, and how many of the first are: the
/// pieces the stream may copy out.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) done: Vec<bool>,
    pub(super) first: usize,
}

impl Progress {
    pub(super) fn new(n: usize) -> Progress {
        Progress { done: vec![false; n], first: 0 }
    }

    /// Request `i` is done: the count of the first requests all done, if
    /// it grew.
    pub(super) fn complete(&mut self, i: usize) -> Option<usize> {
        *self.done.get_mut(i)? = true;
        let before = self.first;
        while self.done.get(self.first) == Some(&true) {
            self.first += 1;
        }
        (self.first > before).then_some(self.first)
    }
}

/// A stream operation's requests with their values bound.
#[derive(Default)]
pub(super) struct Bound {
    pub(super) reqs: Vec<Prepared>,
    pub(super) sinks: Vec<Option<Sink>>,
    /// Whether each request (as `sinks`) is a write, for the counters.
    pub(super) writes: Vec<bool>,
    /// The stream's counters, if it keeps them.
    pub(super) counters: Option<Arc<StreamCounters>>,
    /// What the stream's service decided for the operation.
    pub(super) service: JobService,
    /// The caller's buffers of staged requests, held until the I/O is done.
    pub(super) holds: Vec<BufGuard>,
    pub(super) stages: Vec<(StageLease, BufferToken)>,
    /// For each request (as `sinks`) read through a staging block: the
    /// block (in `stages`), the piece and its length, for the copy to be
    /// cut to what the I/O moved.
    pub(super) cuts: Vec<Option<(usize, usize, usize)>>,
    /// A read copied out in pieces (its requests, in order).
    pub(super) progress: Option<Progress>,
}

/// A stream operation handed to the engine.
pub(super) struct Job {
    pub(super) bound: Bound,
    pub(super) signal: StreamSignal,
    pub(super) handle: HandleRef,
    /// A request timed out: the controller may still reach its memory.
    pub(super) timed_out: bool,
    /// A request failed (the mode is not told the operation's time).
    pub(super) failed: bool,
    /// When it went to the device (timed when its mode asks).
    pub(super) issued: Option<std::time::Instant>,
}

impl Job {
    /// Ends every request of a job that never reached the device with `e`.
    pub(super) fn fail_all(&mut self, e: Error) {
        for i in 0..self.bound.sinks.len() {
            self.cut(i, 0);
        }
        for (i, s) in self.bound.sinks.iter_mut().enumerate() {
            if let Some(s) = s.take() {
                if let Some(c) = &self.bound.counters {
                    c.ended(self.bound.writes[i], &Err(e.clone()));
                }
                s.write(Err(e.clone()));
            }
        }
    }
    /// Request `i` moved `moved` bytes: where it read into a staging block,
    /// the stream copies no more than that out (never bytes of an earlier
    /// use of the block).
    pub(super) fn cut(&mut self, i: usize, moved: usize) {
        if let Some(&Some((stage, piece, len))) = self.bound.cuts.get(i) {
            if moved < len {
                self.bound.stages[stage].0.cut_piece(piece, moved);
            }
        }
    }

    /// Once the I/O is done: gives the staging blocks back (they stay
    /// registered with the handle, for its next operations). After a
    /// timeout they stay out of use: the command may still reach them.
    pub(super) fn release_stages(&mut self) {
        self.bound.holds.clear();
        for (lease, _) in self.bound.stages.drain(..) {
            if self.timed_out {
                tracing::warn!("a staging block is kept out of use: a command on it timed out");
                std::mem::forget(lease);
            } else {
                lease.give_back();
            }
        }
    }
}

/// An in-flight reference on a handle that keeps it alive.
pub(super) struct HandleRef(pub(super) Arc<HandleInner>, pub(super) usize);

impl HandleRef {
    /// Counts an operation in flight on `h` until this is dropped.
    pub(super) fn new(h: &Arc<HandleInner>) -> HandleRef {
        HandleRef(h.clone(), h.life.inflight.add())
    }
}

impl Drop for HandleRef {
    fn drop(&mut self) {
        self.0.life.inflight.sub(self.1);
    }
}
