//! Admin commands: Identify, queue creation and deletion, features, Abort,
//! log pages.

use super::*;

impl Controller {
    pub(super) fn admin(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let Some(op) = AdminOpcode::from_u8(sqe.opcode()) else {
            return done(Status::generic(generic::INVALID_OPCODE));
        };
        match op {
            AdminOpcode::Identify => self.identify(sqe, table),
            AdminOpcode::SetFeatures => self.set_features(sqe),
            AdminOpcode::GetFeatures => match (sqe.cdw10 & 0xff) as u8 {
                feature::NUMBER_OF_QUEUES => ok((self.granted.0 as u32 - 1) | (self.granted.1 as u32 - 1) << 16),
                _ => ok(0),
            },
            AdminOpcode::CreateIoCq => self.create_cq(sqe, table),
            AdminOpcode::CreateIoSq => self.create_sq(sqe, table),
            AdminOpcode::DeleteIoSq => self.delete_sq(sqe),
            AdminOpcode::DeleteIoCq => self.delete_cq(sqe),
            AdminOpcode::GetLogPage => self.get_log_page(sqe, table),
            AdminOpcode::Abort => self.abort(sqe),
            AdminOpcode::AsyncEventRequest => {
                if self.aers >= AER_LIMIT {
                    return done(Status::command_specific(0x05));
                }
                self.aers += 1;
                Outcome::None
            }
            AdminOpcode::DoorbellBufferConfig => done(Status::generic(generic::INVALID_OPCODE)),
        }
    }

    /// Abort (section 5.1): a command still held by the controller (stalled
    /// by fault injection or the latency model) completes at once with
    /// Command Abort Requested and dword 0 bit 0 clear. Anything else (done,
    /// or lost) is not aborted: bit 0 set, which a controller may always say.
    pub(super) fn abort(&mut self, sqe: &Sqe) -> Outcome {
        let (sqid, cid) = ((sqe.cdw10 & 0xffff) as u16, (sqe.cdw10 >> 16) as u16);
        let all = std::mem::take(&mut self.delayed).into_vec();
        let (hit, rest): (Vec<_>, Vec<_>) = all.into_iter().partition(|d| d.0.c.sqid == sqid && d.0.c.cid == cid);
        self.delayed = rest.into_iter().collect();
        match hit.into_iter().next() {
            Some(d) => {
                self.complete(Completion { status: Status::generic(generic::ABORT_REQUESTED), dw0: 0, ..d.0.c });
                ok(0)
            }
            None => ok(1),
        }
    }

    pub(super) fn identify(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let data: [u8; IDENTIFY_LEN] = match (sqe.cdw10 & 0xff) as u8 {
            cns::CONTROLLER => IdentifyController {
                vid: 0,
                ssvid: 0,
                sn: "UGDSEMU0001".into(),
                mn: "ugds emulated controller".into(),
                fr: env!("CARGO_PKG_VERSION").into(),
                mdts: self.cfg.lies.mdts.unwrap_or(self.cfg.mdts),
                cntlid: 1,
                ver: regs::Version::V1_4.0,
                oacs: 0,
                acl: 3,
                sqes: 0x66,
                cqes: 0x44,
                nn: self.ns.len() as u32,
                oncs: IdentifyController::ONCS_DSM | IdentifyController::ONCS_WRITE_ZEROES,
                vwc: 0,
                // SGLs supported, no alignment requirement (as QEMU's).
                sgls: self.cfg.sgl as u32,
                ioccsz: 0,
            }
            .to_bytes(),
            cns::NAMESPACE => match self.namespace(sqe.nsid) {
                Some(ns) => {
                    let mut id = ns.identify();
                    let lies = self.cfg.lies;
                    if let Some(n) = lies.nsze {
                        (id.nsze, id.ncap, id.nuse) = (n, n, n);
                    }
                    if let Some(b) = lies.lbads {
                        let i = (id.flbas & 0xf) as usize;
                        id.lbaf[i].lbads = b;
                    }
                    if let Some(f) = lies.flbas {
                        id.flbas = f;
                    }
                    id.to_bytes()
                }
                None => return done(Status::generic(generic::INVALID_NAMESPACE)),
            },
            cns::ACTIVE_NS_LIST => {
                let mut b = [0u8; IDENTIFY_LEN];
                let ids = (1..=self.ns.len() as u32).filter(|&n| n > sqe.nsid);
                for (i, n) in ids.take(1024).enumerate() {
                    b[i * 4..i * 4 + 4].copy_from_slice(&n.to_le_bytes());
                }
                b
            }
            cns::NS_DESCRIPTORS => {
                if self.namespace(sqe.nsid).is_none() {
                    return done(Status::generic(generic::INVALID_NAMESPACE));
                }
                // The CSI descriptor alone (NIDT 04h, one byte).
                let mut b = [0u8; IDENTIFY_LEN];
                (b[0], b[1], b[4]) = (0x04, 1, self.cfg.lies.csi.unwrap_or(0));
                b
            }
            _ => return done(Status::generic(generic::INVALID_FIELD)),
        };
        match self.dma_write(table, sqe.prp1, sqe.prp2, &data) {
            Ok(()) => ok(0),
            Err(s) => done(s),
        }
    }

