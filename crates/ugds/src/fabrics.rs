//! NVMe over Fabrics: controllers reached over the network, through the
//! standard protocol (NVMe/TCP), from Linux's own target (nvmet) or any
//! other.
//!
//! - [`Driver::open_tcp`](crate::Driver::open_tcp): a handle on a
//!   namespace of a fabrics controller, with every API of a local one
//!   (synchronous, vectored, batch, stream-ordered, lent queues, volumes).
//! - [`probe`]: connects a target's admin queue (the handshake, Fabrics
//!   Connect, the registers through Property Get and Set), enables the
//!   controller, identifies it and its namespaces, and leaves.

pub use crate::engine::tcp::{probe, FabricsProbe, TcpTarget};
pub use ugds_nvme::tcp::Digests;
