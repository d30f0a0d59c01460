//! `ugds bench`: throughput, IOPS and latency, in the spirit of gdsio.
//!
//! Each thread drives its own queue: at queue depth 1 through synchronous
//! `Handle::read`/`write` calls, deeper through a lent `IoQueue` kept full.
//! Latency is measured per I/O from submission to the completion being
//! seen, into a log-linear histogram. `--verify` writes a pattern that is a
//! function of the byte offset and checks every byte read against it.

mod batch;
mod mixed;
mod modes;
mod options;
mod pattern;
mod processes;
mod queue;
mod report;
mod stream;
mod sync;
mod vectored;
mod volume;

pub use options::HELP;
use options::{parse, Mode, Opts};
pub(crate) use pattern::release;
use pattern::{check_pattern, fill_pattern, prefill};
use report::{completion_label, describe_queues, fmt_count, granted_entries, progress_bar, us};

use crate::clock::Clock;
use crate::histogram::Histogram;
use crate::target::{self, TargetOpts};
use crate::{fmt_bytes, parse_size};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use ugds::{
    BatchIo, BatchOp, BufferToken, Completion, Driver, Handle, HandleOptions, HostBuffer, HostStream, QueueRole,
    StreamIo, StreamResult,
};

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Fresh batch contexts whose first batch is timed.
const FIRST_BATCHES: usize = 5;

#[derive(Default)]
struct ThreadResult {
    hist: Histogram,
    ios: u64,
    bytes: u64,
    checked: u64,
    mismatches: u64,
    errors: u64,
    first_error: Option<String>,
    /// Batch mode: the median first-batch latency of fresh contexts, kept
    /// out of the histogram.
    first_batch: Option<Duration>,
    batches: u64,
    doorbells: u64,
}

struct Run<'a> {
    handle: &'a Handle,
    mode: Mode,
    size: usize,
    qd: usize,
    /// Requests of `size` that fit the range, at least 1: divided once
    /// here, not per request (a division is a helper call under TCG).
    units: u64,
    /// Where the range starts: this process's share of the namespace
    /// (`ugds serve --split`), else 0.
    base: u64,
    verify: bool,
    /// I/Os left when the run is bounded by bytes.
    budget: Option<&'a AtomicU64>,
    stop: &'a AtomicBool,
    done_ios: &'a AtomicU64,
    /// Where latencies are read from.
    clock: Clock,
    /// Synchronous calls: one in this many is timed.
    sample: u32,
}

struct Slots {
    token: BufferToken,
    base: *mut u8,
}

// SAFETY: each thread uses only its own Slots; the pointer is to a buffer
// that outlives the scoped threads.
unsafe impl Sync for Slots {}

impl Run<'_> {
    /// Claims one I/O of the byte budget; false when it is spent.
    fn take(&self) -> bool {
        match self.budget {
            None => true,
            Some(b) => b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok(),
        }
    }

    /// The next request's namespace offset: uniform over the range, or
    /// this thread's next in sequence. No division per request (a helper
    /// call under QEMU's TCG): the random index by multiply and shift.
    fn offset(&self, tid: usize, threads: usize, seq: &mut u64, rng: &mut Rng) -> u64 {
        let n = self.units;
        let i = if self.mode.random() {
            ((rng.next() as u128 * n as u128) >> 64) as u64
        } else {
            if *seq == 0 {
                // Each thread starts at its share of the range.
                *seq = n / threads as u64 * tid as u64 + 1;
            }
            let i = *seq - 1;
            *seq = if i + 1 == n { 1 } else { i + 2 };
            i
        };
        self.base + i * self.size as u64
    }

    fn record_error(r: &mut ThreadResult, e: ugds::Error) {
        r.errors += 1;
        if r.first_error.is_none() {
            r.first_error = Some(e.to_string());
        }
    }
}

/// What keeps a deep queue full: a lent queue, batches of N, or a stream.
#[derive(Clone, Copy)]
enum Engine {
    Queue,
    Batch(usize),
    Stream,
}

