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
//! - [`Volume`]: one handle over several namespaces, striped or
//!   concatenated, on any mix of controllers.
//! - [`BufferToken`]: a registration, checked on every use.
//! - [`platform::Platform`]: where the controller lives (the
//!   `ugds-platform` crate: vfio-pci, the ugds_drv module); the `ugds-emu`
//!   crate is an emulated controller, the default target of the CLI and of
//!   the tests.
//!
//! ```
//! use std::sync::Arc;
//! use ugds::{Driver, HandleOptions, HostBuffer};
//! use ugds_emu::{EmuConfig, EmuPlatform};
//! let driver = Driver::open();
//! let emu = Arc::new(EmuPlatform::new(EmuConfig::default())?);
//! let handle = driver.open_handle(emu, HandleOptions::default())?;
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

mod batch;
mod buffer;
mod driver;
#[cfg(not(feature = "engine-internals"))]
mod engine;
/// The engine, public only with the `engine-internals` feature (the
/// emulator's protocol tests and the bare-queue-pair example drive it).
#[cfg(feature = "engine-internals")]
#[doc(hidden)]
pub mod engine;
pub mod fabrics;
pub mod gpu;
mod handle;
mod io_queue;
pub mod log;
pub mod mode;
pub mod publish;
mod registry;
pub mod serve;
pub mod shared_state;
pub mod stream;
mod stream_ops;
pub mod volume;

/// Where a controller lives (the `ugds-platform` crate).
pub use ugds_platform as platform;

pub use batch::{Batch, BatchContext, BatchIo, BatchIov, BatchOp};
pub use buffer::HostBuffer;
pub use driver::Driver;
pub use engine::batch::RequestStats;
pub use engine::trace::{LatencyHistogram, TraceEvent};
pub use engine::{BatchEvent, BatchStatus, Completion, ControllerInfo, NamespaceInfo};
pub use engine::{CachePolicy, KernelRing};
pub use handle::{
    trapping_hypervisor, Drain, Handle, HandleOptions, HandleState, Placement, Priority, QueueInfo, QueueLatency,
    QueueRole, QueueStats, QueueTrace, Segment, MAX_SEGMENTS, MAX_TRACE,
};
pub use io_queue::IoQueue;
pub use mode::Mode;
pub use registry::BufferToken;
pub use stream::{HostStream, Stream, StreamCounters, StreamIo, StreamResult, StreamService, StreamSignal};
pub use ugds_nvme as nvme;
pub use ugds_platform::{Error, ErrorKind, Result};
pub use volume::{Volume, VolumeBatch, VolumeLayout, VolumeQueue};

/// The ugds_drv ioctl ABI version this library speaks.
pub const UGDS_DRV_ABI_VERSION: u32 = ugds_platform::ugds_drv::ABI_VERSION;
