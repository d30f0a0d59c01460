//! The first batch against the steady ones, on a file through the kernel
//! path, as `ugds gpu-bench`'s batch figures take them but into host
//! memory (no GPU needed): 21 batches of 128 x 4 KiB reads at the same
//! offsets, then 21 at offsets no other batch read (scattered over the
//! file, one per 64 KiB block), each set on a new batch context; three
//! passes on one handle. Prints the first batch's time and the median of
//! the other 20 for each set; before them, how long a fresh 64 MiB buffer
//! takes to register and its first six 4 KiB reads, and five more each
//! after 100 ms without I/O (with `UGDS_TRACE=6`, the first six reads'
//! commands and their times in the kernel). Drop the page cache before a run to start
//! cold (`echo 3 > /proc/sys/vm/drop_caches`).
//!
//!     cargo run --release -p ugds --example first_batch -- FILE
//!
//! FILE: at least 8 MiB (2 GiB as gpu-bench's data file); read only.

use std::time::{Duration, Instant};
use ugds::{BatchIo, BatchOp, BufferToken, Driver, Handle, HandleOptions, HostBuffer};

/// Request `i` of fresh batch `rep`: one of `blocks` 64 KiB blocks (a power
/// of two) that no other (rep, i) names while there are enough, 36 KiB in
/// (gpu-bench's `fresh_offset`).
fn fresh_offset(rep: u64, i: u64, blocks: u64) -> u64 {
    ((rep * 128 + i) * 40503 % blocks) * 65536 + 36864
}

/// 21 batches at `offset(batch, request)` on a new context: the first
/// batch's time and the median of the rest.
fn rounds(h: &Handle, tok: &BufferToken, offset: impl Fn(u64, u64) -> u64) -> ugds::Result<(Duration, Duration)> {
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
    let mut rest = times[1..].to_vec();
    rest.sort();
    Ok((times[0], rest[rest.len() / 2]))
}

fn main() -> ugds::Result<()> {
    let path = std::env::args().nth(1).expect("usage: first_batch FILE");
    let d = Driver::open();
    let h = d.open_file(&path, HandleOptions::from_env())?;
    let blocks = (h.capacity() / 65536).clamp(1, 32768);
    if blocks < 128 {
        return Err(ugds::Error::InvalidArgument(format!("{path}: 8 MiB at least")));
    }
    let blocks = 1 << blocks.ilog2();
    // A fresh 64 MiB buffer: its registration, then its first 4 KiB reads.
    let mut big = HostBuffer::new(64 << 20)?;
    let t = Instant::now();
    // SAFETY: `big` outlives the registration (deregistered below).
    let big_tok = unsafe { d.register(big.as_mut_ptr(), big.len())? };
    let registered = t.elapsed();
    let mut reads = Vec::new();
    for i in 0..6u64 {
        let t = Instant::now();
        h.read(&big_tok, 4096, fresh_offset(1000, i, blocks), 0)?;
        reads.push(format!("{:.3}", t.elapsed().as_secs_f64() * 1e3));
    }
    println!(
        "64 MiB host buffer: registered in {:.3} ms; its first 4 KiB reads {} ms",
        registered.as_secs_f64() * 1e3,
        reads.join(" / ")
    );
    // With `UGDS_TRACE=6`: those reads' commands, each with its time in
    // the kernel (the registration with the ring comes before it).
    for q in h.trace() {
        for e in q.events.iter().filter(|e| e.completed.is_some()) {
            println!("  queue {}: {e}", q.qid);
        }
    }
    // The same reads after the disk was idle as long as before the first
    // (a virtual disk answers slowly after a pause; `ugds gpu-bench`'s
    // `read_4k_after_100ms_idle`).
    let mut after = Vec::new();
    for i in 0..5u64 {
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        h.read(&big_tok, 4096, fresh_offset(1001, i, blocks), 0)?;
        after.push(format!("{:.3}", t.elapsed().as_secs_f64() * 1e3));
    }
    println!("4 KiB reads after 100 ms idle: {} ms", after.join(" / "));
    d.deregister(&big_tok)?;
    let mut buf = HostBuffer::new(128 * 4096)?;
    // SAFETY: `buf` outlives the registration (deregistered below).
    let tok = unsafe { d.register(buf.as_mut_ptr(), buf.len())? };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for pass in 0..3u64 {
        let (first, steady) = rounds(&h, &tok, |_, i| i * 8192)?;
        println!(
            "pass {pass}: batch 128 x 4 KiB, same offsets: first {:.3} ms, steady median {:.3} ms",
            ms(first),
            ms(steady)
        );
        let (first, steady) = rounds(&h, &tok, |rep, i| fresh_offset(rep + pass * 21, i, blocks))?;
        println!(
            "pass {pass}: batch 128 x 4 KiB, new offsets each: first {:.3} ms, steady median {:.3} ms",
            ms(first),
            ms(steady)
        );
    }
    let stats = h.queue_stats();
    let (hits, misses) = stats.iter().fold((0, 0), |(h, m), q| (h + q.cache_hits, m + q.cache_misses));
    println!("page cache: {hits} hits, {misses} misses");
    d.deregister(&tok)?;
    Ok(())
}
