//! The scheduler between the synchronous calls and the queue pairs.
//!
//! Placement: each request goes to the synchronous queue pair with the
//! fewest bytes on it (requests staged and not finished, as each queue
//! counts under its own lock), starting from the calling thread's own queue
//! so that an idle handle keeps each thread on one queue (no shared write
//! per request; round robin, the other [`Placement`], takes a shared
//! counter's increment per request).
//!
//! Interleaving: a normal request of more than `chunk_bytes` keeps at most
//! that many bytes (whole commands, at least one) on the device while
//! latency-critical requests, or normal ones of at most `chunk_bytes`, are
//! on the handle, so that small requests are not queued behind all of it on
//! a device that serves commands in turn (large requests do not make room
//! for each other: that would cost wake-ups and help no one); once it has made room it keeps doing so to its end (so
//! that the gaps between another thread's requests do not let all of it
//! through). A background request keeps one command on the device while
//! any request that is not background is on the handle, or a
//! latency-critical one finished less than a millisecond ago. A
//! latency-critical request is never held back. All of this is read from
//! the queues' loads (and background loads), which each queue keeps under
//! its own lock: a normal or background request pays no shared write for
//! it, a latency-critical one a clock read and a store when it finishes,
//! and a request that is not interleaved does not look at all.

use crate::engine::sync::{Pacing, SyncQueue};
use crate::mode::Depth;
pub use crate::mode::Priority;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How synchronous requests are placed on the handle's queue pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// On the queue pair with the fewest bytes outstanding (the default).
    #[default]
    LeastLoaded,
    /// On each queue pair in turn, whatever is on it.
    RoundRobin,
}

/// The scheduler's state, one per handle.
#[derive(Debug)]
pub(crate) struct Scheduler {
    placement: Placement,
    /// Requests larger than this are interleaved (0: never).
    chunk_bytes: usize,
    /// Commands such a request keeps on the device while it yields.
    window_commands: u32,
    /// Bytes of one command at most (a background request's window).
    per_command: usize,
    /// The next queue, for round robin.
    rr: AtomicUsize,
    /// When a latency-critical request last finished (nanoseconds from
    /// `base`, plus one; 0: never).
    critical_seen: AtomicU64,
    base: Instant,
}

/// How long after a latency-critical request background requests still
/// make room for the next (the gaps between one thread's requests would
/// otherwise let a background request put all of itself on the device).
const CRITICAL_RECENT: Duration = Duration::from_millis(1);

