//! `ugds bench --mixed`: small reads at queue depth 1 while another thread
//! streams large reads on the same handle, under each scheduler setting.

use super::*;
use ugds::{Placement, Priority};

/// Large reads of this size stream beside the small ones.
const LARGE: usize = 1 << 20;

/// One configuration of the table.
struct Setting {
    name: &'static str,
    placement: Placement,
    chunk_bytes: usize,
    small: Priority,
    large: Option<Priority>,
}

/// What one configuration measured.
struct Measured {
    small: Histogram,
    small_ios: u64,
    large_bytes: u64,
    secs: f64,
}

/// Runs the table: the small reads alone, then beside the large stream
/// with round robin and no interleaving (the scheduler off), with the
/// scheduler, and with the small reads latency-critical and the large ones
/// background.
pub(super) fn run(o: &Opts, target: &target::Target, driver: &Driver) -> Result<(), String> {
    let small = o.sizes[0];
    let chunk = 256 << 10;
    let settings = [
        Setting {
            name: "alone",
            placement: Placement::LeastLoaded,
            chunk_bytes: chunk,
            small: Priority::Normal,
            large: None,
        },
        Setting {
            name: "round robin",
            placement: Placement::RoundRobin,
            chunk_bytes: 0,
            small: Priority::Normal,
            large: Some(Priority::Normal),
        },
        Setting {
            name: "scheduler",
            placement: Placement::LeastLoaded,
            chunk_bytes: chunk,
            small: Priority::Normal,
            large: Some(Priority::Normal),
        },
        Setting {
            name: "priorities",
            placement: Placement::LeastLoaded,
            chunk_bytes: chunk,
            small: Priority::Critical,
            large: Some(Priority::Background),
        },
    ];
    println!("target   {}", target.description);
    println!(
        "mixed    {} reads at QD1 from one thread, {} reads at QD1 from another on the same handle (2 synchronous queues), {:.1} s each; interleaving chunk {}",
        fmt_bytes(small as u64),
        fmt_bytes(LARGE as u64),
        o.duration.as_secs_f64(),
        fmt_bytes(chunk as u64)
    );
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "setting", "small p50", "p99", "p99.9", "small IOPS", "large MiB/s", "p99/alone"
    );
    let mut alone_p99 = None;
    let mut rows = Vec::new();
    for s in &settings {
        let m = measure(o, target, driver, s, small)?;
        let q = |x| m.small.quantile(x) as f64 / 1e3;
        let p99 = q(0.99);
        let alone = *alone_p99.get_or_insert(p99);
        println!(
            "{:<12} {:>8.1}us {:>8.1}us {:>8.1}us {:>12.0} {:>12.1} {:>9.2}x",
            s.name,
            q(0.5),
            p99,
            q(0.999),
            m.small_ios as f64 / m.secs,
            m.large_bytes as f64 / m.secs / (1 << 20) as f64,
            p99 / alone
        );
        rows.push(serde_json::json!({
            "setting": s.name, "placement": format!("{:?}", s.placement), "chunk_bytes": s.chunk_bytes,
            "small_priority": format!("{:?}", s.small), "large_priority": s.large.map(|p| format!("{p:?}")),
            "small_us": {"p50": q(0.5), "p99": p99, "p999": q(0.999), "max": m.small.max() as f64 / 1e3},
            "small_iops": m.small_ios as f64 / m.secs, "large_mib_s": m.large_bytes as f64 / m.secs / (1 << 20) as f64,
            "seconds": m.secs,
        }));
    }
    println!("         (latency from the call to its return, per small read; the goal: p99 within 2x of alone)");
    if let Some(path) = &o.json {
        let doc = serde_json::json!({
            "ugds_version": env!("CARGO_PKG_VERSION"), "workload": "mixed", "target": target.description,
            "small_size": small, "large_size": LARGE, "machine": crate::machine(), "settings": rows,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("--json {}: {e}", path.display()))?;
    }
    Ok(())
}

fn measure(o: &Opts, target: &target::Target, driver: &Driver, s: &Setting, small: usize) -> Result<Measured, String> {
    let opts = HandleOptions::default()
        .nsid(o.target.nsid)
        .sync_queues(2)
        .async_queues(0)
        .batch_queue(false)
        .placement(s.placement)
        .chunk_bytes(s.chunk_bytes)
        .completion(if o.interrupt { Completion::Interrupt } else { Completion::Poll });
    let handle = target.open_handle(driver, opts).map_err(|e| e.to_string())?;
    let ns = handle.namespace();
    let range = o.range.unwrap_or(ns.capacity()).min(ns.capacity());
    if small % ns.block_size as usize != 0 || (LARGE as u64) * 2 > range {
        return Err(format!(
            "the small size must be a multiple of {} and the range hold two 1 MiB reads",
            ns.block_size
        ));
    }
    let mut mem = HostBuffer::new(LARGE + small).map_err(|e| e.to_string())?;
    // SAFETY: `mem` outlives the registration (deregistered below), and the
    // two threads use disjoint parts of it.
    let token = unsafe { driver.register(mem.as_mut_ptr(), mem.len()) }.map_err(|e| e.to_string())?;
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let result = std::thread::scope(|sc| {
        let large = s.large.map(|prio| {
            let (h, token, stop) = (&handle, &token, &stop);
            sc.spawn(move || {
                let (mut bytes, mut off) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    h.read_with_priority(token, LARGE, off, 0, prio)?;
                    bytes += LARGE as u64;
                    off = (off + LARGE as u64) % (range / 2 / LARGE as u64 * LARGE as u64);
                }
                Ok::<u64, ugds::Error>(bytes)
            })
        });
        let mut hist = Histogram::default();
        let mut rng = Rng(0x5eed_0001);
        let (blocks, base) = ((range / 2) / small as u64, range / 2);
        let mut ios = 0u64;
        let mut err = None;
        while start.elapsed() < o.duration {
            let off = base + rng.next() % blocks * small as u64;
            let t0 = Instant::now();
            if let Err(e) = handle.read_with_priority(&token, small, off, LARGE, s.small) {
                err = Some(e);
                break;
            }
            hist.record(t0.elapsed().as_nanos() as u64);
            ios += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let large_bytes = match large.map(|t| t.join().expect("the large reader does not panic")) {
            Some(Ok(b)) => b,
            Some(Err(e)) => return Err(format!("large reads: {e}")),
            None => 0,
        };
        match err {
            Some(e) => Err(format!("small reads: {e}")),
            None => Ok(Measured { small: hist, small_ios: ios, large_bytes, secs: start.elapsed().as_secs_f64() }),
        }
    });
    let released = release(driver, &token, mem);
    let closed = handle.close(ugds::Drain::Forever);
    let m = result?;
    released.map_err(|e| e.to_string())?;
    closed.map_err(|e| e.to_string())?;
    Ok(m)
}
