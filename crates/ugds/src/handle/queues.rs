//! A handle's queue pairs: how the controller's I/O queues are split
//! between synchronous, batch and lendable use, made at open, counted,
//! traced, and deleted at close.

use super::{HandleOptions, QueueInfo, QueueLatency, QueueRole, QueueStats, QueueTrace};
use crate::engine::batch::BatchQueue;
use crate::engine::stats::QueueCounters;
use crate::engine::sync::SyncQueue;
use crate::engine::trace::TraceEvent;
use crate::engine::{Completion, Controller, QueuePair};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// The controller and its I/O queue pairs. Their memory is the device's
/// to reach until the controller is stopped ([`Queues::released`]); only
/// then are they dropped, and never while a stuck command may still use
/// them (a wedged handle dropped without a forced teardown leaks them).
pub(crate) struct Queues {
    pub ctrl: ManuallyDrop<Controller>,
    /// The synchronous pool.
    pub sync: ManuallyDrop<Box<[Arc<SyncQueue>]>>,
    /// Where the synchronous queues without a vector start, when the mode
    /// both polls and sleeps: requests planned to poll go to them, the
    /// others to the queues before.
    pub polled_from: Option<usize>,
    /// The lendable queue pairs not lent out.
    pool: ManuallyDrop<Mutex<Vec<QueuePair>>>,
    /// How many queue pairs are lendable.
    pub lendable: usize,
    /// The batch queues; the first also carries stream-ordered I/O (and is
    /// the synchronous queue when the controller granted one).
    batch: ManuallyDrop<Vec<Arc<BatchQueue>>>,
    /// Each queue pair's id, role and vector.
    pub info: Vec<QueueInfo>,
    /// Each queue's counters, in the order of `info`.
    pub counters: Vec<Arc<QueueCounters>>,
    /// Set once the controller can no longer reach the queues' memory.
    released: AtomicBool,
}