/// Runs one size; returns (checked, mismatches).
fn run_one(
    o: &Opts,
    handle: &Handle,
    slots: &[Slots],
    size: usize,
    range: u64,
    engine: Engine,
    runs: &mut Vec<serde_json::Value>,
) -> Result<(u64, u64), String> {
    let stop = AtomicBool::new(false);
    let finished = AtomicBool::new(false);
    let done_ios = AtomicU64::new(0);
    let barrier = Barrier::new(o.threads + 1);
    let budget = o.bytes.map(|b| AtomicU64::new(b.div_ceil(size as u64)));
    let run = Run {
        handle,
        mode: o.mode,
        size,
        qd: o.qd,
        units: (range / size as u64).max(1),
        base: handle.share().start,
        verify: o.verify,
        budget: budget.as_ref(),
        stop: &stop,
        done_ios: &done_ios,
        clock: o.clock,
        sample: o.sample,
    };
    let label = format!("{} {}", o.mode.name(), fmt_bytes(size as u64));
    let lines = o.progress_lines;
    let show = lines || (o.progress && std::io::stderr().is_terminal());
    let (results, elapsed) = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..o.threads)
            .map(|tid| {
                let run = &run;
                let barrier = &barrier;
                let s = &slots[tid];
                let stop = &stop;
                sc.spawn(move || {
                    barrier.wait();
                    let r = match engine {
                        Engine::Batch(n) => run.batch_loop(tid, o.threads, s, n),
                        Engine::Stream => run.stream_loop(tid, o.threads, s),
                        Engine::Queue if run.qd == 1 && !o.force_queue => run.sync_loop(tid, o.threads, s),
                        Engine::Queue => run.async_loop(tid, o.threads, s),
                    };
                    // A failed I/O ends the run for every thread: the
                    // report says what failed now, not at the end of -d.
                    if r.errors > 0 {
                        stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let bar = show.then(|| {
            let (stop, finished, done_ios, label) = (&stop, &finished, &done_ios, &label);
            let total = o.bytes.is_none().then_some(o.duration);
            sc.spawn(move || progress_bar(stop, finished, done_ios, start, total, label, lines))
        });
        if o.bytes.is_none() {
            // Few wake-ups: on a one-CPU guest each one takes the CPU from
            // a polling worker.
            while !stop.load(Ordering::Relaxed) {
                let left = o.duration.saturating_sub(start.elapsed());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(100)));
            }
            stop.store(true, Ordering::Relaxed);
        }
        let results: Vec<ThreadResult> =
            workers.into_iter().map(|w| w.join().expect("bench thread panicked")).collect();
        let elapsed = start.elapsed();
        finished.store(true, Ordering::Relaxed);
        if let Some(b) = bar {
            let _ = b.join();
        }
        (results, elapsed)
    });
    let mut hist = Histogram::default();
    let (mut ios, mut bytes, mut checked, mut mism, mut errors) = (0, 0, 0, 0, 0);
    let mut first_error = None;
    let (mut batches, mut doorbells, mut first_batch) = (0u64, 0u64, None::<Duration>);
    for r in &results {
        batches += r.batches;
        doorbells += r.doorbells;
        if let Some(f) = r.first_batch {
            first_batch = Some(first_batch.map_or(f, |x: Duration| x.max(f)));
        }
        hist.merge(&r.hist);
        ios += r.ios;
        bytes += r.bytes;
        checked += r.checked;
        mism += r.mismatches;
        errors += r.errors;
        if first_error.is_none() {
            first_error = r.first_error.clone();
        }
    }
    let secs = elapsed.as_secs_f64();
    // What the queues this engine used really do (the batch queue always
    // polls; a queue without a vector polls).
    let used: &[QueueRole] = match engine {
        Engine::Queue if run.qd == 1 && !o.force_queue => &[QueueRole::Sync],
        Engine::Queue if handle.queue_counts().1 > 0 => &[QueueRole::Lendable],
        Engine::Queue | Engine::Batch(_) | Engine::Stream if handle.batch_queue_is_shared() => &[QueueRole::Sync],
        _ => &[QueueRole::Batch],
    };
    let mode = match (&o.service, used) {
        (Some(m), [QueueRole::Sync]) => m.as_str(),
        _ => completion_label(handle, used),
    };
    let shape = match engine {
        Engine::Batch(n) => format!("batch {n:<4}"),
        Engine::Stream => format!("stream qd {:<4}", o.qd),
        Engine::Queue => format!("qd {:<4}", o.qd),
    };
    let lat = match engine {
        Engine::Batch(_) => "batch lat us",
        Engine::Stream => "enq-done lat us",
        Engine::Queue => "lat us",
    };
    println!(
        "{:<9} {:>8}  threads {:<2} {shape} {:<4} | {:>10.1} MiB/s {:>9} IOPS | {lat} mean {:>8} p50 {:>8} p99 {:>8} p99.9 {:>8} max {:>9} | {:.2} s, {} I/Os",
        o.mode.name(),
        fmt_bytes(size as u64),
        o.threads,
        mode,
        bytes as f64 / secs / (1 << 20) as f64,
        fmt_count(ios as f64 / secs),
        us(hist.mean()),
        us(hist.quantile(0.5) as f64),
        us(hist.quantile(0.99) as f64),
        us(hist.quantile(0.999) as f64),
        us(hist.max() as f64),
        secs,
        ios
    );
    if let (Engine::Batch(_), Some(f)) = (engine, first_batch) {
        println!(
            "          first batch {} us (median of {FIRST_BATCHES} fresh contexts; slowest thread's), steady mean {} us, p50 {} us; {:.2} doorbell writes per batch over {} batches",
            us(f.as_nanos() as f64),
            us(hist.mean()),
            us(hist.quantile(0.5) as f64),
            doorbells as f64 / batches.max(1) as f64,
            batches
        );
    }
    if o.target.null {
        println!(
            "          (null emulator: no data was moved; MiB/s is requests x size, the cost of the driver alone)"
        );
    }
    if o.json.is_some() {
        let us_of = |ns: f64| (ns / 10.0).round() / 100.0;
        // The latency distribution at 1% steps and the tail, for CDFs.
        let cdf: Vec<serde_json::Value> = (1..100)
            .map(|i| i as f64 / 100.0)
            .chain([0.995, 0.999, 0.9999, 1.0])
            .map(|q| serde_json::json!([us_of(hist.quantile(q) as f64), q]))
            .collect();
        runs.push(serde_json::json!({
            "mode": o.mode.name(), "size": size, "threads": o.threads, "qd": o.qd,
            "engine": match engine { Engine::Batch(n) => format!("batch {n}"), Engine::Stream => "stream".into(), Engine::Queue => "queue".into() },
            "completion": mode, "seconds": secs, "ios": ios, "bytes": bytes,
            "mib_s": bytes as f64 / secs / (1 << 20) as f64, "iops": ios as f64 / secs,
            "latency_us": {
                "what": lat, "mean": us_of(hist.mean()), "p50": us_of(hist.quantile(0.5) as f64),
                "p99": us_of(hist.quantile(0.99) as f64), "p999": us_of(hist.quantile(0.999) as f64),
                "max": us_of(hist.max() as f64), "cdf": cdf,
            },
            "first_batch_us": first_batch.map(|f| us_of(f.as_nanos() as f64)),
            "doorbells_per_batch": (batches > 0).then(|| doorbells as f64 / batches as f64),
            "errors": errors, "null": o.target.null,
        }));
    }
    if errors > 0 {
        return Err(format!("{errors} I/O errors; first: {}", first_error.unwrap_or_default()));
    }
    Ok((checked, mism))
}

