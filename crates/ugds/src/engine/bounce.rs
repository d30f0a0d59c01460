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

/// The pool: free buffers by size class, and the slab new small buffers
/// are cut from.
struct Pool {
    free: [Vec<Bounce>; CLASSES],
    /// The newest slab and how many of its bytes are handed out: buffers of
    /// every class below 2 MiB are cut from it in turn, so that a slab made
    /// ahead of time ([`warm`]) serves the first 4 KiB, 64 KiB and 512 KiB
    /// commands alike.
    cursor: Option<Cursor>,
}

#[derive(Clone, Copy)]
struct Cursor {
    slab: (usize, usize),
    index: Option<u16>,
    used: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { free: [const { Vec::new() }; CLASSES], cursor: None });

/// The next registered-buffer slot to give a new slab.
static NEXT_INDEX: AtomicU16 = AtomicU16::new(0);

/// A bounce buffer of at least `len` bytes (at most 4 MiB): from the pool,
/// or cut from a slab (a new one pinned by `runtime` when the last is used
/// up).
pub(crate) fn take(len: usize, runtime: &dyn DeviceRuntime) -> Result<Bounce> {
    let class = (len.max(4096).next_power_of_two().trailing_zeros() - 12) as usize;
    if class >= CLASSES {
        return Err(Error::InvalidArgument(format!("a command of {len} bytes (the kernel path's limit is 4 MiB)")));
    }
    let mut pool = POOL.lock().recover();
    if let Some(b) = pool.free[class].pop() {
        return Ok(b);
    }
    let size = 4096usize << class;
    if size >= SLAB {
        // A slab of its own.
        let (slab, index) = new_slab(size, runtime)?;
        return Ok(Bounce { addr: slab.0, class: class as u8, slab, index });
    }
    if let Some(b) = pool.cut(class) {
        return Ok(b);
    }
    let (slab, index) = new_slab(SLAB, runtime)?;
    pool.cursor = Some(Cursor { slab, index, used: 0 });
    Ok(pool.cut(class).expect("a new slab holds any buffer below its size"))
}

/// The slab small buffers are cut from now, where it has a slot in the
/// rings' tables (the one [`warm`] made, until it is used up).
pub(crate) fn current_slab() -> Option<((usize, usize), u16)> {
    let c = POOL.lock().recover().cursor?;
    Some((c.slab, c.index?))
}

/// Whether a slab was made ([`warm`] has nothing to do).
#[cfg(feature = "gpu")]
pub(crate) fn warmed() -> bool {
    POOL.lock().recover().cursor.is_some()
}

/// Makes a slab ahead of the first command that needs one, where none was
/// made yet, and has `runtime` prepare its copies through a buffer of it:
/// what a GPU registration on a path that copies through bounce buffers
/// calls, so that the first read pins nothing and makes no copy stream's
/// first copy.
pub(crate) fn warm(runtime: &dyn DeviceRuntime) -> Result<()> {
    {
        let mut pool = POOL.lock().recover();
        if pool.cursor.is_none() {
            let (slab, index) = new_slab(SLAB, runtime)?;
            pool.cursor = Some(Cursor { slab, index, used: 0 });
        }
    }
    let b = take(4096, runtime)?;
    // SAFETY: a pinned buffer of the pool, ours until given back.
    unsafe { runtime.prepare_copies(b.addr as *mut u8, 4096) }?;
    // Not given back on an error: a copy may still write it.
    give(b);
    Ok(())
}

impl Pool {
    /// A buffer of `class` cut from the current slab, if it has room. The
    /// bytes skipped to align it go to the free lists as smaller buffers.
    fn cut(&mut self, class: usize) -> Option<Bounce> {
        let size = 4096usize << class;
        let c = self.cursor.as_mut()?;
        let at = c.used.next_multiple_of(size);
        if at + size > c.slab.1 {
            return None;
        }
        let (slab, index) = (c.slab, c.index);
        let mut gap = c.used;
        c.used = at + size;
        while gap < at {
            // The largest naturally aligned buffer that fits the gap.
            let k = (gap.trailing_zeros() as usize - 12).min((at - gap).ilog2() as usize - 12).min(CLASSES - 1);
            self.free[k].push(Bounce { addr: slab.0 + gap, class: k as u8, slab, index });
            gap += 4096 << k;
        }
        Some(Bounce { addr: slab.0 + at, class: class as u8, slab, index })
    }
}

