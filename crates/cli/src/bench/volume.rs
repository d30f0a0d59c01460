//! `ugds bench` over several targets as one volume (several --pci, --drv
//! or --file flags, or --emu-controllers N): the workload on the first
//! member alone (a one-member volume, the same code path), then on the
//! whole volume, and the ratio.

use super::*;
use ugds::{BatchEvent, Volume, VolumeLayout};

/// One run's figures.
struct Figures {
    ios: u64,
    secs: f64,
    /// Latencies of the timed I/Os, in nanoseconds, sorted.
    lat: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
    mismatched_words: u64,
}

impl Figures {
    fn mib_s(&self, size: usize) -> f64 {
        (self.ios * size as u64) as f64 / self.secs / (1 << 20) as f64
    }
    fn pct_us(&self, p: f64) -> f64 {
        if self.lat.is_empty() {
            return 0.0;
        }
        let i = ((self.lat.len() - 1) as f64 * p).round() as usize;
        self.lat[i] as f64 / 1e3
    }
}

/// A thread's buffer: `qd` slots of the largest size, in host memory or
/// (`--gpu`) in GPU 0's.
struct ThreadBuf {
    token: ugds::BufferToken,
    /// The memory, where it is host memory.
    host: Option<HostBuffer>,
    /// Held until the end (freed after its deregistration).
    #[cfg(feature = "gpu-bench")]
    _gpu: Option<ugds::gpu::cuda::DeviceBuffer>,
}

impl ThreadBuf {
    fn host(&self) -> Option<&HostBuffer> {
        self.host.as_ref()
    }
}

// SAFETY: each thread touches only its own buffer, and only the slots with
// no I/O in flight; the buffer outlives the scoped threads.
unsafe impl Sync for ThreadBuf {}

