//! Stream mode: requests enqueued on a host stream, `qd` ahead of the oldest unfinished one.

use super::*;

impl Run<'_> {
    /// Stream mode: requests enqueued on a host stream, `qd` ahead of the
    /// oldest unfinished one. Latency is from enqueue to the result being
    /// seen, queueing on the stream included.
    pub(super) fn stream_loop(&self, tid: usize, threads: usize, s: &Slots) -> ThreadResult {
        let mut r = ThreadResult::default();
        let stream = HostStream::new();
        let mut rng = Rng(0x1234_5678_9abc_def1 ^ (tid as u64 + 1).wrapping_mul(0x9e37_79b9));
        let mut seq = 0u64;
        let size = self.size;
        let mut ring: std::collections::VecDeque<(Arc<StreamResult>, Instant, usize, u64)> = Default::default();
        let mut next_slot = 0usize;
        let mut last_off: Vec<Option<u64>> = vec![None; self.qd];
        let mut stopping = false;
        loop {
            if !stopping && (self.stop.load(Ordering::Relaxed)) {
                stopping = true;
            }
            if !stopping && ring.len() < self.qd {
                if !self.take() {
                    stopping = true;
                    continue;
                }
                let off = self.offset(tid, threads, &mut seq, &mut rng);
                let slot = next_slot;
                next_slot = (next_slot + 1) % self.qd;
                if self.mode.writes() && self.verify {
                    // SAFETY: the slot's previous request has completed.
                    unsafe { fill_pattern(s.base.add(slot * size), size, off) };
                }
                let (io, res) = StreamIo::new(size, off, slot * size);
                let t0 = Instant::now();
                let q = if self.mode.writes() {
                    self.handle.write_async(&s.token, io, &stream)
                } else {
                    self.handle.read_async(&s.token, io, &stream)
                };
                if let Err(e) = q {
                    Self::record_error(&mut r, e);
                    stopping = true;
                    continue;
                }
                ring.push_back((res, t0, slot, off));
                last_off[slot] = Some(off);
                continue;
            }
            let Some((res, t0, slot, off)) = ring.front() else { break };
            if !res.is_done() {
                // The stream's own threads do the work: give them the core.
                std::thread::yield_now();
                continue;
            }
            r.hist.record(t0.elapsed().as_nanos() as u64);
            let n = res.bytes();
            if n < 0 {
                r.errors += 1;
                r.first_error
                    .get_or_insert_with(|| res.take_error().map_or(format!("errno {}", -n), |e| e.to_string()));
            } else {
                r.ios += 1;
                r.bytes += n as u64;
                if self.verify && !self.mode.writes() {
                    // SAFETY: the read into this slot has completed.
                    r.mismatches += unsafe { check_pattern(s.base.add(slot * size), size, *off) };
                    r.checked += 1;
                }
            }
            ring.pop_front();
            self.done_ios.fetch_add(1, Ordering::Relaxed);
        }
        stream.synchronize();
        if self.verify && self.mode.writes() {
            // Read back what each slot wrote last, and check it.
            for (slot, off) in last_off.iter().enumerate() {
                let Some(off) = *off else { continue };
                // SAFETY: the stream is idle; no I/O is in flight on the slot.
                unsafe { std::ptr::write_bytes(s.base.add(slot * size), 0, size) };
                if let Err(e) = self.handle.read(&s.token, size, off, slot * size) {
                    Self::record_error(&mut r, e);
                    break;
                }
                // SAFETY: the read completed.
                r.mismatches += unsafe { check_pattern(s.base.add(slot * size), size, off) };
                r.checked += 1;
            }
        }
        r
    }
}
