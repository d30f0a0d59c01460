//! `ugds gpu-bench`: ugds on GPU memory, in the shape of the cuFile
//! benchmark in bench/cufile, so the two print comparable figures.
//!
//! Every figure is printed as `RESULT key value unit` (for
//! scripts/gpu-bench, which prints both side by side) and in words.

use crate::histogram::Histogram;
use crate::target::{self, TargetOpts};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::gpu::cuda::Cuda;
use ugds::gpu::{GpuStream, StreamWait};
use ugds::{BatchIo, BatchOp, BufferToken, Driver, Handle, HandleOptions, StreamIo};

pub const HELP: &str = "\
Usage: ugds gpu-bench [OPTIONS] [TARGET]

Reads and writes between the target and CUDA device memory (GPU 0):
set-up time, synchronous reads by size, one stream against synchronous
16 MiB reads, the overlap of 16 x 1 MiB writes with compute, many streams,
and a batch of 128 x 4 KiB (first batch and steady state).

Options:
      --seconds S        time per synchronous size [1]
      --compute-us N     compute per I/O in the overlap experiment [500]
      --mode MODE        how the handle serves synchronous reads: latency,
                         throughput, priority or adaptive [none: polling]
      --cache POLICY     with --file: auto, direct or buffered [auto]
      --reads-only       only the set-up and the synchronous reads, each
                         figure's key prefixed `warm_` (scripts/gpu-bench runs
                         it again once the file is in the page cache)
      --neighbour-only   only the set-up and the neighbour figures (a kernel
                         beside streams waiting on I/O): a few seconds
  -h, --help

";

const MIB: usize = 1 << 20;

fn result(key: &str, value: f64, unit: &str) {
    println!("RESULT {key} {value:.3} {unit}");
}

pub fn main(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    use lexopt::prelude::*;
    let mut t = TargetOpts::default();
    let mut seconds = 1.0f64;
    let mut compute_us = 500u64;
    let mut mode = None;
    let mut cache = ugds::CachePolicy::Auto;
    let mut part = Part::All;
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        match arg {
            Short('h') | Long("help") => {
                print!("{HELP}{}", target::HELP);
                return Ok(());
            }
            Long("seconds") => seconds = p.value().map_err(|e| e.to_string())?.parse().map_err(|e| format!("{e}"))?,
            Long("mode") => {
                let m = p.value().map_err(|e| e.to_string())?.string().map_err(|e| e.to_string())?;
                mode = Some(ugds::mode::mode_by_name(&m).map_err(|e| e.to_string())?);
            }
            Long("cache") => {
                let v = p.value().map_err(|e| e.to_string())?.string().map_err(|e| e.to_string())?;
                cache = v.parse().map_err(|e: ugds::Error| e.to_string())?;
            }
            Long("reads-only") => part = Part::Reads,
            Long("neighbour-only") => part = Part::Neighbour,
            Long("compute-us") => {
                compute_us = p.value().map_err(|e| e.to_string())?.parse().map_err(|e| format!("{e}"))?
            }
            Long(l) => {
                let l = l.to_owned();
                if !target::parse_long(&mut t, &l, &mut p).map_err(|e| e.to_string())? {
                    return Err(format!("unexpected option --{l}; try `ugds gpu-bench --help`"));
                }
            }
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    let opts = HandleOptions::default().mode(mode).cache(cache);
    run(&t, Duration::from_secs_f64(seconds), compute_us, opts, part).map_err(|e| e.to_string())
}

/// What a run measures besides the set-up.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    All,
    /// The synchronous reads, keys prefixed `warm_`.
    Reads,
    /// The neighbour figures.
    Neighbour,
}