/// A new slab of `len` bytes on huge pages, pinned by `runtime`, and its
/// slot in the rings' registered-buffer tables if one is left.
fn new_slab(len: usize, runtime: &dyn DeviceRuntime) -> Result<((usize, usize), Option<u16>)> {
    let started = std::time::Instant::now();
    let mem = ugds_platform::sys::Anonymous::huge(len, true)?;
    let base = mem.as_ptr();
    // Kept for the process: the pool hands its buffers out again, rings
    // keep it registered, and unpinning would wait for the device.
    std::mem::forget(mem);
    let allocated = started.elapsed();
    if !runtime.host_register(base, len) {
        tracing::info!("bounce buffers not pinned: the runtime stages its copies");
    }
    tracing::debug!(
        bytes = len,
        alloc_us = allocated.as_micros() as u64,
        pin_us = (started.elapsed() - allocated).as_micros() as u64,
        "bounce slab made"
    );
    let index =
        NEXT_INDEX.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| (i < BOUNCE_BUFFERS).then_some(i + 1)).ok();
    Ok(((base as usize, len), index))
}

/// Gives `b` back to the pool.
pub(crate) fn give(b: Bounce) {
    POOL.lock().recover().free[b.class as usize].push(b);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use ugds_platform::device::DmabufExport;

    /// Counts the pins it is asked for, records where it was asked to
    /// prepare its copies, and fails those when told to.
    #[derive(Default)]
    struct Pins {
        pinned: AtomicUsize,
        fail_prepare: bool,
        prepared: Mutex<Vec<(usize, usize)>>,
    }

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
        unsafe fn prepare_copies(&self, staging: *mut u8, len: usize) -> Result<()> {
            self.prepared.lock().unwrap().push((staging as usize, len));
            if self.fail_prepare {
                return Err(Error::Platform("a copy failed".into()));
            }
            Ok(())
        }
        fn host_register(&self, _: *mut u8, len: usize) -> bool {
            assert_eq!(len, SLAB);
            self.pinned.fetch_add(1, Ordering::Relaxed);
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
        assert!(
            pins.pinned.load(Ordering::Relaxed) <= 3,
            "{} pins for 600 buffers",
            pins.pinned.load(Ordering::Relaxed)
        );
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

    #[test]
    fn buffers_of_every_small_class_share_a_slab_each_aligned_to_its_size() {
        // Alone in the pool: a pool of its own, as `take` would see it.
        let pins = Pins::default();
        let mut pool = Pool { free: [const { Vec::new() }; CLASSES], cursor: None };
        let (slab, index) = new_slab(SLAB, &pins).unwrap();
        pool.cursor = Some(Cursor { slab, index, used: 0 });
        let mut cut = Vec::new();
        for class in [0, 4, 7, 0, 4, 6] {
            let b = pool.cut(class).expect("room in the slab");
            assert_eq!(b.class as usize, class);
            assert_eq!((b.addr - slab.0) % (4096 << class), 0, "aligned to its size: {b:?}");
            cut.push(b);
        }
        assert_eq!(pins.pinned.load(Ordering::Relaxed), 1, "one slab pinned for all of them");
        // What alignment skipped is free, as smaller buffers, none overlapping.
        let mut spans: Vec<(usize, usize)> = cut.iter().map(|b| (b.addr, 4096 << b.class)).collect();
        spans.extend(pool.free.iter().flatten().map(|b| (b.addr, 4096 << b.class)));
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:?}");
        }
        let covered: usize = spans.iter().map(|s| s.1).sum();
        assert_eq!(covered, spans.last().map(|s| s.0 + s.1 - slab.0).unwrap(), "no bytes lost before the cursor");
        // 1.5 MiB of 2 are handed out: a 1 MiB buffer no longer fits, and
        // leaves this slab to a new one (`take` makes it).
        assert_eq!(pool.cursor.unwrap().used, (3 << 20) / 2);
        assert!(pool.cut(8).is_none());
    }

    #[test]
    fn warm_prepares_copies_through_a_pool_buffer_kept_from_the_pool_when_they_fail() {
        let ok = Pins::default();
        warm(&ok).unwrap();
        let asked = ok.prepared.lock().unwrap().clone();
        assert_eq!(asked.len(), 1, "asked once per warm: {asked:?}");
        assert_eq!((asked[0].0 % 4096, asked[0].1), (0, 4096), "a whole pool buffer");

        // A copy may still write the buffer of a failed preparation: it
        // never goes back to the pool (other tests share it, and give
        // their buffers back).
        let failing = Pins { fail_prepare: true, ..Default::default() };
        assert!(warm(&failing).is_err());
        let lost = failing.prepared.lock().unwrap()[0].0;
        let taken: Vec<Bounce> = (0..600).map(|_| take(4096, &failing).unwrap()).collect();
        assert!(taken.iter().all(|b| b.addr != lost), "the buffer a copy may still write was handed out again");
        taken.into_iter().for_each(give);
    }
}
