//! The stream machinery against a fake GPU that runs enqueued work on demand.

use super::words::{MAX_PENDING_WAITS, MAX_STREAM_DEPTH, NOT_PASSED, SLOT};
use super::*;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::AtomicUsize;

/// A backend whose "GPU" is a list of memory operations run on demand,
/// over pages from the heap (leaked, as the real pool's are kept).
#[derive(Default)]
struct FakeGpu {
    pool: Mutex<WordPool>,
    stages: Mutex<StagePool>,
    ops: Mutex<Vec<FakeOp>>,
    /// The staging headers whose copies ran, in order.
    copied: Mutex<Vec<u64>>,
    /// The value the GPU is blocked waiting for (0: not blocked).
    waiting_for: AtomicU32,
    host_fns: Mutex<Vec<(unsafe extern "C" fn(*mut c_void), usize)>>,
    pages: AtomicUsize,
    /// Refuse stream waits on memory (as a runtime that fails to enqueue one).
    refuse_waits: std::sync::atomic::AtomicBool,
    /// Refuse them once this many more have been taken.
    waits_allowed: Mutex<Option<usize>>,
    /// Each staging block lent: its device address and the bytes asked for.
    lent: Mutex<Vec<(u64, usize)>>,
}

impl FakeGpu {
    /// Runs everything enqueued: host functions first (blocking mode),
    /// then each memory operation in order, a wait until the dispatcher
    /// has made it hold (at most 5 s).
    fn run(&self) {
        for (f, d) in self.host_fns.lock().unwrap().drain(..) {
            // SAFETY: launched by GpuStream with its own data.
            unsafe { f(d as *mut c_void) };
        }
        let ops: Vec<_> = self.ops.lock().unwrap().drain(..).collect();
        for op in ops {
            // SAFETY: addresses of pool pages, device == host here.
            let word = |addr: u64| unsafe { &*(addr as *const AtomicU32) };
            match op {
                FakeOp::Write(addr, v) => word(addr).store(v, Ordering::Release),
                FakeOp::Wait(addr, v) => {
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while (word(addr).load(Ordering::Acquire).wrapping_sub(v) as i32) < 0 {
                        self.waiting_for.store(v, Ordering::Release);
                        assert!(Instant::now() < deadline, "wait for {v} would block");
                        std::thread::yield_now();
                    }
                    self.waiting_for.store(0, Ordering::Release);
                }
                FakeOp::Copy(header) => self.copied.lock().unwrap().push(header),
            }
        }
    }
}

