//! Batch mode: batches of N requests, submitted at once and waited for whole.

use super::*;

impl Run<'_> {
    /// Batch mode: batches of `n` requests, each submitted at once and
    /// waited for whole. The histogram holds batch latencies.
    pub(super) fn batch_loop(&self, tid: usize, threads: usize, s: &Slots, n: usize) -> ThreadResult {
        let mut r = ThreadResult::default();
        let batch = match self.handle.batch(n) {
            Ok(b) => b,
            Err(e) => {
                Self::record_error(&mut r, e);
                return r;
            }
        };
        let mut rng = Rng(0x1234_5678_9abc_def1 ^ (tid as u64 + 1).wrapping_mul(0x9e37_79b9));
        let mut seq = 0u64;
        let mut ios: Vec<BatchIo> = Vec::with_capacity(n);
        let mut events: Vec<ugds::BatchEvent> = Vec::with_capacity(n);
        // Fault the vectors' pages in now, not in the first batch.
        for s in ios.spare_capacity_mut() {
            *s = std::mem::MaybeUninit::zeroed();
        }
        for s in events.spare_capacity_mut() {
            *s = std::mem::MaybeUninit::zeroed();
        }
        let size = self.size;
        let op = if self.mode.writes() { BatchOp::Write } else { BatchOp::Read };
        // Fills `ios` with the next batch (empty when the run is over).
        let mut fill = |ios: &mut Vec<BatchIo>| {
            ios.clear();
            while ios.len() < n && self.take() {
                let off = self.offset(tid, threads, &mut seq, &mut rng);
                let slot = ios.len();
                if self.mode.writes() && self.verify {
                    // SAFETY: no I/O is in flight on this slot.
                    unsafe { fill_pattern(s.base.add(slot * size), size, off) };
                }
                ios.push(BatchIo {
                    op,
                    buf: s.token,
                    size,
                    file_offset: off,
                    buf_offset: slot * size,
                    cookie: slot as u64,
                });
            }
        };
        // Submits a batch and waits for all of it; its latency, or None
        // after an error (recorded).
        let run = |b: &ugds::Batch, ios: &[BatchIo], events: &mut Vec<ugds::BatchEvent>, r: &mut ThreadResult| {
            let t0 = Instant::now();
            let k = ios.len();
            let res = b.submit(ios).and_then(|d| {
                events.clear();
                b.get_status(k, k, None, events).map(|_| d)
            });
            let lat = t0.elapsed();
            match res {
                Ok(d) => r.doorbells += d as u64,
                Err(e) => {
                    Self::record_error(r, e);
                    return None;
                }
            }
            r.batches += 1;
            for e in events.iter() {
                match &e.result {
                    Ok(b) => {
                        r.ios += 1;
                        r.bytes += *b as u64;
                    }
                    Err(err) => {
                        r.errors += 1;
                        r.first_error.get_or_insert_with(|| err.to_string());
                    }
                }
            }
            Some(lat)
        };
        // The first batch of a context, measured on FIRST_BATCHES fresh
        // contexts (set up, one batch, dropped): their median is reported.
        let mut firsts = Vec::with_capacity(FIRST_BATCHES);
        for _ in 0..FIRST_BATCHES {
            let fresh = match self.handle.batch(n) {
                Ok(b) => b,
                Err(e) => {
                    Self::record_error(&mut r, e);
                    return r;
                }
            };
            fill(&mut ios);
            if ios.is_empty() {
                break;
            }
            match run(&fresh, &ios, &mut events, &mut r) {
                Some(lat) => firsts.push(lat),
                None => return r,
            }
        }
        firsts.sort();
        r.first_batch = firsts.get(firsts.len() / 2).copied();
        while !self.stop.load(Ordering::Relaxed) {
            fill(&mut ios);
            if ios.is_empty() {
                break;
            }
            let k = ios.len();
            let Some(lat) = run(&batch, &ios, &mut events, &mut r) else { break };
            r.hist.record(lat.as_nanos() as u64);
            if self.verify {
                if self.mode.writes() {
                    // Read the batch back into the same slots.
                    for io in ios.iter_mut() {
                        io.op = BatchOp::Read;
                        // SAFETY: the write completed; the slot is idle.
                        unsafe { std::ptr::write_bytes(s.base.add(io.buf_offset), 0, size) };
                    }
                    events.clear();
                    if let Err(e) = batch.submit(&ios).and_then(|_| batch.get_status(k, k, None, &mut events)) {
                        Self::record_error(&mut r, e);
                        break;
                    }
                }
                for io in &ios {
                    // SAFETY: every request of the batch has completed.
                    r.mismatches += unsafe { check_pattern(s.base.add(io.buf_offset), size, io.file_offset) };
                    r.checked += 1;
                }
            }
            self.done_ios.fetch_add(k as u64, Ordering::Relaxed);
        }
        r
    }
}
