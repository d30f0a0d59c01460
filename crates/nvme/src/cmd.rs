//! Submission and completion queue entries (sections 4.2 and 4.6) and the
//! commands the driver builds.

use crate::{Cid, Lba, Nsid, Qid};

/// Admin command opcodes (section 5, figure 28).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AdminOpcode {
    /// Delete I/O Submission Queue.
    DeleteIoSq = 0x00,
    /// Create I/O Submission Queue.
    CreateIoSq = 0x01,
    /// Get Log Page.
    GetLogPage = 0x02,
    /// Delete I/O Completion Queue.
    DeleteIoCq = 0x04,
    /// Create I/O Completion Queue.
    CreateIoCq = 0x05,
    /// Identify.
    Identify = 0x06,
    /// Abort.
    Abort = 0x08,
    /// Set Features.
    SetFeatures = 0x09,
    /// Get Features.
    GetFeatures = 0x0a,
    /// Asynchronous Event Request.
    AsyncEventRequest = 0x0c,
    /// Doorbell Buffer Config.
    DoorbellBufferConfig = 0x7c,
}

impl AdminOpcode {
    /// Decodes an opcode byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        use AdminOpcode::*;
        Some(match v {
            0x00 => DeleteIoSq,
            0x01 => CreateIoSq,
            0x02 => GetLogPage,
            0x04 => DeleteIoCq,
            0x05 => CreateIoCq,
            0x06 => Identify,
            0x08 => Abort,
            0x09 => SetFeatures,
            0x0a => GetFeatures,
            0x0c => AsyncEventRequest,
            0x7c => DoorbellBufferConfig,
            _ => return None,
        })
    }
}

/// NVM command set opcodes (NVM Command Set Specification, figure 18).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NvmOpcode {
    /// Flush.
    Flush = 0x00,
    /// Write.
    Write = 0x01,
    /// Read.
    Read = 0x02,
    /// Write Zeroes.
    WriteZeroes = 0x08,
    /// Dataset Management.
    DatasetManagement = 0x09,
}

impl NvmOpcode {
    /// Decodes an opcode byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        use NvmOpcode::*;
        Some(match v {
            0x00 => Flush,
            0x01 => Write,
            0x02 => Read,
            0x08 => WriteZeroes,
            0x09 => DatasetManagement,
            _ => return None,
        })
    }

    /// Whether the command moves data described by its PRPs.
    pub fn transfers_data(self) -> bool {
        matches!(self, NvmOpcode::Read | NvmOpcode::Write | NvmOpcode::DatasetManagement)
    }
}

/// Identify CNS values (figure 273).
pub mod cns {
    /// Identify Namespace data structure for NSID.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = 0x01;
    /// Active namespace ID list.
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list for NSID.
    pub const NS_DESCRIPTORS: u8 = 0x03;
}

/// Feature identifiers (figure 317).
pub mod feature {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Interrupt Coalescing.
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
}

/// Log page identifiers (figure 202).
pub mod log_page {
    /// Error Information.
    pub const ERROR_INFO: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
}

/// Submission Queue Entry, 64 bytes (section 4.2, figure 88).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Sqe {
    /// Command Dword 0: opcode (7:0), fused (9:8), PSDT (15:14), CID (31:16).
    pub cdw0: u32,
    /// Namespace Identifier.
    pub nsid: u32,
    /// Command Dword 2.
    pub cdw2: u32,
    /// Command Dword 3.
    pub cdw3: u32,
    /// Metadata Pointer.
    pub mptr: u64,
    /// PRP Entry 1.
    pub prp1: u64,
    /// PRP Entry 2.
    pub prp2: u64,
    /// Command Dword 10.
    pub cdw10: u32,
    /// Command Dword 11.
    pub cdw11: u32,
    /// Command Dword 12.
    pub cdw12: u32,
    /// Command Dword 13.
    pub cdw13: u32,
    /// Command Dword 14.
    pub cdw14: u32,
    /// Command Dword 15.
    pub cdw15: u32,
}

