//! Where a 4 KiB read's time goes, layer by layer, on one controller in one
//! process: the bare queue pair (submit, ring, spin on the phase tag), the
//! same with two clock reads per I/O, ugds's synchronous `Handle::read`, and
//! at depth 32 the bare queue pair against a lent `IoQueue`.
//! `scripts/qemu-bench` runs it beside `ugds bench` to show what the layers
//! above the queue pair cost.
//!
//! Usage: floor <pci-bdf> [seconds [modes]]   (emulated null controller when the BDF is "emu")
//! modes: comma-separated, of raw1 clock1 sync read read-shadow raw32 queue32 queue32-shadow clock
//! (all but clock by default), peek1, lock1 and gapN (the bare queue pair in the synchronous
//! queue's shape, or with N ns between a completion and the next submission: see
//! `raw_shaped`), queue1 (a lent `IoQueue` at depth 1), raw8-128k and queue8-128k
//! (128 KiB reads at depth 8, bare and through a lent `IoQueue`), and on the emulator `percoreNxD`: one thread keeping a lent
//! `IoQueue` on each of N emulated null controllers at depth D, with the CPU time of that
//! thread and of each controller's thread (IOPS per submitting core, and whether a
//! controller was the limit).

use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::engine::{Controller, Owner};
use ugds::nvme::{Cid, Lba, Nsid, NvmOpcode, PrpPlan, Sqe};
use ugds::platform::Platform;
use ugds::{Driver, HandleOptions, HostBuffer};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn report(what: &str, n: u64, el: Duration) {
    println!(
        "floor {what:<34} {:>9.0} IOPS  {:>8.2} us per I/O",
        n as f64 / el.as_secs_f64(),
        el.as_secs_f64() * 1e6 / n as f64
    );
}

fn platform(bdf: &str) -> Result<Arc<dyn Platform>, ugds::Error> {
    Ok(if bdf == "emu" {
        Arc::new(ugds_emu::EmuPlatform::new(ugds_emu::EmuConfig::default().null(true))?)
    } else {
        Arc::new(ugds::platform::vfio::VfioPlatform::open(bdf)?)
    })
}

/// The bare queue pair at depth `qd`: refill what completed, one doorbell
/// write per sweep. `clock` adds two clock reads per I/O (what a benchmark
/// that times every I/O pays).
fn raw(bdf: &str, secs: f64, qd: usize, clock: bool) -> Result<(), ugds::Error> {
    raw_sized(bdf, secs, qd, 4096, clock)
}

/// As `raw`, with reads of `size` bytes (a PRP list past two pages).
fn raw_sized(bdf: &str, secs: f64, qd: usize, size: usize, clock: bool) -> Result<(), ugds::Error> {
    let platform = platform(bdf)?;
    let ctrl = Controller::bring_up(platform.clone(), 1)?;
    let ns = ctrl.info().namespaces[0];
    let mut qp = ctrl.create_io_qpair(1, 64, None)?;
    let buf = platform.alloc_dma(size * qd)?;
    let pages: Vec<u64> = (0..size * qd / 4096).map(|i| buf.iova(i * 4096)).collect();
    let plan = |slot: usize| ugds::nvme::prp::plan(&pages, 4096, slot * size, size).expect("a whole buffer plans");
    let blocks = (size / ns.block_size as usize) as u32;
    let span = ns.blocks / blocks as u64;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let sqe = |rng: &mut Rng| {
        let lba = rng.next() % span * blocks as u64;
        Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(ns.nsid), Lba(lba), blocks, 0, 0)
    };
    let mut t_sum = 0u128;
    for slot in 0..qd {
        qp.submit(sqe(&mut rng), Some(plan(slot)), Owner::Own(slot as u32))?;
    }
    qp.ring_sq_doorbell();
    let mut n = 0u64;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut done = Vec::with_capacity(qd);
    'run: loop {
        for _ in 0..64 {
            let t0 = clock.then(Instant::now);
            qp.process_completions(usize::MAX, |owner, cqe| {
                assert!(cqe.status().is_success());
                done.push(owner)
            });
            for &owner in &done {
                let Owner::Own(slot) = owner else { unreachable!() };
                qp.submit(sqe(&mut rng), Some(plan(slot as usize)), owner)?;
            }
            n += done.len() as u64;
            done.clear();
            qp.ring_sq_doorbell();
            if let Some(t0) = t0 {
                t_sum += t0.elapsed().as_nanos();
            }
        }
        if Instant::now() > end {
            break 'run;
        }
    }
    let el = start.elapsed();
    while qp.outstanding() > 0 {
        qp.process_completions(usize::MAX, |_, _| {});
    }
    std::hint::black_box(t_sum);
    let kib = if size == 4096 { String::new() } else { format!(", {} KiB", size >> 10) };
    report(&format!("queue pair qd {qd}{kib}{}", if clock { " + clock per poll" } else { "" }), n, el);
    ctrl.delete_io_qpair(&qp)?;
    ctrl.shutdown()?;
    Ok(())
}