thread_local! {
    /// This thread's own queue (an index, taken modulo the queue count).
    static HOME: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The next thread's own queue.
static NEXT_HOME: AtomicUsize = AtomicUsize::new(0);

fn home() -> usize {
    HOME.with(|h| {
        if h.get() == usize::MAX {
            h.set(NEXT_HOME.fetch_add(1, Relaxed));
        }
        h.get()
    })
}

impl Scheduler {
    /// A scheduler placing by `placement`, interleaving requests above
    /// `chunk_bytes` in windows of commands of at most `max_transfer` bytes.
    pub fn new(placement: Placement, chunk_bytes: usize, max_transfer: Option<usize>) -> Scheduler {
        let per_command = max_transfer.unwrap_or(usize::MAX).max(1);
        let window_commands = (chunk_bytes / per_command).clamp(1, u32::MAX as usize) as u32;
        Scheduler {
            placement,
            chunk_bytes,
            window_commands,
            per_command,
            rr: AtomicUsize::new(0),
            critical_seen: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    /// The queue for the next request.
    #[inline]
    pub fn pick<'q>(&self, queues: &'q [Arc<SyncQueue>]) -> &'q SyncQueue {
        let n = queues.len();
        if n == 1 {
            return &queues[0];
        }
        if self.placement == Placement::RoundRobin {
            return &queues[self.rr.fetch_add(1, Relaxed) % n];
        }
        let start = home() % n;
        let (mut best, mut least) = (start, queues[start].load());
        let mut i = start;
        while least > 0 {
            i = if i + 1 == n { 0 } else { i + 1 };
            if i == start {
                break;
            }
            let l = queues[i].load();
            if l < least {
                (best, least) = (i, l);
            }
        }
        &queues[best]
    }

    /// How a request of class `prio` and `size` bytes is paced at `depth`
    /// (the scheduler's, unless a mode asks otherwise); `yield_now` is where
    /// the caller keeps [`yields`](Self::yields) for it.
    #[inline]
    pub fn pacing_at<'a>(
        &self,
        prio: Priority,
        size: usize,
        depth: Depth,
        yield_now: &'a dyn Fn() -> bool,
    ) -> Pacing<'a> {
        fn always() -> bool {
            true
        }
        let window = match prio {
            _ if self.chunk_bytes == 0 || depth == Depth::Deep => None,
            _ if depth == Depth::Shallow => {
                return Pacing {
                    background: prio == Priority::Background,
                    urgent: self.urgent(prio, size),
                    window: (size > self.chunk_bytes).then_some((self.window_commands, &always)),
                };
            }
            Priority::Critical => None,
            Priority::Normal => (size > self.chunk_bytes).then_some(self.window_commands),
            // One command at a time while it yields.
            Priority::Background => (size > self.per_command).then_some(1),
        };
        Pacing {
            background: prio == Priority::Background,
            urgent: self.urgent(prio, size),
            window: window.map(|n| (n, yield_now)),
        }
    }

    /// Whether large normal requests make room for this one: a
    /// latency-critical request, or a normal one of at most `chunk_bytes`.
    #[inline]
    fn urgent(&self, prio: Priority, size: usize) -> bool {
        prio == Priority::Critical || (prio == Priority::Normal && size <= self.chunk_bytes)
    }

    /// Whether a request of class `prio` yields now (see the module docs).
    pub fn yields(&self, prio: Priority, queues: &[Arc<SyncQueue>]) -> bool {
        match prio {
            Priority::Critical => false,
            Priority::Normal => queues.iter().any(|q| q.urgent_load() > 0),
            Priority::Background => {
                let (all, background) =
                    queues.iter().fold((0u64, 0u64), |(a, b), q| (a + q.load(), b + q.background_load()));
                // Read without the queues' locks, one after another: the two
                // sums need not agree, so saturating.
                all.saturating_sub(background) > 0 || self.critical_recently()
            }
        }
    }

    /// Notes that a latency-critical request finished now.
    pub fn critical_done(&self) {
        self.critical_seen.store(self.base.elapsed().as_nanos() as u64 + 1, Relaxed);
    }

    fn critical_recently(&self) -> bool {
        match self.critical_seen.load(Relaxed) {
            0 => false,
            t => (self.base.elapsed().as_nanos() as u64 + 1).saturating_sub(t) < CRITICAL_RECENT.as_nanos() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_hold_whole_commands_of_the_chunk() {
        let s = Scheduler::new(Placement::LeastLoaded, 256 << 10, Some(128 << 10));
        assert_eq!(s.window_commands, 2);
        let s = Scheduler::new(Placement::LeastLoaded, 64 << 10, Some(128 << 10));
        assert_eq!(s.window_commands, 1, "at least one command");
        let s = Scheduler::new(Placement::LeastLoaded, 256 << 10, None);
        assert_eq!(s.window_commands, 1, "no MDTS: one command is the whole request");
        let never = || false;
        assert!(s.pacing_at(Priority::Normal, (256 << 10) + 512, Depth::Scheduler, &never).window.is_some());
        assert!(s.pacing_at(Priority::Normal, 256 << 10, Depth::Scheduler, &never).window.is_none());
        assert!(s.pacing_at(Priority::Critical, 1 << 30, Depth::Scheduler, &never).window.is_none());
        let b = s.pacing_at(Priority::Background, 4096, Depth::Scheduler, &never);
        assert!(b.background && b.window.is_none(), "small background requests count as background load");
        let s = Scheduler::new(Placement::LeastLoaded, 256 << 10, Some(128 << 10));
        let b = s.pacing_at(Priority::Background, (128 << 10) + 512, Depth::Scheduler, &never);
        assert_eq!(b.window.map(|(n, _)| n), Some(1), "a background request: one command at a time");
        let off = Scheduler::new(Placement::LeastLoaded, 0, None);
        assert!(off.pacing_at(Priority::Background, 1 << 30, Depth::Scheduler, &never).window.is_none());
        let shallow = s.pacing_at(Priority::Normal, 1 << 20, Depth::Shallow, &never);
        assert!(shallow.window.is_some_and(|(n, y)| n == 2 && y()), "shallow: the window holds, whatever waits");
        assert!(s.pacing_at(Priority::Background, 1 << 20, Depth::Deep, &never).window.is_none());
    }
}
