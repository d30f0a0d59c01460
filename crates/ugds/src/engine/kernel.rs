//! The kernel path's stand-in for a controller: the file (or the namespace
//! behind a generic character device) presented as one namespace, and a
//! ring ([`UringQueue`]) for each queue pair asked for.

use super::uring::UringQueue;
pub use super::uring::{CachePolicy, KernelRing};
use std::sync::Arc;
use ugds_platform::kernel::KernelPlatform;
use ugds_platform::{Error, Result};

/// The kernel path's stand-in for a controller: what it "identifies" is
/// the file, and creating a queue pair makes a ring.
pub struct KernelController {
    platform: Arc<KernelPlatform>,
    dyn_platform: Arc<dyn ugds_platform::Platform>,
    info: super::ControllerInfo,
    block_size: u32,
    ring: KernelRing,
    cache: CachePolicy,
}

impl std::fmt::Debug for KernelController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelController").field("platform", &self.platform).finish_non_exhaustive()
    }
}

/// The largest transfer of one operation by default: a request above it
/// becomes several operations in flight at once, and a GPU request's copies
/// overlap its later reads. Chosen by measurement on the H200 VM's virtio
/// disk (docs/benchmarks.md): 512 KiB gave synchronous 1 MiB and 16 MiB
/// reads into GPU memory 9-10% above 1 MiB commands (medians of five
/// alternating runs each); 128 and 256 KiB were not better.
const DEFAULT_TRANSFER: usize = 512 << 10;

/// The largest passed-through command (see `KernelController::new`).
const PASSTHROUGH_TRANSFER: usize = 256 << 10;

/// The largest transfer `UGDS_KERNEL_CHUNK` may set (the bounce buffers'
/// largest size class).
const MAX_TRANSFER: usize = 4 << 20;

/// Block size the kernel path presents: offsets and sizes are multiples
/// of it (`O_DIRECT` is used where they are also multiples of what the file
/// needs for it).
pub const KERNEL_BLOCK_SIZE: u32 = 512;

/// The largest command from `UGDS_KERNEL_CHUNK` (its value, if set): bytes,
/// a power of two from 64 KiB to [`MAX_TRANSFER`]; unset or empty, the
/// default.
fn kernel_chunk(value: Option<&str>) -> Result<usize> {
    let Some(v) = value.filter(|v| !v.is_empty()) else { return Ok(DEFAULT_TRANSFER) };
    v.parse::<usize>().ok().filter(|c| c.is_power_of_two() && (64 << 10..=MAX_TRANSFER).contains(c)).ok_or_else(|| {
        Error::InvalidArgument(format!("UGDS_KERNEL_CHUNK={v:?}: bytes, a power of two from 65536 to {MAX_TRANSFER}"))
    })
}