const _: () = assert!(std::mem::size_of::<Sqe>() == 64);
const _: () = assert!(std::mem::offset_of!(Sqe, prp1) == 24);
const _: () = assert!(std::mem::offset_of!(Sqe, cdw10) == 40);

impl Sqe {
    /// Size of an entry in bytes (CC.IOSQES = 6).
    pub const SIZE: usize = 64;

    /// An entry with opcode and CID set, everything else zero.
    #[inline]
    pub const fn new(opcode: u8, cid: Cid) -> Sqe {
        Sqe {
            cdw0: opcode as u32 | (cid.0 as u32) << 16,
            nsid: 0,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            prp1: 0,
            prp2: 0,
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
        }
    }

    /// Opcode.
    pub const fn opcode(&self) -> u8 {
        self.cdw0 as u8
    }

    /// Command identifier.
    pub const fn cid(&self) -> Cid {
        Cid((self.cdw0 >> 16) as u16)
    }

    /// Replaces the command identifier.
    #[inline]
    pub fn set_cid(&mut self, cid: Cid) {
        self.cdw0 = (self.cdw0 & 0xffff) | (cid.0 as u32) << 16;
    }

    /// PRP or SGL for Data Transfer (0: PRPs).
    pub const fn psdt(&self) -> u32 {
        (self.cdw0 >> 14) & 3
    }

    /// Fused operation.
    pub const fn fuse(&self) -> u32 {
        (self.cdw0 >> 8) & 3
    }

    // ---- admin commands ----

