//! Stream-ordered I/O on GPU streams.
//!
//! For each operation, a host function is launched on the stream; it binds
//! the late values and hands the I/O to the handle's stream engine, then
//! returns at once. Behind it the stream waits on the GPU side
//! (`cuStreamWaitValue32` / `hipStreamWaitValue32`, "greater or equal") for
//! a word in device-mapped host memory, which the operation's signal sets
//! to the operation's sequence number once the bytes moved are written. So
//! the runtime's callback thread is never held for an I/O, and many
//! streams progress at once. Where stream memory operations are not
//! supported, the host function waits for the signal itself (logged once).

use crate::stream::{Stream, StreamSignal};
use crate::{Error, Result};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

/// How a GPU stream waits for an operation's I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamWait {
    /// The stream waits on the GPU for a completion word; the callback
    /// returns at once. Falls back to [`BlockingCallback`](Self::BlockingCallback)
    /// where the device cannot wait on memory.
    DeviceSide,
    /// The host callback waits for the I/O (what the existing uGDS does for
    /// every operation; here only a fallback).
    BlockingCallback,
}

/// What a GPU runtime provides for [`GpuStream`].
pub(crate) trait StreamBackend: Send + Sync {
    /// Allocates a zeroed, device-mapped host word: (host address, device address).
    fn alloc_flag(&self) -> Result<(usize, u64)>;
    /// Frees a word from `alloc_flag`, once no stream can wait on it.
    fn free_flag(&self, host: usize);
    /// Launches `f(data)` on `stream` in stream order.
    fn launch_host_fn(&self, stream: usize, f: unsafe extern "C" fn(*mut c_void), data: *mut c_void) -> Result<()>;
    /// Makes `stream` wait until the word at `addr` is at least `value`
    /// (cyclically). `Ok(false)`: not supported here.
    fn wait_value32(&self, stream: usize, addr: u64, value: u32) -> Result<bool>;
    /// Waits until all work on `stream` is done.
    fn synchronize(&self, stream: usize) -> Result<()>;
    /// "CUDA" or "HIP".
    fn name(&self) -> &'static str;
}

/// A GPU stream (CUDA or HIP) that ugds places operations in; see
/// [`Handle::read_async`](crate::Handle::read_async). Dropping it waits for
/// the stream's work before freeing the completion word.
pub struct GpuStream {
    backend: Arc<dyn StreamBackend>,
    raw: usize,
    flag_host: usize,
    flag_dev: u64,
    wait: StreamWait,
    /// Sequence number of the last operation; held while launching, so that
    /// numbers reach the stream in order.
    seq: Mutex<u32>,
    timing: Arc<Timing>,
}

/// When the last signal was set, and the gaps from a signal to the next
/// operation's start, for [`GpuStream::gaps`].
#[derive(Default)]
struct Timing {
    /// Nanoseconds since `EPOCH` of the last signal; 0 before the first.
    last_signal: AtomicU64,
    gap_sum_ns: AtomicU64,
    gaps: AtomicU64,
    /// Start of the running operation, and the sum of operations' times
    /// from start to signal.
    last_start: AtomicU64,
    busy_sum_ns: AtomicU64,
    ops: AtomicU64,
}

impl Timing {
    fn started(&self) {
        let now = now_ns();
        let last = self.last_signal.swap(0, Ordering::Relaxed);
        if last != 0 {
            self.gap_sum_ns.fetch_add(now.saturating_sub(last), Ordering::Relaxed);
            self.gaps.fetch_add(1, Ordering::Relaxed);
        }
        self.last_start.store(now, Ordering::Relaxed);
    }

    fn signalled(&self) {
        let now = now_ns();
        let start = self.last_start.load(Ordering::Relaxed);
        self.busy_sum_ns.fetch_add(now.saturating_sub(start), Ordering::Relaxed);
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.last_signal.store(now, Ordering::Relaxed);
    }
}

static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

static FALLBACK_LOGGED: Once = Once::new();

