//! [`HostStream`]: a host-side stream with a GPU stream's contract, for
//! machines without a GPU and for tests.

use super::{Stream, StreamCounters, StreamService, StreamSignal};
use crate::engine::batch::RequestStats;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use ugds_platform::Recover;
use ugds_platform::Result;

enum Item {
    Host(Box<dyn FnOnce() + Send>),
    Op(Box<dyn FnOnce(StreamSignal) + Send>),
}

struct HostStreamState {
    queue: VecDeque<Item>,
    enqueued: u64,
    completed: u64,
    stop: bool,
}

struct HostStreamShared {
    state: Mutex<HostStreamState>,
    work: Condvar,
    idle: Condvar,
    longest_callback_ns: AtomicU64,
}

/// A stream executed by a host thread, in order: host functions and
/// operations. The stand-in for a GPU stream where there is none.
pub struct HostStream {
    shared: Arc<HostStreamShared>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<StreamCounters>,
    service: Mutex<StreamService>,
}

impl std::fmt::Debug for HostStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStream").finish_non_exhaustive()
    }
}

impl Default for HostStream {
    fn default() -> Self {
        HostStream::new()
    }
}

impl HostStream {
    /// A new, empty stream with its executor thread.
    pub fn new() -> HostStream {
        let shared = Arc::new(HostStreamShared {
            state: Mutex::new(HostStreamState { queue: VecDeque::new(), enqueued: 0, completed: 0, stop: false }),
            work: Condvar::new(),
            idle: Condvar::new(),
            longest_callback_ns: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ugds-hoststream".into())
            .spawn(move || HostStream::run(&s))
            .expect("spawn host stream thread");
        HostStream { shared, thread: Some(thread), counters: Arc::default(), service: Mutex::default() }
    }

    /// What the stream-ordered requests placed on this stream have done
    /// (see [`StreamCounters`]).
    pub fn stats(&self) -> RequestStats {
        self.counters.snapshot()
    }

    /// Sets how the stream engines serve this stream's operations enqueued
    /// from now on (see [`StreamService`]).
    pub fn set_service(&self, service: StreamService) {
        *self.service.lock().recover() = service;
    }

    fn run(s: &HostStreamShared) {
        loop {
            let item = {
                let mut st = s.state.lock().recover();
                loop {
                    if let Some(i) = st.queue.pop_front() {
                        break i;
                    }
                    if st.stop {
                        return;
                    }
                    st = s.work.wait(st).recover();
                }
            };
            match item {
                Item::Host(f) => f(),
                Item::Op(op) => {
                    let gate = Arc::new((Mutex::new(false), Condvar::new()));
                    let g = gate.clone();
                    let signal = StreamSignal::new(move || {
                        *g.0.lock().recover() = true;
                        g.1.notify_all();
                    });
                    let t0 = Instant::now();
                    op(signal);
                    let took = t0.elapsed().as_nanos() as u64;
                    s.longest_callback_ns.fetch_max(took, Ordering::Relaxed);
                    // The stream (not the callback) waits for the signal.
                    let mut set = gate.0.lock().recover();
                    while !*set {
                        set = gate.1.wait(set).recover();
                    }
                }
            }
            let mut st = s.state.lock().recover();
            st.completed += 1;
            s.idle.notify_all();
        }
    }

    fn push(&self, item: Item) {
        let mut st = self.shared.state.lock().recover();
        st.queue.push_back(item);
        st.enqueued += 1;
        self.shared.work.notify_one();
    }

    /// Enqueues a host function, run in stream order.
    pub fn enqueue(&self, f: impl FnOnce() + Send + 'static) {
        self.push(Item::Host(Box::new(f)));
    }

    /// Waits until everything enqueued so far has run.
    pub fn synchronize(&self) {
        let mut st = self.shared.state.lock().recover();
        let target = st.enqueued;
        while st.completed < target {
            st = self.shared.idle.wait(st).recover();
        }
    }

    /// The longest an operation's callback ran before returning (not
    /// counting the stream's wait for its signal).
    pub fn longest_callback(&self) -> Duration {
        Duration::from_nanos(self.shared.longest_callback_ns.load(Ordering::Relaxed))
    }
}

impl Stream for HostStream {
    fn launch(&self, op: Box<dyn FnOnce(StreamSignal) + Send>) -> Result<()> {
        self.push(Item::Op(op));
        Ok(())
    }

    fn counters(&self) -> Option<Arc<StreamCounters>> {
        Some(self.counters.clone())
    }

    fn service(&self) -> StreamService {
        self.service.lock().recover().clone()
    }
}

impl Drop for HostStream {
    fn drop(&mut self) {
        self.synchronize();
        self.shared.state.lock().recover().stop = true;
        self.shared.work.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
