//! The NVMe protocol as plain data: no I/O, no unsafe.
//!
//! Everything the driver and the emulated controller have to agree on lives
//! here, so that both sides read the specification through the same code:
//!
//! - [`regs`]: controller registers (`CAP`, `CC`, `CSTS`, `AQA`, ...) and
//!   doorbell offsets.
//! - [`cmd`]: the 64-byte submission entry [`Sqe`] and the 16-byte completion
//!   entry [`Cqe`], admin and NVM opcodes, and builders for the commands the
//!   driver issues.
//! - [`status`]: completion status kept as data ([`Status`]) with the spec's
//!   names.
//! - [`identify`]: parsing of Identify Controller, Identify Namespace and the
//!   active namespace list.
//! - [`ring`]: ring index and phase-tag arithmetic.
//! - [`cid`]: command identifiers independent of SQ slots, with a value per
//!   command.
//! - [`prp`]: the PRP planner and the chunking rules around it.
//! - [`sgl`]: Scatter Gather List descriptors, built and walked.
//! - [`fabrics`]: NVMe over Fabrics commands (Connect, Property Get and
//!   Set) and their data and responses.
//! - [`tcp`]: NVMe/TCP PDUs, built and parsed, with their digests.
//! - [`rdma`]: NVMe/RDMA's connection private data (its capsules are
//!   [`fabrics`]' with a Keyed SGL).
//!
//! Section numbers refer to the NVM Express Base Specification 2.0 unless a
//! comment says otherwise.

pub mod cid;
pub mod cmd;
pub mod fabrics;
#[cfg(test)]
mod fuzz;
pub mod identify;
pub mod prp;
pub mod rdma;
pub mod regs;
pub mod ring;
pub mod sgl;
pub mod status;
pub mod tcp;
mod types;

pub use cid::{CidAllocator, CidTable};
pub use cmd::{AdminOpcode, Cqe, NvmOpcode, Sqe};
pub use identify::{IdentifyController, IdentifyNamespace, LbaFormat};
pub use prp::{PrpError, PrpPlan};
pub use status::Status;
pub use types::{Cid, Iova, Lba, Nsid, Qid};

/// Size of one Identify data structure and of one PRP-list page we use.
pub const IDENTIFY_LEN: usize = 4096;
