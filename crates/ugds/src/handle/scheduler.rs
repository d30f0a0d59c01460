//! The scheduler between the synchronous calls and the queue pairs.
//!
//! Placement: each request goes to the synchronous queue pair with the
//! fewest bytes on it (requests staged and not finished, as each queue
//! counts under its own lock), starting from the calling thread's own queue
//! so that an idle handle keeps each thread on one queue (no shared write
//! per request; round robin, the other [`Placement`], takes a shared
//! counter's increment per request).
//!
//! Interleaving: a request of more than `chunk_bytes` keeps at most that
//! many bytes (whole commands, at least one) on the device while other work
//! waits, so that small requests are not queued behind all of it on a
//! device that serves commands in turn. What it waits for is its
//! [`Priority`]: a normal request yields to other normal and to
//! latency-critical synchronous requests on the handle, a background one to
//! any that is not background, a latency-critical one to none. Both are read from the queues' loads (and
//! background loads), which each queue keeps under its own lock: no class
//! pays a shared write for it, and a request that is not interleaved does
//! not look at all.

use crate::engine::sync::{Pacing, SyncQueue};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

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

/// A request's class: what its large transfers yield to (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Priority {
    /// Never held back; large normal and background requests make room for it.
    Critical,
    /// Held back, when large, while another normal or a latency-critical
    /// synchronous request is on the handle.
    #[default]
    Normal,
    /// Held back, when large, while any synchronous request that is not
    /// background is on the handle.
    Background,
}

/// The scheduler's state, one per handle.
#[derive(Debug)]
pub(crate) struct Scheduler {
    placement: Placement,
    /// Requests larger than this are interleaved (0: never).
    chunk_bytes: usize,
    /// Commands such a request keeps on the device while it yields.
    window_commands: u32,
    /// The next queue, for round robin.
    rr: AtomicUsize,
}

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
        Scheduler { placement, chunk_bytes, window_commands, rr: AtomicUsize::new(0) }
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

    /// How a request of class `prio` and `size` bytes is paced; `yield_now`
    /// is where the caller keeps [`yields`](Self::yields) for it.
    #[inline]
    pub fn pacing<'a>(&self, prio: Priority, size: usize, yield_now: &'a dyn Fn(u64) -> bool) -> Pacing<'a> {
        let background = prio == Priority::Background;
        let interleaved = self.chunk_bytes > 0 && size > self.chunk_bytes && prio != Priority::Critical;
        Pacing { background, window: interleaved.then_some((self.window_commands, yield_now)) }
    }

    /// Whether a request of class `prio` whose own bytes on `queues` are
    /// `own` yields now (see the module docs).
    pub fn yields(prio: Priority, queues: &[Arc<SyncQueue>], own: u64) -> bool {
        let (all, background) = queues.iter().fold((0, 0), |(a, b), q| (a + q.load(), b + q.background_load()));
        match prio {
            Priority::Critical => false,
            Priority::Normal => all - background > own,
            Priority::Background => all > background,
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
        let never = |_| false;
        assert!(s.pacing(Priority::Normal, (256 << 10) + 512, &never).window.is_some());
        assert!(s.pacing(Priority::Normal, 256 << 10, &never).window.is_none());
        assert!(s.pacing(Priority::Critical, 1 << 30, &never).window.is_none());
        let b = s.pacing(Priority::Background, 4096, &never);
        assert!(b.background && b.window.is_none(), "small background requests count as background load");
        let off = Scheduler::new(Placement::LeastLoaded, 0, None);
        assert!(off.pacing(Priority::Background, 1 << 30, &never).window.is_none());
    }
}
