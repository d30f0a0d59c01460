//! Stream-ordered operations on a handle: the `Handle` calls that place
//! reads and writes on a [`Stream`](crate::Stream) (`read_async`,
//! `write_async`, `batch_async`), the job each becomes once the stream
//! reaches it and its values are bound, and the per-handle stream engine
//! that runs those jobs on the batch queue and sets their signals.
//!
//! What a stream is, its signal and its counters are in [`crate::stream`],
//! below the GPU streams that implement it; this module sits above both
//! and the handle.

mod engine;
mod job;
mod op;

pub(crate) use engine::start_engine;