    pub(super) fn io_queues_exist(&self) -> bool {
        self.sqs.iter().skip(1).any(|q| q.is_some()) || self.cqs.iter().skip(1).any(|q| q.is_some())
    }

    pub(super) fn set_features(&mut self, sqe: &Sqe) -> Outcome {
        match (sqe.cdw10 & 0xff) as u8 {
            feature::NUMBER_OF_QUEUES => {
                if self.io_queues_exist() {
                    return done(Status::generic(generic::COMMAND_SEQUENCE_ERROR));
                }
                let (nsqr, ncqr) = (sqe.cdw11 & 0xffff, sqe.cdw11 >> 16);
                if nsqr == 0xffff || ncqr == 0xffff {
                    return done(Status::generic(generic::INVALID_FIELD));
                }
                let max = self.cfg.max_io_queues as u32;
                self.granted = ((nsqr + 1).min(max) as u16, (ncqr + 1).min(max) as u16);
                ok((self.granted.0 as u32 - 1) | (self.granted.1 as u32 - 1) << 16)
            }
            _ => ok(0),
        }
    }

    pub(super) fn queue_args(&self, sqe: &Sqe, granted: u16) -> Result<(usize, Ring), Status> {
        let qid = (sqe.cdw10 & 0xffff) as usize;
        let entries = (sqe.cdw10 >> 16) + 1;
        if qid == 0 || qid > granted as usize {
            return Err(Status::command_specific(cs::INVALID_QID));
        }
        if entries < 2 || entries > self.cfg.mqes as u32 + 1 {
            return Err(Status::command_specific(cs::INVALID_QUEUE_SIZE));
        }
        if sqe.cdw11 & 1 == 0 {
            // CAP.CQR: queues must be physically contiguous.
            return Err(Status::generic(generic::INVALID_FIELD));
        }
        if sqe.prp1 % self.page_size as u64 != 0 {
            return Err(Status::generic(generic::INVALID_PRP_OFFSET));
        }
        Ok((qid, Ring::new(entries)))
    }

    pub(super) fn create_cq(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let (qid, ring) = match self.queue_args(sqe, self.granted.1) {
            Ok(v) => v,
            Err(s) => return done(s),
        };
        if self.cqs[qid].is_some() {
            return done(Status::command_specific(cs::INVALID_QID));
        }
        let ien = sqe.cdw11 & 2 != 0;
        let iv = (sqe.cdw11 >> 16) as u16;
        if ien && iv as usize >= self.shared.vectors.len() {
            return done(Status::command_specific(cs::INVALID_INTERRUPT_VECTOR));
        }
        let Some(mem) = translate_region(table, sqe.prp1, ring.size() as usize * ugds_nvme::Cqe::SIZE) else {
            self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
            return done(Status::generic(generic::DATA_TRANSFER_ERROR));
        };
        self.set_reg(regs::cq_head_doorbell(qid as u16, 0), 0);
        self.cqs[qid] = Some(Cq {
            iova: sqe.prp1,
            ring,
            tail: 0,
            phase: true,
            iv,
            ien,
            mem: Some(mem),
            pending: VecDeque::new(),
            fresh: false,
            last_head: 0,
        });
        ok(0)
    }

