//! The engine: controller bring-up, queue pairs, splitting requests into
//! commands, and waiting for completions.
//!
//! - [`controller`]: a controller of any transport, one enum over them;
//!   [`pcie`], a PCIe controller's bring-up, admin commands and shutdown;
//!   [`info`], what bring-up learns (controller, namespaces).
//! - [`queue`]: a queue pair of any transport, used by one thread at a time:
//!   [`qpair`] a controller's, [`uring`] the kernel path's, [`tcp`]'s an
//!   NVMe/TCP connection; [`kernel`], the kernel path's stand-in for a
//!   controller; `bounce`, the pinned host buffers of the transports that
//!   copy to and from GPU memory.
//! - [`tracker`]: what a queue pair knows of each command on the device;
//!   `requests`, the table of requests (each one or more commands) that
//!   every user of a queue pair keeps.
//! - [`stats`]: what each queue pair has done, counted without a shared
//!   atomic operation per I/O.
//! - [`chunk`]: splitting a request by MDTS and PRP-list capacity.
//! - [`sync`]: shared queue pairs for synchronous callers.
//! - [`batch`]: the deep batch queue shared by batch contexts;
//!   `contexts`, what the contexts keep (requests, events, counts).
//! - `hold`: what keeps a request's memory registered while it is in flight.
//! - `fabrics`: what the fabrics transports share above their capsules
//!   (Connect, the registers through Property Get and Set, Identify).
//! - [`tcp`]: NVMe over TCP, the host side: the connection, the controller
//!   (admin queue, keep-alive) and its I/O queues.
//! - [`rdma`]: NVMe over RDMA, the host side: a connection per queue
//!   through librdmacm and libibverbs, commands by SEND, data by the
//!   target's RDMA READ and WRITE of registered host memory.

pub mod batch;
pub(crate) mod bounce;
pub mod chunk;
pub(crate) mod contexts;
pub mod controller;
pub mod counter;
pub mod cq_view;
pub(crate) mod fabrics;
#[cfg(test)]
mod fake;
pub(crate) mod hold;
pub mod info;
pub mod kernel;
pub mod pcie;
pub mod qpair;
pub mod queue;
pub mod rdma;
pub(crate) mod requests;
#[cfg(test)]
pub(crate) mod slow_gpu;
pub mod stats;
pub mod sync;
pub mod tcp;
pub mod trace;
pub mod tracker;
pub mod transport;
pub mod uring;

pub use batch::{BatchEvent, BatchStatus};
#[cfg_attr(not(feature = "engine-internals"), allow(unused_imports))]
pub use controller::Controller;
pub use info::{ControllerInfo, NamespaceInfo};
#[cfg_attr(not(feature = "engine-internals"), allow(unused_imports))]
pub use kernel::{CachePolicy, KernelController, KernelRing};
#[cfg_attr(not(feature = "engine-internals"), allow(unused_imports))]
pub use pcie::NvmeController;
#[cfg_attr(not(feature = "engine-internals"), allow(unused_imports))]
pub use qpair::NvmeQueue;
pub use queue::QueuePair;
pub use sync::Completion;
pub use tracker::Owner;
#[cfg_attr(not(feature = "engine-internals"), allow(unused_imports))]
pub use transport::Transport;
#[cfg_attr(not(feature = "engine-internals"), allow(unused_imports))]
pub use uring::UringQueue;