    /// Identify (section 5.17): `cns` selects the structure.
    pub fn identify(cid: Cid, cns: u8, nsid: Nsid, prp1: u64) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::Identify as u8, cid);
        s.nsid = nsid.0;
        s.prp1 = prp1;
        s.cdw10 = cns as u32;
        s
    }

    /// Create I/O Completion Queue (section 5.4): physically contiguous,
    /// `entries` entries, interrupts enabled on vector `iv` when `ien`.
    pub fn create_io_cq(cid: Cid, qid: Qid, entries: u16, prp1: u64, iv: u16, ien: bool) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::CreateIoCq as u8, cid);
        s.prp1 = prp1;
        s.cdw10 = qid.0 as u32 | ((entries as u32 - 1) << 16);
        // PC (bit 0): physically contiguous. IEN (bit 1). IV (31:16).
        s.cdw11 = 1 | (ien as u32) << 1 | (iv as u32) << 16;
        s
    }

    /// Create I/O Submission Queue (section 5.5), physically contiguous,
    /// completing to `cqid`.
    pub fn create_io_sq(cid: Cid, qid: Qid, entries: u16, prp1: u64, cqid: Qid) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::CreateIoSq as u8, cid);
        s.prp1 = prp1;
        s.cdw10 = qid.0 as u32 | ((entries as u32 - 1) << 16);
        s.cdw11 = 1 | (cqid.0 as u32) << 16;
        s
    }

    /// Delete I/O Submission Queue.
    pub fn delete_io_sq(cid: Cid, qid: Qid) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::DeleteIoSq as u8, cid);
        s.cdw10 = qid.0 as u32;
        s
    }

    /// Delete I/O Completion Queue.
    pub fn delete_io_cq(cid: Cid, qid: Qid) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::DeleteIoCq as u8, cid);
        s.cdw10 = qid.0 as u32;
        s
    }

    /// Set Features, Number of Queues (section 5.27.1.7): asks for `nsq` I/O
    /// submission and `ncq` I/O completion queues (not zero-based here).
    pub fn set_num_queues(cid: Cid, nsq: u16, ncq: u16) -> Sqe {
        Sqe::set_features(cid, crate::cmd::feature::NUMBER_OF_QUEUES, (nsq as u32 - 1) | (ncq as u32 - 1) << 16)
    }

    /// Set Features with `fid` and CDW11 `value`.
    pub fn set_features(cid: Cid, fid: u8, value: u32) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::SetFeatures as u8, cid);
        s.cdw10 = fid as u32;
        s.cdw11 = value;
        s
    }

    /// Get Features, current value of `fid`.
    pub fn get_features(cid: Cid, fid: u8) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::GetFeatures as u8, cid);
        s.cdw10 = fid as u32;
        s
    }

    /// Get Log Page `lid`, `len` bytes (a multiple of 4) into `prp1`/`prp2`.
    pub fn get_log_page(cid: Cid, lid: u8, nsid: Nsid, len: u32, prp1: u64, prp2: u64) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::GetLogPage as u8, cid);
        let numd = len / 4 - 1;
        s.nsid = nsid.0;
        s.prp1 = prp1;
        s.prp2 = prp2;
        s.cdw10 = lid as u32 | (numd & 0xffff) << 16;
        s.cdw11 = numd >> 16;
        s
    }

    /// Doorbell Buffer Config (section 5.9): the shadow doorbell page at
    /// `prp1` and the EventIdx page at `prp2`.
    pub fn doorbell_buffer_config(cid: Cid, shadow: u64, eventidx: u64) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::DoorbellBufferConfig as u8, cid);
        s.prp1 = shadow;
        s.prp2 = eventidx;
        s
    }

    /// Abort the command `target` submitted on queue `sqid`.
    pub fn abort(cid: Cid, sqid: Qid, target: Cid) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::Abort as u8, cid);
        s.cdw10 = sqid.0 as u32 | (target.0 as u32) << 16;
        s
    }

    // ---- NVM commands ----

    /// Read or Write of `nlb` blocks at `slba` (NVM spec 3.2.4 / 3.2.6).
    #[inline]
    pub fn rw(op: NvmOpcode, cid: Cid, nsid: Nsid, slba: Lba, nlb: u32, prp1: u64, prp2: u64) -> Sqe {
        debug_assert!((1..=0x1_0000).contains(&nlb));
        let mut s = Sqe::new(op as u8, cid);
        s.nsid = nsid.0;
        s.prp1 = prp1;
        s.prp2 = prp2;
        s.cdw10 = slba.0 as u32;
        s.cdw11 = (slba.0 >> 32) as u32;
        s.cdw12 = nlb - 1; // NLB is zero-based
        s
    }

    /// Write Zeroes of `nlb` blocks at `slba`.
    pub fn write_zeroes(cid: Cid, nsid: Nsid, slba: Lba, nlb: u32) -> Sqe {
        Sqe::rw(NvmOpcode::WriteZeroes, cid, nsid, slba, nlb, 0, 0)
    }

    /// Flush the volatile write cache of `nsid`.
    #[inline]
    pub fn flush(cid: Cid, nsid: Nsid) -> Sqe {
        let mut s = Sqe::new(NvmOpcode::Flush as u8, cid);
        s.nsid = nsid.0;
        s
    }

    /// Dataset Management with `nr` ranges at `prp1` (16 bytes each);
    /// `deallocate` sets AD.
    pub fn dataset_management(cid: Cid, nsid: Nsid, nr: u32, prp1: u64, deallocate: bool) -> Sqe {
        let mut s = Sqe::new(NvmOpcode::DatasetManagement as u8, cid);
        s.nsid = nsid.0;
        s.prp1 = prp1;
        s.cdw10 = nr - 1;
        s.cdw11 = (deallocate as u32) << 2;
        s
    }

    /// Starting LBA of a Read/Write/Write Zeroes.
    pub const fn slba(&self) -> Lba {
        Lba(self.cdw10 as u64 | (self.cdw11 as u64) << 32)
    }

    /// Number of logical blocks of a Read/Write/Write Zeroes (not zero-based).
    pub const fn nlb(&self) -> u32 {
        (self.cdw12 & 0xffff) + 1
    }

    /// The entry's bytes in the little-endian layout the controller reads.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        let dw = self.to_dwords();
        for (i, d) in dw.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&d.to_le_bytes());
        }
        b
    }

    /// The entry as sixteen dwords, in order.
    pub fn to_dwords(&self) -> [u32; 16] {
        [
            self.cdw0,
            self.nsid,
            self.cdw2,
            self.cdw3,
            self.mptr as u32,
            (self.mptr >> 32) as u32,
            self.prp1 as u32,
            (self.prp1 >> 32) as u32,
            self.prp2 as u32,
            (self.prp2 >> 32) as u32,
            self.cdw10,
            self.cdw11,
            self.cdw12,
            self.cdw13,
            self.cdw14,
            self.cdw15,
        ]
    }

    /// Rebuilds an entry from sixteen dwords.
    pub fn from_dwords(d: [u32; 16]) -> Sqe {
        Sqe {
            cdw0: d[0],
            nsid: d[1],
            cdw2: d[2],
            cdw3: d[3],
            mptr: d[4] as u64 | (d[5] as u64) << 32,
            prp1: d[6] as u64 | (d[7] as u64) << 32,
            prp2: d[8] as u64 | (d[9] as u64) << 32,
            cdw10: d[10],
            cdw11: d[11],
            cdw12: d[12],
            cdw13: d[13],
            cdw14: d[14],
            cdw15: d[15],
        }
    }
}

