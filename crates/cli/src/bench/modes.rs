//! `ugds bench --modes`: each way of serving synchronous requests (polling,
//! interrupts, and the modes) on a latency-bound and a bandwidth-bound
//! workload: IOPS, bandwidth, latency, and the CPU time the calling threads
//! spent per GB moved.

use super::*;
use crate::clock::cpu_time;
use ugds::mode::mode_by_name;

/// The bandwidth-bound workload's request size.
const LARGE: usize = 1 << 20;

/// One way of serving the requests: a mode by name, or none with the
/// handle's completion.
struct Setting {
    name: &'static str,
    mode: Option<&'static str>,
    completion: Completion,
}

const SETTINGS: [Setting; 5] = [
    Setting { name: "polling", mode: None, completion: Completion::Poll },
    Setting { name: "interrupts", mode: None, completion: Completion::Interrupt },
    Setting { name: "latency", mode: Some("latency"), completion: Completion::Poll },
    Setting { name: "throughput", mode: Some("throughput"), completion: Completion::Poll },
    Setting { name: "adaptive", mode: Some("adaptive"), completion: Completion::Poll },
];

struct Measured {
    hist: Histogram,
    ios: u64,
    bytes: u64,
    secs: f64,
    /// The calling threads' CPU time, summed.
    callers_cpu: Duration,
    /// The whole process's (an emulated controller's thread included).
    process_cpu: Duration,
}

impl Measured {
    fn iops(&self) -> f64 {
        self.ios as f64 / self.secs
    }
    fn mib_s(&self) -> f64 {
        self.bytes as f64 / self.secs / (1 << 20) as f64
    }
    /// CPU seconds per GB (10^9 bytes) moved.
    fn per_gb(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() / (self.bytes as f64 / 1e9)
    }
}

