//! Controller registers (section 3.1.4, "Controller Properties") and doorbells.
//!
//! Each register is a newtype over its raw value with one accessor per field;
//! field names are the spec's.

/// Controller Capabilities, 64-bit.
pub const CAP: usize = 0x00;
/// Version.
pub const VS: usize = 0x08;
/// Interrupt Mask Set.
pub const INTMS: usize = 0x0c;
/// Interrupt Mask Clear.
pub const INTMC: usize = 0x10;
/// Controller Configuration.
pub const CC: usize = 0x14;
/// Controller Status.
pub const CSTS: usize = 0x1c;
/// NVM Subsystem Reset.
pub const NSSR: usize = 0x20;
/// Admin Queue Attributes.
pub const AQA: usize = 0x24;
/// Admin Submission Queue Base Address, 64-bit.
pub const ASQ: usize = 0x28;
/// Admin Completion Queue Base Address, 64-bit.
pub const ACQ: usize = 0x30;
/// Offset of the first doorbell (admin SQ tail).
pub const DOORBELL_BASE: usize = 0x1000;

/// Offset of the submission queue tail doorbell of `qid` (section 3.1.4.21).
pub const fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    DOORBELL_BASE + (2 * qid as usize) * (4usize << dstrd)
}

/// Offset of the completion queue head doorbell of `qid`.
pub const fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    DOORBELL_BASE + (2 * qid as usize + 1) * (4usize << dstrd)
}

/// The shadow doorbell rule (Doorbell Buffer Config, section 5.9; the same
/// test as Linux's `nvme_dbbuf_need_event`): after moving a doorbell from
/// `old` to `new` in the shadow page, the controller needs an MMIO doorbell
/// write only if the EventIdx it published lies in `[old, new)`, all modulo
/// 2^16.
#[inline]
pub const fn dbbuf_need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Bytes of register space needed for `nqueues` queue pairs (admin included).
pub const fn bar_len(nqueues: u16, dstrd: u8) -> usize {
    cq_head_doorbell(nqueues, dstrd) + 4
}

const fn bits64(v: u64, lo: u32, width: u32) -> u64 {
    (v >> lo) & ((1u64 << width) - 1)
}

const fn bits32(v: u32, lo: u32, width: u32) -> u32 {
    (v >> lo) & ((1u32 << width) - 1)
}

/// CAP: Controller Capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// Maximum Queue Entries Supported, zero-based (so `mqes() + 1` entries).
    pub const fn mqes(self) -> u16 {
        bits64(self.0, 0, 16) as u16
    }
    /// Contiguous Queues Required.
    pub const fn cqr(self) -> bool {
        bits64(self.0, 16, 1) != 0
    }
    /// Timeout: worst-case time for CSTS.RDY to change, in 500 ms units.
    pub const fn to(self) -> u8 {
        bits64(self.0, 24, 8) as u8
    }
    /// Doorbell Stride: doorbells are `4 << dstrd` bytes apart.
    pub const fn dstrd(self) -> u8 {
        bits64(self.0, 32, 4) as u8
    }
    /// Command Sets Supported (bit 0: NVM command set).
    pub const fn css(self) -> u8 {
        bits64(self.0, 37, 8) as u8
    }
    /// Memory Page Size Minimum: `2 ^ (12 + mpsmin)` bytes.
    pub const fn mpsmin(self) -> u8 {
        bits64(self.0, 48, 4) as u8
    }
    /// Memory Page Size Maximum.
    pub const fn mpsmax(self) -> u8 {
        bits64(self.0, 52, 4) as u8
    }
    /// Builds a CAP value from its fields (used by the emulator).
    pub const fn new(mqes: u16, cqr: bool, to: u8, dstrd: u8, mpsmin: u8, mpsmax: u8) -> Cap {
        Cap(mqes as u64
            | (cqr as u64) << 16
            | (to as u64) << 24
            | ((dstrd & 0xf) as u64) << 32
            | 1u64 << 37 // CSS: NVM command set
            | ((mpsmin & 0xf) as u64) << 48
            | ((mpsmax & 0xf) as u64) << 52)
    }
}

/// CC: Controller Configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

/// CC.SHN / CSTS.SHST values.
pub mod shutdown {
    /// CC.SHN: no notification.
    pub const NONE: u32 = 0;
    /// CC.SHN: normal shutdown.
    pub const NORMAL: u32 = 1;
    /// CC.SHN: abrupt shutdown.
    pub const ABRUPT: u32 = 2;
    /// CSTS.SHST: shutdown processing occurring.
    pub const OCCURRING: u32 = 1;
    /// CSTS.SHST: shutdown processing complete.
    pub const COMPLETE: u32 = 2;
}

impl Cc {
    /// Enable.
    pub const fn en(self) -> bool {
        self.0 & 1 != 0
    }
    /// I/O Command Set Selected.
    pub const fn css(self) -> u32 {
        bits32(self.0, 4, 3)
    }
    /// Memory Page Size: `2 ^ (12 + mps)`.
    pub const fn mps(self) -> u32 {
        bits32(self.0, 7, 4)
    }
    /// Shutdown Notification.
    pub const fn shn(self) -> u32 {
        bits32(self.0, 14, 2)
    }
    /// I/O Submission Queue Entry Size, log2 bytes.
    pub const fn iosqes(self) -> u32 {
        bits32(self.0, 16, 4)
    }
    /// I/O Completion Queue Entry Size, log2 bytes.
    pub const fn iocqes(self) -> u32 {
        bits32(self.0, 20, 4)
    }
    /// The configuration the driver writes to enable: NVM command set,
    /// round-robin arbitration, 64-byte SQEs, 16-byte CQEs.
    pub const fn enable(mps: u32) -> Cc {
        Cc(1 | (mps & 0xf) << 7 | 6 << 16 | 4 << 20)
    }
    /// This value with SHN set to `shn`.
    pub const fn with_shn(self, shn: u32) -> Cc {
        Cc(self.0 & !(3 << 14) | (shn & 3) << 14)
    }
}

