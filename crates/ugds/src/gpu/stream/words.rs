//! The device-mapped words streams wait on, and their pool.

use super::StreamBackend;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use ugds_platform::Result;

/// Bytes of one stream's words: `done` at 0 (host writes, GPU waits on it),
/// `passed` at 4 (GPU writes, host reads) and `reach` at 8 (GPU writes when
/// it reaches an operation, the dispatcher reads); a cache line, so that two
/// streams' words never share one.
pub(super) const SLOT: usize = 64;
/// Bytes the pool asks the runtime for at a time.
pub(crate) const WORD_PAGE: usize = 4096;
/// `passed` before the GPU has written it.
pub(super) const NOT_PASSED: u32 = u32::MAX;

/// One stream's two words: host address and the device's address of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(super) host: usize,
    pub(super) dev: u64,
}

impl Slot {
    pub(super) fn done(&self) -> &AtomicU32 {
        // SAFETY: a slot lies in a pool page, which is never freed; aligned
        // to 64 bytes.
        unsafe { &*(self.host as *const AtomicU32) }
    }

    pub(super) fn passed(&self) -> &AtomicU32 {
        // SAFETY: as for `done`, 4 bytes further.
        unsafe { &*((self.host + 4) as *const AtomicU32) }
    }

    pub(super) fn reach(&self) -> &AtomicU32 {
        // SAFETY: as for `done`, 8 bytes further.
        unsafe { &*((self.host + 8) as *const AtomicU32) }
    }

    /// The device address of `reach`.
    pub(super) fn reach_dev(&self) -> u64 {
        self.dev + 8
    }
}

/// Device-mapped words for streams, per runtime context. Pages come from
/// the runtime (`cuMemHostAlloc`) and are never given back while the
/// process runs: freeing pinned memory synchronizes the device, and a
/// stream the caller destroyed may still be waiting on a word. A slot is
/// reused only once the GPU has written its last `passed` value, so no
/// stream can still read it.
#[derive(Default)]
pub(crate) struct WordPool {
    pub(super) free: Vec<Slot>,
    /// Slots of dropped streams, with the `passed` value that frees them.
    pub(super) retired: Vec<(Slot, u32)>,
    /// Pages allocated.
    pages: usize,
    /// Streams with device-side waits enqueued, and the value of the last
    /// one: (slot, value); forgotten once passed.
    pub(super) pending: Vec<(Slot, u32)>,
}

/// Streams of a context that may wait on the device at once. The CUDA
/// driver blocks the thread that enqueues a wait beyond what its hardware
/// queues hold (measured on an H200 with the default 8 queues: the 33rd to
/// 40th stream waiting on memory blocks the enqueue), and it blocks there
/// holding its process-wide lock, so no other CUDA call in the process can
/// proceed. Beyond this budget ugds waits on the host, without any lock of
/// the driver, for earlier waits to pass.
pub(super) const MAX_PENDING_WAITS: usize = 16;

/// Points (see `reach`) one stream may have ahead of the GPU. One stream
/// took 511 waits, each with a write after it, before the enqueue blocked
/// (bench/cuda-probes/one_stream.c); an operation here enqueues up to two
/// writes, a wait and a kernel per point.
pub(super) const MAX_STREAM_DEPTH: u32 = 64;

/// How long an operation waits for the budget before it is enqueued anyway
/// (when the waits ahead of it depend on work that comes only later).
pub(super) const BUDGET_PATIENCE: Duration = Duration::from_secs(5);

pub(super) fn has_passed(slot: &Slot, value: u32) -> bool {
    // Acquire: pairs with the GPU's write of `passed` after its wait.
    let p = slot.passed().load(Ordering::Acquire);
    p != NOT_PASSED && p.wrapping_sub(value) as i32 >= 0
}

impl WordPool {
    pub(super) fn take(&mut self, backend: &dyn StreamBackend) -> Result<Slot> {
        self.sweep();
        if self.free.is_empty() {
            let (host, dev) = backend.alloc_page()?;
            self.pages += 1;
            // Last first, so that slots are handed out in address order.
            for off in (0..WORD_PAGE).step_by(SLOT).rev() {
                self.free.push(Slot { host: host + off, dev: dev + off as u64 });
            }
        }
        let slot = self.free.pop().expect("a page was just added");
        // A free slot's waits have all passed; forget any still listed.
        self.pending.retain(|(s, _)| *s != slot);
        // Release: nothing reads the slot now (it was free); the GPU reads
        // these values only after the wait that is enqueued later.
        slot.done().store(0, Ordering::Release);
        slot.reach().store(0, Ordering::Release);
        slot.passed().store(NOT_PASSED, Ordering::Release);
        Ok(slot)
    }

    /// Moves retired slots whose last wait the GPU has passed to `free`.
    pub(super) fn sweep(&mut self) {
        let free = &mut self.free;
        // Acquire: pairs with the GPU's write of `passed`, its last access.
        self.retired.retain(|(slot, last)| {
            let gone = slot.passed().load(Ordering::Acquire) == *last;
            if gone {
                free.push(*slot);
            }
            !gone
        });
    }

    /// Counts the streams with waits not yet passed, after forgetting
    /// those passed.
    #[cfg(test)]
    pub(super) fn pending_waits(&mut self) -> usize {
        self.pending.retain(|(s, v)| !has_passed(s, *v));
        self.pending.len()
    }

    /// Whether `slot` may enqueue a wait for `value` now: it already waits
    /// (and stays within [`MAX_STREAM_DEPTH`] of the GPU), or fewer than
    /// [`MAX_PENDING_WAITS`] streams do. If so, it is counted.
    pub(super) fn try_reserve(&mut self, slot: Slot, value: u32) -> bool {
        self.pending.retain(|(s, v)| !has_passed(s, *v));
        let passed = slot.passed().load(Ordering::Acquire);
        let waiting = self.pending.len();
        match self.pending.iter_mut().find(|(s, _)| *s == slot) {
            Some(entry) => {
                // `passed` is NOT_PASSED only before the probe's write.
                let behind = if passed == NOT_PASSED { 0 } else { value.wrapping_sub(passed) };
                if behind > MAX_STREAM_DEPTH {
                    return false;
                }
                entry.1 = value;
                true
            }
            None if waiting < MAX_PENDING_WAITS => {
                self.pending.push((slot, value));
                true
            }
            None => false,
        }
    }

    /// Counts `slot` as waiting for `value` whatever the budget.
    pub(super) fn force_reserve(&mut self, slot: Slot, value: u32) {
        match self.pending.iter_mut().find(|(s, _)| *s == slot) {
            Some(entry) => entry.1 = value,
            None => self.pending.push((slot, value)),
        }
    }

    /// `(pages allocated, slots waiting for their stream to pass)`.
    #[cfg(test)]
    pub(super) fn usage(&mut self) -> (usize, usize) {
        self.sweep();
        (self.pages, self.retired.len())
    }
}