/// One controller with one I/O queue pair of 64 entries and a page of DMA
/// memory: what the depth-1 modes below read into, 4 KiB at random offsets.
struct OnePage {
    ctrl: Controller,
    platform: Arc<dyn Platform>,
    buf: ugds::platform::dma::DmaBuffer,
    nsid: u32,
    blocks: u32,
    span: u64,
    rng: Rng,
}

impl OnePage {
    fn open(bdf: &str) -> Result<OnePage, ugds::Error> {
        let platform = platform(bdf)?;
        let ctrl = Controller::bring_up(platform.clone(), 1)?;
        let ns = ctrl.info().namespaces[0];
        let buf = platform.alloc_dma(4096)?;
        let blocks = 4096 / ns.block_size;
        let span = ns.blocks / blocks as u64;
        Ok(OnePage { ctrl, platform, buf, nsid: ns.nsid, blocks, span, rng: Rng(0x9e37_79b9_7f4a_7c15) })
    }

    /// Its I/O queue pair (qid 1, 64 entries, polled).
    fn queue(&self) -> Result<ugds::engine::QueuePair, ugds::Error> {
        self.ctrl.create_io_qpair(1, 64, None)
    }

    /// The next 4 KiB read, into the page.
    fn read(&mut self) -> (Sqe, PrpPlan<'static>) {
        let lba = self.rng.next() % self.span * self.blocks as u64;
        let sqe = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(self.nsid), Lba(lba), self.blocks, 0, 0);
        (sqe, PrpPlan::One { prp1: self.buf.iova(0) })
    }
}

/// The bare queue pair at depth 1 in the shape of the engine's synchronous
/// queue, one step at a time, to find what costs where the engine differs
/// from the bare loop: `peek` spins on the phase tag before reaping (as
/// `SyncQueue::execute` does); `lock` adds a mutex held around staging
/// and around reaping, taken twice per I/O as there; `delay_ns` waits that
/// long (reading the clock) between a completion and the next submission,
/// as any layer's bookkeeping does.
fn raw_shaped(bdf: &str, secs: f64, lock: bool, delay_ns: u64) -> Result<(), ugds::Error> {
    let mut p = OnePage::open(bdf)?;
    let qp = std::sync::Mutex::new(p.queue()?);
    let mut n = 0u64;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut bare = if lock { None } else { Some(qp.lock().unwrap()) };
    while Instant::now() < end {
        for _ in 0..64 {
            let (sqe, prp) = p.read();
            if delay_ns > 0 {
                let t = Instant::now();
                while (t.elapsed().as_nanos() as u64) < delay_ns {}
            }
            {
                let mut g = if lock { Some(qp.lock().unwrap()) } else { None };
                let q = g.as_deref_mut().or(bare.as_deref_mut()).expect("one of the two");
                q.submit(sqe, Some(prp), Owner::Own(0))?;
                q.ring_sq_doorbell();
            }
            loop {
                let mut g = if lock { Some(qp.lock().unwrap()) } else { None };
                let q = g.as_deref_mut().or(bare.as_deref_mut()).expect("one of the two");
                if !q.completion_pending() {
                    continue;
                }
                if q.process_completions(usize::MAX, |_, cqe| assert!(cqe.status().is_success())) > 0 {
                    break;
                }
            }
        }
        n += 64;
    }
    let el = start.elapsed();
    drop(bare);
    let what = match (lock, delay_ns) {
        (true, _) => "queue pair qd 1, peek + lock".to_string(),
        (false, 0) => "queue pair qd 1, peek".to_string(),
        (false, ns) => format!("queue pair qd 1, {ns} ns gap"),
    };
    report(&what, n, el);
    let q = qp.into_inner().unwrap();
    p.ctrl.delete_io_qpair(&q)?;
    p.ctrl.shutdown()?;
    Ok(())
}