impl GpuStream {
    pub(crate) fn new(backend: Arc<dyn StreamBackend>, raw: usize, wait: StreamWait) -> Result<GpuStream> {
        let (flag_host, flag_dev) = backend.alloc_flag()?;
        let timing = Arc::new(Timing::default());
        let mut s = GpuStream { backend, raw, flag_host, flag_dev, wait, seq: Mutex::new(0), timing };
        if wait == StreamWait::DeviceSide {
            // The word is 0, so waiting for >= 0 passes at once: a probe.
            match s.backend.wait_value32(raw, flag_dev, 0) {
                Ok(true) => {}
                Ok(false) => {
                    FALLBACK_LOGGED.call_once(|| {
                        tracing::warn!(
                            "{}: stream memory operations are not supported; stream-ordered I/O \
                             blocks the runtime's callback thread for each I/O",
                            s.backend.name()
                        )
                    });
                    s.wait = StreamWait::BlockingCallback;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(s)
    }

    /// How this stream waits for I/O.
    pub fn wait_mode(&self) -> StreamWait {
        self.wait
    }

    /// The runtime's stream handle.
    pub fn raw(&self) -> *mut c_void {
        self.raw as *mut c_void
    }

    /// Waits until all work on the stream is done.
    pub fn synchronize(&self) -> Result<()> {
        let r = self.backend.synchronize(self.raw);
        self.timing.last_signal.store(0, Ordering::Relaxed);
        r
    }

    /// Where a stream's time went, for operations queued back to back:
    /// `(operations, mean time from start to signal, mean time from one
    /// operation's signal to the next one's start)`. The second is the
    /// hand-off (the GPU seeing the word, the runtime running the next host
    /// function); gaps across a [`synchronize`](Self::synchronize) are not
    /// counted.
    pub fn timing(&self) -> (u64, Duration, Duration) {
        let t = &self.timing;
        let (ops, gaps) = (t.ops.load(Ordering::Relaxed), t.gaps.load(Ordering::Relaxed));
        let busy = t.busy_sum_ns.load(Ordering::Relaxed).checked_div(ops).unwrap_or(0);
        let gap = t.gap_sum_ns.load(Ordering::Relaxed).checked_div(gaps).unwrap_or(0);
        (ops, Duration::from_nanos(busy), Duration::from_nanos(gap))
    }

    /// The completion word's value: the sequence number of the last
    /// operation whose I/O is done (device-side waiting only).
    pub fn completed(&self) -> u32 {
        // SAFETY: a live, aligned 64-byte mapping we own until drop; the
        // GPU only reads it.
        unsafe { &*(self.flag_host as *const AtomicU32) }.load(Ordering::Acquire)
    }
}

struct HostCall {
    timing: Arc<Timing>,
    op: Box<dyn FnOnce(StreamSignal) + Send>,
    signal: StreamSignal,
    /// Set in blocking mode: the callback waits on it.
    gate: Option<Arc<(Mutex<bool>, Condvar)>>,
}

unsafe extern "C" fn host_call(data: *mut c_void) {
    // SAFETY: boxed by `launch`, launched once, run once.
    let call = unsafe { Box::from_raw(data as *mut HostCall) };
    let HostCall { timing, op, signal, gate } = *call;
    timing.started();
    // A panic must not unwind into the runtime; the signal, dropped while
    // unwinding, still lets the stream go on.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || op(signal))).is_err() {
        tracing::error!("stream operation panicked");
    }
    if let Some(g) = gate {
        let mut done = g.0.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            done = g.1.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Stream for GpuStream {
    fn launch(&self, op: Box<dyn FnOnce(StreamSignal) + Send>) -> Result<()> {
        let mut seq = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        let next = seq.wrapping_add(1);
        let timing = self.timing.clone();
        let (signal, gate) = match self.wait {
            StreamWait::DeviceSide => {
                let flag = self.flag_host;
                let t = timing.clone();
                let signal = StreamSignal::new(move || {
                    t.signalled();
                    // SAFETY: the word outlives every signal: drop
                    // synchronizes the stream, which waits for this store.
                    let f = unsafe { &*(flag as *const AtomicU32) };
                    // Release: the bytes moved, written before, are visible
                    // to whatever the stream runs after it sees this value.
                    f.store(next, Ordering::Release);
                });
                (signal, None)
            }
            StreamWait::BlockingCallback => {
                let gate = Arc::new((Mutex::new(false), Condvar::new()));
                let g = gate.clone();
                let t = timing.clone();
                let signal = StreamSignal::new(move || {
                    t.signalled();
                    *g.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    g.1.notify_all();
                });
                (signal, Some(gate))
            }
        };
        let data = Box::into_raw(Box::new(HostCall { timing, op, signal, gate })) as *mut c_void;
        if let Err(e) = self.backend.launch_host_fn(self.raw, host_call, data) {
            // SAFETY: not launched: still ours. Dropping it sets the signal,
            // which nothing waits for.
            drop(unsafe { Box::from_raw(data as *mut HostCall) });
            return Err(e);
        }
        *seq = next;
        if self.wait == StreamWait::DeviceSide {
            match self.backend.wait_value32(self.raw, self.flag_dev, next) {
                Ok(true) => {}
                // The host function is queued and will run; only the wait
                // is missing, so later work may overtake this operation.
                Ok(false) => return Err(Error::Unsupported("stream wait on memory".into())),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Drop for GpuStream {
    fn drop(&mut self) {
        match self.backend.synchronize(self.raw) {
            Ok(()) => self.backend.free_flag(self.flag_host),
            // The stream may still wait on the word: leak it rather than
            // free memory the GPU may read.
            Err(e) => {
                tracing::warn!("{}: stream synchronize failed ({e}); completion word leaked", self.backend.name())
            }
        }
    }
}
