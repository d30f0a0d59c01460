//! Where the first 4 KiB read after set-up goes (issue 40: `ugds gpu-bench`'s
//! `first_read_4k`, 400 us on the H200 against 37-51 us for the next
//! ones): a handle on FILE through the kernel path, 64 MiB of GPU memory
//! and 1 MiB of host memory registered, then 4 KiB reads in the order
//! ORDER names, each timed:
//!
//! - `gpu0`: GPU memory at offset 0 first (as gpu-bench), then fresh offsets;
//! - `gpu`: GPU memory at a fresh offset first, then host memory;
//! - `host`: host memory first, then GPU memory;
//! - `warm`: as `gpu`, after a 4 KiB copy to and from the GPU buffer of the
//!   example's own (`cuMemcpyHtoD`, `cuMemcpyDtoH`): what the CUDA
//!   driver's first copies cost, apart from ugds;
//! - `fiemap`: as `gpu`, after asking the file system for the file's
//!   extents (`FS_IOC_FIEMAP`, which reads its extent tree from the disk
//!   where it is not cached): what the first read's block lookup costs.
//!   Since 61e2248 the handle's open asks the same, so this order now
//!   shows the first read with that map in the cache either way.
//!
//! - `idle`: after the orders' first reads, what a pause costs each part
//!   of a read: for pauses of 0 to 100 ms, the median of 5 of each, in
//!   turn: a `pread` of 4 KiB of the file (buffered) of the example's own,
//!   a 4 KiB `cuMemcpyHtoDAsync` + stream sync of the example's own, and
//!   ugds's 4 KiB reads into host and GPU memory. Every offset was read
//!   once before (run with `UGDS_CACHE_POLICY=buffered` to have ugds's
//!   reads served from the page cache too), so the disk is not asked.
//!
//! Every read but `gpu0`'s first is at an offset no other read named (each
//! is the disk's). Drop the page cache before a run to start cold.
//! `UGDS_LOG=debug` prints the library's first-use messages (a ring's
//! registration of a buffer, a bounce slab made); `UGDS_TRACE=N` then
//! lists each queue's commands with the time each spent in the kernel,
//! the rest of a read's time being ugds's and CUDA's around it.
//!
//!     cargo run --release -p ugds --example first_read -- FILE ORDER

use std::time::Instant;
use ugds::gpu::cuda::Cuda;
use ugds::{BufferToken, Driver, Handle, HandleOptions, HostBuffer};

fn timed(h: &Handle, tok: &BufferToken, off: u64) -> ugds::Result<f64> {
    let t = Instant::now();
    h.read(tok, 4096, off, 0)?;
    Ok(t.elapsed().as_secs_f64() * 1e6)
}

/// How many extents the file at `path` has (the library's own request,
/// made on a descriptor of the example's).
fn fiemap(path: &str) -> ugds::Result<u32> {
    use std::os::fd::AsFd;
    let f = std::fs::File::open(path).map_err(|e| ugds::Error::Platform(format!("open {path}: {e}")))?;
    ugds_platform::sys::load_extent_map(f.as_fd()).map_err(|e| ugds::Error::Platform(e.to_string()))
}