/// The engine's shared synchronous queue (`SyncQueue::execute`: slot,
/// lock, stage, wait) on a bare queue pair: what `Handle::read` adds on top
/// of it is the registry, the range checks and the chunker.
fn sync_queue(bdf: &str, secs: f64) -> Result<(), ugds::Error> {
    use ugds::engine::sync::{Cmd, Completion, Pacing, SyncQueue};
    let mut p = OnePage::open(bdf)?;
    let q = SyncQueue::new(p.queue()?, p.platform.clone())?;
    let mut n = 0u64;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        for _ in 0..64 {
            let (sqe, prp) = p.read();
            let cmd = Cmd { sqe, prp: Some(prp), sgl: None, bytes: 4096 };
            let (poll, timeout) = (Completion::Poll, Duration::from_secs(5));
            if q.execute(std::iter::once(cmd), "Read", poll, timeout, Pacing::NONE).is_err() {
                return Err(ugds::Error::Platform("read failed".into()));
            }
        }
        n += 64;
    }
    report("SyncQueue::execute qd 1", n, start.elapsed());
    q.with_qp(|qp| p.ctrl.delete_io_qpair(qp))?;
    p.ctrl.shutdown()?;
    Ok(())
}

/// ugds's public API: `Handle::read` at depth 1, an `IoQueue` deeper.
fn handle(bdf: &str, secs: f64, qd: usize, shadow: bool) -> Result<(), ugds::Error> {
    handle_as(bdf, secs, qd, 4096, shadow, qd > 1)
}

/// As `handle`, with reads of `size` bytes, and `lent`: a lent `IoQueue`
/// (at any depth) rather than `Handle::read`.
fn handle_as(bdf: &str, secs: f64, qd: usize, size: usize, shadow: bool, lent: bool) -> Result<(), ugds::Error> {
    let driver = Driver::open();
    let opts = HandleOptions::default()
        .sync_queues(1)
        .async_queues(if lent { 1 } else { 0 })
        .queue_depth(64)
        .shadow_doorbells(shadow);
    let h = driver.open_handle(platform(bdf)?, opts)?;
    let ns = h.namespace();
    let span = ns.capacity() / size as u64;
    let mut b = HostBuffer::new(size * qd)?;
    // SAFETY: `b` outlives its registration (deregistered below).
    let token = unsafe { driver.register(b.as_mut_ptr(), b.len())? };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut n = 0u64;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    if !lent {
        while Instant::now() < end {
            for _ in 0..64 {
                h.read(&token, size, rng.next() % span * size as u64, 0)?;
            }
            n += 64;
        }
    } else {
        let mut q = h.io_queue()?;
        for slot in 0..qd {
            q.submit_read(&token, size, rng.next() % span * size as u64, slot * size, slot as u64)?;
        }
        let mut done = Vec::with_capacity(qd);
        while Instant::now() < end {
            for _ in 0..64 {
                q.poll(usize::MAX, |tag, r| done.push((tag, r)));
                for (slot, r) in done.drain(..) {
                    r?;
                    q.submit_read(&token, size, rng.next() % span * size as u64, slot as usize * size, slot)?;
                    n += 1;
                }
            }
        }
        q.drain(|_, _| {})?;
    }
    let el = start.elapsed();
    let kib = if size == 4096 { String::new() } else { format!(", {} KiB", size >> 10) };
    report(
        &format!(
            "{} qd {qd}{kib}, shadow {}",
            if !lent { "Handle::read" } else { "IoQueue" },
            if shadow { "on" } else { "off" }
        ),
        n,
        el,
    );
    driver.deregister(&token)?;
    drop(b);
    h.close(ugds::Drain::NoWait)?;
    Ok(())
}

/// CPU seconds of the calling thread.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// CPU seconds (user + system, in clock ticks) of this process's threads
/// named `ugds-emu` (the emulated controllers' own threads), by thread id.
fn emulator_cpu() -> Vec<(u32, f64)> {
    let tick = 100.0; // USER_HZ
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else { continue };
        let Some((name, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") ")) else { continue };
        if name != "ugds-emu" {
            continue;
        }
        // Fields after the name: state is the first; utime and stime the 12th and 13th.
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (u, s) = (f[11].parse::<f64>().unwrap_or(0.0), f[12].parse::<f64>().unwrap_or(0.0));
        let tid = t.file_name().to_string_lossy().parse().unwrap_or(0);
        out.push((tid, (u + s) / tick));
    }
    out.sort_by_key(|x| x.0);
    out
}

