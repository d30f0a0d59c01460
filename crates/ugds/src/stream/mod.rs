//! Stream-ordered I/O: reads and writes placed in a stream's order, as
//! cuFile's `cuFileReadAsync` / `cuFileWriteAsync` do on a CUDA stream.
//!
//! A [`Stream`] runs an operation when all earlier work on it is done, and
//! holds later work back until the operation sets its [`StreamSignal`]. The
//! operation ugds launches only reads the late-bound size and offsets,
//! validates them and hands the request to the handle's stream engine; it
//! returns at once and never holds the stream's callback thread for the
//! length of the I/O. The engine (one thread per handle, on the batch queue)
//! issues the commands, writes the bytes moved (or `-errno`) where the
//! caller asked, and only then sets the signal. On a GPU the signal is a
//! word the stream waits on device-side (`cuStreamWaitValue32`); here,
//! [`HostStream`] is a host-side executor with the same contract, for
//! machines without a GPU and for tests.
//!
//! Ordered batches ([`Handle::batch_async`](crate::Handle::batch_async)) are ordered as a whole against
//! the stream and unordered among themselves: all their requests are on the
//! device at once.

use crate::engine::batch::RequestStats;
use crate::mode::Mode;
use crate::mode::Priority;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use ugds_platform::{Error, Result};

/// Sets a stream free to run the work after an operation. Setting it is the
/// operation's last act; dropping it unset sets it (a stream never hangs on
/// a lost signal).
pub struct StreamSignal {
    set: Option<Box<dyn FnOnce() + Send>>,
    /// Where the operation's data is copied out in pieces, each after a
    /// wait of its own: lets the stream copy the first `n` pieces.
    progress: Option<Box<dyn Fn(u32) + Send>>,
}

impl std::fmt::Debug for StreamSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSignal").finish_non_exhaustive()
    }
}

impl StreamSignal {
    /// A signal that runs `f` when set.
    pub fn new(f: impl FnOnce() + Send + 'static) -> StreamSignal {
        StreamSignal { set: Some(Box::new(f)), progress: None }
    }

    /// A signal that also lets the stream go on piece by piece: `progress(n)`
    /// once the first `n` pieces are in place.
    pub(crate) fn with_progress(
        f: impl FnOnce() + Send + 'static,
        progress: impl Fn(u32) + Send + 'static,
    ) -> StreamSignal {
        StreamSignal { set: Some(Box::new(f)), progress: Some(Box::new(progress)) }
    }

    /// The first `n` pieces of the operation's data are in place (a no-op
    /// where the operation is not copied out in pieces).
    pub(crate) fn progress(&self, n: u32) {
        if let Some(p) = &self.progress {
            p(n)
        }
    }

    /// Lets the stream go on.
    pub fn set(mut self) {
        if let Some(f) = self.set.take() {
            f()
        }
    }
}

impl Drop for StreamSignal {
    fn drop(&mut self) {
        if let Some(f) = self.set.take() {
            f()
        }
    }
}

/// An ordered sequence of work that ugds can place operations in.
pub trait Stream: Send + Sync {
    /// When all work enqueued before this call is done, run `op` with a
    /// signal; work enqueued after it waits until the signal is set. `op`
    /// must return promptly: it starts work, it does not wait for it.
    fn launch(&self, op: Box<dyn FnOnce(StreamSignal) + Send>) -> Result<()>;

    /// How the handles' stream engines serve this stream's operations
    /// ([`StreamService`]; the default: normal class, no mode).
    fn service(&self) -> StreamService {
        StreamService::default()
    }

    /// Where the requests of the operations placed on this stream are
    /// counted ([`StreamCounters`]); `None`: not counted.
    fn counters(&self) -> Option<Arc<StreamCounters>> {
        None
    }

    /// This stream as `Any`, where ugds may look at its type: a GPU
    /// stream answers (ugds stages device memory through it where the
    /// controller cannot reach that memory itself); others need not.
    #[doc(hidden)]
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

mod host;
pub(crate) mod io;

/// How the handles' stream engines serve a stream's operations
/// ([`Stream::service`]; set with `HostStream::set_service` or
/// `GpuStream::set_service`). A stream runs one operation at a time; the
/// engine of a handle has the operations of all its streams to serve.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct StreamService {
    /// The operations' class: an engine sends a latency-critical stream's
    /// waiting operations to the device before other streams', and holds a
    /// background stream's back while any other operation is on the device.
    pub priority: Priority,
    /// Asked once per operation, when it is enqueued (its size where known
    /// then, its direction, `priority`): the plan's class replaces
    /// `priority`; a plan that sleeps (interrupt completion) lets the engine
    /// nap between looks at the device while only such operations are in
    /// flight (the batch queue has no interrupt: naps of 50 us, the CPU free
    /// meanwhile); a plan that asks to measure is told each operation's time
    /// from its submission to its last completion. Depth is not applied:
    /// an operation's requests all go to the device at once.
    pub mode: Option<Arc<dyn Mode>>,
}

impl StreamService {
    /// Operations of class `priority`, served as `mode` plans them.
    pub fn new(priority: Priority, mode: Option<Arc<dyn Mode>>) -> StreamService {
        StreamService { priority, mode }
    }
}

/// What the stream-ordered requests placed on one stream have done, on
/// every handle ([`HostStream::stats`], [`GpuStream::stats`](crate::gpu::GpuStream::stats)). A
/// request is counted as submitted when the stream reaches it and its
/// values are bound, and as ended when its result is written (one refused
/// then ends at once, as an error). Written by the handles' stream engines
/// (one thread each), so with relaxed atomic additions.
#[derive(Debug, Default)]
pub struct StreamCounters {
    submitted: AtomicU64,
    ended: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
}

impl StreamCounters {
    /// The totals now (read one after another: each is current, the set is
    /// not one instant's).
    pub fn snapshot(&self) -> RequestStats {
        let ended = self.ended.load(Ordering::Relaxed);
        let submitted = self.submitted.load(Ordering::Relaxed).max(ended);
        RequestStats {
            submitted,
            ended,
            in_flight: submitted - ended,
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            canceled: 0,
            timeouts: self.timeouts.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn submitted(&self, n: u64) {
        self.submitted.fetch_add(n, Ordering::Relaxed);
    }

    /// One request ended with `r` (a `write` or a read).
    pub(crate) fn ended(&self, write: bool, r: &Result<usize>) {
        match r {
            Ok(n) if write => self.bytes_written.fetch_add(*n as u64, Ordering::Relaxed),
            Ok(n) => self.bytes_read.fetch_add(*n as u64, Ordering::Relaxed),
            Err(Error::Timeout { .. }) => self.timeouts.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.errors.fetch_add(1, Ordering::Relaxed),
        };
        self.ended.fetch_add(1, Ordering::Relaxed);
    }
}

pub use host::HostStream;
pub use io::{StreamIo, StreamResult};