/// What the fake GPU has been given to run, in stream order.
enum FakeOp {
    Write(u64, u32),
    /// Until the word is at least the value (cyclically).
    Wait(u64, u32),
    /// A staging copy, with its header.
    Copy(u64),
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
        let mut allowed = self.waits_allowed.lock().unwrap();
        if self.refuse_waits.load(Ordering::Relaxed) || *allowed == Some(0) {
            return Err(Error::Platform("fake: cuStreamWaitValue32 failed".into()));
        }
        if let Some(n) = allowed.as_mut() {
            *n -= 1;
        }
        self.ops.lock().unwrap().push(FakeOp::Wait(addr, value));
        Ok(true)
    }
    fn write_value32(&self, _: usize, addr: u64, value: u32) -> Result<bool> {
        self.ops.lock().unwrap().push(FakeOp::Write(addr, value));
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
    fn stage_lent(&self, dev: u64, bytes: usize) {
        self.lent.lock().unwrap().push((dev, bytes));
    }
    fn launch_copy(&self, _: usize, header: u64) -> Result<()> {
        self.ops.lock().unwrap().push(FakeOp::Copy(header));
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
    let header = lease.header_dev(0);
    s.launch_staged(Box::new(|| {}), Box::new(|sig| sig.set()), Vec::new(), &[header], false, &mark).unwrap();
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

/// The runtime hears what each lease asks for, not its block's size: a
/// 1 MiB block reused for 8 KiB is an 8 KiB copy (its grid is sized so).
#[test]
fn a_lent_block_tells_the_runtime_what_its_operation_moves() {
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::DeviceSide).unwrap();
    let big = s.stage(1 << 20, &StageMark::default()).unwrap();
    let dev = big.header_dev(0);
    // `big` stays lent; a second 1 MiB block runs its copy and comes back.
    let mark = StageMark::default();
    let lease = s.stage(1 << 20, &mark).unwrap();
    let reused = lease.header_dev(0);
    s.launch_staged(Box::new(|| {}), Box::new(|sig| sig.set()), Vec::new(), &[reused], false, &mark).unwrap();
    lease.give_back();
    gpu.run();
    let small = s.stage(8192, &StageMark::default()).unwrap();
    assert_eq!(small.header_dev(0), reused, "the free 1 MiB block is lent again");
    assert_eq!(*gpu.lent.lock().unwrap(), vec![(dev, 1 << 20), (reused, 1 << 20), (reused, 8192)]);
}

#[test]
fn a_word_whose_wait_failed_is_never_handed_out_again() {
    // The operation's `reach` write is queued, then its wait fails: the
    // call fails and the operation never runs, but the stream will still
    // write `reach`. The word must not go to another stream.
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::DeviceSide).unwrap();
    let first = s.slot;
    gpu.run(); // the probe at creation passes
    gpu.refuse_waits.store(true, Ordering::Relaxed);
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = ran.clone();
    assert!(s
        .launch(Box::new(move |sig| {
            r.store(true, Ordering::Release);
            sig.set()
        }))
        .is_err());
    gpu.refuse_waits.store(false, Ordering::Relaxed);
    drop(s);
    for i in 0..4 {
        let t = GpuStream::new(gpu.clone(), 2 + i, StreamWait::DeviceSide).unwrap();
        assert_ne!(t.slot, first, "a word the stream still writes was handed out again");
    }
    gpu.run();
    assert_eq!(first.reach().load(Ordering::Acquire), 1);
    std::thread::sleep(Duration::from_millis(20));
    assert!(!ran.load(Ordering::Acquire), "an operation whose wait failed ran");
}

#[test]
fn operations_run_only_when_the_stream_reaches_them_and_in_order() {
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::DeviceSide).unwrap();
    gpu.run();
    let order = Arc::new(Mutex::new(Vec::new()));
    for i in 0..3 {
        let o = order.clone();
        s.launch(Box::new(move |sig| {
            o.lock().unwrap().push(i);
            sig.set()
        }))
        .unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(order.lock().unwrap().is_empty(), "an operation ran before its stream reached it");
    gpu.run();
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    assert_eq!((s.completed(), s.passed()), (3, 3));
}

#[test]
fn a_staged_write_binds_before_its_copies_and_runs_after() {
    // Points 1 (binding) and 2 (the I/O): the stream waits for `done` at 1
    // before its copies into the staging block, which the binding's
    // dispatcher run sets.
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::DeviceSide).unwrap();
    gpu.run();
    let mark = StageMark::default();
    let lease = s.stage(4096, &mark).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let (b, o) = (order.clone(), order.clone());
    s.launch_staged(
        Box::new(move || b.lock().unwrap().push("bind")),
        Box::new(move |sig| {
            o.lock().unwrap().push("io");
            sig.set()
        }),
        vec![lease.header_dev(0)],
        &[],
        false,
        &mark,
    )
    .unwrap();
    gpu.run();
    assert_eq!(*order.lock().unwrap(), vec!["bind", "io"]);
    assert_eq!((s.completed(), s.passed()), (2, 2));
    lease.give_back();
}

#[test]
fn one_stream_stays_within_its_depth_of_the_gpu() {
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::DeviceSide).unwrap();
    gpu.run();
    for _ in 0..MAX_STREAM_DEPTH {
        s.launch(Box::new(|sig| sig.set())).unwrap();
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            s.launch(Box::new(|sig| sig.set())).unwrap();
            done.store(true, Ordering::Release);
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!done.load(Ordering::Acquire), "an operation beyond the stream's depth was enqueued");
        gpu.run(); // the GPU passes the pending waits
    });
    assert!(done.load(Ordering::Acquire));
    gpu.run();
    assert_eq!(s.passed(), MAX_STREAM_DEPTH + 1);
}