pub(super) fn run(o: &Opts, layout: VolumeLayout) -> Result<(), String> {
    let targets = target::open_all(&o.target)?;
    let driver = Driver::open();
    // A lent queue takes a request's pieces (one per stripe) as requests
    // of their own: room for `qd` of the largest.
    let stripe = match layout {
        VolumeLayout::Striped { stripe } => stripe as usize,
        _ => usize::MAX,
    };
    let pieces = o.sizes.iter().map(|&s| s.div_ceil(stripe) + 1).max().unwrap_or(1);
    let depth = if o.volume_batch { o.qd * 4 } else { o.qd * pieces.max(4) }.clamp(32, 1024) as u16;
    let opts = || {
        HandleOptions::default()
            .nsid(o.target.nsid)
            // Synchronous calls (qd 1 runs, the pattern's writes) on a
            // queue per thread; at depth the threads take lent queues, and
            // one synchronous queue is left (emulated controllers grant 16).
            .sync_queues(if o.qd == 1 || o.volume_batch { o.threads.clamp(1, 8) as u16 } else { 1 })
            // A deep run's thread takes a queue of each member: lent, or
            // (--volume-batch) a batch queue pair of its own.
            .async_queues(if o.volume_batch { 0 } else { o.threads.clamp(1, 64) as u16 })
            .batch_queues(if o.volume_batch { super::batch_queue_per_thread(o.threads) } else { 0 })
            .queue_depth(depth)
            .shadow_doorbells(o.shadow_doorbells)
            .completion(if o.interrupt { Completion::Interrupt } else { Completion::Poll })
    };
    let open_all = || -> Result<Volume, String> {
        let hs = targets.iter().map(|t| t.open_handle(&driver, opts())).collect::<ugds::Result<Vec<_>>>();
        Volume::new(hs.map_err(|e| e.to_string())?, layout).map_err(|e| e.to_string())
    };
    let volume = open_all()?;
    let n = targets.len();
    println!("target   volume of {n}: {}", describe_layout(layout));
    for (i, t) in targets.iter().enumerate() {
        println!("member {i} {} ({})", t.description, volume.member_name(i));
    }
    if o.volume_batch {
        println!(
            "queues   {} batch queue pair(s) per member (a context per thread each)",
            volume.member(0).batch_queues()
        );
    } else {
        println!("queues   a queue pair of each member lent to each thread (Volume::io_queue) at qd above 1");
    }
    let max_size = *o.sizes.iter().max().expect("a size");
    let bufs = thread_buffers(&driver, o, o.qd * max_size)?;
    println!("buffers  {}", if o.gpu { "GPU 0's memory (CUDA)" } else { "host memory" });
    let cap = volume.capacity();
    let range = o.range.unwrap_or(cap).min(cap);
    // The pattern goes in first for --verify, and into emulated memory
    // namespaces always: reads of memory never written would copy the
    // zero page, not the data.
    let memory = o.target.targets.is_empty() && o.target.memory && !o.target.null;
    if o.verify || memory {
        prefill(&driver, &volume, range).map_err(|e| format!("writing the pattern: {e}"))?;
    }
    let block = volume.block_size();
    // A controller takes one handle at a time: each run opens its own.
    drop(volume);
    println!(
        "{} {} thread(s) x qd {}, {:.1} s per run{}",
        o.mode.name(),
        o.threads,
        o.qd,
        o.duration.as_secs_f64(),
        if o.verify { ", every byte read from the volume checked" } else { "" }
    );
    println!(
        "{:<9} {:<14} {:>10} {:>10} {:>9} {:>9} {:>9}",
        "size", "on", "MiB/s", "IOPS", "p50 us", "p99 us", "vs one"
    );
    let mut rows = Vec::new();
    let mut failed = None;
    for &size in &o.sizes {
        if size % block != 0 || size as u64 > range {
            return Err(format!("size {size}: whole blocks of {block} bytes within the range"));
        }
        // One member alone first (opened anew, so that the volume's handles
        // are not in use meanwhile), then the volume.
        let mut one_mib = None;
        let runs: &[(&str, bool)] =
            if n > 1 { &[("member 0 alone", false), ("the volume", true)] } else { &[("the volume", true)] };
        for &(name, whole) in runs {
            let v = if whole {
                open_all()?
            } else {
                let h = targets[0].open_handle(&driver, opts()).map_err(|e| e.to_string())?;
                Volume::new(vec![h], layout).map_err(|e| e.to_string())?
            };
            let range = range.min(v.capacity());
            // The pattern was written through the volume: only its reads are checked.
            let f = run_one(o, &v, &bufs, size, range, whole);
            // With --verify the volume's reads are checked and member 0's
            // are not: no ratio then.
            let ratio = one_mib.filter(|_| !o.verify).map(|m: f64| f.mib_s(size) / m);
            println!(
                "{:<9} {:<14} {:>10.1} {:>10.0} {:>9.1} {:>9.1} {:>9}",
                fmt_bytes(size as u64),
                name,
                f.mib_s(size),
                f.ios as f64 / f.secs,
                f.pct_us(0.5),
                f.pct_us(0.99),
                ratio.map_or(String::new(), |r| format!("{r:.2}x"))
            );
            if n > 1 && one_mib.is_none() {
                one_mib = Some(f.mib_s(size));
            }
            if f.errors > 0 || f.mismatched_words > 0 {
                let why = f
                    .first_error
                    .clone()
                    .unwrap_or_else(|| format!("{} words differ from the pattern", f.mismatched_words));
                println!("          {} errors, {} mismatched words: {why}", f.errors, f.mismatched_words);
                failed.get_or_insert(why);
            }
            rows.push(serde_json::json!({
                "size": size, "on": name, "members": if name == "the volume" { n } else { 1 },
                "seconds": f.secs, "ios": f.ios, "mib_s": f.mib_s(size), "iops": f.ios as f64 / f.secs,
                "p50_us": f.pct_us(0.5), "p99_us": f.pct_us(0.99), "errors": f.errors,
                "mismatched_words": f.mismatched_words, "vs_one_member": ratio,
            }));
        }
    }
    if o.target.null {
        println!("          (null emulator: no data was moved)");
    }
    if let Some(path) = &o.json {
        let doc = serde_json::json!({
            "ugds_version": env!("CARGO_PKG_VERSION"), "workload": "volume", "layout": describe_layout(layout),
            "members": targets.iter().map(|t| t.description.clone()).collect::<Vec<_>>(),
            "mode": o.mode.name(), "threads": o.threads, "qd": o.qd, "machine": crate::machine(), "runs": rows,
            "through": if o.qd == 1 { "synchronous calls" } else if o.volume_batch { "volume batch context" } else { "members' lent queues" },
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("--json {}: {e}", path.display()))?;
    }
    let mut kept = None;
    for b in &bufs {
        if let Err(e) = driver.deregister(&b.token) {
            kept = Some(e);
        }
    }
    if let Some(e) = &kept {
        // Requests still hold them: the device may still write them.
        eprintln!("ugds bench: the buffers are kept, not freed: {e}");
        std::mem::forget(bufs);
    }
    match (failed, kept) {
        (Some(why), _) => Err(format!("the runs had errors: {why}")),
        (None, Some(e)) => Err(e.to_string()),
        (None, None) => Ok(()),
    }
}

/// A buffer of `len` bytes per thread, registered: GPU 0's memory with
/// `--gpu` (a build with the `gpu-bench` feature), host memory otherwise.
fn thread_buffers(driver: &Driver, o: &Opts, len: usize) -> Result<Vec<ThreadBuf>, String> {
    #[cfg(feature = "gpu-bench")]
    let cuda = if o.gpu {
        let c = ugds::gpu::cuda::Cuda::get().map_err(|e| format!("--gpu: {e}"))?;
        c.use_device(0).map_err(|e| format!("--gpu: {e}"))?;
        Some(c)
    } else {
        None
    };
    #[cfg(not(feature = "gpu-bench"))]
    if o.gpu {
        return Err("--gpu: this ugds was built without GPU buffers (`--features gpu-bench`)".into());
    }
    (0..o.threads)
        .map(|_| {
            #[cfg(feature = "gpu-bench")]
            if let Some(c) = &cuda {
                let g = c.alloc(len)?;
                // SAFETY: `g` lives in the ThreadBuf, deregistered before it is dropped.
                let token = unsafe { driver.register_cuda(g.ptr(), g.len())? };
                return Ok(ThreadBuf { token, host: None, _gpu: Some(g) });
            }
            let mut mem = HostBuffer::new(len)?;
            // SAFETY: `mem` lives in the ThreadBuf, deregistered before it is dropped.
            let token = unsafe { driver.register(mem.as_mut_ptr(), mem.len())? };
            Ok(ThreadBuf {
                token,
                host: Some(mem),
                #[cfg(feature = "gpu-bench")]
                _gpu: None,
            })
        })
        .collect::<ugds::Result<_>>()
        .map_err(|e| e.to_string())
}

fn describe_layout(l: VolumeLayout) -> String {
    match l {
        VolumeLayout::Striped { stripe } => format!("striped (RAID 0), {} stripes", fmt_bytes(stripe)),
        _ => "concatenated".to_string(),
    }
}

/// Writes the pattern over `range` of the volume, 1 MiB at a time
/// through a host buffer of its own.
fn prefill(driver: &Driver, v: &Volume, range: u64) -> ugds::Result<()> {
    let mut mem = HostBuffer::new(1 << 20)?;
    // SAFETY: `mem` outlives the registration (deregistered below).
    let token = unsafe { driver.register(mem.as_mut_ptr(), mem.len())? };
    let mut off = 0;
    let mut r = Ok(());
    while off < range && r.is_ok() {
        let n = (range - off).min(mem.len() as u64) as usize;
        // SAFETY: no I/O is in flight on the buffer; `n` is within it and a
        // multiple of the block size (so of 8).
        unsafe { fill_pattern(mem.as_mut_ptr(), n, off) };
        r = v.write(&token, n, off, 0).map(|_| ());
        off += n as u64;
    }
    super::release(driver, &token, mem)?;
    r
}

fn run_one(o: &Opts, v: &Volume, bufs: &[ThreadBuf], size: usize, range: u64, verify: bool) -> Figures {
    let stop = AtomicBool::new(false);
    let budget = o.bytes.map(|b| AtomicU64::new(b.div_ceil(size as u64)));
    let take = || {
        budget
            .as_ref()
            .is_none_or(|b| b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok())
    };
    let start = Instant::now();
    let results: Vec<Figures> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..o.threads)
            .map(|tid| {
                let (b, stop, take) = (&bufs[tid], &stop, &take);
                sc.spawn(move || thread_loop(o, v, b, (size, range, verify), tid, stop, take))
            })
            .collect();
        while start.elapsed() < o.duration && !workers.iter().all(|w| w.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
        workers.into_iter().map(|w| w.join().expect("bench thread")).collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut all = Figures { ios: 0, secs, lat: Vec::new(), errors: 0, first_error: None, mismatched_words: 0 };
    for r in results {
        all.ios += r.ios;
        all.lat.extend(r.lat);
        all.errors += r.errors;
        all.mismatched_words += r.mismatched_words;
        all.first_error = all.first_error.or(r.first_error);
    }
    all.lat.sort_unstable();
    all
}

/// One thread: `qd` requests outstanding (synchronous calls at qd 1, the
/// members' lent queues or, with --volume-batch, a volume batch context
/// otherwise) until stopped or the budget is spent.
fn thread_loop(
    o: &Opts,
    v: &Volume,
    b: &ThreadBuf,
    (size, range, verify): (usize, u64, bool),
    tid: usize,
    stop: &AtomicBool,
    take: &(dyn Fn() -> bool + Sync),
) -> Figures {
    let mut f = Figures { ios: 0, secs: 0.0, lat: Vec::new(), errors: 0, first_error: None, mismatched_words: 0 };
    let mut rng = Rng(0x9e37_79b9 ^ (tid as u64 + 1).wrapping_mul(0x1234_5678_9abc_def1));
    let slots = (range / size as u64).max(1);
    let mut seq = slots / o.threads as u64 * tid as u64;
    let mut next_off = || {
        let i = if o.mode.random() {
            ((rng.next() as u128 * slots as u128) >> 64) as u64
        } else {
            seq = (seq + 1) % slots;
            seq
        };
        i * size as u64
    };
    let op = if o.mode.writes() { BatchOp::Write } else { BatchOp::Read };
    if let Err(e) = if o.gpu { ugds::gpu::cuda::Cuda::get().and_then(|c| c.use_device(0)) } else { Ok(()) } {
        f.errors += 1;
        f.first_error = Some(format!("--gpu: {e}"));
        return f;
    }
    // Patterns are written and checked in host memory only (`--verify` and
    // writes' contents need no GPU memory: there they are whatever it holds).
    let base = b.host().map_or(std::ptr::null_mut(), |h| h.as_ptr() as *mut u8);
    let fail = |f: &mut Figures, e: String| {
        f.errors += 1;
        f.first_error.get_or_insert(e);
    };
    // Before a write, the slot holds the pattern of where it goes; after a
    // read, it is checked against it.
    let prepare = |slot: usize, off: u64| {
        if op == BatchOp::Write && !base.is_null() {
            // SAFETY: the slot lies in this thread's buffer with no I/O in flight on it.
            unsafe { fill_pattern(base.add(slot * size), size, off) };
        }
    };
    let check = |slot: usize, off: u64| -> u64 {
        if verify && o.verify && op == BatchOp::Read && !base.is_null() {
            // SAFETY: the slot's read has completed; nothing else writes it.
            unsafe { check_pattern(base.add(slot * size), size, off) }
        } else {
            0
        }
    };
    if o.qd == 1 {
        while !stop.load(Ordering::Relaxed) && take() {
            let off = next_off();
            prepare(0, off);
            let t = Instant::now();
            let r = if op == BatchOp::Read { v.read(&b.token, size, off, 0) } else { v.write(&b.token, size, off, 0) };
            f.lat.push(t.elapsed().as_nanos() as u64);
            match r {
                Ok(_) => {
                    f.ios += 1;
                    f.mismatched_words += check(0, off);
                }
                Err(e) => fail(&mut f, e.to_string()),
            }
        }
        return f;
    }
    if !o.volume_batch {
        return queue_loop(o, v, b, size, op, f, &prepare, &check, &mut next_off, take, stop);
    }
    let batch = match v.batch(o.qd) {
        Ok(b) => b,
        Err(e) => {
            fail(&mut f, format!("volume batch context: {e}"));
            return f;
        }
    };
    let mut started: Vec<(Instant, u64)> = vec![(Instant::now(), 0); o.qd];
    let submit = |slot: usize, off: u64| {
        let io = BatchIo { op, buf: b.token, size, file_offset: off, buf_offset: slot * size, cookie: slot as u64 };
        batch.submit(&[io])
    };
    let mut outstanding = 0;
    for (slot, start) in started.iter_mut().enumerate() {
        if !take() {
            break;
        }
        let off = next_off();
        prepare(slot, off);
        *start = (Instant::now(), off);
        match submit(slot, off) {
            Ok(_) => outstanding += 1,
            Err(e) => fail(&mut f, e.to_string()),
        }
    }
    let mut events: Vec<BatchEvent> = Vec::with_capacity(o.qd);
    while outstanding > 0 {
        events.clear();
        if let Err(e) = batch.get_status(1, o.qd, None, &mut events) {
            fail(&mut f, e.to_string());
            break;
        }
        for ev in events.drain(..) {
            outstanding -= 1;
            let slot = ev.cookie as usize;
            let (t, off) = started[slot];
            f.lat.push(t.elapsed().as_nanos() as u64);
            match ev.result {
                Ok(_) => {
                    f.ios += 1;
                    f.mismatched_words += check(slot, off);
                }
                Err(e) => fail(&mut f, e.to_string()),
            }
            if stop.load(Ordering::Relaxed) || !take() {
                continue;
            }
            let off = next_off();
            prepare(slot, off);
            started[slot] = (Instant::now(), off);
            match submit(slot, off) {
                Ok(_) => outstanding += 1,
                Err(e) => fail(&mut f, e.to_string()),
            }
        }
    }
    f
}

/// A deep run through `Volume::io_queue`: `qd` requests staged and rung
/// together, then each slot submitted again as its request is reported
/// (rung with the others found in the same look); a slot a member had no
/// room for waits for the next look.
#[allow(clippy::too_many_arguments)]
fn queue_loop(
    o: &Opts,
    v: &Volume,
    b: &ThreadBuf,
    size: usize,
    op: BatchOp,
    mut f: Figures,
    prepare: &dyn Fn(usize, u64),
    check: &dyn Fn(usize, u64) -> u64,
    next_off: &mut dyn FnMut() -> u64,
    take: &dyn Fn() -> bool,
    stop: &AtomicBool,
) -> Figures {
    let mut q = match v.io_queue() {
        Ok(q) => q,
        Err(e) => {
            f.errors += 1;
            f.first_error.get_or_insert(format!("volume queue: {e}"));
            return f;
        }
    };
    let mut started: Vec<(Instant, u64)> = vec![(Instant::now(), 0); o.qd];
    // Slots to submit, each with its offset once drawn: all at first, then
    // each as its request is reported.
    let mut ready: Vec<(usize, Option<u64>)> = (0..o.qd).rev().map(|s| (s, None)).collect();
    let mut done: Vec<(u64, ugds::Result<usize>)> = Vec::with_capacity(o.qd);
    loop {
        while let Some((slot, drawn)) = ready.pop() {
            if stop.load(Ordering::Relaxed) || (drawn.is_none() && !take()) {
                continue;
            }
            let off = drawn.unwrap_or_else(|| {
                let off = next_off();
                prepare(slot, off);
                off
            });
            started[slot] = (Instant::now(), off);
            let r = match op {
                BatchOp::Read => q.submit_read(&b.token, size, off, slot * size, slot as u64),
                _ => q.submit_write(&b.token, size, off, slot * size, slot as u64),
            };
            match r {
                Ok(()) => {}
                Err(ugds::Error::QueueFull) if q.outstanding() > 0 => {
                    // Again after the next look, at the same offset.
                    ready.push((slot, Some(off)));
                    break;
                }
                Err(e) => {
                    f.errors += 1;
                    f.first_error.get_or_insert(e.to_string());
                }
            }
        }
        if q.outstanding() == 0 {
            break;
        }
        q.ring();
        done.clear();
        if q.poll(usize::MAX, |tag, r| done.push((tag, r))) == 0 {
            q.wait(Duration::from_millis(10));
            continue;
        }
        for (tag, r) in done.drain(..) {
            let slot = tag as usize;
            let (t, off) = started[slot];
            f.lat.push(t.elapsed().as_nanos() as u64);
            match r {
                Ok(_) => {
                    f.ios += 1;
                    f.mismatched_words += check(slot, off);
                }
                Err(e) => {
                    f.errors += 1;
                    f.first_error.get_or_insert(e.to_string());
                }
            }
            ready.push((slot, None));
        }
    }
    f
}