fn main() -> ugds::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(order)) = (args.next(), args.next()) else {
        eprintln!("usage: first_read FILE gpu0|gpu|host|warm|fiemap|idle");
        std::process::exit(2);
    };
    ugds::log::install_from_env(ugds::log::Level::WARN);
    let cuda = Cuda::get()?;
    cuda.use_device(0)?;
    let gpu = cuda.alloc(64 << 20)?;
    let d = Driver::open();
    let t = Instant::now();
    let h = d.open_file(&path, HandleOptions::from_env())?;
    let opened = t.elapsed();
    let t = Instant::now();
    // SAFETY: `gpu` outlives the registration (the process ends first).
    let gtok = unsafe { d.register_cuda(gpu.ptr(), gpu.len())? };
    let registered = t.elapsed();
    let mut host = HostBuffer::new(1 << 20)?;
    // SAFETY: `host` outlives the registration (the process ends first).
    let htok = unsafe { d.register(host.as_mut_ptr(), host.len())? };
    println!(
        "handle {:.3} ms, 64 MiB GPU registration {:.3} ms",
        opened.as_secs_f64() * 1e3,
        registered.as_secs_f64() * 1e3
    );
    if order == "warm" {
        let t = Instant::now();
        let mut page = vec![1u8; 4096];
        gpu.upload(0, &page)?;
        gpu.download(0, &mut page)?;
        println!("warm-up copies {:.1} us", t.elapsed().as_secs_f64() * 1e6);
    }
    if order == "fiemap" {
        let t = Instant::now();
        let extents = fiemap(&path)?;
        println!("FS_IOC_FIEMAP: {extents} extents, {:.1} us", t.elapsed().as_secs_f64() * 1e6);
    }
    let blocks = h.capacity() / 4096;
    let mut n = 0u64;
    let mut fresh = || {
        n += 1;
        (n * 7919 * 13 % blocks) * 4096
    };
    let plan: Vec<(&str, u64)> = match order.as_str() {
        "gpu0" => vec![("gpu", 0), ("gpu", fresh()), ("gpu", fresh()), ("host", fresh()), ("host", fresh())],
        "gpu" | "warm" | "fiemap" | "idle" => {
            vec![("gpu", fresh()), ("gpu", fresh()), ("host", fresh()), ("host", fresh()), ("gpu", fresh())]
        }
        "host" => vec![("host", fresh()), ("host", fresh()), ("gpu", fresh()), ("gpu", fresh()), ("gpu", fresh())],
        o => {
            eprintln!("unknown order {o}: gpu0, gpu, host, warm, fiemap or idle");
            std::process::exit(2);
        }
    };
    let mut out = Vec::new();
    for (what, off) in plan.iter().chain([("gpu", fresh()), ("host", fresh()), ("gpu", fresh())].iter()) {
        let tok = if *what == "gpu" { &gtok } else { &htok };
        out.push(format!("{what}@{off:#x} {:.1}", timed(&h, tok, *off)?));
    }
    println!("{order}: 4 KiB reads in turn, us: {}", out.join(" / "));
    if order == "idle" {
        idle(&path, &h, &gtok, &htok, &gpu)?;
    }
    for q in h.trace() {
        for e in q.events {
            println!("  queue {}: {e}", q.qid);
        }
    }
    Ok(())
}

/// What a pause before it costs each part of a 4 KiB read (order `idle`).
fn idle(
    path: &str,
    h: &Handle,
    gtok: &BufferToken,
    htok: &BufferToken,
    gpu: &ugds::gpu::cuda::DeviceBuffer,
) -> ugds::Result<()> {
    use std::os::unix::fs::FileExt;
    use std::time::Duration;
    let file = std::fs::File::open(path).map_err(|e| ugds::Error::Platform(format!("open {path}: {e}")))?;
    let offsets: Vec<u64> = (0..64u64).map(|i| (1 << 30) + i * 3 * 4096).collect();
    let mut page = vec![0u8; 4096];
    for &off in &offsets {
        file.read_at(&mut page, off).map_err(|e| ugds::Error::Platform(e.to_string()))?;
        h.read(htok, 4096, off, 0)?;
        h.read(gtok, 4096, off, 0)?;
    }
    let mut next = offsets.iter().cycle();
    println!("idle: median of 5 4 KiB operations after each pause, us (pread / cuMemcpyHtoD / ugds host / ugds gpu)");
    for pause_us in [0u64, 200, 1000, 5000, 20_000, 100_000] {
        let mut times: [Vec<f64>; 4] = Default::default();
        for _ in 0..5 {
            for (k, t) in times.iter_mut().enumerate() {
                let off = *next.next().unwrap();
                std::thread::sleep(Duration::from_micros(pause_us));
                let s = Instant::now();
                match k {
                    0 => drop(file.read_at(&mut page, off).map_err(|e| ugds::Error::Platform(e.to_string()))?),
                    1 => gpu.upload(0, &page)?,
                    2 => drop(h.read(htok, 4096, off, 0)?),
                    _ => drop(h.read(gtok, 4096, off, 0)?),
                }
                t.push(s.elapsed().as_secs_f64() * 1e6);
            }
        }
        let med: Vec<String> = times
            .iter_mut()
            .map(|t| {
                t.sort_by(f64::total_cmp);
                format!("{:.1}", t[2])
            })
            .collect();
        println!("  after {:>6} us: {}", pause_us, med.join(" / "));
    }
    Ok(())
}
