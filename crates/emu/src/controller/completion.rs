//! The completion side: posting entries (and the lies a broken controller
//! tells), delayed completions, interrupts.

use super::*;

#[derive(Clone, Copy)]
pub(super) struct Completion {
    pub(super) sqid: u16,
    pub(super) cid: u16,
    pub(super) dw0: u32,
    pub(super) status: Status,
    /// A broken controller's completion: what it reports (see `Lie`).
    pub(super) lie: Lie,
}

/// How a completion entry is posted wrong (fault injection).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Lie {
    #[default]
    None,
    /// This SQ head instead of the real one.
    SqHead(u16),
    /// The new phase tag over the slot's stale fields; the real entry is
    /// never seen (it lands in the slot the host already consumed).
    EarlyPhase,
}

pub(super) struct Delayed {
    pub(super) due: Instant,
    pub(super) seq: u64,
    pub(super) c: Completion,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(o.due, o.seq))
    }
}

impl Controller {
    pub(super) fn complete(&mut self, c: Completion) {
        let Some(sq) = self.sqs.get(c.sqid as usize).and_then(|q| q.as_ref()) else { return };
        let cqid = sq.cqid as usize;
        if let Some(cq) = self.cqs[cqid].as_mut() {
            cq.pending.push_back(c);
            self.flush_cq(cqid);
        }
    }

    /// Posts pending completions while the completion queue has room.
    pub(super) fn flush_cq(&mut self, cqid: usize) -> bool {
        let head = self.reg(regs::cq_head_doorbell(cqid as u16, 0));
        let Some(cq) = self.cqs[cqid].as_mut() else { return false };
        if head >= cq.ring.size() {
            if head != cq.last_head {
                cq.last_head = head;
                self.shared.stats.invalid_doorbells.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(cqid, head, "emulator: CQ head doorbell outside the queue, ignored");
            }
            return false;
        }
        cq.last_head = head;
        let mut posted = 0;
        while let Some(&c) = cq.pending.front() {
            if cq.ring.is_full(head, cq.tail) {
                break;
            }
            let Some(mem) = cq.mem.as_ref() else { break };
            let mut sqhd = self.sqs.get(c.sqid as usize).and_then(|s| s.as_ref()).map_or(0, |s| s.head);
            let off = cq.tail as usize * ugds_nvme::Cqe::SIZE;
            if let Lie::SqHead(h) = c.lie {
                sqhd = h as u32;
            }
            if c.lie == Lie::EarlyPhase {
                // Only the phase bit of the stale entry flips.
                let stale = mem.read_u32(off + 12);
                mem.store_u32_release(off + 12, stale & !(1 << 16) | (cq.phase as u32) << 16);
            } else {
                mem.write_u32(off, c.dw0);
                mem.write_u32(off + 4, 0);
                mem.write_u32(off + 8, sqhd | (c.sqid as u32) << 16);
                // The phase tag goes last, with release ordering: a host that
                // sees the new phase sees the fields above and the data moved.
                mem.store_u32_release(off + 12, c.cid as u32 | (c.status.to_field(cq.phase) as u32) << 16);
            }
            cq.tail += 1;
            if cq.tail == cq.ring.size() {
                cq.tail = 0;
                cq.phase = !cq.phase;
            }
            cq.pending.pop_front();
            cq.fresh = true;
            posted += 1;
        }
        if posted > 0 {
            // After the entries: a host that sees the count sees them.
            self.shared.stats.completions_posted.fetch_add(posted, Ordering::Release);
        }
        posted > 0
    }

    pub(super) fn release_due(&mut self) -> bool {
        let now = Instant::now();
        let mut did = false;
        while self.delayed.peek().is_some_and(|d| d.0.due <= now) {
            let d = self.delayed.pop().expect("peeked").0;
            self.complete(d.c);
            did = true;
        }
        did
    }

    pub(super) fn raise_interrupts(&mut self) {
        for cq in self.cqs.iter_mut().flatten() {
            if cq.fresh {
                cq.fresh = false;
                if cq.ien {
                    if let Some(v) = self.shared.vectors.get(cq.iv as usize) {
                        v.signal();
                        self.shared.stats.interrupts.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}
