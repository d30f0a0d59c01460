//! Controller state: enabling (CC.EN), reset, fatal status, and the
//! checks that follow a change of the host's memory.

use super::*;

impl Controller {
    pub(super) fn check_cc(&mut self) -> bool {
        let cc = self.reg(regs::CC);
        if cc == self.cc {
            return false;
        }
        let (old, new) = (Cc(self.cc), Cc(cc));
        self.cc = cc;
        if !old.en() && new.en() {
            self.enable(new);
        } else if old.en() && !new.en() {
            self.reset();
        }
        if new.en() && new.shn() != regs::shutdown::NONE && old.shn() == regs::shutdown::NONE {
            for n in self.ns.iter() {
                n.flush();
            }
            let csts = self.reg(regs::CSTS) & !(3 << 2);
            self.set_reg(regs::CSTS, csts | regs::shutdown::COMPLETE << 2);
        }
        true
    }

    pub(super) fn enable(&mut self, cc: Cc) {
        let aqa = Aqa(self.reg(regs::AQA));
        let asq = self.reg(regs::ASQ) as u64 | (self.reg(regs::ASQ + 4) as u64) << 32;
        let acq = self.reg(regs::ACQ) as u64 | (self.reg(regs::ACQ + 4) as u64) << 32;
        self.page_size = 4096 << cc.mps().min(4);
        let ps = self.page_size as u64;
        let ok = cc.mps() <= 4
            && cc.css() == 0
            && aqa.asq_entries() >= 2
            && aqa.acq_entries() >= 2
            && asq % ps == 0
            && acq % ps == 0
            && asq != 0
            && acq != 0;
        if !ok {
            tracing::warn!(?cc, ?aqa, asq, acq, "emulator: invalid admin queue configuration at enable");
            self.set_fatal();
            return;
        }
        self.cqs[0] = Some(Cq {
            iova: acq,
            ring: Ring::new(aqa.acq_entries()),
            tail: 0,
            phase: true,
            iv: 0,
            ien: true,
            mem: None,
            pending: VecDeque::new(),
            fresh: false,
            last_head: 0,
        });
        self.sqs[0] =
            Some(Sq { iova: asq, ring: Ring::new(aqa.asq_entries()), head: 0, cqid: 0, mem: None, last_tail: 0 });
        self.set_reg(regs::DOORBELL_BASE, 0);
        self.set_reg(regs::cq_head_doorbell(0, 0), 0);
        self.table_version = u64::MAX;
        self.enabled = true;
        self.set_reg(regs::CSTS, Csts::RDY);
    }

    /// Controller reset: every queue and every command in flight is dropped,
    /// and nothing is touched in host memory after CSTS.RDY reads 0.
    pub(super) fn reset(&mut self) {
        // No DMA after the controller is disabled: wait for the workers,
        // and drop what they finished (the queues go with the reset).
        for w in [self.workers.as_mut(), self.gpu_copies.as_mut()].into_iter().flatten() {
            w.drain();
        }
        self.sq_jobs.fill(0);
        self.deleting.clear();
        for q in self.sqs.iter_mut() {
            *q = None;
        }
        for q in self.cqs.iter_mut() {
            *q = None;
        }
        self.delayed.clear();
        self.duplicates.clear();
        self.enabled = false;
        self.fatal = false;
        self.aers = 0;
        self.granted = (self.cfg.max_io_queues, self.cfg.max_io_queues);
        self.shared.stats.resets.fetch_add(1, Ordering::Relaxed);
        for n in self.ns.iter() {
            n.flush();
        }
        self.set_reg(regs::CSTS, 0);
    }

    pub(super) fn set_fatal(&mut self) {
        self.fatal = true;
        let csts = self.reg(regs::CSTS);
        self.set_reg(regs::CSTS, csts | Csts::CFS);
    }

    /// Re-translates every queue's ring after the IOVA table changed. A
    /// queue whose memory was unmapped under it is a fatal DMA fault.
    pub(super) fn revalidate(&mut self, table: &IovaTable) {
        self.table_version = table.version;
        let mut lost = false;
        for sq in self.sqs.iter_mut().flatten() {
            sq.mem = translate_region(table, sq.iova, sq.ring.size() as usize * Sqe::SIZE);
            lost |= sq.mem.is_none();
        }
        for cq in self.cqs.iter_mut().flatten() {
            cq.mem = translate_region(table, cq.iova, cq.ring.size() as usize * ugds_nvme::Cqe::SIZE);
            lost |= cq.mem.is_none();
        }
        if lost {
            tracing::warn!("emulator: queue memory unmapped while the queue exists");
            self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
            self.set_fatal();
        }
    }
}
