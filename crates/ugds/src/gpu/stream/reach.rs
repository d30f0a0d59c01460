//! How the host learns that a stream reached an operation: the stream
//! writes the operation's point number into its `reach` word
//! (`cuStreamWriteValue32`), and one ugds thread, the dispatcher, watches
//! the `reach` words of streams with operations ahead and runs each
//! operation's host part once its point is reached.
//!
//! This replaces a host function per operation (`cuLaunchHostFunc`), which
//! costs the runtime's callback thread a wake-up each time (measured on an
//! H200 with bench/cuda-probes/signal_paths.c: 24 us per operation with no
//! I/O, 52 us on top of a 35 us I/O handed to another thread, against 9 us
//! with a polled word), and lets a stream hold only about 57 operations
//! before the enqueue blocks inside the driver (511 with memory operations
//! alone; bench/cuda-probes/one_stream.c).
//!
//! The dispatcher polls while operations are ahead of it: it spins for
//! [`SPIN`] after its last progress, then looks every [`NAP`] (a stream
//! behind a long kernel does not cost a core for the kernel's length), and
//! parks when no stream has operations ahead.

use super::words::Slot;
use super::Timing;
use crate::stream::StreamSignal;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};
use ugds_platform::Recover;

/// How long the dispatcher spins after its last progress before it naps.
const SPIN: Duration = Duration::from_micros(200);
/// Its pause between looks after that.
const NAP: Duration = Duration::from_micros(20);

/// The host part of an operation, run when the stream reaches its point.
pub(super) enum Action {
    /// Binds late values and writes staging headers; then sets `done` to
    /// the point, so the stream's copies into staging blocks may run.
    Bind(Box<dyn FnOnce() + Send>),
    /// Hands the operation's I/O over with a signal that sets `done` to
    /// the operation's last point when the I/O is done (made only here: an
    /// action that never runs sets nothing). An operation copied out in
    /// `pieces` has that many points from its own, one per piece's copy;
    /// the signal's progress moves `done` through them.
    Run { timing: Arc<Timing>, op: Box<dyn FnOnce(StreamSignal) + Send>, pieces: u32 },
}

/// One stream's operations ahead of the dispatcher, in point order.
pub(super) struct Points {
    slot: Slot,
    queue: Mutex<VecDeque<(u32, Action)>>,
    /// In the dispatcher's list (set by `post`, cleared by the dispatcher
    /// under the queue's lock when it finds the queue empty).
    listed: AtomicBool,
}

impl Points {
    pub(super) fn new(slot: Slot) -> Arc<Points> {
        Arc::new(Points { slot, queue: Mutex::new(VecDeque::new()), listed: AtomicBool::new(false) })
    }

    /// Queues `action` for `point` and makes sure the dispatcher watches
    /// this stream. The stream's write of `point` may come before or after.
    pub(super) fn post(self: &Arc<Self>, point: u32, action: Action) {
        let mut q = self.queue.lock().recover();
        q.push_back((point, action));
        if !self.listed.swap(true, Ordering::AcqRel) {
            drop(q);
            dispatcher().add(self.clone());
        }
    }

    /// Runs the actions whose points the stream has reached. Returns how
    /// many ran, and whether the queue is now empty (and the stream
    /// unlisted).
    fn run_reached(&self) -> (usize, bool) {
        // Acquire: pairs with the device's write; nothing the operation
        // reads is written by the stream before it, but the order is free.
        let reached = self.slot.reach().load(Ordering::Acquire);
        let mut ran = 0;
        loop {
            let mut q = self.queue.lock().recover();
            match q.front() {
                Some((p, _)) if reached.wrapping_sub(*p) as i32 >= 0 => {
                    let (point, action) = q.pop_front().expect("front exists");
                    drop(q);
                    self.run(point, action);
                    ran += 1;
                }
                Some(_) => return (ran, false),
                None => {
                    self.listed.store(false, Ordering::Release);
                    return (ran, true);
                }
            }
        }
    }

    fn run(&self, point: u32, action: Action) {
        match action {
            Action::Bind(bind) => {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(bind)).is_err() {
                    tracing::error!("stream operation panicked while binding its values");
                }
                // Release: the staging headers written by `bind` are visible
                // to the copy kernels the stream runs after seeing this.
                self.slot.done().store(point, Ordering::Release);
            }
            Action::Run { timing, op, pieces } => {
                timing.started();
                let slot = self.slot;
                let last = point.wrapping_add(pieces.max(1) - 1);
                let set = move || {
                    timing.signalled();
                    // Release: the bytes moved, written before, are visible
                    // to whatever the stream runs after it sees this value.
                    slot.done().store(last, Ordering::Release);
                };
                let signal = match pieces {
                    0 | 1 => StreamSignal::new(set),
                    // Progress comes from the one thread that sets the
                    // signal, before it (the signal is consumed then), so
                    // `done` only grows.
                    _ => StreamSignal::with_progress(set, move |n| {
                        if (1..pieces).contains(&n) {
                            // Release: the first `n` pieces' bytes and
                            // copy parameters are visible to their copies.
                            slot.done().store(point.wrapping_add(n - 1), Ordering::Release);
                        }
                    }),
                };
                // A panic must not take the dispatcher down; the signal,
                // dropped while unwinding, still lets the stream go on.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || op(signal))).is_err() {
                    tracing::error!("stream operation panicked");
                }
            }
        }
    }
}

/// The process's dispatcher thread and the streams it watches.
struct Dispatcher {
    incoming: Mutex<Vec<Arc<Points>>>,
    pending: AtomicBool,
    thread: Thread,
}

fn dispatcher() -> &'static Dispatcher {
    static D: OnceLock<Dispatcher> = OnceLock::new();
    D.get_or_init(|| {
        let t = std::thread::Builder::new()
            .name("ugds-stream-dispatch".into())
            .spawn(run)
            .expect("the stream dispatcher thread starts");
        Dispatcher { incoming: Mutex::new(Vec::new()), pending: AtomicBool::new(false), thread: t.thread().clone() }
    })
}

impl Dispatcher {
    fn add(&self, p: Arc<Points>) {
        self.incoming.lock().recover().push(p);
        self.pending.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

fn run() {
    let d = dispatcher();
    let mut watched: Vec<Arc<Points>> = Vec::new();
    let mut last_progress = Instant::now();
    loop {
        // A load first: the swap, a write, only when something came.
        if d.pending.load(Ordering::Acquire) && d.pending.swap(false, Ordering::AcqRel) {
            watched.append(&mut d.incoming.lock().recover());
            last_progress = Instant::now();
        }
        let mut ran = 0;
        watched.retain(|p| {
            let (n, empty) = p.run_reached();
            ran += n;
            !empty
        });
        if ran > 0 {
            last_progress = Instant::now();
        } else if watched.is_empty() {
            // Unparked by `add`; a token left by an earlier unpark only
            // makes this return at once.
            std::thread::park();
        } else if last_progress.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(NAP);
        }
    }
}
