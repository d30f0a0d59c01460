//! Queue depth 1: one synchronous call at a time per thread.

use super::*;

impl Run<'_> {
    /// Queue depth 1: synchronous calls.
    pub(super) fn sync_loop(&self, tid: usize, threads: usize, s: &Slots) -> ThreadResult {
        let mut r = ThreadResult::default();
        let mut rng = Rng(0x1234_5678_9abc_def1 ^ (tid as u64 + 1).wrapping_mul(0x9e37_79b9));
        let mut seq = 0u64;
        let mut pending_progress = 0u64;
        // Timed when this reaches 0 (one call in `sample`).
        let mut countdown = 1u32;
        while !self.stop.load(Ordering::Relaxed) && self.take() {
            let off = self.offset(tid, threads, &mut seq, &mut rng);
            if self.mode.writes() && self.verify {
                // SAFETY: the slot is ours and idle.
                unsafe { fill_pattern(s.base, self.size, off) };
            }
            countdown -= 1;
            let timed = countdown == 0;
            let t0 = if timed { self.clock.now() } else { 0 };
            let res = if self.mode.writes() {
                self.handle.write(&s.token, self.size, off, 0)
            } else {
                self.handle.read(&s.token, self.size, off, 0)
            };
            if timed {
                r.hist.record(self.clock.ns(t0, self.clock.now()));
                countdown = self.sample;
            }
            match res {
                Ok(n) => {
                    r.ios += 1;
                    r.bytes += n as u64;
                }
                Err(e) => {
                    Self::record_error(&mut r, e);
                    break;
                }
            }
            if self.verify {
                if self.mode.writes() {
                    // SAFETY: idle slot.
                    unsafe { std::ptr::write_bytes(s.base, 0, self.size) };
                    if let Err(e) = self.handle.read(&s.token, self.size, off, 0) {
                        Self::record_error(&mut r, e);
                        break;
                    }
                }
                // SAFETY: idle slot, fully written by the completed read.
                r.mismatches += unsafe { check_pattern(s.base, self.size, off) };
                r.checked += 1;
            }
            pending_progress += 1;
            if pending_progress == 64 {
                self.done_ios.fetch_add(64, Ordering::Relaxed);
                pending_progress = 0;
            }
        }
        self.done_ios.fetch_add(pending_progress, Ordering::Relaxed);
        r
    }
}
