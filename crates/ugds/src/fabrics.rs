//! NVMe over Fabrics: controllers reached over the network, through the
//! standard protocol (NVMe/TCP), from Linux's own target (nvmet) or any
//! other.
//!
//! So far: [`probe`] connects a target's admin queue (the handshake, Fabrics
//! Connect, the registers through Property Get and Set), enables the
//! controller and identifies it and its namespaces. I/O on a fabrics
//! controller through the handle API comes next.

pub use crate::engine::tcp::{probe, FabricsProbe, TcpTarget};
pub use ugds_nvme::tcp::Digests;
