//! NVMe over Fabrics: controllers reached over the network, through the
//! standard protocols (NVMe/TCP, NVMe/RDMA), from Linux's own target
//! (nvmet) or any other.
//!
//! - [`Driver::open_tcp`](crate::Driver::open_tcp): a handle on a
//!   namespace of a fabrics controller, with every API of a local one
//!   (synchronous, vectored, batch, stream-ordered, lent queues, volumes).
//! - [`probe`]: connects a target's admin queue (the handshake, Fabrics
//!   Connect, the registers through Property Get and Set), enables the
//!   controller, identifies it and its namespaces, and leaves.
//! - [`RdmaSession`]: an NVMe/RDMA controller's admin queue and one I/O
//!   queue (through rdma-core, loaded at run time), synchronous reads and
//!   writes of up to [`RDMA_STAGING`] bytes through a registered buffer of
//!   the queue's own. A handle on an RDMA controller is not built yet.

pub use crate::engine::rdma::{RdmaSession, RdmaTarget, STAGING as RDMA_STAGING};
pub use crate::engine::tcp::{probe, FabricsProbe, TcpTarget};
pub use ugds_nvme::tcp::Digests;
