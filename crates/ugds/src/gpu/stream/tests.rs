//! The stream machinery against a fake GPU that runs enqueued work on demand.

use super::words::{NOT_PASSED, SLOT};
use super::*;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::AtomicUsize;

/// A backend whose "GPU" is a list of memory operations run on demand,
/// over pages from the heap (leaked, as the real pool's are kept).
#[derive(Default)]
struct FakeGpu {
    pool: Mutex<WordPool>,
    stages: Mutex<StagePool>,
    ops: Mutex<Vec<(bool, u64, u32)>>,
    host_fns: Mutex<Vec<(unsafe extern "C" fn(*mut c_void), usize)>>,
    pages: AtomicUsize,
    /// Refuse stream waits on memory (as a runtime that fails to enqueue one).
    refuse_waits: std::sync::atomic::AtomicBool,
}

impl FakeGpu {
    /// Runs everything enqueued: host functions first (the I/O), then
    /// each wait (which must hold) and write.
    fn run(&self) {
        for (f, d) in self.host_fns.lock().unwrap().drain(..) {
            // SAFETY: launched by GpuStream with its own data.
            unsafe { f(d as *mut c_void) };
        }
        for (write, addr, v) in self.ops.lock().unwrap().drain(..) {
            // SAFETY: addresses of pool pages, device == host here.
            let w = unsafe { &*(addr as *const AtomicU32) };
            if write {
                w.store(v, Ordering::Release);
            } else {
                assert!(w.load(Ordering::Acquire).wrapping_sub(v) as i32 >= 0, "wait for {v} would block");
            }
        }
    }
}

impl StreamBackend for FakeGpu {
    fn alloc_page(&self) -> Result<(usize, u64)> {
        self.pages.fetch_add(1, Ordering::Relaxed);
        let page = Box::leak(vec![0u64; WORD_PAGE / 8].into_boxed_slice());
        Ok((page.as_ptr() as usize, page.as_ptr() as u64))
    }
    fn pool(&self) -> &Mutex<WordPool> {
        &self.pool
    }
    fn launch_host_fn(&self, _: usize, f: unsafe extern "C" fn(*mut c_void), data: *mut c_void) -> Result<()> {
        self.host_fns.lock().unwrap().push((f, data as usize));
        Ok(())
    }
    fn wait_value32(&self, _: usize, addr: u64, value: u32) -> Result<bool> {
        if self.refuse_waits.load(Ordering::Relaxed) {
            return Err(Error::Platform("fake: cuStreamWaitValue32 failed".into()));
        }
        self.ops.lock().unwrap().push((false, addr, value));
        Ok(true)
    }
    fn write_value32(&self, _: usize, addr: u64, value: u32) -> Result<bool> {
        self.ops.lock().unwrap().push((true, addr, value));
        Ok(true)
    }
    fn synchronize(&self, _: usize) -> Result<()> {
        panic!("GpuStream must not synchronize the caller's stream")
    }
    fn alloc_stage(&self, len: usize) -> Result<(usize, u64)> {
        // Page-aligned, as the runtime's pinned memory is; never freed.
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!p.is_null());
        Ok((p as usize, p as u64))
    }
    fn stage_pool(&self) -> Option<&Mutex<StagePool>> {
        Some(&self.stages)
    }
    fn launch_copy(&self, _: usize, _: u64) -> Result<()> {
        Ok(())
    }
    fn name(&self) -> &'static str {
        "fake"
    }
}