#[test]
fn a_blocking_stream_gives_its_words_back_at_once() {
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::BlockingCallback).unwrap();
    drop(s);
    assert_eq!(gpu.pool.lock().unwrap().usage(), (1, 0));
}

#[test]
fn each_piece_is_copied_after_its_own_progress() {
    // One operation copied out in 3 pieces: points 1 to 3, the copy of
    // piece i after `done` reaches 1 + i.
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::DeviceSide).unwrap();
    gpu.run();
    let mark = StageMark::default();
    let lease = s.stage(3 << 20, &mark).unwrap();
    let headers: Vec<u64> = (0..3).map(|i| lease.header_dev(i)).collect();
    let held = Arc::new(Mutex::new(None));
    let h = held.clone();
    let op = Box::new(move |sig| *h.lock().unwrap() = Some(sig));
    s.launch_staged(Box::new(|| {}), op, Vec::new(), &headers, true, &mark).unwrap();
    let blocked_at = |v: u32| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while gpu.waiting_for.load(Ordering::Acquire) != v {
            assert!(Instant::now() < deadline, "the GPU never waited for {v}");
            std::thread::yield_now();
        }
    };
    std::thread::scope(|sc| {
        sc.spawn(|| gpu.run());
        blocked_at(1);
        // The dispatcher ran the operation when the stream reached point 1.
        let deadline = Instant::now() + Duration::from_secs(5);
        let sig = loop {
            if let Some(sig) = held.lock().unwrap().take() {
                break sig;
            }
            assert!(Instant::now() < deadline, "the operation never ran");
            std::thread::yield_now();
        };
        assert!(gpu.copied.lock().unwrap().is_empty());
        sig.progress(1);
        blocked_at(2);
        assert_eq!(*gpu.copied.lock().unwrap(), headers[..1]);
        // Progress past the last piece is left to the signal.
        sig.progress(3);
        sig.progress(2);
        blocked_at(3);
        assert_eq!(*gpu.copied.lock().unwrap(), headers[..2]);
        sig.set();
    });
    assert_eq!(*gpu.copied.lock().unwrap(), headers);
    assert_eq!((s.completed(), s.passed()), (3, 3));
    lease.give_back();
    // The next operation's point follows the pieces'.
    s.launch(Box::new(|sig| sig.set())).unwrap();
    gpu.run();
    assert_eq!((s.completed(), s.passed()), (4, 4));
}

#[test]
fn an_operation_whose_copies_are_not_all_enqueued_never_runs() {
    let gpu = Arc::new(FakeGpu::default());
    let s = GpuStream::new(gpu.clone(), 1, StreamWait::DeviceSide).unwrap();
    gpu.run();
    let mark = StageMark::default();
    let lease = s.stage(2 << 20, &mark).unwrap();
    let headers = [lease.header_dev(0), lease.header_dev(1)];
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = ran.clone();
    let op = Box::new(move |sig: StreamSignal| {
        r.store(true, Ordering::Release);
        sig.set()
    });
    // The operation's wait goes in; the second piece's is refused.
    *gpu.waits_allowed.lock().unwrap() = Some(1);
    assert!(s.launch_staged(Box::new(|| {}), op, Vec::new(), &headers, true, &mark).is_err());
    *gpu.waits_allowed.lock().unwrap() = None;
    // The stream reaches the operation: it is dropped unrun, and `done`
    // goes past all its points, so the stream does not hang.
    gpu.run();
    assert!(!ran.load(Ordering::Acquire), "an operation with a piece's copy missing ran");
    assert_eq!(s.completed(), 2);
    assert_eq!(*gpu.copied.lock().unwrap(), headers[..1], "the first piece's copy (of nothing) is on the stream");
    // Not given back: never reused.
    drop(lease);
}
