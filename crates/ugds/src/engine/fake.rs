//! Test doubles for the engine's unit tests: a platform that records
//! doorbell writes instead of sending them, and a device the test plays on
//! a queue pair's rings (fetching commands where the doorbell says, posting
//! completions where, when and in what order the test likes, with the phase
//! tag a controller writes).

use super::qpair::NvmeQueue;
use super::transport::Transport;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use ugds_nvme::{regs, Cid, Cqe, Iova, Lba, Nsid, NvmOpcode, Sqe};
use ugds_platform::dma::{DmaBuffer, DmaRegion};
use ugds_platform::sys::EventFd;
use ugds_platform::{Error, HostMapping, Platform, Result};

/// Host memory for the rings; doorbell writes recorded, not sent.
#[derive(Default)]
pub(crate) struct Doorbells(Mutex<Vec<(usize, u32)>>);

impl Platform for Doorbells {
    fn describe(&self) -> String {
        "a device played by the test".into()
    }
    fn read32(&self, _off: usize) -> u32 {
        0
    }
    unsafe fn write32(&self, off: usize, val: u32) {
        self.0.lock().unwrap().push((off, val));
    }
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        DmaBuffer::anonymous(len)
    }
    unsafe fn map_host(&self, _vaddr: *mut u8, _len: usize) -> Result<HostMapping> {
        Err(Error::Unsupported("no mappings here".into()))
    }
    unsafe fn unmap_host(&self, _mapping: &HostMapping) -> Result<()> {
        Ok(())
    }
    fn interrupt(&self, _vector: u16) -> Result<Option<&EventFd>> {
        Ok(None)
    }
    fn interrupt_vectors(&self) -> u16 {
        0
    }
}

impl Doorbells {
    /// The last value written to the register at `off`.
    pub(crate) fn last(&self, off: usize) -> Option<u32> {
        self.0.lock().unwrap().iter().rev().find(|(o, _)| *o == off).map(|(_, v)| *v)
    }

    /// The last submission queue tail rung for queue `qid` (stride 0).
    pub(crate) fn sq_tail(&self, qid: u16) -> Option<u32> {
        self.last(regs::sq_tail_doorbell(qid, 0))
    }
}

/// The controller's side of one queue pair.
pub(crate) struct Device {
    /// The submission ring, seen by the device.
    sq: DmaRegion,
    cq: Arc<DmaBuffer>,
    qid: u16,
    entries: u32,
    pub sq_head: u32,
    pub cq_tail: u32,
    phase: bool,
}

// SAFETY: the region is the submission ring of a queue pair the test keeps
// alive while the device works (see `Device::of`); the device only reads it.
unsafe impl Send for Device {}

impl Device {
    /// The device of `q`'s rings. The caller keeps `q` (or what owns it)
    /// alive for as long as it uses the device.
    pub(crate) fn of(q: &NvmeQueue) -> Device {
        let (sq, cq) = q.rings();
        let vaddr = NonNull::new(sq.vaddr()).expect("a ring has an address");
        // SAFETY: the ring's memory, valid and 8-byte aligned while `q`
        // lives, which the caller keeps longer than this device.
        let sq = unsafe { DmaRegion::new(vaddr, sq.len(), Iova(sq.iova(0))) };
        let entries = q.entries() as u32;
        Device { sq, cq: cq.clone(), qid: q.qid().0, entries, sq_head: 0, cq_tail: 0, phase: true }
    }

    /// Fetches the commands up to the tail the doorbell gave.
    pub(crate) fn fetch_sqes(&mut self, tail: u32) -> Vec<Sqe> {
        let mut sqes = Vec::new();
        while self.sq_head != tail {
            sqes.push(self.sq.read_sqe(self.sq_head as usize * Sqe::SIZE));
            self.sq_head = (self.sq_head + 1) % self.entries;
        }
        sqes
    }

    /// Fetches the commands up to the tail the doorbell gave: their CIDs.
    pub(crate) fn fetch(&mut self, tail: u32) -> Vec<u16> {
        self.fetch_sqes(tail).iter().map(|s| s.cid().0).collect()
    }

    /// Posts a completion, dword 3 (with the phase tag) last.
    pub(crate) fn post(&mut self, cid: u16, sqhd: u32, status: u16) {
        let off = self.cq_tail as usize * Cqe::SIZE;
        self.cq.write_u32(off, 0);
        self.cq.write_u32(off + 4, 0);
        self.cq.write_u32(off + 8, sqhd | (self.qid as u32) << 16);
        self.cq.store_u32_release(off + 12, cid as u32 | ((status << 1) as u32 | self.phase as u32) << 16);
        self.cq_tail += 1;
        if self.cq_tail == self.entries {
            self.cq_tail = 0;
            self.phase = !self.phase;
        }
    }
}

/// A one-block read at block `lba`.
pub(crate) fn read(lba: u64) -> Sqe {
    Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(1), Lba(lba), 1, 0x1000, 0)
}
