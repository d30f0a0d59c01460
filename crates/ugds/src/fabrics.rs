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
//! - [`Driver::open_rdma`](crate::Driver::open_rdma): a handle on a
//!   namespace of an NVMe/RDMA controller (through rdma-core, loaded at
//!   run time), every API of a local one on host memory, each command's
//!   data copied through its queue's registered memory (at most
//!   [`RDMA_STAGING`] bytes a command; larger requests are split), polled
//!   or with interrupt completion (completion channels); GPU memory is
//!   refused.
//! - [`RdmaSession`]: an NVMe/RDMA controller's admin queue and one I/O
//!   queue, one command at a time (`ugds rdma --connect`).

pub use crate::engine::rdma::{RdmaSession, RdmaTarget, STAGING as RDMA_STAGING};
pub use crate::engine::tcp::{probe, FabricsProbe, TcpTarget};
pub use ugds_nvme::tcp::Digests;
