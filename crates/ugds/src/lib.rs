//! ugds: a user-space NVMe driver that moves data between a namespace and
//! host or GPU memory, behind a cuFile-style API.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod barrier;
pub mod dma;
mod error;
pub mod platform;
pub mod sys;

pub use error::{Error, Result};