/// CSTS: Controller Status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Csts(pub u32);

impl Csts {
    /// Ready.
    pub const RDY: u32 = 1;
    /// Controller Fatal Status.
    pub const CFS: u32 = 1 << 1;
    /// Ready.
    pub const fn rdy(self) -> bool {
        self.0 & Self::RDY != 0
    }
    /// Controller Fatal Status.
    pub const fn cfs(self) -> bool {
        self.0 & Self::CFS != 0
    }
    /// Shutdown Status.
    pub const fn shst(self) -> u32 {
        bits32(self.0, 2, 2)
    }
    /// A register read that returns all ones means the device is gone
    /// (surprise removal, or a BAR that is no longer mapped).
    pub const fn is_gone(self) -> bool {
        self.0 == u32::MAX
    }
}

/// AQA: Admin Queue Attributes (sizes are zero-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Aqa(pub u32);

impl Aqa {
    /// Builds AQA from the number of entries of each admin queue.
    pub const fn new(sq_entries: u16, cq_entries: u16) -> Aqa {
        Aqa(((sq_entries as u32 - 1) & 0xfff) | ((cq_entries as u32 - 1) & 0xfff) << 16)
    }
    /// Admin Submission Queue Size, in entries (not zero-based).
    pub const fn asq_entries(self) -> u32 {
        bits32(self.0, 0, 12) + 1
    }
    /// Admin Completion Queue Size, in entries (not zero-based).
    pub const fn acq_entries(self) -> u32 {
        bits32(self.0, 16, 12) + 1
    }
}

/// Version register: major.minor.tertiary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version(pub u32);

impl Version {
    /// NVMe 1.4.0, what the emulator reports.
    pub const V1_4: Version = Version(0x0001_0400);
    /// Builds a version.
    pub const fn new(major: u16, minor: u8, ter: u8) -> Version {
        Version((major as u32) << 16 | (minor as u32) << 8 | ter as u32)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0 >> 16, (self.0 >> 8) & 0xff, self.0 & 0xff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbell_offsets_follow_the_stride() {
        assert_eq!(sq_tail_doorbell(0, 0), 0x1000);
        assert_eq!(cq_head_doorbell(0, 0), 0x1004);
        assert_eq!(sq_tail_doorbell(1, 0), 0x1008);
        assert_eq!(cq_head_doorbell(3, 0), 0x101c);
        assert_eq!(sq_tail_doorbell(1, 2), 0x1000 + 2 * 16);
    }

    #[test]
    fn cap_round_trips_its_fields() {
        let cap = Cap::new(1023, true, 20, 0, 0, 4);
        assert_eq!(cap.mqes(), 1023);
        assert!(cap.cqr());
        assert_eq!(cap.to(), 20);
        assert_eq!(cap.dstrd(), 0);
        assert_eq!(cap.css() & 1, 1);
        assert_eq!(cap.mpsmin(), 0);
        assert_eq!(cap.mpsmax(), 4);
    }

    #[test]
    fn cc_enable_has_the_entry_sizes() {
        let cc = Cc::enable(0);
        assert!(cc.en());
        assert_eq!(cc.iosqes(), 6);
        assert_eq!(cc.iocqes(), 4);
        assert_eq!(cc.with_shn(shutdown::NORMAL).shn(), 1);
        assert!(cc.with_shn(shutdown::NORMAL).en());
    }

    #[test]
    fn aqa_is_zero_based() {
        let aqa = Aqa::new(32, 64);
        assert_eq!(aqa.0, 31 | 63 << 16);
        assert_eq!(aqa.asq_entries(), 32);
        assert_eq!(aqa.acq_entries(), 64);
    }

    #[test]
    fn need_event_is_a_window_check() {
        // Controller asked to be told once the tail passes 5.
        assert!(dbbuf_need_event(5, 6, 5));
        assert!(dbbuf_need_event(5, 9, 3));
        assert!(!dbbuf_need_event(5, 5, 3), "event index not yet passed");
        assert!(!dbbuf_need_event(5, 9, 6), "already passed before this update");
        // Across the 16-bit wrap.
        assert!(dbbuf_need_event(0xfffe, 2, 0xfff0));
        assert!(!dbbuf_need_event(3, 2, 0xfff0));
    }

    proptest::proptest! {
        /// Equal to "event_idx is one of the values old, old+1, ..., new-1".
        #[test]
        fn need_event_matches_a_walk(ei in proptest::prelude::any::<u16>(), old in proptest::prelude::any::<u16>(), step in 0u16..600) {
            let new = old.wrapping_add(step);
            let walked = (0..step).any(|k| old.wrapping_add(k) == ei);
            proptest::prop_assert_eq!(dbbuf_need_event(ei, new, old), walked);
        }
    }

    #[test]
    fn version_prints_dotted() {
        assert_eq!(Version::V1_4.to_string(), "1.4.0");
    }
}
