//! A lock-free look at a queue pair's completion ring.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use ugds_nvme::Cqe;
use ugds_platform::dma::DmaBuffer;

/// A read-only view of a completion ring's phase tags, so that threads
/// waiting on a shared queue pair can see that something completed without
/// taking its lock. It shares the ring's memory (an `Arc`), so it stays
/// valid however long it outlives the queue pair.
pub struct CqView {
    /// The ring; none for a queue whose entries are not ours to read (the
    /// kernel path's), which `is_new` answers with `assume`.
    ring: Option<Arc<DmaBuffer>>,
    entries: u32,
    assume: bool,
    /// Without a ring: work in flight that only a look finishes (the
    /// kernel path's copies to and from GPU memory), while non-zero.
    busy: Option<Arc<AtomicU32>>,
}

impl std::fmt::Debug for CqView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqView").field("entries", &self.entries).finish_non_exhaustive()
    }
}

impl CqView {
    /// A view of `ring`, of `entries` entries.
    pub(crate) fn ring(ring: Arc<DmaBuffer>, entries: u32) -> CqView {
        CqView { ring: Some(ring), entries, assume: false, busy: None }
    }

    /// A view with no ring to read: it answers `new`, or true while
    /// `busy` is non-zero.
    pub fn kernel(new: bool, busy: Arc<AtomicU32>) -> CqView {
        CqView { ring: None, entries: 0, assume: new, busy: Some(busy) }
    }

    /// The work in flight that only a look finishes (0 with a ring).
    pub fn busy(&self) -> u32 {
        self.busy.as_ref().map_or(0, |b| b.load(Ordering::Acquire))
    }

    /// Whether the entry at `head` carries phase `phase` (is new). Panics
    /// if `head` is outside the ring.
    #[inline]
    pub fn is_new(&self, head: u32, phase: bool) -> bool {
        let Some(ring) = &self.ring else {
            return self.assume || self.busy.as_ref().is_some_and(|b| b.load(Ordering::Acquire) != 0);
        };
        assert!(head < self.entries, "completion entry {head} outside a ring of {}", self.entries);
        let dw3 = ring.load_u32_acquire(head as usize * Cqe::SIZE + 12);
        (dw3 >> 16) & 1 == phase as u32
    }

    /// As [`CqView::is_new`], but without a ring only what `new` says:
    /// work in flight is not a completion.
    pub fn posted(&self, head: u32, phase: bool) -> bool {
        match &self.ring {
            None => self.assume,
            Some(_) => self.is_new(head, phase),
        }
    }
}
