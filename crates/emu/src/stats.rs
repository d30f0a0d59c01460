//! The counters the emulated controller keeps.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters the controller keeps; tests read them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EmuStats {
    /// Commands fetched from any submission queue.
    pub commands: u64,
    /// Completion entries written to any completion queue (counted once
    /// the entries are in place, unlike the counters below).
    pub completions_posted: u64,
    /// Read commands completed successfully.
    pub reads: u64,
    /// Write commands completed successfully.
    pub writes: u64,
    /// Bytes moved by reads.
    pub bytes_read: u64,
    /// Bytes moved by writes.
    pub bytes_written: u64,
    /// DMA faults: PRPs or queue addresses that were unmapped or misaligned.
    pub dma_faults: u64,
    /// Doorbell writes with a value outside the queue, or for no queue.
    pub invalid_doorbells: u64,
    /// Interrupts signalled.
    pub interrupts: u64,
    /// Doorbell writes the driver made (submission and completion).
    pub doorbell_writes: u64,
    /// Completions deliberately dropped by fault injection.
    pub lost_completions: u64,
    /// Controller resets (CC.EN 1 to 0).
    pub resets: u64,
}

/// Counters the driver side bumps (in `write32`), kept off the cache lines
/// the controller thread writes.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct DriverCounters {
    pub(crate) doorbell_writes: AtomicU64,
    pub(crate) invalid_doorbells: AtomicU64,
}

#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Counters {
    pub(crate) commands: AtomicU64,
    pub(crate) completions_posted: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) dma_faults: AtomicU64,
    pub(crate) invalid_doorbells: AtomicU64,
    pub(crate) interrupts: AtomicU64,
    pub(crate) lost_completions: AtomicU64,
    pub(crate) resets: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self, d: &DriverCounters) -> EmuStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EmuStats {
            commands: l(&self.commands),
            completions_posted: self.completions_posted.load(Ordering::Acquire),
            reads: l(&self.reads),
            writes: l(&self.writes),
            bytes_read: l(&self.bytes_read),
            bytes_written: l(&self.bytes_written),
            dma_faults: l(&self.dma_faults),
            invalid_doorbells: l(&self.invalid_doorbells) + l(&d.invalid_doorbells),
            interrupts: l(&self.interrupts),
            doorbell_writes: l(&d.doorbell_writes),
            lost_completions: l(&self.lost_completions),
            resets: l(&self.resets),
        }
    }
}