impl Queues {
    /// Creates the queue pairs `opts` asks for, within what the controller
    /// granted: the synchronous pool, then the batch queues, then the
    /// lendable ones. On failure, deletes what it made and shuts the
    /// controller down.
    pub fn open(ctrl: Controller, opts: &HandleOptions, nsid: u32) -> Result<Queues> {
        let info = ctrl.info().clone();
        // Traces count from the handle's opening.
        let opened = Instant::now();
        let granted = info.io_queues.max(1);
        // Batch queues of their own while one is left for synchronous I/O.
        let nbatch = if granted >= 2 { opts.batch_queues_wanted().min(granted - 1) } else { 0 };
        let avail = granted - nbatch;
        // A mode that both polls and sleeps gets synchronous queues of each
        // kind (where the controller grants them): a queue with a vector
        // interrupts on every completion, polled or not, which costs the
        // CPU the polling was for (as Linux keeps poll queues apart).
        let split = opts.split_sync();
        // Synchronous queues beyond 4 (one per CPU by default) make room
        // for the lendable queues asked for when the grant holds too few
        // for both; the first 4 do not.
        let want = opts.sync_queues.max(1);
        let nsleep = want.min(want.min(4).max(avail.saturating_sub(opts.async_queues))).clamp(1, avail);
        let npoll = if split { nsleep.min(avail - nsleep) } else { 0 };
        let nsync = nsleep + npoll;
        let nasync = opts.async_queues.min(avail - nsync);
        let platform = ctrl.platform().clone();
        let vectors = platform.interrupt_vectors();
        // Vector 0 is the admin queue's; queue `qid` gets vector `qid`
        // while there are enough. Beyond that synchronous queues share
        // vectors 1.. round robin (vector 0 when it is the only one), as
        // Linux shares them; a lendable queue without a vector of its own
        // polls (its owner waits alone, it cannot share).
        // A mode that may sleep on interrupts needs them on the synchronous queues.
        let mode_sleeps = opts.mode.as_ref().is_some_and(|m| m.interrupts());
        let completion_of = |lent: bool| if mode_sleeps && !lent { Completion::Interrupt } else { opts.completion };
        let vector_for = |qid: u16, lent: bool| match completion_of(lent) {
            Completion::Interrupt if qid < vectors => Some(qid),
            Completion::Interrupt if vectors == 0 => {
                tracing::warn!(qid, "the platform has no interrupt vectors; the queue polls");
                None
            }
            Completion::Interrupt if lent => {
                tracing::info!(qid, "no interrupt vector left for this lendable queue; it polls");
                None
            }
            Completion::Interrupt => Some(if vectors > 1 { 1 + (qid - 1) % (vectors - 1) } else { 0 }),
            Completion::Poll => None,
        };
        // One queue pair for everything: deep enough for batches too.
        let shared_batch = opts.batch_queue && nbatch == 0;
        let mut created: Vec<QueuePair> = Vec::new();
        let depth = if shared_batch { opts.queue_depth.max(opts.batch_depth) } else { opts.queue_depth }.max(2);
        // Queue ids: the synchronous pool, then the batch queues, then the
        // lendable ones. Batch queues always poll (as in the paper).
        let is_batch = |qid: u16| qid > nsync && qid <= nsync + nbatch;
        let mut slowest = (0u16, std::time::Duration::ZERO);
        for qid in 1..=nsync + nbatch + nasync {
            let started = Instant::now();
            let made = if is_batch(qid) {
                ctrl.create_io_qpair_with(qid, opts.batch_depth.max(2), None, opts.batch_prp_pages)
            } else {
                let polled = qid > nsleep && qid <= nsync;
                ctrl.create_io_qpair(qid, depth, if polled { None } else { vector_for(qid, qid > nsync) })
            };
            let took = started.elapsed();
            if took > slowest.1 {
                slowest = (qid, took);
            }
            match made {
                Ok(qp) => created.push(qp),
                Err(e) => {
                    for qp in &created {
                        let _ = ctrl.delete_io_qpair(qp);
                    }
                    let _ = ctrl.shutdown();
                    return Err(e);
                }
            }
        }
        tracing::debug!(
            queues = created.len(),
            took_us = opened.elapsed().as_micros() as u64,
            slowest_qid = slowest.0,
            slowest_us = slowest.1.as_micros() as u64,
            "I/O queue pairs created"
        );
        if opts.trace > 0 {
            for qp in &mut created {
                qp.enable_trace(opts.trace, opened);
            }
        }
        let mut queues: Vec<QueueInfo> = created
            .iter()
            .map(|qp| {
                let qid = qp.qid().0;
                let role = match qid {
                    q if q <= nsync => QueueRole::Sync,
                    q if is_batch(q) => QueueRole::Batch,
                    _ => QueueRole::Lendable,
                };
                QueueInfo { qid, role, vector: qp.vector(), entries: qp.entries(), vector_shared_with: 0 }
            })
            .collect();
        let counters: Vec<Arc<QueueCounters>> = created.iter().map(|qp| qp.counters().clone()).collect();
        for i in 0..queues.len() {
            let v = queues[i].vector;
            if v.is_some() {
                queues[i].vector_shared_with = queues.iter().filter(|o| o.vector == v).count() as u16 - 1;
            }
        }
        let mut rest: Vec<QueuePair> = created.split_off(nsync as usize);
        let pool = rest.split_off(nbatch as usize);
        let mut sync: Vec<Arc<SyncQueue>> = Vec::with_capacity(created.len());
        let mut unwrapped = created.into_iter();
        for qp in unwrapped.by_ref() {
            match SyncQueue::new(qp, platform.clone()) {
                Ok(q) => sync.push(Arc::new(q)),
                Err(e) => {
                    // No I/O was issued: delete what was created and stop.
                    for q in &sync {
                        q.with_qp(|qp| ctrl.delete_io_qpair(qp)).ok();
                    }
                    for qp in unwrapped.chain(rest).chain(pool) {
                        ctrl.delete_io_qpair(&qp).ok();
                    }
                    let _ = ctrl.shutdown();
                    return Err(e);
                }
            }
        }
        for q in &sync {
            let siblings: Box<[_]> = sync
                .iter()
                .filter(|o| !Arc::ptr_eq(o, q) && o.vector().is_some() && o.vector() == q.vector())
                .map(Arc::downgrade)
                .collect();
            if !siblings.is_empty() {
                q.set_siblings(siblings);
            }
        }
        let sync: Box<[Arc<SyncQueue>]> = sync.into();
        let mut batch: Vec<(Arc<SyncQueue>, bool)> = rest
            .into_iter()
            .map(|qp| {
                let q = SyncQueue::new(qp, platform.clone()).expect("a queue without a vector needs no eventfd");
                (Arc::new(q), false)
            })
            .collect();
        if batch.is_empty() && shared_batch {
            tracing::info!("one I/O queue pair: batch and stream-ordered I/O share it with synchronous I/O");
            batch.push((sync[0].clone(), true));
        }
        let batch: Vec<Arc<BatchQueue>> =
            batch.into_iter().map(|(q, shared)| Arc::new(BatchQueue::new(q, shared, nsid, opts.timeout))).collect();
        Ok(Queues {
            ctrl: ManuallyDrop::new(ctrl),
            sync: ManuallyDrop::new(sync),
            polled_from: (npoll > 0).then_some(nsleep as usize),
            lendable: pool.len(),
            pool: ManuallyDrop::new(Mutex::new(pool)),
            batch: ManuallyDrop::new(batch),
            info: queues,
            counters,
            released: AtomicBool::new(false),
        })
    }