    pub(super) fn create_sq(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let (qid, ring) = match self.queue_args(sqe, self.granted.0) {
            Ok(v) => v,
            Err(s) => return done(s),
        };
        // In use, or its delete is still waiting for its commands.
        if self.sqs[qid].is_some() || self.deleting.iter().any(|&(q, _)| q == qid) {
            return done(Status::command_specific(cs::INVALID_QID));
        }
        let cqid = (sqe.cdw11 >> 16) as u16;
        if cqid == 0 || self.cqs.get(cqid as usize).is_none_or(|c| c.is_none()) {
            return done(Status::command_specific(cs::INVALID_CQ));
        }
        let Some(mem) = translate_region(table, sqe.prp1, ring.size() as usize * Sqe::SIZE) else {
            self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
            return done(Status::generic(generic::DATA_TRANSFER_ERROR));
        };
        self.set_reg(regs::sq_tail_doorbell(qid as u16, 0), 0);
        self.sqs[qid] = Some(Sq { iova: sqe.prp1, ring, head: 0, cqid, mem: Some(mem), last_tail: 0 });
        ok(0)
    }

    pub(super) fn delete_sq(&mut self, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xffff) as usize;
        if qid == 0 || self.sqs.get(qid).is_none_or(|q| q.is_none()) {
            return done(Status::command_specific(cs::INVALID_QID));
        }
        // Commands still held (stalled) complete as aborted before the
        // queue goes away.
        let held: Vec<Delayed> = {
            let all = std::mem::take(&mut self.delayed).into_vec();
            let (mine, rest): (Vec<_>, Vec<_>) = all.into_iter().partition(|d| d.0.c.sqid as usize == qid);
            self.delayed = rest.into_iter().collect();
            mine.into_iter().map(|d| d.0).collect()
        };
        for d in held {
            self.complete(Completion { status: Status::generic(generic::ABORTED_SQ_DELETION), ..d.c });
        }
        self.sqs[qid] = None;
        // Commands on the workers or the GPU copy thread still move data:
        // the delete completes when they stop (`collect_jobs`), so that a
        // host that unmaps their memory after it is never copied into.
        // Their own completions are dropped (the queue is gone).
        if self.sq_jobs[qid] > 0 {
            self.deleting.push((qid, sqe.cid().0));
            return Outcome::None;
        }
        ok(0)
    }

    pub(super) fn delete_cq(&mut self, sqe: &Sqe) -> Outcome {
        let qid = (sqe.cdw10 & 0xffff) as usize;
        if qid == 0 || self.cqs.get(qid).is_none_or(|q| q.is_none()) {
            return done(Status::command_specific(cs::INVALID_QID));
        }
        if self.sqs.iter().flatten().any(|s| s.cqid as usize == qid) {
            return done(Status::command_specific(cs::INVALID_QUEUE_DELETION));
        }
        self.cqs[qid] = None;
        ok(0)
    }

    pub(super) fn get_log_page(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let lid = (sqe.cdw10 & 0xff) as u8;
        let numd = (sqe.cdw10 >> 16) | (sqe.cdw11 & 0xffff) << 16;
        let len = ((numd as usize + 1) * 4).min(IDENTIFY_LEN);
        let mut page = vec![0u8; len.max(512)];
        match lid {
            log_page::ERROR_INFO => {}
            log_page::SMART => {
                let s = self.shared.stats.snapshot(&self.shared.driver_stats);
                // Data Units Read / Written are in thousands of 512-byte units.
                let put = |p: &mut [u8], off: usize, v: u64| p[off..off + 8].copy_from_slice(&v.to_le_bytes());
                put(&mut page, 32, s.bytes_read.div_ceil(512_000));
                put(&mut page, 48, s.bytes_written.div_ceil(512_000));
                put(&mut page, 64, s.reads);
                put(&mut page, 80, s.writes);
                page[3] = 100; // Available Spare
                page[4] = 10; // Available Spare Threshold
                page[1..3].copy_from_slice(&(273u16 + 25).to_le_bytes()); // Composite Temperature, K
            }
            _ => return done(Status::command_specific(cs::INVALID_LOG_PAGE)),
        }
        match self.dma_write(table, sqe.prp1, sqe.prp2, &page[..len]) {
            Ok(()) => ok(0),
            Err(s) => done(s),
        }
    }
}