/// Completion Queue Entry, 16 bytes (section 4.6, figure 90).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Cqe {
    /// Dword 0: command specific.
    pub dw0: u32,
    /// Dword 1: command specific.
    pub dw1: u32,
    /// SQ Head Pointer: how far the controller has consumed the SQ.
    pub sqhd: u16,
    /// SQ Identifier.
    pub sqid: u16,
    /// Command Identifier.
    pub cid: u16,
    /// Phase tag (bit 0) and Status Field (15:1).
    pub status: u16,
}

const _: () = assert!(std::mem::size_of::<Cqe>() == 16);
const _: () = assert!(std::mem::offset_of!(Cqe, status) == 14);

impl Cqe {
    /// Size of an entry in bytes (CC.IOCQES = 4).
    pub const SIZE: usize = 16;

    /// Phase tag.
    pub const fn phase(&self) -> bool {
        self.status & 1 != 0
    }

    /// Whether the command succeeded (status code type and code both 0),
    /// read straight from the field: what the reaping loop asks of every
    /// entry, without decoding the rest.
    #[inline(always)]
    pub const fn is_success(&self) -> bool {
        self.status & 0x0ffe == 0
    }

    /// The status field, decoded.
    #[inline]
    pub const fn status(&self) -> crate::Status {
        crate::Status::from_field(self.status)
    }

    /// Dword 3 as the controller writes it (CID low, status+phase high).
    pub const fn dw3(&self) -> u32 {
        self.cid as u32 | (self.status as u32) << 16
    }

    /// Dword 2 (SQHD low, SQID high).
    pub const fn dw2(&self) -> u32 {
        self.sqhd as u32 | (self.sqid as u32) << 16
    }

    /// Rebuilds an entry from its four dwords.
    #[inline]
    pub const fn from_dwords(d: [u32; 4]) -> Cqe {
        Cqe {
            dw0: d[0],
            dw1: d[1],
            sqhd: d[2] as u16,
            sqid: (d[2] >> 16) as u16,
            cid: d[3] as u16,
            status: (d[3] >> 16) as u16,
        }
    }
}

/// Dataset Management range (NVM spec figure 39), 16 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct DsmRange {
    /// Context attributes.
    pub cattr: u32,
    /// Length in logical blocks.
    pub nlb: u32,
    /// Starting LBA.
    pub slba: u64,
}

const _: () = assert!(std::mem::size_of::<DsmRange>() == 16);

