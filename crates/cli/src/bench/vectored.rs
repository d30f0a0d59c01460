//! `ugds bench --vectored N`: N scattered segments read as one call
//! (`Handle::readv`) against N separate calls, from one thread.

use super::*;
use crate::clock::cpu_time;
use ugds::Segment;

pub(super) fn run(o: &Opts, target: &target::Target, driver: &Driver, n: usize) -> Result<(), String> {
    let size = o.sizes[0];
    let open = |sgl: bool| {
        let opts = HandleOptions::default()
            .nsid(o.target.nsid)
            .sync_queues(1)
            .async_queues(0)
            .batch_queue(false)
            .sgl(sgl)
            .completion(if o.interrupt { Completion::Interrupt } else { Completion::Poll });
        target.open_handle(driver, opts).map_err(|e| e.to_string())
    };
    let handle = open(true)?;
    let ns = handle.namespace();
    let total = n * size;
    let range = o.range.unwrap_or(ns.capacity()).min(ns.capacity());
    if size % ns.block_size as usize != 0 || total as u64 > range {
        return Err(format!("{n} segments of {size} bytes must be whole blocks and fit the namespace"));
    }
    let fits = handle.controller().max_transfer.is_none_or(|m| total <= m);
    // The segments lie every other slot of a buffer twice their total, in
    // reverse: scattered, as KV-cache blocks are.
    let mut mem = HostBuffer::new(2 * total).map_err(|e| e.to_string())?;
    // SAFETY: `mem` outlives the registration (deregistered below).
    let token = unsafe { driver.register(mem.as_mut_ptr(), mem.len()) }.map_err(|e| e.to_string())?;
    let segs: Vec<Segment> = (0..n).map(|i| Segment::new(&token, (2 * (n - 1 - i)) * size, size)).collect();
    println!("target   {}", target.description);
    println!(
        "vectored {n} segments of {} scattered in one buffer, one thread, {:.1} s each; {}",
        fmt_bytes(size as u64),
        o.duration.as_secs_f64(),
        match (handle.sgl(), fits) {
            (true, true) => "the controller takes SGLs: readv as one SGL command, then as PRP windows".to_string(),
            (true, false) =>
                format!("{} is more than one command (MDTS): readv as PRP windows", fmt_bytes(total as u64)),
            (false, _) => "the controller takes no SGLs: readv as PRP windows".to_string(),
        }
    );
    let extents = (range / total as u64).max(1);
    let mut rows = Vec::new();
    let mut handle = Some(handle);
    let mut hows = vec![("readv, PRP windows", true), ("separate calls", false)];
    if handle.as_ref().is_some_and(|h| h.sgl()) && fits {
        hows.insert(0, ("readv, one SGL", true));
    }
    for (name, one_call) in hows {
        if name == "readv, PRP windows" && handle.as_ref().is_some_and(|h| h.sgl()) {
            // The same controller, vectored requests as PRP windows.
            handle.take().expect("open").close(ugds::Drain::Forever).map_err(|e| e.to_string())?;
            handle = Some(open(false)?);
        }
        let h = handle.as_ref().expect("open");
        let (start, cpu0) = (Instant::now(), cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID));
        let (mut calls, mut k) = (0u64, 0u64);
        while start.elapsed() < o.duration {
            let off = (k % extents) * total as u64;
            k += 1;
            if one_call {
                h.readv(&segs, off).map_err(|e| format!("readv: {e}"))?;
            } else {
                for (i, s) in segs.iter().enumerate() {
                    h.read(&token, size, off + (i * size) as u64, s.offset).map_err(|e| format!("read: {e}"))?;
                }
            }
            calls += 1;
        }
        let (secs, cpu) =
            (start.elapsed().as_secs_f64(), (cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu0).as_secs_f64());
        let segments = calls * n as u64;
        println!(
            "{name:<18} {:>12.0} segments/s {:>10.1} MiB/s {:>8.1} us per {n} segments {:>8.0} ns CPU per segment",
            segments as f64 / secs,
            (segments * size as u64) as f64 / secs / (1 << 20) as f64,
            secs * 1e6 / calls as f64,
            cpu * 1e9 / segments as f64
        );
        rows.push(serde_json::json!({
            "how": name, "segments": n, "size": size, "seconds": secs, "segments_per_s": segments as f64 / secs,
            "cpu_ns_per_segment": cpu * 1e9 / segments as f64,
        }));
    }
    println!("         (CPU: the whole process's user and system time, an emulated controller's thread included)");
    if o.target.null {
        println!("         (null emulator: no data was moved; the cost of the driver alone)");
    }
    if let Some(path) = &o.json {
        let doc = serde_json::json!({
            "ugds_version": env!("CARGO_PKG_VERSION"), "workload": "vectored", "target": target.description,
            "machine": crate::machine(), "runs": rows,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("--json {}: {e}", path.display()))?;
    }
    release(driver, &token, mem).map_err(|e| e.to_string())?;
    handle.take().expect("open").close(ugds::Drain::Forever).map_err(|e| e.to_string())
}