pub fn main(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    let command: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let Some(mut o) = parse(args)? else { return Ok(()) };
    // An SSD does not fall asleep between commands: keep the emulated
    // controller's thread awake across the short gaps of a run (it otherwise
    // parks after 100 us idle, and the next command pays a wake-up of up to a
    // few hundred microseconds on a VM), unless told otherwise.
    // Not where the emulated controllers' threads and the bench's would
    // then be more than the cores: spinning threads that share a core wait
    // for each other's time slices (milliseconds).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let spinners = if o.target.targets.len() > 1 { 0 } else { o.target.emu_controllers };
    if o.target.spin_us.is_none() && (spinners <= 1 || spinners + o.threads <= cores) {
        o.target.spin_us = Some(20_000);
    }
    if let Some(layout) = o.volume {
        return volume::run(&o, layout);
    }
    if o.processes > 1 {
        return processes::run(&o, &command);
    }
    let target = target::open(&o.target)?;
    if o.mixed {
        return mixed::run(&o, &target, &Driver::open());
    }
    if o.modes {
        return modes::run(&o, &target, &Driver::open());
    }
    if let Some(n) = o.vectored {
        return vectored::run(&o, &target, &Driver::open(), n);
    }
    let max_size = *o.sizes.iter().max().expect("at least one size");
    let t_setup = Instant::now();
    let driver = Driver::open();
    let control = target.emu.clone();
    // Deep enough for qd requests of the largest size, each split by MDTS.
    // (For a PCI target MDTS is known only after bring-up: assume the
    // smallest, one page per command.) No deeper than that needs, and no
    // shallower than 64 entries: a ring larger than the work costs (under
    // QEMU's TCG a 1024-entry queue at depth 1 gave about 20% fewer IOPS
    // than a 64-entry one, medians of four alternations in one boot), and a
    // tiny one reports every completion to the controller.
    let per_req = if target.is_kernel_path() || target.is_fabrics() {
        max_size.div_ceil(1 << 20)
    } else if o.target.pci.is_some() || o.target.drv.is_some() || o.target.attach.is_some() {
        max_size.div_ceil(4096)
    } else if o.target.mdts == 0 {
        1
    } else {
        max_size.div_ceil(4096 << o.target.mdts)
    };
    let depth = (o.qd * per_req + 1).clamp(64, 1024) as u16;
    let lent = (o.qd > 1 || o.force_queue) && o.batches.is_empty() && !o.stream;
    // `--cache`, else UGDS_CACHE_POLICY (as C and Python take it), whose
    // unknown value is refused as the option's is.
    let cache = match o.cache {
        Some(c) => c,
        None => ugds::CachePolicy::from_env()?.unwrap_or_default(),
    };
    let mut opts = HandleOptions::default()
        .nsid(o.target.nsid)
        .completion(if o.interrupt { Completion::Interrupt } else { Completion::Poll })
        .sync_queues(if lent { 1 } else { o.threads as u16 })
        .async_queues(if lent { o.threads as u16 } else { 0 })
        .queue_depth(depth)
        // Queue mode needs lendable queues more than a batch queue (few queues: QEMU max_ioqpairs=2).
        .batch_queue(!o.batches.is_empty() || o.stream)
        // Each thread's batch context on a queue pair of its own.
        .batch_queues(if o.batches.is_empty() { 1 } else { batch_queue_per_thread(o.threads) })
        .shadow_doorbells(o.shadow_doorbells)
        .kernel_ring(o.kernel_ring)
        .cache(cache)
        .stats_dir(HandleOptions::from_env().stats_dir)
        .trace(o.trace)
        .placement(o.placement)
        .chunk_bytes(o.chunk)
        .mode(o.service.as_deref().map(ugds::mode::mode_by_name).transpose().map_err(|e| e.to_string())?);
    let mut handle = target.open_handle(&driver, opts.clone()).map_err(|e| e.to_string())?;
    let mut shared_note = "";
    if lent && handle.queue_counts().1 < o.threads {
        // Too few queue pairs to lend one per thread: every thread's queue
        // is a context on the batch queue instead (shared with synchronous
        // I/O when the controller grants one queue pair).
        handle.close(ugds::Drain::NoWait).map_err(|e| e.to_string())?;
        opts.async_queues = 0;
        opts.batch_queue = true;
        opts.queue_depth = opts.queue_depth.max(opts.batch_depth);
        handle = target.open_handle(&driver, opts).map_err(|e| e.to_string())?;
        shared_note = "; too few to lend one per thread: each thread's queue is a context on the batch queue";
    }
    let setup = t_setup.elapsed();
    if let (Some(m), true) = (&o.service, lent || !o.batches.is_empty() || o.stream) {
        eprintln!("note: --mode {m} serves synchronous requests (queue depth 1); these runs' queues poll or wait as --interrupt says");
    }
    let ns = handle.namespace();
    let share = handle.share();
    let range = o.range.unwrap_or(share.end - share.start).min(share.end - share.start);
    if let Some(&bad) = o.sizes.iter().find(|&&s| s % ns.block_size as usize != 0 || s as u64 > range) {
        return Err(format!(
            "request size {bad} must be a multiple of the {}-byte block and fit the {range}-byte range",
            ns.block_size
        ));
    }
    let (nsync, nasync) = handle.queue_counts();
    println!("target   {}", target.description);
    println!(
        "setup    {:.2} ms ({}, {} sync + {} lent queue pairs of {}{}{})",
        setup.as_secs_f64() * 1e3,
        if target.is_kernel_path() {
            "file opened, one io_uring ring per queue"
        } else if target.is_fabrics() {
            "controller connected, enabled, identified; one connection per queue"
        } else {
            "controller enabled, identified"
        },
        nsync,
        nasync,
        granted_entries(&handle, depth),
        if handle.shadow_doorbells() { ", shadow doorbells" } else { "" },
        shared_note
    );
    if !target.is_kernel_path() && !target.is_fabrics() {
        println!(
            "         doorbells: {} ({})",
            if handle.shadow_doorbells() { "shadow" } else { "MMIO" },
            match (o.shadow_doorbells, ugds::trapping_hypervisor()) {
                (false, _) => "shadow doorbells not asked for".to_string(),
                (true, _) if !handle.shadow_doorbells() => "the controller offers no Doorbell Buffer Config".into(),
                (true, Some(hv)) => format!("the controller offers them; doorbell writes trap to {hv}"),
                (true, None) => "asked for; the controller offers them".into(),
            }
        );
    }
    if o.interrupt {
        println!("         completion: {}", describe_queues(&handle));
    }
    println!(
        "latency  {}, read from {}",
        match o.sample {
            1 => "every I/O timed".to_string(),
            n => format!("at queue depth 1 one call in {n} timed (--sample 1: every one), deeper every I/O"),
        },
        o.clock.describe()
    );
    match handle.batch_geometry() {
        Some((entries, _)) if handle.batch_queue_is_shared() => {
            println!("         batch queue: the one queue pair, shared with synchronous I/O ({entries} entries)")
        }
        Some((entries, pages)) => println!("         batch queue: {entries} entries, {pages} PRP-list pages"),
        None => {}
    }
    // One registered buffer per thread: qd slots of the largest size.
    let mut bufs = Vec::new();
    let mut slots = Vec::new();
    for _ in 0..o.threads {
        let slots_per_thread = o.qd.max(o.batches.iter().copied().max().unwrap_or(0));
        let mut b = HostBuffer::new(max_size * slots_per_thread).map_err(|e| e.to_string())?;
        // SAFETY: `b` is kept in `bufs` until after deregistration below,
        // and each slot is touched only while it has no I/O in flight.
        let token = unsafe { driver.register(b.as_mut_ptr(), b.len()) }.map_err(|e| e.to_string())?;
        slots.push(Slots { token, base: b.as_mut_ptr() });
        bufs.push(b);
    }
    if o.verify && !o.mode.writes() {
        let t = Instant::now();
        prefill(&driver, &handle, share.start, range).map_err(|e| format!("prefill: {e}"))?;
        println!("prefill  {} written with the verify pattern in {:.2} s", fmt_bytes(range), t.elapsed().as_secs_f64());
    }
    processes::wait_for_start();
    let (mut checked, mut mismatches) = (0, 0);
    let mut runs = Vec::new();
    let before = control.as_ref().map(|c| c.stats());
    let queues_before = handle.queue_stats();
    let mut result = Ok(());
    let engines: Vec<Engine> = if o.stream {
        vec![Engine::Stream]
    } else if o.batches.is_empty() {
        vec![Engine::Queue]
    } else {
        o.batches.iter().map(|&n| Engine::Batch(n)).collect()
    };
    'runs: for &engine in &engines {
        for &size in &o.sizes {
            match run_one(&o, &handle, &slots, size, range, engine, &mut runs) {
                Ok((c, m)) => {
                    checked += c;
                    mismatches += m;
                }
                Err(e) => {
                    result = Err(e);
                    break 'runs;
                }
            }
        }
    }
    // What each queue pair did during the runs (prefill left out).
    let queue_runs: Vec<ugds::QueueStats> = handle
        .queue_stats()
        .iter()
        .zip(&queues_before)
        .map(|(a, b)| queue_delta(a, b))
        .filter(|d| d.submitted > 0)
        .collect();
    for q in &queue_runs {
        println!(
            "queue {:<3}{:<9} {} commands, {} read, {} written, {:.3} doorbell writes and {} interrupts per command, {} errors, {} timeouts",
            q.qid,
            format!("{:?}", q.role).to_lowercase(),
            q.submitted,
            fmt_amount(q.bytes_read),
            fmt_amount(q.bytes_written),
            q.doorbell_writes as f64 / q.submitted as f64,
            fmt_ratio(q.interrupts, q.submitted),
            q.errors,
            q.timeouts
        );
        if q.copied > 0 {
            println!("queue {:<3}{} commands' data copied through the queue's own memory", q.qid, q.copied);
        }
        if q.cache_hits + q.cache_misses > 0 {
            println!(
                "queue {:<3}page cache: {} reads served from it, {} tried it and went to the disk",
                q.qid, q.cache_hits, q.cache_misses
            );
        }
    }
    let latency = handle.queue_latency();
    for l in latency.iter().filter(|l| l.latency.count() > 0) {
        let q = |x| l.latency.quantile(x).map_or(0.0, |d| d.as_secs_f64() * 1e6);
        println!(
            "latency  queue {:<3}{:<9} {} commands, staged to completion consumed (library trace, buckets 25% wide): us p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.2}",
            l.qid,
            format!("{:?}", l.role).to_lowercase(),
            l.latency.count(),
            q(0.5),
            q(0.99),
            q(0.999),
            q(1.0)
        );
    }
    if o.interrupt {
        println!(
            "irq      waits that slept to their 100 ms cap (a lost wake-up, or a device gone quiet): {}, of which found their work ready (a lost wake-up): {}",
            handle.interrupt_waits_capped(),
            handle.interrupt_wakeups_lost()
        );
    }
    if handle.protocol_errors() > 0 {
        println!(
            "protocol completions the controller posted against the protocol, ignored: {}",
            handle.protocol_errors()
        );
    }
    if let (Some(c), Some(before)) = (&control, before) {
        let after = c.stats();
        if after.dma_faults > before.dma_faults {
            println!("emulator DMA faults during the runs: {}", after.dma_faults - before.dma_faults);
        }
    }
    if o.verify {
        println!("verify   {checked} I/Os checked, {mismatches} mismatched 8-byte words");
    }
    if let Some(path) = &o.json {
        let doc = serde_json::json!({
            "ugds_version": env!("CARGO_PKG_VERSION"),
            "command": std::iter::once("ugds bench".to_string()).chain(command).collect::<Vec<_>>().join(" "),
            "target": target.description, "setup_ms": setup.as_secs_f64() * 1e3,
            "queues": handle.queues().iter().map(|q| {
                let s = queue_runs.iter().find(|s| s.qid == q.qid);
                serde_json::json!({
                    "qid": q.qid, "role": format!("{:?}", q.role), "entries": q.entries, "vector": q.vector,
                    "latency_us": latency.iter().find(|l| l.qid == q.qid).map(|l| {
                        let p = |x| l.latency.quantile(x).map(|d| d.as_secs_f64() * 1e6);
                        serde_json::json!({"commands": l.latency.count(), "p50": p(0.5), "p99": p(0.99), "p999": p(0.999), "max": p(1.0)})
                    }),
                    "during_runs": s.map(|s| serde_json::json!({
                        "submitted": s.submitted, "completed": s.completed, "bytes_read": s.bytes_read,
                        "bytes_written": s.bytes_written, "errors": s.errors, "timeouts": s.timeouts,
                        "doorbell_writes": s.doorbell_writes, "interrupts": s.interrupts,
                    })),
                })
            }).collect::<Vec<_>>(),
            "shadow_doorbells": handle.shadow_doorbells(),
            "verify": o.verify.then(|| serde_json::json!({"checked": checked, "mismatched_words": mismatches})),
            "interrupt_waits_capped": o.interrupt.then(|| handle.interrupt_waits_capped()),
            "interrupt_wakeups_lost": o.interrupt.then(|| handle.interrupt_wakeups_lost()),
            "protocol_errors": handle.protocol_errors(),
            "machine": crate::machine(),
            "runs": runs,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("--json {}: {e}", path.display()))?;
    }
    // The run's own error (a timeout, say) comes first; a buffer the
    // library would not deregister (requests still hold it: the device may
    // still write it) is kept, never freed.
    let mut kept = None;
    for s in &slots {
        if let Err(e) = driver.deregister(&s.token) {
            kept = Some(e);
        }
    }
    match &kept {
        Some(e) => {
            eprintln!("ugds bench: the buffers are kept, not freed: {e}");
            std::mem::forget(bufs);
        }
        None => drop(bufs),
    }
    let closed = handle.close(ugds::Drain::Timeout(Duration::from_secs(5)));
    result?;
    if let Some(e) = kept {
        return Err(e.to_string());
    }
    closed.map_err(|e| e.to_string())?;
    if mismatches > 0 {
        return Err(format!("verify failed: {mismatches} words differ from the pattern"));
    }
    Ok(())
}

