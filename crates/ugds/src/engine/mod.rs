//! The engine: controller bring-up, queue pairs, splitting requests into
//! commands, and waiting for completions.
//!
//! - [`controller`]: bring-up, admin commands, shutdown.
//! - [`qpair`]: one queue pair, used by one thread at a time.
//! - [`tracker`]: what a queue pair knows of each command on the device.
//! - [`chunk`]: splitting a request by MDTS and PRP-list capacity.
//! - [`sync`]: shared queue pairs for synchronous callers.
//! - [`batch`]: the deep batch queue shared by batch contexts.
//! - `hold`: what keeps a request's memory registered while it is in flight.

pub mod batch;
pub mod chunk;
pub mod controller;
pub(crate) mod hold;
pub mod qpair;
pub mod sync;
pub mod tracker;

pub use batch::{BatchEvent, BatchStatus};
pub use controller::{Controller, ControllerInfo, NamespaceInfo};
pub use qpair::QueuePair;
pub use sync::Completion;
pub use tracker::Owner;
