//! ugds: a user-space NVMe driver that moves data between an NVMe namespace
//! and host (or GPU) memory, behind a cuFile-style API.
//!
//! The CPU orchestrates, the SSD transfers: commands are built, submitted
//! and completed in user space over queues the process owns; the kernel is
//! only used once, to set up access. The principal types:
//!
//! - [`Driver`]: library state; registers buffers and opens handles.
//! - [`Handle`]: one controller and namespace; synchronous [`Handle::read`]
//!   and [`Handle::write`] of any size, from any number of threads.
//! - [`IoQueue`]: a queue pair lent to one thread for deep asynchronous I/O.
//! - [`Batch`]: a batch context on the handle's deep queue: submit many,
//!   collect events by cookie in any order.
//! - [`Stream`], [`StreamIo`]: stream-ordered I/O with late-bound
//!   parameters ([`Handle::read_async`]); [`HostStream`] runs a stream on a
//!   host thread where there is no GPU.
//! - [`BufferToken`]: a registration, checked on every use.
//! - [`platform::Platform`]: where the controller lives;
//!   [`platform::emu`] is an emulated controller, the default target.
//!
//! ```
//! use ugds::{Driver, HandleOptions, HostBuffer, platform::emu::EmuConfig};
//! let driver = Driver::open();
//! let (handle, _emu) = driver.open_emulated(EmuConfig::default(), HandleOptions::default())?;
//! let mut buf = HostBuffer::new(1 << 20)?;
//! buf.fill(0xab);
//! // SAFETY: `buf` outlives the registration and is not touched during I/O.
//! let token = unsafe { driver.register(buf.as_mut_ptr(), buf.len())? };
//! handle.write(&token, 1 << 20, 0, 0)?;
//! buf.fill(0);
//! handle.read(&token, 4096, 4096, 0)?;
//! assert!(buf[..4096].iter().all(|&b| b == 0xab));
//! driver.deregister(&token)?;
//! # Ok::<(), ugds::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod barrier;
mod batch;
mod buffer;
pub mod dma;
mod driver;
pub mod engine;
mod error;
pub mod gpu;
mod handle;
mod io_queue;
pub mod log;
pub mod platform;
mod registry;
pub mod stream;
pub mod sys;

pub use batch::{Batch, BatchIo, BatchOp};
pub use buffer::HostBuffer;
pub use driver::Driver;
pub use engine::{BatchEvent, BatchStatus, Completion, ControllerInfo, NamespaceInfo};
pub use error::{Error, Result};
pub use handle::{Drain, Handle, HandleOptions, HandleState, QueueInfo, QueueRole};
pub use io_queue::IoQueue;
pub use registry::BufferToken;
pub use stream::{HostStream, Stream, StreamIo, StreamResult, StreamSignal};
pub use ugds_nvme as nvme;
