//! Deeper queues: one `IoQueue` per thread kept `qd` requests full.

use super::*;

impl Run<'_> {
    /// Deeper queues: one lent IoQueue kept `qd` requests full.
    pub(super) fn async_loop(&self, tid: usize, threads: usize, s: &Slots) -> ThreadResult {
        let mut r = ThreadResult::default();
        let mut q = match self.handle.io_queue() {
            Ok(q) => q,
            Err(e) => {
                Self::record_error(&mut r, e);
                return r;
            }
        };
        let mut rng = Rng(0x1234_5678_9abc_def1 ^ (tid as u64 + 1).wrapping_mul(0x9e37_79b9));
        let mut seq = 0u64;
        // Per slot: namespace offset, submit time, and whether a verifying
        // write is now being read back.
        let mut slot_off = vec![0u64; self.qd];
        let mut slot_t0 = vec![0u64; self.qd];
        let mut slot_readback = vec![false; self.qd];
        let mut done: Vec<(u64, Result<usize, ugds::Error>)> = Vec::with_capacity(self.qd);
        let size = self.size;
        // A request that does not fit (QueueFull) waits in the backlog.
        let submit = |q: &mut ugds::IoQueue<'_>, slot: usize, off: u64, read: bool| -> Result<(), ugds::Error> {
            if read {
                q.submit_read(&s.token, size, off, slot * size, slot as u64)
            } else {
                q.submit_write(&s.token, size, off, slot * size, slot as u64)
            }
        };
        let mut backlog: Vec<usize> = Vec::new();
        let start_slot = |slot: usize, rng: &mut Rng, seq: &mut u64, slot_off: &mut [u64]| {
            let off = self.offset(tid, threads, seq, rng);
            slot_off[slot] = off;
            if self.mode.writes() && self.verify {
                // SAFETY: this slot has no I/O in flight.
                unsafe { fill_pattern(s.base.add(slot * size), size, off) };
            }
        };
        let mut stopping = false;
        for slot in 0..self.qd {
            if !self.take() {
                stopping = true;
                break;
            }
            start_slot(slot, &mut rng, &mut seq, &mut slot_off);
            slot_t0[slot] = self.clock.now();
            match submit(&mut q, slot, slot_off[slot], !self.mode.writes()) {
                Ok(()) => {}
                Err(ugds::Error::QueueFull) => backlog.push(slot),
                Err(e) => {
                    Self::record_error(&mut r, e);
                    return r;
                }
            }
        }
        let mut pending_progress = 0u64;
        loop {
            done.clear();
            let n = q.poll(usize::MAX, |tag, res| done.push((tag, res)));
            if n == 0 {
                if stopping && q.outstanding() == 0 {
                    break;
                }
                if !backlog.is_empty() {
                    let slot = backlog.pop().expect("non-empty");
                    slot_t0[slot] = self.clock.now();
                    if let Err(ugds::Error::QueueFull) = submit(&mut q, slot, slot_off[slot], !self.mode.writes()) {
                        backlog.push(slot);
                    }
                    continue;
                }
                q.wait(Duration::from_millis(100));
                continue;
            }
            let now = self.clock.now();
            if !stopping && self.stop.load(Ordering::Relaxed) {
                stopping = true;
            }
            for (tag, res) in done.drain(..) {
                let slot = tag as usize;
                let mut next_is_readback = false;
                match res {
                    Ok(bytes) => {
                        if slot_readback[slot] {
                            // SAFETY: the read-back into this slot completed.
                            r.mismatches += unsafe { check_pattern(s.base.add(slot * size), size, slot_off[slot]) };
                            r.checked += 1;
                            slot_readback[slot] = false;
                        } else {
                            r.hist.record(self.clock.ns(slot_t0[slot], now));
                            r.ios += 1;
                            r.bytes += bytes as u64;
                            pending_progress += 1;
                            if self.verify && !self.mode.writes() {
                                // SAFETY: the read into this slot completed.
                                r.mismatches += unsafe { check_pattern(s.base.add(slot * size), size, slot_off[slot]) };
                                r.checked += 1;
                            } else if self.verify {
                                next_is_readback = true;
                            }
                        }
                    }
                    Err(e) => {
                        Self::record_error(&mut r, e);
                        stopping = true;
                    }
                }
                if !next_is_readback && (stopping || !self.take()) {
                    stopping = true;
                    continue;
                }
                let read = if next_is_readback {
                    slot_readback[slot] = true;
                    // SAFETY: idle slot.
                    unsafe { std::ptr::write_bytes(s.base.add(slot * size), 0, size) };
                    true
                } else {
                    start_slot(slot, &mut rng, &mut seq, &mut slot_off);
                    !self.mode.writes()
                };
                slot_t0[slot] = now;
                match submit(&mut q, slot, slot_off[slot], read) {
                    Ok(()) => {}
                    Err(ugds::Error::QueueFull) => backlog.push(slot),
                    Err(e) => {
                        Self::record_error(&mut r, e);
                        stopping = true;
                    }
                }
            }
            if pending_progress >= 64 {
                self.done_ios.fetch_add(pending_progress, Ordering::Relaxed);
                pending_progress = 0;
            }
            if stopping && q.outstanding() == 0 {
                break;
            }
        }
        self.done_ios.fetch_add(pending_progress, Ordering::Relaxed);
        if let Err(e) = q.drain(|_, _| {}) {
            Self::record_error(&mut r, e);
        }
        r
    }
}
