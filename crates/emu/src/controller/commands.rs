//! NVM commands: reads, writes, flush, DSM, write zeroes; their PRPs, the
//! latency model, and the data moved for admin commands.

use super::*;

impl Controller {
    pub(super) fn run_command(&mut self, qid: u16, sqe: &Sqe, table: &IovaTable) -> Outcome {
        // SGLs for I/O commands where Identify says so; admin commands over
        // PCIe use PRPs.
        let sgl_ok = qid != 0 && self.cfg.sgl && sqe.psdt() == ugds_nvme::sgl::PSDT_SGL;
        if sqe.fuse() != 0 || (sqe.psdt() != 0 && !sgl_ok) {
            return done(Status::generic(generic::INVALID_FIELD));
        }
        if qid == 0 {
            self.admin(sqe, table)
        } else {
            self.io(sqe, table)
        }
    }

    pub(super) fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        nsid.checked_sub(1).and_then(|i| self.ns.get(i as usize))
    }

    pub(super) fn io(&mut self, sqe: &Sqe, table: &IovaTable) -> Outcome {
        let Some(op) = NvmOpcode::from_u8(sqe.opcode()) else {
            return done(Status::generic(generic::INVALID_OPCODE));
        };
        let Some(ns) = self.namespace(sqe.nsid) else {
            return done(Status::generic(generic::INVALID_NAMESPACE));
        };
        let bs = ns.block_size as u64;
        match op {
            NvmOpcode::Flush => {
                ns.flush();
                ok(0)
            }
            NvmOpcode::Read | NvmOpcode::Write => {
                let (slba, nlb) = (sqe.slba().0, sqe.nlb() as u64);
                if slba.checked_add(nlb).is_none_or(|e| e > ns.blocks) {
                    return done(Status::generic(generic::LBA_OUT_OF_RANGE));
                }
                let len = (nlb * bs) as usize;
                if self.cfg.mdts != 0 && len > 4096usize << self.cfg.mdts {
                    return done(Status::generic(generic::INVALID_FIELD));
                }
                if !self.cfg.null {
                    if let Err(s) = self.transfer(op, sqe, slba * bs, len, table) {
                        return done(s);
                    }
                }
                self.count(op, len);
                Outcome::Done { status: Status::SUCCESS, dw0: 0, due: self.model_due(len) }
            }
            NvmOpcode::WriteZeroes => {
                let (slba, nlb) = (sqe.slba().0, sqe.nlb() as u64);
                if slba.checked_add(nlb).is_none_or(|e| e > ns.blocks) {
                    return done(Status::generic(generic::LBA_OUT_OF_RANGE));
                }
                if !self.cfg.null && ns.zero(slba * bs, nlb * bs).is_err() {
                    return done(Status::new(2, ugds_nvme::status::media::WRITE_FAULT));
                }
                ok(0)
            }
            NvmOpcode::DatasetManagement => {
                let nr = (sqe.cdw10 & 0xff) as usize + 1;
                let raw = match self.dma_read(table, sqe.prp1, sqe.prp2, nr * 16) {
                    Ok(r) => r,
                    Err(s) => return done(s),
                };
                let ns = self.namespace(sqe.nsid).expect("checked above");
                let ranges: Vec<DsmRange> =
                    raw.chunks_exact(16).map(|c| DsmRange::from_bytes(c.try_into().expect("16 bytes"))).collect();
                if ranges.iter().any(|r| r.slba.checked_add(r.nlb as u64).is_none_or(|e| e > ns.blocks)) {
                    return done(Status::generic(generic::LBA_OUT_OF_RANGE));
                }
                // Deallocate: deallocated blocks read back as zeros here.
                if sqe.cdw11 & (1 << 2) != 0 && !self.cfg.null {
                    for r in &ranges {
                        if ns.zero(r.slba * bs, r.nlb as u64 * bs).is_err() {
                            return done(Status::new(2, ugds_nvme::status::media::WRITE_FAULT));
                        }
                    }
                }
                ok(0)
            }
        }
    }

    pub(super) fn model_due(&mut self, len: usize) -> Option<Instant> {
        let m = self.cfg.latency?;
        let now = Instant::now();
        let xfer = if m.bytes_per_sec == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos((len as u128 * 1_000_000_000 / m.bytes_per_sec as u128) as u64)
        };
        self.busy_until = self.busy_until.max(now) + xfer;
        Some(self.busy_until + m.latency)
    }

    /// Walks the command's PRPs into `self.segs`; a fault names the status.
    pub(super) fn walk(&mut self, table: &IovaTable, prp1: u64, prp2: u64, len: usize) -> Result<(), Status> {
        self.segs.clear();
        let segs = &mut self.segs;
        let read_list = |addr: u64, out: &mut [u64]| -> Result<(), ()> {
            let region = translate_region(table, addr, out.len() * 8).ok_or(())?;
            for (i, e) in out.iter_mut().enumerate() {
                *e = region.read_u64(i * 8);
            }
            Ok(())
        };
        match prp::walk(prp1, prp2, len, self.page_size, read_list, |a, l| segs.push((a, l))) {
            Ok(()) => Ok(()),
            Err(prp::WalkError::InvalidOffset { addr }) => {
                tracing::debug!(addr, "emulator: PRP with invalid offset");
                self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                Err(Status::generic(generic::INVALID_PRP_OFFSET))
            }
            Err(prp::WalkError::ListRead { addr, .. }) => {
                tracing::debug!(addr, "emulator: PRP list not mapped");
                self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                Err(Status::generic(generic::DATA_TRANSFER_ERROR))
            }
        }
    }

    /// Walks an I/O command's data pointer, PRPs or an SGL, into `self.segs`.
    pub(super) fn walk_data(&mut self, table: &IovaTable, sqe: &Sqe, len: usize) -> Result<(), Status> {
        if sqe.psdt() == 0 {
            return self.walk(table, sqe.prp1, sqe.prp2, len);
        }
        self.segs.clear();
        let segs = &mut self.segs;
        let read = |addr: u64, n: usize| -> Result<Vec<sgl::Descriptor>, ()> {
            let region = translate_region(table, addr, n * sgl::DESCRIPTOR_LEN).ok_or(())?;
            Ok((0..n)
                .map(|i| {
                    let mut b = [0u8; sgl::DESCRIPTOR_LEN];
                    for (k, w) in b.chunks_exact_mut(8).enumerate() {
                        w.copy_from_slice(&region.read_u64(i * sgl::DESCRIPTOR_LEN + k * 8).to_le_bytes());
                    }
                    sgl::Descriptor::from_bytes(&b)
                })
                .collect())
        };
        let sgl1 = sgl::Descriptor::from_dptr(sqe.prp1, sqe.prp2);
        match sgl::walk(sgl1, len, read, |a, l| segs.push((a, l))) {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::debug!(?e, "emulator: SGL refused");
                self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                Err(Status::generic(e.status_code().unwrap_or(generic::DATA_TRANSFER_ERROR)))
            }
        }
    }

    /// Translates `self.segs` into host ranges, merging neighbours.
    pub(super) fn translate_segs(&mut self, table: &IovaTable) -> Result<(), Status> {
        self.host_segs.clear();
        for &(iova, len) in &self.segs {
            let Some((addr, device)) = table.translate_data(iova, len) else {
                tracing::debug!(iova, len, "emulator: DMA to unmapped address");
                self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
                return Err(Status::generic(generic::DATA_TRANSFER_ERROR));
            };
            match self.host_segs.last_mut() {
                Some((a, l, d)) if *a + *l == addr && same_target(d.as_ref(), device) => *l += len,
                _ => self.host_segs.push((addr, len, device.cloned())),
            }
        }
        Ok(())
    }

    /// Refuses device segments where only host memory is possible (data
    /// of admin commands).
    pub(super) fn host_only(&self) -> Result<(), Status> {
        if self.host_segs.iter().any(|s| s.2.is_some()) {
            self.shared.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
            return Err(Status::generic(generic::DATA_TRANSFER_ERROR));
        }
        Ok(())
    }

    pub(super) fn transfer(
        &mut self,
        op: NvmOpcode,
        sqe: &Sqe,
        ns_off: u64,
        len: usize,
        table: &IovaTable,
    ) -> Result<(), Status> {
        self.walk_data(table, sqe, len)?;
        self.translate_segs(table)?;
        let ns = &self.ns[(sqe.nsid - 1) as usize];
        // SAFETY: the segments were translated under `table`'s read lock,
        // which the caller holds for the duration of the copy.
        unsafe { move_data(ns, op, ns_off, &self.host_segs, &mut self.staging) }
    }

    pub(super) fn dma_write(&mut self, table: &IovaTable, prp1: u64, prp2: u64, data: &[u8]) -> Result<(), Status> {
        self.walk(table, prp1, prp2, data.len())?;
        self.translate_segs(table)?;
        self.host_only()?;
        let mut done = 0;
        for &(host, l, _) in &self.host_segs {
            // SAFETY: a translated, mapped range (see `transfer`).
            unsafe { std::ptr::copy_nonoverlapping(data[done..].as_ptr(), host as *mut u8, l) };
            done += l;
        }
        Ok(())
    }

    pub(super) fn dma_read(&mut self, table: &IovaTable, prp1: u64, prp2: u64, len: usize) -> Result<Vec<u8>, Status> {
        self.walk(table, prp1, prp2, len)?;
        self.translate_segs(table)?;
        self.host_only()?;
        let mut out = vec![0u8; len];
        let mut done = 0;
        for &(host, l, _) in &self.host_segs {
            // SAFETY: a translated, mapped range (see `transfer`).
            unsafe { std::ptr::copy_nonoverlapping(host as *const u8, out[done..].as_mut_ptr(), l) };
            done += l;
        }
        Ok(out)
    }
}
