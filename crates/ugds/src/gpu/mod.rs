//! GPU runtimes, loaded at run time: registration of device memory, dma-buf
//! export, the copy engine the emulated controller uses in place of PCIe
//! peer-to-peer DMA, and streams for stream-ordered I/O.
//!
//! - `cuda`: NVIDIA's driver API (`libcuda.so.1`).
//! - `hip`: AMD's HIP runtime (`libamdhip64.so`) and HSA for dma-buf export.
//!
//! Nothing here is needed to build, or to run on host memory: a runtime is
//! loaded the first time it is asked for, and its absence is an
//! [`Error::GpuUnavailable`](crate::Error::GpuUnavailable). The runtimes
//! are behind the `gpu` feature (on by default); without it the library
//! has no CUDA or HIP code at all.

#[cfg(feature = "gpu")]
pub mod cuda;
#[cfg(feature = "gpu")]
pub mod hip;
// Without the runtimes nothing makes a GpuStream: its machinery stays
// (the stream-ordered API names it) but is unused.
#[cfg_attr(not(feature = "gpu"), allow(dead_code))]
mod stream;

pub use stream::{GpuStream, StreamWait};
pub(crate) use stream::{StageLease, StageMark, MAX_PIECES};
#[cfg(feature = "gpu")]
pub(crate) use ugds_platform::device::page_span;
pub use ugds_platform::device::{dmabuf, CopyTicket, DeviceMemory, DeviceRuntime, DmabufExport};
#[cfg(feature = "gpu")]
pub(crate) use ugds_platform::sys::dl;