fn run(t: &TargetOpts, per_size: Duration, compute_us: u64, opts: HandleOptions, part: Part) -> ugds::Result<()> {
    let opts_cache = opts.cache;
    let key = |k: &str| if part == Part::Reads { format!("warm_{k}") } else { k.to_string() };
    let cuda = Cuda::get()?;
    cuda.use_device(0)?;
    // The CUDA context exists and the buffer is allocated before timing,
    // as in the cuFile benchmark.
    let gpu = cuda.alloc(64 * MIB)?;

    let faults0 = page_faults();
    let t0 = Instant::now();
    let target = target::open(t).map_err(ugds::Error::Platform)?;
    let driver = Driver::open();
    let t_open = t0.elapsed();
    let h = target.open_handle(&driver, opts)?;
    let t_handle = t0.elapsed();
    // SAFETY: `gpu` outlives the registration (deregistered at the end).
    let tok = unsafe { driver.register_cuda(gpu.ptr(), gpu.len())? };
    let t_reg = t0.elapsed();
    h.read(&tok, 4096, 0, 0)?;
    let t_first = t0.elapsed();
    let faults = page_faults().zip(faults0).map(|((min1, maj1), (min0, maj0))| (min1 - min0, maj1 - maj0));
    println!("target: {}", target.description);
    println!(
        "set-up: driver open {:.3} ms, handle {:.3} ms, 64 MiB GPU buffer registered {:.3} ms, first 4 KiB read done at {:.3} ms",
        ms(t_open),
        ms(t_handle - t_open),
        ms(t_reg - t_handle),
        ms(t_first)
    );
    // Major faults read the binary's or a library's pages from the disk:
    // after the page cache is dropped, code run for the first time.
    if let Some((minor, major)) = faults {
        println!("set-up page faults: {major} major, {minor} minor");
    }
    result(&key("setup_total"), ms(t_first), "ms");
    result(&key("setup_buf_register"), ms(t_reg - t_handle), "ms");
    // The first read against the ones after it, at new offsets (each a
    // 4 KiB read the disk serves): what set-up left to the first use.
    let mut next = Vec::new();
    for i in 1..=8u64 {
        let s = Instant::now();
        h.read(&tok, 4096, i * 7919 * 4096, 0)?;
        next.push(s.elapsed().as_secs_f64() * 1e6);
    }
    let first_us = ms(t_first - t_reg) * 1e3;
    println!(
        "first 4 KiB read {first_us:.1} us, the next ones {}",
        next.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(" / ")
    );
    result(&key("first_read_4k"), first_us, "us");
    // The first read also follows the disk's idle time (the process's
    // set-up), and a virtual disk answers slowly after a pause (the
    // development VM's: 75-81 us back to back, 175-450 after 100 ms;
    // bench/disk_idle.py). Reads after pauses, at fresh offsets: what the
    // first read costs with nothing left to its first use.
    let blocks = (h.capacity() / 4096).max(1);
    for (name, pause) in [("5ms", Duration::from_millis(5)), ("100ms", Duration::from_millis(100))] {
        let mut after = Vec::new();
        for i in 0..5u64 {
            std::thread::sleep(pause);
            let s = Instant::now();
            h.read(&tok, 4096, (100 + i) * 7919 % blocks * 4096, 0)?;
            after.push(s.elapsed().as_secs_f64() * 1e6);
        }
        after.sort_by(f64::total_cmp);
        println!(
            "4 KiB reads after {name} idle, us: {}",
            after.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(" / ")
        );
        result(&key(&format!("read_4k_after_{name}_idle")), after[2], "us");
    }
    if part == Part::Neighbour {
        neighbour(&cuda, &h, &tok)?;
        driver.deregister(&tok)?;
        return h.close(ugds::Drain::Forever);
    }

    // Synchronous random reads by size.
    let cap = h.capacity();
    let mut rng = crate::bench::Rng(0x9e37_79b9_7f4a_7c15);
    for size in [4096usize, 65536, MIB, 16 * MIB] {
        let mut hist = Histogram::default();
        let (mut n, start) = (0u64, Instant::now());
        while start.elapsed() < per_size || n < 4 {
            let off = rng.next() % (cap / size as u64) * size as u64;
            let s = Instant::now();
            h.read(&tok, size, off, 0)?;
            hist.record(s.elapsed().as_nanos() as u64);
            n += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        let mibs = (n * size as u64) as f64 / secs / MIB as f64;
        println!(
            "sync read {:>6}: {:>8.1} MiB/s, mean {:.1} us, p99 {:.1} us ({n} reads)",
            crate::fmt_bytes(size as u64),
            mibs,
            hist.mean() / 1e3,
            hist.quantile(0.99) as f64 / 1e3
        );
        result(&key(&format!("sync_read_{}k_mibs", size / 1024)), mibs, "MiB/s");
        if size == 4096 {
            result(&key("sync_read_4k_mean"), hist.mean() / 1e3, "us");
            result(&key("sync_read_4k_p99"), hist.quantile(0.99) as f64 / 1e3, "us");
        }
    }
    if let Some(s) = ugds::QueueStats::total(&h.queue_stats()) {
        println!(
            "page cache ({:?}): {} commands served from it, {} tried it and read from the disk",
            opts_cache, s.cache_hits, s.cache_misses
        );
    }
    if part == Part::Reads {
        driver.deregister(&tok)?;
        return h.close(ugds::Drain::Forever);
    }

    // Synchronous writes from GPU memory, and reads into host memory, at the
    // same sizes (as cufile_bench does).
    let mut host = ugds::HostBuffer::new(64 * MIB)?;
    // SAFETY: `host` outlives the registration (deregistered below).
    let host_tok = unsafe { driver.register(host.as_mut_ptr(), host.len())? };
    for (name, write, t) in [("sync_write", true, &tok), ("host_read", false, &host_tok)] {
        for size in [4096usize, 65536, MIB, 16 * MIB] {
            let (mut n, start) = (0u64, Instant::now());
            while start.elapsed() < per_size || n < 4 {
                let off = rng.next() % (cap / size as u64) * size as u64;
                if write {
                    h.write(t, size, off, 0)?;
                } else {
                    h.read(t, size, off, 0)?;
                }
                n += 1;
            }
            let mibs = (n * size as u64) as f64 / start.elapsed().as_secs_f64() / MIB as f64;
            println!("{name} {:>6}: {mibs:>8.1} MiB/s ({n})", crate::fmt_bytes(size as u64));
            result(&format!("{name}_{}k_mibs", size / 1024), mibs, "MiB/s");
        }
    }
    driver.deregister(&host_tok)?;
    drop(host);

    // One stream against the same 16 MiB reads done synchronously.
    let raw = cuda.create_stream()?;
    let reads = 32usize;
    let mut ratios = Vec::new();
    for wait in [StreamWait::DeviceSide, StreamWait::BlockingCallback] {
        // SAFETY: `raw` outlives `s`.
        let s = unsafe { cuda.stream(raw.raw(), wait)? };
        // Sync and stream alternate, so that a disk's drift hits both; the
        // figure is the median of the pairs' ratios.
        let (mut syncs, mut streams, mut kept) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..REPS {
            let sync = {
                let start = Instant::now();
                for i in 0..reads {
                    h.read(&tok, 16 * MIB, (i * 16 * MIB) as u64, (i % 4) * 16 * MIB)?;
                }
                (reads * 16) as f64 / start.elapsed().as_secs_f64()
            };
            let stream = {
                let start = Instant::now();
                let mut res = Vec::with_capacity(reads);
                for i in 0..reads {
                    let (io, r) = StreamIo::new(16 * MIB, (i * 16 * MIB) as u64, (i % 4) * 16 * MIB);
                    h.read_async(&tok, io, &s)?;
                    res.push(r);
                }
                s.synchronize()?;
                let bw = (reads * 16) as f64 / start.elapsed().as_secs_f64();
                if let Some(bad) = res.iter().find(|r| r.bytes() != (16 * MIB) as i64) {
                    return Err(ugds::Error::Platform(format!("stream read failed: {}", bad.bytes())));
                }
                bw
            };
            syncs.push(sync);
            streams.push(stream);
            kept.push(100.0 * stream / sync);
        }
        let best = (median(&mut syncs), median(&mut streams), median(&mut kept));
        let name = if wait == StreamWait::DeviceSide { "device-side wait" } else { "blocking callback" };
        let (n, busy, gap) = s.timing();
        println!(
            "one stream, {reads} x 16 MiB ({name}): sync {:.1} MiB/s, stream {:.1} MiB/s, {:.1}% kept (medians of {REPS} \
             alternating runs); per operation (mean of {n}): {:.1} us from start to signal, {:.1} us from signal to the next start",
            best.0,
            best.1,
            best.2,
            busy.as_secs_f64() * 1e6,
            gap.as_secs_f64() * 1e6
        );
        ratios.push(best);
    }
    result("sync_16m_mibs", ratios[0].0, "MiB/s");
    result("stream_16m_mibs", ratios[0].1, "MiB/s");
    result("stream_16m_kept", ratios[0].2, "%");
    result("stream_16m_blocking_kept", ratios[1].2, "%");

    stream_costs(&cuda, &h, &tok, &driver)?;
    overlap(&cuda, &h, &tok, compute_us)?;
    many_streams(&cuda, &h, &tok)?;
    neighbour(&cuda, &h, &tok)?;
    batch(&h, &tok)?;

    driver.deregister(&tok)?;
    h.close(ugds::Drain::Forever)?;
    Ok(())
}

/// What one stream operation costs: with no I/O (a size of zero, refused
/// inside the host function), and with one 4 KiB read, per operation.
fn stream_costs(cuda: &Arc<Cuda>, h: &Handle, tok: &BufferToken, driver: &Driver) -> ugds::Result<()> {
    let raw = cuda.create_stream()?;
    // SAFETY: `raw` outlives `s`.
    let s = unsafe { cuda.stream(raw.raw(), StreamWait::DeviceSide)? };
    let n = 2000;
    // Mean time per operation of `n` stream reads of `size` into `tok`.
    let per_op = |tok: &BufferToken, size: usize| -> ugds::Result<f64> {
        let start = Instant::now();
        for i in 0..n {
            let (io, _r) = StreamIo::new(size, (i * 8192) as u64, 0);
            h.read_async(tok, io, &s)?;
        }
        s.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
    };
    per_op(tok, 0)?;
    let empty = per_op(tok, 0)?;
    let read = per_op(tok, 4096)?;
    let (ops, busy, gap) = s.timing();
    let start = Instant::now();
    for i in 0..n {
        h.read(tok, 4096, (i * 8192) as u64, 0)?;
    }
    let sync = start.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!(
        "stream operation, {n} in a row: {empty:.1} us with no I/O, {read:.1} us with a 4 KiB read (sync 4 KiB read {sync:.1} us); \
         per operation (mean of {ops}): {:.1} us from start to signal, {:.1} us from signal to the next start",
        busy.as_secs_f64() * 1e6,
        gap.as_secs_f64() * 1e6
    );
    // The same on host memory (no staging block, no copy kernel).
    let mut host = ugds::HostBuffer::new(MIB)?;
    // SAFETY: `host` outlives the registration (deregistered below).
    let host_tok = unsafe { driver.register(host.as_mut_ptr(), host.len())? };
    let (host_empty, host_read) = (per_op(&host_tok, 0)?, per_op(&host_tok, 4096)?);
    driver.deregister(&host_tok)?;
    drop(host);
    println!("stream operation on host memory: {host_empty:.1} us with no I/O, {host_read:.1} us with a 4 KiB read");
    result("stream_op_host_empty", host_empty, "us");
    result("stream_op_host_4k", host_read, "us");
    result("stream_op_empty", empty, "us");
    result("stream_op_4k", read, "us");
    result("sync_op_4k", sync, "us");
    Ok(())
}

/// The paper's overlap experiment: 16 x 1 MiB writes from GPU memory and as
/// many compute kernels, three schedules.
fn overlap(cuda: &Arc<Cuda>, h: &Handle, tok: &BufferToken, compute_us: u64) -> ugds::Result<()> {
    let spin = cuda.spin_kernel()?;
    let (io_raw, c_raw) = (cuda.create_stream()?, cuda.create_stream()?);
    // SAFETY: `io_raw` outlives `io`.
    let io = unsafe { cuda.stream(io_raw.raw(), StreamWait::DeviceSide)? };
    // Written into the namespace's upper half, away from the read data.
    let base = h.capacity() / 2;
    let write = |i: usize| -> ugds::Result<()> {
        let (sio, _r) = StreamIo::new(MIB, base + (i * MIB) as u64, i * MIB);
        h.write_async(tok, sio, &io)
    };
    let ns = compute_us * 1000;
    // Warm-up: one of each.
    write(0)?;
    spin.launch(&c_raw, ns)?;
    io.synchronize()?;
    c_raw.synchronize()?;
    // Each side alone: what a perfect overlap would take is the larger.
    let start = Instant::now();
    for i in 0..16 {
        write(i)?;
    }
    io.synchronize()?;
    let io_alone = ms(start.elapsed());
    let start = Instant::now();
    for _ in 0..16 {
        spin.launch(&c_raw, ns)?;
    }
    c_raw.synchronize()?;
    let compute_alone = ms(start.elapsed());
    result("overlap_io_alone", io_alone, "ms");
    result("overlap_compute_alone", compute_alone, "ms");
    let mut out = Vec::new();
    for schedule in ["sequential", "per_io_overlap", "pipelined"] {
        let start = Instant::now();
        for i in 0..16 {
            match schedule {
                "sequential" => {
                    write(i)?;
                    io.synchronize()?;
                    spin.launch(&c_raw, ns)?;
                    c_raw.synchronize()?;
                }
                "per_io_overlap" => {
                    write(i)?;
                    spin.launch(&c_raw, ns)?;
                    io.synchronize()?;
                    c_raw.synchronize()?;
                }
                _ => {
                    write(i)?;
                    spin.launch(&c_raw, ns)?;
                }
            }
        }
        io.synchronize()?;
        c_raw.synchronize()?;
        let took = ms(start.elapsed());
        result(&format!("overlap_{schedule}"), took, "ms");
        out.push(took);
    }
    println!(
        "overlap, 16 x (1 MiB write + {compute_us} us compute): I/O alone {io_alone:.2} ms, compute alone \
         {compute_alone:.2} ms; sequential {:.2} ms, per-I/O overlap {:.2} ms, pipelined {:.2} ms",
        out[0], out[1], out[2]
    );
    Ok(())
}

/// Aggregate read bandwidth with 1, 4 and 16 streams, 16 x 1 MiB each.
fn many_streams(cuda: &Arc<Cuda>, h: &Handle, tok: &BufferToken) -> ugds::Result<()> {
    for n in [1usize, 4, 16] {
        let raws: Vec<_> = (0..n).map(|_| cuda.create_stream()).collect::<ugds::Result<_>>()?;
        // SAFETY: `raws` outlive the streams (dropped first, below).
        let streams: Vec<GpuStream> = raws
            .iter()
            .map(|r| unsafe { cuda.stream(r.raw(), StreamWait::DeviceSide) })
            .collect::<ugds::Result<_>>()?;
        let start = Instant::now();
        let mut res = Vec::new();
        for i in 0..16 {
            for (k, s) in streams.iter().enumerate() {
                let idx = k * 16 + i;
                let (io, r) = StreamIo::new(MIB, (idx * MIB) as u64, (idx % 64) * MIB);
                h.read_async(tok, io, s)?;
                res.push(r);
            }
        }
        for s in &streams {
            s.synchronize()?;
        }
        let mibs = (n * 16) as f64 / start.elapsed().as_secs_f64();
        if res.iter().any(|r| r.bytes() != MIB as i64) {
            return Err(ugds::Error::Platform("a stream read failed".into()));
        }
        println!("{n:>2} streams x 16 x 1 MiB reads: {mibs:.1} MiB/s");
        result(&format!("streams_{n}_mibs"), mibs, "MiB/s");
        drop(streams);
    }
    Ok(())
}

/// What streams waiting on I/O cost a kernel on a stream of its own: its
/// time from launch to the end of a synchronize, with no I/O, and while 1,
/// 4 and 32 streams share 128 x 1 MiB reads (enqueued from another thread:
/// ugds holds the enqueueing thread while 16 streams of its context wait on
/// the device).
fn neighbour(cuda: &Arc<Cuda>, h: &Handle, tok: &BufferToken) -> ugds::Result<()> {
    const READS: usize = 128;
    let spin = cuda.spin_kernel()?;
    let k = cuda.create_stream()?;
    // Launch to end, and the launch call alone (a driver lock or a full
    // queue shows in the second, the GPU in the first only).
    // Each launch call is kept with when it began, so that the slowest
    // can be placed in the pass.
    let sample = |v: &mut Vec<f64>, calls: &mut Vec<(Instant, f64)>| -> ugds::Result<()> {
        let t = Instant::now();
        spin.launch(&k, 0)?;
        calls.push((t, t.elapsed().as_secs_f64() * 1e6));
        k.synchronize()?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
        Ok(())
    };
    let mut calls = Vec::new();
    let mut idle = Vec::new();
    for _ in 0..50 {
        sample(&mut idle, &mut calls)?;
    }
    idle.clear();
    for _ in 0..500 {
        sample(&mut idle, &mut calls)?;
    }
    // The same HDR histogram as every other percentile here (and as
    // `ugds hist`, through which the cuFile side's samples go).
    let hist = |v: &[f64]| {
        let mut h = Histogram::default();
        v.iter().for_each(|us| h.record((us * 1e3).round() as u64));
        h
    };
    let pct = |h: &Histogram, p: f64| h.quantile(p) as f64 / 1e3;
    let idle = hist(&idle);
    println!(
        "kernel launch to end on its own stream, idle: p50 {:.1} us p99 {:.1} us",
        pct(&idle, 0.5),
        pct(&idle, 0.99)
    );
    result("neighbour_idle_p50", pct(&idle, 0.5), "us");
    result("neighbour_idle_p99", pct(&idle, 0.99), "us");
    let device = cuda.current_device()?;
    // The last: 32 streams whose operations wait in a host callback rather
    // than on the GPU (`StreamWait::BlockingCallback`, the choice the
    // architecture document gives for many waiting streams).
    for (n, wait) in [
        (1usize, StreamWait::DeviceSide),
        (4, StreamWait::DeviceSide),
        (32, StreamWait::DeviceSide),
        (32, StreamWait::BlockingCallback),
    ] {
        let per = READS / n;
        let raws: Vec<_> = (0..n).map(|_| cuda.create_stream()).collect::<ugds::Result<_>>()?;
        // SAFETY: `raws` outlive the streams (dropped first, below).
        let streams: Vec<GpuStream> =
            raws.iter().map(|r| unsafe { cuda.stream(r.raw(), wait) }).collect::<ugds::Result<_>>()?;
        let mut busy = Vec::new();
        // Two passes; the first one fills the staging pool (its blocks are
        // allocated once and then reused), the second is measured.
        let mut host = HostSide::default();
        // When the pass began, when the last read was enqueued, how long
        // the pass took (ms into it).
        let (mut pass_start, mut enqueued_ms, mut pass_ms) = (Instant::now(), 0.0, 0.0);
        for pass in 0..2 {
            busy.clear();
            calls.clear();
            pass_start = Instant::now();
            host = HostSide::now();
            let (res, enqueued) = std::thread::scope(|sc| -> ugds::Result<(Vec<_>, Instant)> {
                let enqueue = sc.spawn(|| -> ugds::Result<(Vec<_>, Instant)> {
                    cuda.use_device(device)?;
                    let mut res = Vec::new();
                    for i in 0..per {
                        for (j, s) in streams.iter().enumerate() {
                            let idx = j * per + i;
                            let (io, r) = StreamIo::new(MIB, ((idx + 512 + pass * 128) * MIB) as u64, (idx % 64) * MIB);
                            h.read_async(tok, io, s)?;
                            res.push(r);
                        }
                    }
                    Ok((res, Instant::now()))
                });
                // Sampled until every read has run (or 20000 kernels).
                while busy.len() < 20000 {
                    sample(&mut busy, &mut calls)?;
                    if enqueue.is_finished() {
                        break;
                    }
                }
                let (res, enqueued) = enqueue.join().expect("the enqueueing thread does not panic")?;
                while busy.len() < 20000 && !res.iter().all(|r| r.is_done()) {
                    sample(&mut busy, &mut calls)?;
                }
                Ok((res, enqueued))
            })?;
            for s in &streams {
                s.synchronize()?;
            }
            if res.iter().any(|r| r.bytes() != MIB as i64) {
                return Err(ugds::Error::Platform("a stream read failed".into()));
            }
            host = HostSide::now().since(&host);
            enqueued_ms = ms(enqueued.duration_since(pass_start));
            pass_ms = ms(pass_start.elapsed());
        }
        let busy = hist(&busy);
        // The three slowest launch calls: when in the pass they began.
        calls.sort_by(|a, b| b.1.total_cmp(&a.1));
        let slowest: Vec<String> = calls
            .iter()
            .take(3)
            .map(|(t, us)| format!("{us:.0} us at {:.1} ms", ms(t.duration_since(pass_start))))
            .collect();
        let calls = hist(&calls.iter().map(|c| c.1).collect::<Vec<_>>());
        let (how, suffix) =
            if wait == StreamWait::BlockingCallback { (", waiting in host callbacks", "_callback") } else { ("", "") };
        println!(
            "  while {n} stream(s) x {per} x 1 MiB reads are queued{how} ({} kernels, second pass): p50 {:.1} us p99 {:.1} us \
             (the launch call alone: p50 {:.1} us p99 {:.1} us)",
            busy.len(),
            pct(&busy, 0.5),
            pct(&busy, 0.99),
            pct(&calls, 0.5),
            pct(&calls, 0.99)
        );
        println!(
            "    the pass took {pass_ms:.1} ms, its reads all enqueued at {enqueued_ms:.1} ms; slowest launch calls: {}",
            slowest.join(", ")
        );
        result(&format!("neighbour_busy{n}{suffix}_launch_call_p99"), pct(&calls, 0.99), "us");
        result(&format!("neighbour_busy{n}{suffix}_p50"), pct(&busy, 0.5), "us");
        result(&format!("neighbour_busy{n}{suffix}_p99"), pct(&busy, 0.99), "us");
        // The host side of that pass: how long the sampling thread waited
        // for a CPU, and what ugds's threads ran.
        println!(
            "    host, same pass: the sampling thread waited {:.0} us for a CPU ({} involuntary switches); \
             on a CPU: {}",
            host.sampler_wait_ns as f64 / 1e3,
            host.sampler_involuntary,
            host.threads
                .iter()
                .map(|(name, ns)| format!("{name} {:.1} ms", *ns as f64 / 1e6))
                .collect::<Vec<_>>()
                .join(", ")
        );
        result(&format!("neighbour_busy{n}{suffix}_sampler_cpu_wait"), host.sampler_wait_ns as f64 / 1e3, "us");
        let ugds_ns: u64 = host.threads.iter().filter(|(name, _)| name.starts_with("ugds")).map(|(_, ns)| ns).sum();
        result(&format!("neighbour_busy{n}{suffix}_ugds_threads_cpu"), ugds_ns as f64 / 1e6, "ms");
        drop(streams);
    }
    Ok(())
}

/// 128 x 4 KiB reads per batch: the first batch, then 20 more.
fn batch(h: &Handle, tok: &BufferToken) -> ugds::Result<()> {
    // The same 128 offsets every batch; then new offsets for every batch,
    // scattered over the 2 GiB file (one per 64 KiB block, the blocks in a
    // multiplicative order mod 2^15), so that no batch reads data, or a
    // readahead window, an earlier one read: the first against the rest is
    // what ugds defers to a first use, not a cache warming up.
    batch_rounds(h, tok, "", "batch", |_, i| i * 8192)?;
    let blocks = (h.capacity() / 65536).clamp(1, 32768);
    let blocks = 1 << blocks.ilog2();
    batch_rounds(h, tok, ", new offsets each", "batch_fresh", |rep, i| fresh_offset(rep, i, blocks))
}

/// Request `i` of fresh batch `rep`: one of `blocks` 64 KiB blocks (a power
/// of two, 2^15 on the 2 GiB file) that no other (rep, i) names while there
/// are enough (40503 is odd: a bijection mod a power of two), 36 KiB in (off
/// the first batches' 8 KiB grid).
fn fresh_offset(rep: u64, i: u64, blocks: u64) -> u64 {
    ((rep * 128 + i) * 40503 % blocks) * 65536 + 36864
}

/// 21 batches of 128 x 4 KiB reads at `offset(batch, request)`: the first
/// batch's time and the median of the rest, as `{key}_first` and
/// `{key}_steady`.
fn batch_rounds(
    h: &Handle,
    tok: &BufferToken,
    what: &str,
    key: &str,
    offset: impl Fn(u64, u64) -> u64,
) -> ugds::Result<()> {
    let b = h.batch(128)?;
    let mut ev = Vec::with_capacity(128);
    let mut times = Vec::new();
    for rep in 0..21u64 {
        let ios: Vec<BatchIo> = (0..128u64)
            .map(|i| BatchIo {
                op: BatchOp::Read,
                buf: *tok,
                size: 4096,
                file_offset: offset(rep, i),
                buf_offset: i as usize * 4096,
                cookie: i,
            })
            .collect();
        ev.clear();
        let start = Instant::now();
        b.submit(&ios)?;
        b.get_status(128, 128, Some(Duration::from_secs(10)), &mut ev)?;
        times.push(start.elapsed());
        if ev.iter().any(|e| e.result.as_ref().ok() != Some(&4096)) {
            return Err(ugds::Error::Platform("a batch read failed".into()));
        }
    }
    let first = times[0];
    let mut steady: Vec<_> = times[1..].to_vec();
    steady.sort();
    let median = steady[steady.len() / 2];
    println!("batch 128 x 4 KiB{what}: first {:.3} ms, steady median {:.3} ms", ms(first), ms(median));
    result(&format!("{key}_first"), ms(first), "ms");
    result(&format!("{key}_steady"), ms(median), "ms");
    Ok(())
}

/// Alternating sync/stream runs of the one-stream comparison.
const REPS: usize = 7;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// What the host's scheduler did over a stretch of the run, from
/// `/proc/thread-self` (the calling thread) and `/proc/self/task` (every
/// thread): the caller's time waiting for a CPU and its involuntary
/// context switches, and each thread's time on a CPU by name (threads of
/// one name summed). Zero where procfs has no such file.
#[derive(Default)]
struct HostSide {
    sampler_wait_ns: u64,
    sampler_involuntary: u64,
    threads: Vec<(String, u64)>,
}

impl HostSide {
    fn now() -> HostSide {
        // schedstat: ns on a CPU, ns waiting on a run queue, time slices.
        let schedstat = |path: &str| -> (u64, u64) {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let mut f = text.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
            (f.next().unwrap_or(0), f.next().unwrap_or(0))
        };
        let involuntary = std::fs::read_to_string("/proc/thread-self/status")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:").map(|v| v.trim().parse().unwrap_or(0)))
            .unwrap_or(0);
        let mut threads: Vec<(String, u64)> = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
            let dir = task.path();
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default().trim().to_string();
            let (run, _) = schedstat(&dir.join("schedstat").to_string_lossy());
            match threads.iter_mut().find(|(n, _)| *n == name) {
                Some(t) => t.1 += run,
                None => threads.push((name, run)),
            }
        }
        HostSide {
            sampler_wait_ns: schedstat("/proc/thread-self/schedstat").1,
            sampler_involuntary: involuntary,
            threads,
        }
    }

    /// What happened between `before` and `self`: threads that ran,
    /// busiest first.
    fn since(&self, before: &HostSide) -> HostSide {
        let mut threads: Vec<(String, u64)> = self
            .threads
            .iter()
            .map(|(name, ns)| {
                let was = before.threads.iter().find(|(n, _)| n == name).map_or(0, |t| t.1);
                (name.clone(), ns.saturating_sub(was))
            })
            .filter(|(_, ns)| *ns > 0)
            .collect();
        threads.sort_by_key(|t| std::cmp::Reverse(t.1));
        HostSide {
            sampler_wait_ns: self.sampler_wait_ns.saturating_sub(before.sampler_wait_ns),
            sampler_involuntary: self.sampler_involuntary.saturating_sub(before.sampler_involuntary),
            threads,
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The process's minor and major page faults so far (`/proc/self/stat`).
fn page_faults() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (in parentheses, which may hold spaces):
    // state is field 3; minflt is 10, majflt 12.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    Some((f.get(7)?.parse().ok()?, f.get(9)?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::HostSide;

    #[test]
    fn host_side_names_the_threads_that_ran() {
        let before = HostSide::now();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(100) {
            std::hint::spin_loop();
        }
        let d = HostSide::now().since(&before);
        let me = std::thread::current().name().unwrap_or_default().chars().take(15).collect::<String>();
        let ran = d.threads.iter().find(|(n, _)| *n == me).map_or(0, |t| t.1);
        assert!(ran >= 10_000_000, "this thread spun 100 ms; measured {ran} ns among {:?}", d.threads);
        assert!(d.threads.windows(2).all(|w| w[0].1 >= w[1].1), "busiest first: {:?}", d.threads);
    }
}
