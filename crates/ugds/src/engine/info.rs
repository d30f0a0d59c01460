//! What bring-up learns about a controller and its namespaces, on every
//! transport.

use ugds_nvme::identify::IdentifyController;
use ugds_nvme::regs::{self, Cap};

/// A namespace as Identify describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Namespace identifier.
    pub nsid: u32,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Size in logical blocks.
    pub blocks: u64,
}

impl NamespaceInfo {
    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.blocks * self.block_size as u64
    }
}

/// What bring-up learned about the controller.
#[derive(Clone, Debug)]
pub struct ControllerInfo {
    /// Controller Capabilities.
    pub cap: Cap,
    /// Version register.
    pub version: regs::Version,
    /// Identify Controller.
    pub identify: IdentifyController,
    /// Active namespaces with a usable LBA format.
    pub namespaces: Vec<NamespaceInfo>,
    /// Active namespaces that are not usable, each with why (metadata, a
    /// size that overflows, a command set other than NVM).
    pub skipped: Vec<(u32, String)>,
    /// I/O queue pairs the controller granted.
    pub io_queues: u16,
    /// Largest transfer per command in bytes, when MDTS sets one.
    pub max_transfer: Option<usize>,
    /// Controller memory page size in use.
    pub page_size: usize,
    /// Where the controller is.
    pub platform: String,
}