    /// The (first) batch queue, or why there is none.
    pub fn batch_queue(&self) -> Result<&BatchQueue> {
        self.batch.first().map(|b| &**b).ok_or_else(|| {
            Error::Unsupported(format!(
                "no batch queue: batch_queue is off in this handle's options (the controller granted {} I/O queue pair(s))",
                self.ctrl.info().io_queues
            ))
        })
    }

    /// The first batch queue, shared (for the stream engine).
    pub fn first_batch(&self) -> Option<&Arc<BatchQueue>> {
        self.batch.first()
    }

    /// How many batch queues there are.
    pub fn batch_queues(&self) -> usize {
        self.batch.len()
    }

    /// The batch queues that are queue pairs of their own (not the
    /// synchronous one shared).
    pub fn batch_queues_own(&self) -> impl Iterator<Item = &BatchQueue> {
        self.batch.iter().filter(|b| !b.is_shared()).map(|b| &**b)
    }

    /// Batch queue `i` (see [`open_batch_context`](Self::open_batch_context)).
    pub fn batch_queue_at(&self, i: usize) -> &BatchQueue {
        &self.batch[i]
    }

    /// Opens a batch context of `capacity` requests on the batch queue with
    /// the fewest contexts (the first on a tie: the stream engine's context
    /// counts). Returns the queue's index and the context.
    pub fn open_batch_context(&self, capacity: usize) -> Result<(usize, u32)> {
        self.batch_queue()?;
        let i = (0..self.batch.len()).min_by_key(|&i| self.batch[i].contexts()).expect("at least one");
        Ok((i, self.batch[i].open_context(capacity)))
    }

    pub fn take_lendable(&self) -> Option<QueuePair> {
        self.pool.lock().recover().pop()
    }

    pub fn return_lendable(&self, qp: QueuePair) {
        self.pool.lock().recover().push(qp);
    }

    /// The counters of I/O queue `qid`.
    pub fn counters_of(&self, qid: u16) -> Option<&Arc<QueueCounters>> {
        self.info.iter().position(|q| q.qid == qid).map(|i| &self.counters[i])
    }

