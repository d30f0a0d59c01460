//! A handle's count of what is in flight on it (synchronous calls, batch
//! contexts, lent queues, stream operations), kept in stripes so that a
//! request's increment and decrement touch a cache line of its thread's,
//! never one every thread writes.
//!
//! Closing relies on a store-then-load handshake: a request raises its
//! stripe and then reads the handle's state; `close` moves the state to
//! CLOSING and then reads every stripe. Both sides are SeqCst, so in their
//! single total order either the request sees CLOSING (and leaves) or the
//! close sees the request (and waits). A request lowers the stripe it
//! raised, so no stripe goes below zero and a sum never hides one in flight.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Stripes per handle: threads beyond this share them (still correct,
/// only no longer private).
const STRIPES: usize = 32;

/// One stripe on a cache line (and its neighbour, which x86 prefetches in pairs) of its own.
#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicUsize);

/// The in-flight count of one handle.
pub(crate) struct Inflight {
    stripes: Box<[Stripe]>,
}

impl Default for Inflight {
    fn default() -> Inflight {
        Inflight { stripes: (0..STRIPES).map(|_| Stripe::default()).collect() }
    }
}

/// The calling thread's stripe: given out in turn, once per thread.
fn my_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static MINE: Cell<usize> = const { Cell::new(usize::MAX) });
    MINE.with(|m| {
        if m.get() == usize::MAX {
            m.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        }
        m.get()
    })
}

impl Inflight {
    /// Counts one more in flight; returns the stripe that [`sub`](Self::sub)
    /// must lower. SeqCst: before the caller's read of the handle's state.
    pub(crate) fn add(&self) -> usize {
        let i = my_stripe();
        self.stripes[i].0.fetch_add(1, Ordering::SeqCst);
        i
    }

    /// One fewer in flight, on the stripe [`add`](Self::add) returned.
    pub(crate) fn sub(&self, stripe: usize) {
        let before = self.stripes[stripe].0.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "in-flight stripe {stripe} lowered below zero");
    }

    /// What is in flight now. SeqCst: after the closer's state change.
    pub(crate) fn total(&self) -> usize {
        self.stripes.iter().map(|s| s.0.load(Ordering::SeqCst)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn raised_on_one_thread_lowered_on_another() {
        let f = Arc::new(Inflight::default());
        let stripes: Vec<usize> = (0..8)
            .map(|_| {
                let f = f.clone();
                std::thread::spawn(move || f.add()).join().unwrap()
            })
            .collect();
        assert_eq!(f.total(), 8);
        let g = f.clone();
        std::thread::spawn(move || stripes.iter().for_each(|&s| g.sub(s))).join().unwrap();
        assert_eq!(f.total(), 0);
    }

    #[test]
    fn threads_get_different_stripes() {
        let f = Arc::new(Inflight::default());
        let got: std::collections::HashSet<usize> =
            (0..4).map(|_| std::thread::spawn(my_stripe).join().unwrap()).collect();
        assert_eq!(got.len(), 4);
        drop(f);
    }
}
