//! The stream engine: the per-handle thread that puts stream operations'
//! requests on the batch queue, writes their results and sets their
//! signals.

use super::job::Job;
use crate::engine::batch::BatchQueue;
use crate::engine::BatchEvent;
use crate::handle::{HandleInner, Priority, QueueService};
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

enum Msg {
    Job(Box<Job>),
    Stop,
}

/// How long an idle engine polls for the next operation before it sleeps.
const IDLE_SPIN: Duration = Duration::from_micros(200);

/// Requests the engine keeps on the device at once.
const ENGINE_CAPACITY: usize = 1024;

/// How long the engine sleeps between looks at the device while only
/// operations whose streams' modes sleep are in flight.
const NAP: Duration = Duration::from_micros(50);

/// The per-handle thread that runs stream operations' I/O.
pub(crate) struct StreamEngine {
    tx: Mutex<Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
}

impl StreamEngine {
    fn start(queue: Arc<BatchQueue>, handle: Weak<HandleInner>) -> Result<StreamEngine> {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ugds-stream".into())
            .spawn(move || Engine::new(queue, handle, rx).run())
            .map_err(|e| Error::io("spawn stream engine", e))?;
        Ok(StreamEngine { tx: Mutex::new(tx), thread: Some(thread) })
    }

    fn send(&self, job: Job) -> Result<()> {
        self.tx.lock().recover().send(Msg::Job(Box::new(job))).map_err(|_| Error::Closed)
    }