    /// What each I/O queue pair has done.
    pub fn stats(&self, block_size: u64) -> Vec<QueueStats> {
        crate::publish::queue_stats(&self.info, &self.counters, block_size)
    }

    /// Each traced queue pair's latencies (none when not traced).
    pub fn latency(&self) -> Vec<QueueLatency> {
        let with = |(q, c): (&QueueInfo, &Arc<QueueCounters>)| {
            let h = c.latency.get()?;
            Some(QueueLatency { qid: q.qid, role: q.role, latency: h.snapshot() })
        };
        self.info.iter().zip(&self.counters).filter_map(with).collect()
    }

    /// The traces of the queue pairs that can be looked at now: the
    /// synchronous and batch queues (`wait`: waiting for their locks, else
    /// skipping those held) and the lendable ones not lent out.
    pub fn trace(&self, wait: bool) -> Vec<QueueTrace> {
        let role_of = |qid: u16| self.info.iter().find(|q| q.qid == qid).map_or(QueueRole::Sync, |q| q.role);
        let look = |q: &SyncQueue| {
            let f = |qp: &mut QueuePair| (qp.qid().0, qp.trace_events());
            if wait {
                Some(q.with_qp(f))
            } else {
                q.try_with_qp(f)
            }
        };
        let batch: Vec<Arc<SyncQueue>> = self.batch_queues_own().map(|b| b.queue().clone()).collect();
        let mut out: Vec<(u16, Option<Vec<TraceEvent>>)> =
            self.sync.iter().chain(&batch).filter_map(|q| look(q)).collect();
        if let Ok(pool) = self.pool.try_lock() {
            out.extend(pool.iter().map(|qp| (qp.qid().0, qp.trace_events())));
        }
        out.sort_by_key(|(qid, _)| *qid);
        out.into_iter()
            .filter_map(|(qid, events)| Some(QueueTrace { qid, role: role_of(qid), events: events? }))
            .collect()
    }

    /// Deletes every I/O queue pair (nothing in flight), then shuts the
    /// controller down; disables it where that does not go cleanly. An
    /// error: the controller did not confirm it stopped (nothing is
    /// released).
    pub fn delete_and_stop(&self) -> Result<()> {
        let mut clean = true;
        for q in self.sync.iter() {
            clean &= q.with_qp(|qp| self.ctrl.delete_io_qpair(qp)).is_ok();
        }
        for qp in self.pool.lock().recover().iter() {
            clean &= self.ctrl.delete_io_qpair(qp).is_ok();
        }
        for b in self.batch_queues_own() {
            clean &= self.ctrl.delete_io_qpair(&b.lock().qp).is_ok();
        }
        let down = if clean { self.ctrl.shutdown() } else { self.ctrl.disable() };
        down.or_else(|_| self.ctrl.disable())?;
        self.released.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Disables the controller (CC.EN = 0, CSTS.RDY = 0: it has stopped
    /// and dropped every queue) and forgets what was outstanding: nothing
    /// it held can be written any more.
    pub fn disable_and_forget(&self) -> Result<()> {
        self.ctrl.disable()?;
        for q in self.sync.iter() {
            q.with_qp(|qp| qp.forget_outstanding());
        }
        for b in self.batch.iter() {
            b.forget_outstanding();
        }
        self.released.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Whether the controller can no longer reach the queues' memory.
    pub fn released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        if self.released() {
            // SAFETY: each field is dropped exactly once, here, and never
            // used after; the controller can no longer reach their memory.
            unsafe {
                ManuallyDrop::drop(&mut self.sync);
                ManuallyDrop::drop(&mut self.pool);
                ManuallyDrop::drop(&mut self.batch);
                ManuallyDrop::drop(&mut self.ctrl);
            }
        }
        // Otherwise the queues, their DMA memory and the controller are
        // leaked on purpose (the handle says why).
    }
}