impl KernelController {
    /// The file behind `platform` as a one-namespace controller granting
    /// `want_io_queues` queues, whose rings run as `ring` says. IOPOLL needs
    /// polled completion (`polled`) and a file that takes it: a direct read
    /// is tried on such a ring first, and a file that refuses is a clear
    /// error here rather than at the first I/O.
    pub fn new(
        platform: Arc<KernelPlatform>,
        want_io_queues: u16,
        ring: KernelRing,
        polled: bool,
    ) -> Result<KernelController> {
        if ring == KernelRing::IoPoll {
            if !polled {
                return Err(Error::InvalidArgument("IOPOLL rings have no interrupts: use polled completion".into()));
            }
            if platform.direct_fd().is_none() && platform.passthrough_namespace().is_none() {
                return Err(Error::Unsupported(format!(
                    "IOPOLL on {}: it takes no direct I/O",
                    platform.path().display()
                )));
            }
            UringQueue::new(platform.clone(), None, 0, 2, KERNEL_BLOCK_SIZE, ring)?.probe().map_err(|e| {
                Error::Unsupported(format!(
                    "IOPOLL on {}: a direct read on a polled ring failed ({e})",
                    platform.path().display()
                ))
            })?;
        }
        let pt = platform.passthrough_namespace();
        let block_size = pt.map_or(KERNEL_BLOCK_SIZE, |(_, bs, _)| bs);
        // Passed through, a command is the controller's: within its MDTS.
        // `UGDS_KERNEL_CHUNK` (bytes, a power of two from 64 KiB to 4 MiB)
        // sets a smaller largest command, to measure what suits a disk.
        let chunk = kernel_chunk(std::env::var("UGDS_KERNEL_CHUNK").ok().as_deref())?;
        // Passed through, a command also meets the kernel's limits on one
        // request: at most 127 segments on NVMe over PCIe (a 512 KiB buffer
        // that does not start on a page spans 129 pages: EINVAL, seen on
        // QEMU's controller), so at most 256 KiB.
        let max_transfer = match pt {
            Some((_, _, mdts)) => mdts.unwrap_or(PASSTHROUGH_TRANSFER).min(PASSTHROUGH_TRANSFER).min(chunk),
            None => chunk,
        };
        // The last block may be partial: a read of it returns what there is.
        // An empty file has no blocks until it grows (`Handle::grow`).
        let blocks = platform.size().div_ceil(block_size as u64);
        let identify = ugds_nvme::IdentifyController {
            mn: "Linux kernel (io_uring)".into(),
            sn: platform.path().display().to_string(),
            nn: 1,
            ..Default::default()
        };
        let info = super::ControllerInfo {
            // MQES 4095 (a ring of 4096), doorbell stride 4 bytes.
            cap: ugds_nvme::regs::Cap(4095),
            version: ugds_nvme::regs::Version(0),
            identify,
            namespaces: vec![super::NamespaceInfo { nsid: pt.map_or(1, |(nsid, _, _)| nsid), block_size, blocks }],
            skipped: Vec::new(),
            io_queues: want_io_queues.clamp(1, 64),
            max_transfer: Some(max_transfer),
            page_size: 4096,
            platform: ugds_platform::Platform::describe(&*platform),
        };
        Ok(KernelController {
            dyn_platform: platform.clone(),
            platform,
            info,
            block_size,
            ring,
            cache: CachePolicy::default(),
        })
    }

    /// Sets whether its rings read through the page cache.
    pub fn cache_policy(mut self, cache: CachePolicy) -> Self {
        self.cache = cache;
        self
    }

    /// What it presents.
    pub fn info(&self) -> &super::ControllerInfo {
        &self.info
    }

    /// The file.
    pub fn file(&self) -> &Arc<KernelPlatform> {
        &self.platform
    }

    /// The same, as the engine's platform.
    pub fn dyn_platform(&self) -> &Arc<dyn ugds_platform::Platform> {
        &self.dyn_platform
    }

    /// A ring of `entries` for queue `qid`, signalling `vector` when given.
    pub fn create_ring(&self, qid: u16, entries: u16, vector: Option<u16>) -> Result<UringQueue> {
        // IOPOLL rings take no interrupts (their queues poll).
        let vector = vector.filter(|_| self.ring != KernelRing::IoPoll);
        let interrupt = match vector {
            Some(v) => {
                let efd = ugds_platform::Platform::interrupt(&*self.platform, v)?
                    .ok_or_else(|| Error::InvalidArgument(format!("no interrupt vector {v}")))?;
                Some((v, efd))
            }
            None => None,
        };
        let mut q = UringQueue::new(self.platform.clone(), interrupt, qid, entries, self.block_size, self.ring)?;
        q.set_cache_policy(self.cache);
        Ok(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_chunk_takes_powers_of_two_in_range_only() {
        assert_eq!(kernel_chunk(None).unwrap(), DEFAULT_TRANSFER);
        assert_eq!(kernel_chunk(Some("")).unwrap(), DEFAULT_TRANSFER);
        assert_eq!(kernel_chunk(Some("65536")).unwrap(), 64 << 10);
        assert_eq!(kernel_chunk(Some("4194304")).unwrap(), MAX_TRANSFER);
        // Each of these used to leave the default in place without a word.
        for v in ["64k", "32768", "100000", "8388608", "-1"] {
            let e = kernel_chunk(Some(v)).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("UGDS_KERNEL_CHUNK")), "{v}: {e}");
        }
    }
}