    /// Stops the thread. When the engine itself drops the last reference
    /// to its handle, it is told to stop and not waited for (it exits right
    /// after).
    fn halt(&mut self) {
        let _ = self.tx.lock().recover().send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl QueueService for StreamEngine {
    fn stop(&mut self) {
        self.halt();
    }
}

impl Drop for StreamEngine {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Starts `h`'s stream engine (at open).
pub(crate) fn start_engine(h: &Arc<HandleInner>) -> Result<()> {
    h.start_service(|queue, handle| Ok(Box::new(StreamEngine::start(queue, handle)?)))
}

/// Hands `job` to `h`'s stream engine.
pub(super) fn send(h: &HandleInner, job: Job) -> Result<()> {
    let g = h.service().ok_or(Error::Closed)?;
    let s: &dyn std::any::Any = g.as_deref().ok_or(Error::Closed)?;
    s.downcast_ref::<StreamEngine>().ok_or(Error::Closed)?.send(job)
}

struct Engine {
    queue: Arc<BatchQueue>,
    handle: Weak<HandleInner>,
    rx: Receiver<Msg>,
    ctx: u32,
    jobs: HashMap<u64, (Job, usize)>,
    /// Of `jobs`, those whose plan does not nap (counted, so that an idle
    /// look at the device need not walk the jobs).
    awake: usize,
    waiting: VecDeque<(u64, Job)>,
    next_job: u64,
    events: Vec<BatchEvent>,
}

impl Engine {
    fn new(queue: Arc<BatchQueue>, handle: Weak<HandleInner>, rx: Receiver<Msg>) -> Engine {
        let ctx = queue.open_context(ENGINE_CAPACITY);
        Engine {
            queue,
            handle,
            rx,
            ctx,
            jobs: HashMap::new(),
            awake: 0,
            waiting: VecDeque::new(),
            next_job: 1,
            events: Vec::with_capacity(ENGINE_CAPACITY),
        }
    }

    fn run(mut self) {
        let mut spins = 0u32;
        loop {
            // Idle: poll for work for a while (a thread woken from sleep
            // takes tens of microseconds on a VM, paid by every operation
            // of a stream), then block. Busy: take what has arrived.
            let msg = if self.jobs.is_empty() && self.waiting.is_empty() {
                let idle_since = Instant::now();
                loop {
                    match self.rx.try_recv() {
                        Ok(m) => break Some(m),
                        Err(TryRecvError::Disconnected) => break Some(Msg::Stop),
                        Err(TryRecvError::Empty) if idle_since.elapsed() < IDLE_SPIN => std::hint::spin_loop(),
                        Err(TryRecvError::Empty) => match self.rx.recv() {
                            Ok(m) => break Some(m),
                            Err(_) => break Some(Msg::Stop),
                        },
                    }
                }
            } else {
                match self.rx.try_recv() {
                    Ok(m) => Some(m),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => break,
                }
            };
            match msg {
                Some(Msg::Stop) => break,
                Some(Msg::Job(job)) => {
                    let id = self.next_job;
                    self.next_job += 1;
                    self.waiting.push_back((id, *job));
                }
                None => {}
            }
            self.issue_waiting();
            self.events.clear();
            let (n, _) = self.queue.collect(self.ctx, ENGINE_CAPACITY, &mut self.events);
            let events = std::mem::take(&mut self.events);
            for e in events.iter() {
                self.finish(e);
            }
            self.events = events;
            if n == 0 {
                spins = spins.wrapping_add(1);
                if spins % 4096 == 0 {
                    self.expire();
                }
                if !self.jobs.is_empty() && self.waiting.is_empty() && self.awake == 0 {
                    std::thread::sleep(NAP);
                } else if spins % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        let left = self.queue.close_context(self.ctx);
        if !left.is_empty() {
            if let Some(h) = self.handle.upgrade() {
                h.wedge(left);
            } else {
                std::mem::forget(left);
            }
        }
    }

    /// The waiting job to send next: the first of the best class (critical,
    /// normal, background); none while the best is background and another
    /// class's job is on the device.
    fn next_waiting(&self) -> Option<usize> {
        let rank = |p: Priority| match p {
            Priority::Critical => 0,
            Priority::Normal => 1,
            _ => 2,
        };
        let (i, (_, job)) =
            self.waiting.iter().enumerate().min_by_key(|(i, (_, j))| (rank(j.bound.service.class), *i))?;
        let class = job.bound.service.class;
        if class == Priority::Background && self.jobs.values().any(|(j, _)| j.bound.service.class != class) {
            return None;
        }
        Some(i)
    }

    /// Sends waiting jobs to the device while the context has room, best
    /// class first.
    fn issue_waiting(&mut self) {
        while let Some(i) = self.next_waiting() {
            if i != 0 {
                let j = self.waiting.remove(i).expect("found");
                self.waiting.push_front(j);
            }
            let (_, job) = self.waiting.front().expect("front exists");
            if job.bound.reqs.len() > self.queue.room(self.ctx) {
                if job.bound.reqs.len() > ENGINE_CAPACITY {
                    // Never fits: fail it rather than wait forever.
                    let (_, mut job) = self.waiting.pop_front().expect("front exists");
                    let requested = std::mem::take(&mut job.bound.reqs).len();
                    job.fail_all(Error::CapacityExceeded { capacity: ENGINE_CAPACITY, requested, outstanding: 0 });
                    job.release_stages();
                    continue;
                }
                break;
            }
            let (id, mut job) = self.waiting.pop_front().expect("front exists");
            let mut reqs = std::mem::take(&mut job.bound.reqs);
            for (i, r) in reqs.iter_mut().enumerate() {
                r.cookie = id << 20 | i as u64;
            }
            let n = reqs.len();
            match self.queue.submit(self.ctx, &mut reqs) {
                Ok(_) => {
                    if job.bound.service.observe.is_some() {
                        job.issued = Some(Instant::now());
                    }
                    self.awake += !job.bound.service.naps as usize;
                    self.jobs.insert(id, (job, n));
                }
                Err(e) => {
                    tracing::error!("stream operation could not be submitted: {e}");
                    if matches!(e, Error::Timeout { .. }) {
                        job.handle.0.wedge_holding_nothing();
                    }
                    job.fail_all(e);
                    drop(reqs);
                    job.release_stages();
                }
            }
        }
    }

    fn finish(&mut self, e: &BatchEvent) {
        let id = e.cookie >> 20;
        let idx = (e.cookie & 0xf_ffff) as usize;
        let Some((job, left)) = self.jobs.get_mut(&id) else { return };
        job.timed_out |= matches!(e.result, Err(Error::Timeout { .. }));
        job.failed |= e.result.is_err();
        // Before the stream may copy the request's data out.
        job.cut(idx, *e.result.as_ref().unwrap_or(&0));
        if let Some(s) = job.bound.sinks.get_mut(idx).and_then(|s| s.take()) {
            let r = match &e.result {
                Ok(n) => Ok(*n),
                Err(Error::Nvme { op, status }) => Err(Error::Nvme { op, status: *status }),
                Err(Error::Timeout { qid, cid, after }) => Err(Error::Timeout { qid: *qid, cid: *cid, after: *after }),
                Err(other) => Err(Error::Platform(other.to_string())),
            };
            if let Some(c) = &job.bound.counters {
                c.ended(job.bound.writes[idx], &r);
            }
            s.write(r);
        }
        *left -= 1;
        if let Some(n) = job.bound.progress.as_mut().and_then(|p| p.complete(idx)) {
            // The first `n` pieces are read: the stream may copy them out
            // while the rest is read.
            job.signal.progress(n as u32);
        }
        if *left == 0 {
            let (mut job, _) = self.jobs.remove(&id).expect("present");
            self.awake -= !job.bound.service.naps as usize;
            if let (Some(o), Some(t), false) = (&job.bound.service.observe, job.issued, job.failed) {
                let (mode, req, plan) = &**o;
                mode.observe(req, plan, t.elapsed());
            }
            job.release_stages();
            let Job { signal, handle, .. } = job;
            // Results are written and the handle released; now the stream
            // may go on (and whoever waits on it may close the handle).
            drop(handle);
            signal.set();
        }
    }

    fn expire(&mut self) {
        let Some(h) = self.handle.upgrade() else {
            // The handle is going: its teardown stops this engine first.
            return;
        };
        let guards = h.expire_batch(&self.queue, self.ctx);
        if !guards.is_empty() {
            h.wedge(guards);
        }
    }
}
