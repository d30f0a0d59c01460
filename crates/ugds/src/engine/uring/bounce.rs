//! Pinned host bounce buffers for the kernel path's commands on GPU memory:
//! by size class, shared by every queue of the process, and kept for its
//! life (unpinning waits for the device). The first [`BOUNCE_BUFFERS`] made
//! also have a slot number in every ring's registered-buffer table, which
//! each ring fills the first time it meets the buffer: the kernel then
//! pins nothing per I/O.

use crate::{Error, Result};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Mutex;
use ugds_platform::device::DeviceRuntime;
use ugds_platform::sys::uring::BOUNCE_BUFFERS;

/// Smallest and largest bounce buffer: 4 KiB << class, class 0..=10.
const CLASSES: usize = 11;

/// One bounce buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Bounce {
    /// Its first byte.
    pub addr: usize,
    /// Its size class: 4 KiB << class bytes.
    pub class: u8,
    /// Its slot in the rings' registered-buffer tables, if it has one.
    pub index: Option<u16>,
}

impl Bounce {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        4096 << self.class
    }
}

/// Free bounce buffers, by size class.
static FREE: Mutex<[Vec<Bounce>; CLASSES]> = Mutex::new([const { Vec::new() }; CLASSES]);

/// The next registered-buffer slot to give a new bounce buffer.
static NEXT_INDEX: AtomicU16 = AtomicU16::new(0);

/// A bounce buffer of at least `len` bytes (at most 4 MiB): from the pool,
/// or made and pinned by `runtime`.
pub(super) fn take(len: usize, runtime: &dyn DeviceRuntime) -> Result<Bounce> {
    let class = (len.max(4096).next_power_of_two().trailing_zeros() - 12) as usize;
    if class >= CLASSES {
        return Err(Error::InvalidArgument(format!("a command of {len} bytes (the kernel path's limit is 4 MiB)")));
    }
    if let Some(b) = FREE.lock().unwrap_or_else(|p| p.into_inner())[class].pop() {
        return Ok(b);
    }
    let mem = ugds_platform::sys::Anonymous::populated(4096 << class)?;
    let ptr = mem.as_ptr();
    // Kept for the process: the pool hands it out again, rings keep it
    // registered, and unpinning would wait for the device.
    std::mem::forget(mem);
    if !runtime.host_register(ptr, 4096 << class) {
        tracing::info!("bounce buffer not pinned: the runtime stages its copies");
    }
    let index =
        NEXT_INDEX.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| (i < BOUNCE_BUFFERS).then_some(i + 1)).ok();
    Ok(Bounce { addr: ptr as usize, class: class as u8, index })
}

/// Gives `b` back to the pool.
pub(super) fn give(b: Bounce) {
    FREE.lock().unwrap_or_else(|p| p.into_inner())[b.class as usize].push(b);
}