#[test]
fn words_are_reused_only_after_the_gpu_passed_the_last_wait() {
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::DeviceSide).unwrap();
    assert_eq!(s.wait_mode(), StreamWait::DeviceSide);
    let first = s.slot;
    s.launch(Box::new(|sig| sig.set())).unwrap();
    s.launch(Box::new(|sig| sig.set())).unwrap();
    // Dropped with its waits still queued (the caller destroyed the
    // stream): no synchronize, and the slot is not handed out again.
    drop(s);
    let t = GpuStream::new(gpu.clone(), 2, StreamWait::DeviceSide).unwrap();
    assert_ne!(t.slot, first, "a slot the GPU may still read was reused");
    gpu.run();
    assert_eq!(first.passed().load(Ordering::Acquire), 2);
    drop(t);
    gpu.run();
    let u = GpuStream::new(gpu.clone(), 3, StreamWait::DeviceSide).unwrap();
    assert!(u.slot == first || u.slot.host == first.host + SLOT, "a passed slot is reused");
    assert_eq!(u.completed(), 0);
    assert_eq!(u.passed(), NOT_PASSED);
    drop(u);
    gpu.run();
    assert_eq!(gpu.pages.load(Ordering::Relaxed), 1, "one page serves streams one after another");
    assert_eq!(gpu.pool.lock().unwrap().usage(), (1, 0));
}

#[test]
fn pending_device_side_waits_are_bounded() {
    let gpu = Arc::new(FakeGpu::default());
    let streams: Vec<_> =
        (0..MAX_PENDING_WAITS).map(|i| GpuStream::new(gpu.clone(), i, StreamWait::DeviceSide).unwrap()).collect();
    for s in &streams {
        s.launch(Box::new(|sig| sig.set())).unwrap();
    }
    let last = GpuStream::new(gpu.clone(), 99, StreamWait::DeviceSide).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            last.launch(Box::new(|sig| sig.set())).unwrap();
            done.store(true, Ordering::Release);
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!done.load(Ordering::Acquire), "a wait beyond the budget was enqueued");
        gpu.run(); // the GPU passes the pending waits
    });
    assert!(done.load(Ordering::Acquire));
    gpu.run();
    assert_eq!(gpu.pool.lock().unwrap().pending_waits(), 0);
}

#[test]
fn staging_blocks_are_reused_only_after_the_gpu_passed_the_copy() {
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::DeviceSide).unwrap();
    let mark = StageMark::default();
    let lease = s.stage(5000, &mark).unwrap();
    let (ptr, cap) = lease.data();
    assert!(cap >= 5000 && ptr as usize % 4096 == 0, "page-aligned data after the header");
    let header = lease.header_dev();
    s.launch_staged(Box::new(|| {}), Box::new(|sig| sig.set()), Vec::new(), &[header], &mark).unwrap();
    // Given back (its I/O is done) before the GPU ran the copy.
    lease.give_back();
    let other = s.stage(5000, &StageMark::default()).unwrap();
    assert_ne!(other.data().0, ptr, "a block whose copy has not run was lent again");
    gpu.run();
    let again = s.stage(5000, &StageMark::default()).unwrap();
    assert_eq!(again.data().0, ptr, "a block the GPU is done with is reused");
    // Never launched: kept out of use.
    again.give_back();
    assert_ne!(s.stage(5000, &StageMark::default()).unwrap().data().0, ptr);
}

#[test]
fn a_word_a_queued_host_function_still_writes_is_never_handed_out_again() {
    // The operation's host function is queued, then its wait fails: the
    // call fails, but the host function will still write `done`. The
    // word must not go to another stream.
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::DeviceSide).unwrap();
    let first = s.slot;
    gpu.run(); // the probe at creation passes
    gpu.refuse_waits.store(true, Ordering::Relaxed);
    assert!(s.launch(Box::new(|sig| sig.set())).is_err());
    gpu.refuse_waits.store(false, Ordering::Relaxed);
    drop(s);
    for i in 0..4 {
        let t = GpuStream::new(gpu.clone(), 2 + i, StreamWait::DeviceSide).unwrap();
        assert_ne!(t.slot, first, "a word the queued host function writes was handed out again");
    }
    // The host function writes `done` into the kept word.
    for (f, d) in gpu.host_fns.lock().unwrap().drain(..).take(1) {
        // SAFETY: launched by GpuStream with its own data.
        unsafe { f(d as *mut c_void) };
    }
    assert_eq!(first.done().load(Ordering::Acquire), 1);
}

#[test]
fn a_blocking_stream_gives_its_words_back_at_once() {
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::BlockingCallback).unwrap();
    drop(s);
    assert_eq!(gpu.pool.lock().unwrap().usage(), (1, 0));
}