pub(super) fn run(o: &Opts, target: &target::Target, driver: &Driver) -> Result<(), String> {
    let small = o.sizes[0];
    let workloads = [("latency-bound", small, 1usize), ("bandwidth-bound", LARGE, o.threads)];
    println!("target   {}", target.description);
    println!(
        "modes    latency-bound: {} reads at QD1 from 1 thread; bandwidth-bound: {} reads at QD1 from {} thread(s), a synchronous queue each; {:.1} s each",
        fmt_bytes(small as u64),
        fmt_bytes(LARGE as u64),
        o.threads,
        o.duration.as_secs_f64()
    );
    println!(
        "{:<16} {:<11} {:>10} {:>10} {:>9} {:>9} {:>13} {:>13}",
        "workload", "mode", "IOPS", "MiB/s", "p50", "p99", "CPU s/GB", "process s/GB"
    );
    let mut rows = Vec::new();
    for (wname, size, threads) in workloads {
        let mut got: Vec<(&str, Measured)> = Vec::new();
        for s in &SETTINGS {
            let m = measure(o, target, driver, s, size, threads)?;
            let q = |x| m.hist.quantile(x) as f64 / 1e3;
            println!(
                "{:<16} {:<11} {:>10.0} {:>10.1} {:>7.1}us {:>7.1}us {:>13.3} {:>13.3}",
                wname,
                s.name,
                m.iops(),
                m.mib_s(),
                q(0.5),
                q(0.99),
                m.per_gb(m.callers_cpu),
                m.per_gb(m.process_cpu)
            );
            rows.push(serde_json::json!({
                "workload": wname, "mode": s.name, "size": size, "threads": threads,
                "iops": m.iops(), "mib_s": m.mib_s(), "latency_us": {"p50": q(0.5), "p99": q(0.99)},
                "callers_cpu_s_per_gb": m.per_gb(m.callers_cpu), "process_cpu_s_per_gb": m.per_gb(m.process_cpu),
                "seconds": m.secs,
            }));
            got.push((s.name, m));
        }
        summarise(wname, &got);
    }
    println!("         (CPU s/GB: the calling threads' CPU time per 10^9 bytes read; process: the whole process's, an emulated controller's thread included)");
    if let Some(path) = &o.json {
        let doc = serde_json::json!({
            "ugds_version": env!("CARGO_PKG_VERSION"), "workload": "modes", "target": target.description,
            "machine": crate::machine(), "rows": rows,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("--json {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Throughput mode's CPU per GB against polling's, and adaptive mode
/// against the better of polling and throughput mode: by IOPS on the
/// latency-bound workload, by CPU per GB on the bandwidth-bound one.
fn summarise(workload: &str, got: &[(&str, Measured)]) {
    let by = |n: &str| &got.iter().find(|(name, _)| *name == n).expect("measured").1;
    let (poll, thr, ada) = (by("polling"), by("throughput"), by("adaptive"));
    let cpu = |m: &Measured| m.per_gb(m.callers_cpu);
    println!(
        "{workload:<16} throughput mode: {:.3}x polling's CPU per GB at {:.2}x its bandwidth",
        cpu(thr) / cpu(poll),
        thr.mib_s() / poll.mib_s()
    );
    if workload == "latency-bound" {
        let (best, b) = if poll.iops() >= thr.iops() { ("polling", poll) } else { ("throughput", thr) };
        println!(
            "{workload:<16} adaptive mode: {:.3}x the IOPS of the better fixed mode ({best})",
            ada.iops() / b.iops()
        );
    } else {
        let (best, b) = if cpu(poll) <= cpu(thr) { ("polling", poll) } else { ("throughput", thr) };
        println!(
            "{workload:<16} adaptive mode: {:.3}x the CPU per GB of the better fixed mode ({best}) at {:.2}x its bandwidth",
            cpu(ada) / cpu(b),
            ada.mib_s() / b.mib_s()
        );
    }
}

fn measure(
    o: &Opts,
    target: &target::Target,
    driver: &Driver,
    s: &Setting,
    size: usize,
    threads: usize,
) -> Result<Measured, String> {
    let mode = s.mode.map(mode_by_name).transpose().map_err(|e| e.to_string())?;
    let opts = HandleOptions::default()
        .nsid(o.target.nsid)
        .sync_queues(threads as u16)
        .async_queues(0)
        .batch_queue(false)
        .completion(s.completion)
        .mode(mode);
    let handle = target.open_handle(driver, opts).map_err(|e| e.to_string())?;
    let ns = handle.namespace();
    let range = o.range.unwrap_or(ns.capacity()).min(ns.capacity());
    if size % ns.block_size as usize != 0 || size as u64 > range {
        return Err(format!("the size must be a multiple of {} and fit the range", ns.block_size));
    }
    let mut mem = HostBuffer::new(size * threads).map_err(|e| e.to_string())?;
    // SAFETY: `mem` outlives the registration (deregistered below), and
    // each thread reads into its own part of it.
    let token = unsafe { driver.register(mem.as_mut_ptr(), mem.len()) }.map_err(|e| e.to_string())?;
    let (start, cpu0) = (Instant::now(), cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID));
    let results: Vec<Result<(Histogram, u64, Duration), String>> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (h, token) = (&handle, &token);
                sc.spawn(move || {
                    let cpu0 = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
                    let mut hist = Histogram::default();
                    let mut rng = Rng(0x5eed_0100 + t as u64);
                    let blocks = range / size as u64;
                    let mut ios = 0u64;
                    while start.elapsed() < o.duration {
                        let off = rng.next() % blocks * size as u64;
                        let t0 = Instant::now();
                        h.read(token, size, off, t * size).map_err(|e| e.to_string())?;
                        hist.record(t0.elapsed().as_nanos() as u64);
                        ios += 1;
                    }
                    Ok((hist, ios, cpu_time(libc::CLOCK_THREAD_CPUTIME_ID) - cpu0))
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("a bench thread does not panic")).collect()
    });
    let (secs, process_cpu) = (start.elapsed().as_secs_f64(), cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu0);
    let released = release(driver, &token, mem);
    let closed = handle.close(ugds::Drain::Forever);
    let mut m =
        Measured { hist: Histogram::default(), ios: 0, bytes: 0, secs, callers_cpu: Duration::ZERO, process_cpu };
    for r in results {
        let (hist, ios, cpu) = r?;
        m.hist.merge(&hist);
        m.ios += ios;
        m.bytes += ios * size as u64;
        m.callers_cpu += cpu;
    }
    released.map_err(|e| e.to_string())?;
    closed.map_err(|e| e.to_string())?;
    Ok(m)
}
