//! A test double for a GPU runtime whose copies take several looks to
//! finish and move their bytes only then: what the queues that start
//! copies and go on (the kernel path's, NVMe/TCP's) are tested against.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use ugds_platform::device::{CopyTicket, DeviceRuntime, DmabufExport};
use ugds_platform::{Error, Result};

/// A copy in flight: bytes move when `left` looks have been spent.
struct Job {
    left: u32,
    to_device: bool,
    host: usize,
    dev: u64,
    len: usize,
    fail: bool,
}

/// GPU memory in a vector, behind copies that finish on their third look.
pub(crate) struct SlowGpu {
    pub base: u64,
    pub mem: Mutex<Vec<u8>>,
    jobs: Mutex<HashMap<usize, Job>>,
    next: AtomicU32,
    /// Copies started from now on fail.
    pub fail: AtomicBool,
    /// The most copies in flight at once.
    peak: AtomicUsize,
}

impl SlowGpu {
    pub fn new(len: usize) -> Arc<SlowGpu> {
        Arc::new(SlowGpu {
            base: 0x7000_0000_0000,
            mem: Mutex::new(vec![0; len]),
            jobs: Mutex::new(HashMap::new()),
            next: AtomicU32::new(1),
            fail: AtomicBool::new(false),
            peak: AtomicUsize::new(0),
        })
    }

    fn start(&self, to_device: bool, host: usize, dev: u64, len: usize) -> CopyTicket {
        let t = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        let fail = self.fail.load(Ordering::Relaxed);
        let mut jobs = self.jobs.lock().unwrap();
        jobs.insert(t, Job { left: 3, to_device, host, dev, len, fail });
        self.peak.fetch_max(jobs.len(), Ordering::Relaxed);
        CopyTicket::new(t)
    }

    pub fn in_flight(&self) -> usize {
        self.jobs.lock().unwrap().len()
    }

    /// The most copies that were in flight at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

impl DeviceRuntime for SlowGpu {
    fn name(&self) -> &'static str {
        "slow"
    }
    unsafe fn copy_to_device(&self, _: u64, _: &[u8]) -> Result<()> {
        panic!("the queues under test start their copies and do not wait for them");
    }
    unsafe fn copy_from_device(&self, _: &mut [u8], _: u64) -> Result<()> {
        panic!("the queues under test start their copies and do not wait for them");
    }
    unsafe fn copy_to_device_start(&self, dst: u64, src: *const u8, len: usize) -> Result<CopyTicket> {
        Ok(self.start(true, src as usize, dst, len))
    }
    unsafe fn copy_from_device_start(&self, dst: *mut u8, src: u64, len: usize) -> Result<CopyTicket> {
        Ok(self.start(false, dst as usize, src, len))
    }
    fn copy_finished(&self, ticket: CopyTicket) -> Result<bool> {
        let mut jobs = self.jobs.lock().unwrap();
        let j = jobs.get_mut(&ticket.raw()).expect("a ticket of ours, not yet answered");
        j.left -= 1;
        if j.left > 0 {
            return Ok(false);
        }
        let j = jobs.remove(&ticket.raw()).expect("looked at");
        if j.fail {
            return Err(Error::Platform("copy engine fault (injected)".into()));
        }
        let off = (j.dev - self.base) as usize;
        let mut mem = self.mem.lock().unwrap();
        // SAFETY: the queue keeps the bounce buffer's `len` bytes for this
        // copy until it is answered (what the tests check).
        let host = unsafe { std::slice::from_raw_parts_mut(j.host as *mut u8, j.len) };
        if j.to_device {
            mem[off..off + j.len].copy_from_slice(host);
        } else {
            host.copy_from_slice(&mem[off..off + j.len]);
        }
        Ok(true)
    }
    fn host_register(&self, _: *mut u8, _: usize) -> bool {
        false
    }
    fn host_unregister(&self, _: *mut u8) {}
    fn export_dmabuf(&self, _: u64, _: usize) -> Result<DmabufExport> {
        Err(Error::Unsupported("a test runtime".into()))
    }
}