impl DsmRange {
    /// Parses a range from its 16 bytes.
    pub fn from_bytes(b: &[u8; 16]) -> DsmRange {
        DsmRange {
            cattr: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            nlb: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            slba: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        }
    }
    /// The range's bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.cattr.to_le_bytes());
        b[4..8].copy_from_slice(&self.nlb.to_le_bytes());
        b[8..16].copy_from_slice(&self.slba.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_success_agrees_with_the_decoded_status() {
        // Every field value (every 97th under Miri, which CI runs this
        // crate's tests in): phase, more, dnr and crd do not matter.
        for field in (0..=u16::MAX).step_by(if cfg!(miri) { 97 } else { 1 }) {
            let c = Cqe::from_dwords([0, 0, 0, (field as u32) << 16]);
            assert_eq!(c.is_success(), c.status().is_success(), "field {field:#06x}");
        }
    }

    #[test]
    fn read_command_layout() {
        let s = Sqe::rw(NvmOpcode::Read, Cid(0x1234), Nsid(1), Lba(0x1_0000_0002), 8, 0x1000, 0x2000);
        let b = s.to_bytes();
        assert_eq!(b[0], 0x02);
        assert_eq!(u16::from_le_bytes([b[2], b[3]]), 0x1234);
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 1);
        assert_eq!(u64::from_le_bytes(b[24..32].try_into().unwrap()), 0x1000);
        assert_eq!(u64::from_le_bytes(b[32..40].try_into().unwrap()), 0x2000);
        assert_eq!(u32::from_le_bytes(b[40..44].try_into().unwrap()), 2);
        assert_eq!(u32::from_le_bytes(b[44..48].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(b[48..52].try_into().unwrap()), 7);
        assert_eq!(s.slba(), Lba(0x1_0000_0002));
        assert_eq!(s.nlb(), 8);
        assert_eq!(Sqe::from_dwords(s.to_dwords()), s);
    }

    #[test]
    fn create_queue_fields() {
        let s = Sqe::create_io_cq(Cid(1), Qid(3), 1024, 0x8000, 2, true);
        assert_eq!(s.cdw10, 3 | 1023 << 16);
        assert_eq!(s.cdw11, 1 | 2 | 2 << 16);
        let s = Sqe::create_io_sq(Cid(1), Qid(3), 16, 0x8000, Qid(3));
        assert_eq!(s.cdw10, 3 | 15 << 16);
        assert_eq!(s.cdw11, 1 | 3 << 16);
    }

    #[test]
    fn cqe_round_trips_dwords() {
        let c = Cqe { dw0: 7, dw1: 0, sqhd: 5, sqid: 2, cid: 9, status: 0x8003 };
        assert_eq!(Cqe::from_dwords([c.dw0, c.dw1, c.dw2(), c.dw3()]), c);
        assert!(c.phase());
        assert_eq!(c.status().sc, 1);
        assert!(c.status().dnr);
    }

    #[test]
    fn opcodes_decode() {
        for op in [0x00u8, 0x01, 0x02, 0x04, 0x05, 0x06, 0x08, 0x09, 0x0a, 0x0c, 0x7c] {
            assert_eq!(AdminOpcode::from_u8(op).unwrap() as u8, op);
        }
        assert!(AdminOpcode::from_u8(0x03).is_none());
        for op in [0x00u8, 0x01, 0x02, 0x08, 0x09] {
            assert_eq!(NvmOpcode::from_u8(op).unwrap() as u8, op);
        }
        assert!(NvmOpcode::from_u8(0x05).is_none());
    }

    #[test]
    fn set_num_queues_is_zero_based() {
        let s = Sqe::set_num_queues(Cid(0), 4, 4);
        assert_eq!(s.cdw10, 7);
        assert_eq!(s.cdw11, 3 | 3 << 16);
    }

    #[test]
    fn dsm_range_round_trips() {
        let r = DsmRange { cattr: 0, nlb: 8, slba: 77 };
        assert_eq!(DsmRange::from_bytes(&r.to_bytes()), r);
    }
}
