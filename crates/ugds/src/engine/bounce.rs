//! Pinned host bounce buffers for commands on GPU memory where the transport
//! copies (the kernel path, NVMe over TCP):
//! by size class, shared by every queue of the process, and kept for its
//! life (unpinning waits for the device). Buffers of up to 2 MiB are cut
//! from 2 MiB slabs, each pinned with one call to the GPU runtime (a first
//! batch of 128 small reads pins one slab, not 128 buffers); larger ones
//! are a slab each. The first [`BOUNCE_BUFFERS`] slabs also have a slot
//! number in every ring's registered-buffer table, which each ring fills
//! the first time it meets the slab: the kernel then pins nothing per I/O.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Mutex;
use ugds_platform::device::DeviceRuntime;
use ugds_platform::sys::uring::BOUNCE_BUFFERS;
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// Smallest and largest bounce buffer: 4 KiB << class, class 0..=10.
const CLASSES: usize = 11;

/// Bytes of the slabs small buffers are cut from.
const SLAB: usize = 2 << 20;

/// One bounce buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounce {
    /// Its first byte.
    pub addr: usize,
    /// Its size class: 4 KiB << class bytes.
    pub class: u8,
    /// The slab it was cut from (first byte, bytes): what rings register.
    pub slab: (usize, usize),
    /// The slab's slot in the rings' registered-buffer tables, if it has one.
    pub index: Option<u16>,
}

/// Free bounce buffers, by size class.
static FREE: Mutex<[Vec<Bounce>; CLASSES]> = Mutex::new([const { Vec::new() }; CLASSES]);

/// The next registered-buffer slot to give a new slab.
static NEXT_INDEX: AtomicU16 = AtomicU16::new(0);

/// A bounce buffer of at least `len` bytes (at most 4 MiB): from the pool,
/// or cut from a new slab pinned by `runtime`.
pub(crate) fn take(len: usize, runtime: &dyn DeviceRuntime) -> Result<Bounce> {
    let class = (len.max(4096).next_power_of_two().trailing_zeros() - 12) as usize;
    if class >= CLASSES {
        return Err(Error::InvalidArgument(format!("a command of {len} bytes (the kernel path's limit is 4 MiB)")));
    }
    let mut free = FREE.lock().recover();
    if let Some(b) = free[class].pop() {
        return Ok(b);
    }
    let size = 4096usize << class;
    let slab_len = size.max(SLAB);
    let started = std::time::Instant::now();
    let mem = ugds_platform::sys::Anonymous::huge(slab_len, true)?;
    let base = mem.as_ptr();
    // Kept for the process: the pool hands its buffers out again, rings
    // keep it registered, and unpinning would wait for the device.
    std::mem::forget(mem);
    let allocated = started.elapsed();
    if !runtime.host_register(base, slab_len) {
        tracing::info!("bounce buffers not pinned: the runtime stages its copies");
    }
    tracing::debug!(
        bytes = slab_len,
        buffer = size,
        alloc_us = allocated.as_micros() as u64,
        pin_us = (started.elapsed() - allocated).as_micros() as u64,
        "bounce slab made"
    );
    let index =
        NEXT_INDEX.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| (i < BOUNCE_BUFFERS).then_some(i + 1)).ok();
    let slab = (base as usize, slab_len);
    // Handed out from the slab's start first.
    free[class].extend((1..slab_len / size).rev().map(|i| Bounce {
        addr: base as usize + i * size,
        class: class as u8,
        slab,
        index,
    }));
    Ok(Bounce { addr: base as usize, class: class as u8, slab, index })
}

/// Gives `b` back to the pool.
pub(crate) fn give(b: Bounce) {
    FREE.lock().recover()[b.class as usize].push(b);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use ugds_platform::device::DmabufExport;

    /// Counts the pins it is asked for.
    #[derive(Default)]
    struct Pins(AtomicUsize);

    impl DeviceRuntime for Pins {
        fn name(&self) -> &'static str {
            "pins"
        }
        unsafe fn copy_to_device(&self, _: u64, _: &[u8]) -> Result<()> {
            unreachable!()
        }
        unsafe fn copy_from_device(&self, _: &mut [u8], _: u64) -> Result<()> {
            unreachable!()
        }
        fn host_register(&self, _: *mut u8, len: usize) -> bool {
            assert_eq!(len, SLAB);
            self.0.fetch_add(1, Ordering::Relaxed);
            true
        }
        fn host_unregister(&self, _: *mut u8) {}
        fn export_dmabuf(&self, _: u64, _: usize) -> Result<DmabufExport> {
            Err(Error::Unsupported("a test runtime".into()))
        }
    }

    #[test]
    fn small_buffers_are_cut_from_slabs_pinned_once() {
        let pins = Pins::default();
        // More than one slab's worth of 4 KiB buffers (512 a slab).
        let taken: Vec<Bounce> = (0..600).map(|_| take(4096, &pins).unwrap()).collect();
        // Other tests share the pool (and may take from a slab made here).
        assert!(pins.0.load(Ordering::Relaxed) <= 3, "{} pins for 600 buffers", pins.0.load(Ordering::Relaxed));
        let mut addrs: Vec<usize> = taken.iter().map(|b| b.addr).collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), 600, "no buffer handed out twice");
        for b in &taken {
            assert_eq!(b.addr % 4096, 0);
            assert!(b.addr >= b.slab.0 && b.addr + 4096 <= b.slab.0 + b.slab.1, "inside its slab: {b:?}");
        }
        taken.into_iter().for_each(give);
        assert!(take(8 << 20, &pins).is_err(), "over the largest class");
    }
}