/// One thread keeps a lent `IoQueue` on each of `n` emulated null
/// controllers `qd` deep: what the driver does per I/O on one core, with
/// the controllers' threads beside it (each below 100% of a core: they
/// were not the limit).
fn per_core(secs: f64, n: usize, qd: usize) -> Result<(), ugds::Error> {
    let driver = Driver::open();
    let opts = HandleOptions::default().sync_queues(1).async_queues(1).queue_depth((qd + 1).next_power_of_two() as u16);
    let handles = (0..n).map(|_| driver.open_handle(platform("emu")?, opts.clone())).collect::<Result<Vec<_>, _>>()?;
    let mut b = HostBuffer::new(4096 * qd)?;
    // SAFETY: `b` outlives its registration (deregistered below).
    let token = unsafe { driver.register(b.as_mut_ptr(), b.len())? };
    let span = handles[0].namespace().capacity() / 4096;
    let mut queues = handles.iter().map(|h| h.io_queue()).collect::<Result<Vec<_>, _>>()?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for q in queues.iter_mut() {
        for slot in 0..qd {
            q.submit_read(&token, 4096, rng.next() % span * 4096, slot * 4096, slot as u64)?;
        }
    }
    let (emu0, cpu0) = (emulator_cpu(), thread_cpu());
    let mut n_ios = 0u64;
    let mut done = Vec::with_capacity(qd);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        for _ in 0..64 {
            for q in queues.iter_mut() {
                q.poll(usize::MAX, |tag, r| done.push((tag, r)));
                for (slot, r) in done.drain(..) {
                    r?;
                    q.submit_read(&token, 4096, rng.next() % span * 4096, slot as usize * 4096, slot)?;
                    n_ios += 1;
                }
            }
        }
    }
    let (el, cpu) = (start.elapsed(), thread_cpu() - cpu0);
    let emu = emulator_cpu();
    for q in queues.iter_mut() {
        q.drain(|_, _| {})?;
    }
    drop(queues);
    let wall = el.as_secs_f64();
    report(&format!("IoQueue x{n} qd {qd}, one thread"), n_ios, el);
    let loads: Vec<String> = emu
        .iter()
        .map(|(tid, c)| {
            let before = emu0.iter().find(|x| x.0 == *tid).map_or(0.0, |x| x.1);
            format!("{:.0}%", (c - before) / wall * 100.0)
        })
        .collect();
    println!(
        "floor IoQueue x{n} qd {qd}: submitting thread {:.0}% of a core, {:.2} M IOPS per core; controller threads {}",
        cpu / wall * 100.0,
        n_ios as f64 / cpu / 1e6,
        loads.join(" ")
    );
    driver.deregister(&token)?;
    drop(b);
    for h in handles {
        h.close(ugds::Drain::NoWait)?;
    }
    Ok(())
}

fn main() -> Result<(), ugds::Error> {
    let mut args = std::env::args().skip(1);
    let bdf = args.next().unwrap_or_else(|| "emu".into());
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let modes = args.next().unwrap_or_else(|| "raw1,clock1,sync,read,read-shadow,raw32,queue32,queue32-shadow".into());
    for m in modes.split(',') {
        match m {
            "raw1" => raw(&bdf, secs, 1, false)?,
            "clock1" => raw(&bdf, secs, 1, true)?,
            "sync" => sync_queue(&bdf, secs)?,
            "peek1" => raw_shaped(&bdf, secs, false, 0)?,
            "lock1" => raw_shaped(&bdf, secs, true, 0)?,
            "read" => handle(&bdf, secs, 1, false)?,
            "read-shadow" => handle(&bdf, secs, 1, true)?,
            "queue1" => handle_as(&bdf, secs, 1, 4096, false, true)?,
            "raw8-128k" => raw_sized(&bdf, secs, 8, 128 << 10, false)?,
            "queue8-128k" => handle_as(&bdf, secs, 8, 128 << 10, false, true)?,
            "raw32" => raw(&bdf, secs, 32, false)?,
            "queue32" => handle(&bdf, secs, 32, false)?,
            "queue32-shadow" => handle(&bdf, secs, 32, true)?,
            "clock" => {
                let n = 100_000u32;
                let t0 = Instant::now();
                let mut last = t0;
                for _ in 0..n {
                    last = std::hint::black_box(Instant::now());
                }
                let ns = last.duration_since(t0).as_nanos() as f64 / n as f64;
                println!("floor one clock read (Instant::now)        {ns:>9.1} ns");
            }
            _ if m.starts_with("gap") => {
                let Some(ns) = m.strip_prefix("gap").and_then(|n| n.parse().ok()) else {
                    return Err(ugds::Error::InvalidArgument(format!("{m}: gapN, N in ns, e.g. gap250")));
                };
                raw_shaped(&bdf, secs, false, ns)?
            }
            _ if m.starts_with("percore") => {
                let parse = || {
                    let (n, d) = m.strip_prefix("percore")?.split_once('x')?;
                    Some((n.parse().ok()?, d.parse().ok()?))
                };
                let Some((n, d)) = parse() else {
                    return Err(ugds::Error::InvalidArgument(format!("{m}: percoreNxD, e.g. percore2x128")));
                };
                if bdf != "emu" {
                    return Err(ugds::Error::InvalidArgument(format!("{m}: on the emulator only (BDF emu)")));
                }
                per_core(secs, n, d)?
            }
            _ => return Err(ugds::Error::InvalidArgument(format!("unknown mode {m}"))),
        }
    }
    Ok(())
}
