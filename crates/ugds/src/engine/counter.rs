//! A counter with one writer at a time: a plain load and store of an
//! atomic word (see `stats`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A counter with one writer at a time (see the module docs).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`; only by the queue pair's current user.
    #[inline(always)]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    /// Sets the value; only by the queue pair's current user, publishing a
    /// count it keeps in its own memory.
    #[inline(always)]
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }

    /// Adds `n` from any thread (a read-modify-write: for rare events).
    #[inline]
    pub fn add_shared(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    /// The value now.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}