/// Writes the verify pattern over `range` bytes, 1 MiB at a time.
/// What a queue did between two readings of its statistics.
fn queue_delta(after: &ugds::QueueStats, before: &ugds::QueueStats) -> ugds::QueueStats {
    let mut d = *after;
    d.submitted -= before.submitted;
    d.completed -= before.completed;
    d.bytes_read -= before.bytes_read;
    d.bytes_written -= before.bytes_written;
    d.errors -= before.errors;
    d.timeouts -= before.timeouts;
    d.doorbell_writes -= before.doorbell_writes;
    d.interrupts -= before.interrupts;
    d.copied -= before.copied;
    d.cache_hits -= before.cache_hits;
    d.cache_misses -= before.cache_misses;
    d
}

/// Bytes in the largest binary unit that leaves at least 1 (one decimal).
pub(crate) fn fmt_amount(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut i) = (n as f64, 0);
    while i < 4 && v >= 1024.0 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// `n / of` with three decimals ("0" for none).
fn fmt_ratio(n: u64, of: u64) -> String {
    if n == 0 {
        "0".into()
    } else {
        format!("{:.3}", n as f64 / of as f64)
    }
}

/// A batch queue pair per thread (at most 64), so that each thread's
/// batch context is on a queue of its own and the threads share no
/// queue's lock.
pub(super) fn batch_queue_per_thread(threads: usize) -> u16 {
    threads.clamp(1, 64) as u16
}

#[cfg(test)]
mod tests;
