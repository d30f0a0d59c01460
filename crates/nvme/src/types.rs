//! Newtypes for the numbers the protocol passes around, so that a queue id is
//! never taken for a command id or an LBA for a byte offset.

use std::fmt;

/// Command Identifier (SQE CDW0 bits 31:16), unique among a submission queue's
/// outstanding commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Cid(pub u16);

/// Queue identifier. Queue 0 is the admin queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qid(pub u16);

impl Qid {
    /// The admin queue pair.
    pub const ADMIN: Qid = Qid(0);
}

/// Namespace identifier (1-based; 0 and 0xffff_ffff are special).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Nsid(pub u32);

/// Logical block address within a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Lba(pub u64);

/// An address as the controller sees it: an IOVA behind an IOMMU, a bus
/// address without one. Never a host virtual address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Iova(pub u64);

impl fmt::Debug for Iova {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Iova({:#x})", self.0)
    }
}

impl fmt::Display for Iova {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}
