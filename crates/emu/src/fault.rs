//! Faults injected into the emulated controller at run time.

use std::time::Duration;
use ugds_nvme::Status;

/// Which commands a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultTarget {
    /// I/O commands, optionally only this opcode.
    Io(Option<u8>),
    /// Admin commands, optionally only this opcode.
    Admin(Option<u8>),
}

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultAction {
    /// Complete with this status (no data is moved).
    Status(Status),
    /// Fetch the command, never complete it.
    LoseCompletion,
    /// Complete it (normally) only after this long.
    Stall(Duration),
    /// Set Controller Fatal Status and stop processing commands.
    Fatal,
    /// Complete it normally, and post the same completion again before the
    /// next command of its submission queue completes (a broken controller
    /// repeating a completion after the host gave the CID to a new command).
    Duplicate,
    /// Post a completion naming this CID (out of range, or not in flight)
    /// before the command's own.
    ExtraCompletion(u16),
    /// Complete it reporting this SQ head (out of range, or behind the one
    /// reported before).
    SqHead(u16),
    /// Flip the phase tag of its completion slot over the slot's stale
    /// fields; the real entry is never seen.
    EarlyPhase,
}

/// What the emulated controller's Identify data claims that is not so (a
/// broken or hostile controller); `None` tells the truth. The controller
/// still works by the truth: its backing's size, its block size, its MDTS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdentifyLies {
    /// Namespace size (NSZE, NCAP, NUSE) in blocks.
    pub nsze: Option<u64>,
    /// LBADS of the LBA format in use.
    pub lbads: Option<u8>,
    /// FLBAS: the index of the format in use.
    pub flbas: Option<u8>,
    /// MDTS.
    pub mdts: Option<u8>,
    /// The command set (CSI) the namespace descriptor list names, where
    /// not NVM (a zoned namespace, say; its blocks are still served as
    /// plain blocks here).
    pub csi: Option<u8>,
}

impl IdentifyLies {
    /// Claims `blocks` blocks.
    pub fn nsze(blocks: u64) -> IdentifyLies {
        IdentifyLies { nsze: Some(blocks), ..IdentifyLies::default() }
    }
    /// Claims blocks of `1 << lbads` bytes.
    pub fn lbads(lbads: u8) -> IdentifyLies {
        IdentifyLies { lbads: Some(lbads), ..IdentifyLies::default() }
    }
    /// Claims format `flbas` is in use.
    pub fn flbas(flbas: u8) -> IdentifyLies {
        IdentifyLies { flbas: Some(flbas), ..IdentifyLies::default() }
    }
    /// Claims MDTS `mdts`.
    pub fn mdts(mdts: u8) -> IdentifyLies {
        IdentifyLies { mdts: Some(mdts), ..IdentifyLies::default() }
    }
    /// Names command set `csi` for the namespaces (2: Zoned Namespace).
    pub fn csi(csi: u8) -> IdentifyLies {
        IdentifyLies { csi: Some(csi), ..IdentifyLies::default() }
    }
}

/// A fault: skip `skip` matching commands, then apply `action` to the next
/// `count` of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Which commands.
    pub target: FaultTarget,
    /// Matching commands to let through first.
    pub skip: u32,
    /// Matching commands to hit.
    pub count: u32,
    /// What to do to them.
    pub action: FaultAction,
}

impl Fault {
    /// The next matching command gets `action`.
    pub fn next(target: FaultTarget, action: FaultAction) -> Fault {
        Fault { target, skip: 0, count: 1, action }
    }
}
