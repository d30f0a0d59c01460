//! `ugds-kbench`: random reads through the kernel's NVMe driver, for the
//! side-by-side benchmark against ugds (`scripts/qemu-bench`).
//!
//! Engines: `pread` (O_DIRECT, one thread per queue-depth slot), `uring`
//! (io_uring, registered buffers, interrupt completion) and `uring-poll`
//! (the same with IORING_SETUP_IOPOLL; the nvme driver needs poll queues,
//! `nvme poll_queues=N`). Prints one line:
//! `kbench engine=E size=S qd=Q iops=N mean_us=M p50_us=.. p99_us=..`.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

struct Opts {
    dev: String,
    engine: String,
    size: usize,
    qd: usize,
    secs: f64,
    range: u64,
}

fn parse() -> Result<Opts, String> {
    use lexopt::prelude::*;
    let mut o = Opts { dev: String::new(), engine: "uring".into(), size: 4096, qd: 1, secs: 2.0, range: 0 };
    let mut p = lexopt::Parser::from_env();
    let e = |e: lexopt::Error| e.to_string();
    while let Some(a) = p.next().map_err(e)? {
        match a {
            Long("dev") => o.dev = p.value().map_err(e)?.string().map_err(e)?,
            Long("engine") => o.engine = p.value().map_err(e)?.string().map_err(e)?,
            Long("size") => o.size = p.value().map_err(e)?.parse().map_err(e)?,
            Long("qd") => o.qd = p.value().map_err(e)?.parse().map_err(e)?,
            Long("duration") => o.secs = p.value().map_err(e)?.parse().map_err(e)?,
            Long("range") => o.range = p.value().map_err(e)?.parse().map_err(e)?,
            _ => return Err(a.unexpected().to_string()),
        }
    }
    if o.dev.is_empty() || o.qd == 0 || o.size == 0 || o.size % 512 != 0 {
        return Err("usage: ugds-kbench --dev /dev/nvme0n1 [--engine pread|uring|uring-poll] [--size B] [--qd N] [--duration S] [--range B]".into());
    }
    Ok(o)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn aligned(len: usize) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping, page aligned as O_DIRECT needs.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    assert!(p != libc::MAP_FAILED, "mmap failed");
    p.cast()
}

/// Latencies in nanoseconds: the same HDR histogram (three significant
/// digits) `ugds bench` reports from, so both sides count alike.
fn histogram() -> Hist {
    Hist::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

type Hist = hdrhistogram::Histogram<u64>;

fn report(engine: &str, o: &Opts, ios: u64, elapsed: Duration, lat: &Hist) {
    let q = |f: f64| lat.value_at_quantile(f) as f64 / 1000.0;
    println!(
        "kbench engine={engine} size={} qd={} iops={:.0} mean_us={:.2} p50_us={:.2} p99_us={:.2}",
        o.size,
        o.qd,
        ios as f64 / elapsed.as_secs_f64(),
        lat.mean() / 1000.0,
        q(0.5),
        q(0.99)
    );
}

fn device_size(f: &std::fs::File) -> u64 {
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: BLKGETSIZE64 writes one u64 into `size`.
    unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    size
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ugds-kbench: {e}");
            std::process::exit(2);
        }
    };
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&o.dev).unwrap_or_else(|e| {
        eprintln!("ugds-kbench: open {}: {e}", o.dev);
        std::process::exit(1)
    });
    let range = if o.range == 0 { device_size(&f) } else { o.range.min(device_size(&f)) };
    let slots = (range / o.size as u64).max(1);
    let dur = Duration::from_secs_f64(o.secs);
    match o.engine.as_str() {
        "pread" => {
            let fd = f.as_raw_fd();
            let start = Instant::now();
            let results: Vec<(u64, Hist)> = std::thread::scope(|s| {
                (0..o.qd)
                    .map(|t| {
                        let o = &o;
                        s.spawn(move || {
                            let buf = aligned(o.size) as usize;
                            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                            let mut lat = histogram();
                            while start.elapsed() < dur {
                                let off = rng.next() % slots * o.size as u64;
                                let t0 = Instant::now();
                                // SAFETY: `buf` is a live mapping of `size` bytes.
                                let n =
                                    unsafe { libc::pread(fd, buf as *mut libc::c_void, o.size, off as libc::off_t) };
                                assert_eq!(n, o.size as isize, "pread failed: {}", std::io::Error::last_os_error());
                                lat.saturating_record(t0.elapsed().as_nanos() as u64);
                            }
                            (lat.len(), lat)
                        })
                    })
                    .collect::<Vec<_>>()
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .collect()
            });
            let el = start.elapsed();
            let ios = results.iter().map(|r| r.0).sum();
            let mut lat = histogram();
            for (_, h) in &results {
                lat.add(h).expect("same bounds");
            }
            report("pread", &o, ios, el, &lat);
        }
        "uring" | "uring-poll" => {
            let poll = o.engine == "uring-poll";
            let mut b = io_uring::IoUring::builder();
            if poll {
                b.setup_iopoll();
            }
            let mut ring = b.build((o.qd * 2).next_power_of_two() as u32).expect("io_uring setup");
            let buf = aligned(o.size * o.qd);
            let iov = libc::iovec { iov_base: buf.cast(), iov_len: o.size * o.qd };
            // SAFETY: the buffer stays mapped for the life of the ring.
            unsafe { ring.submitter().register_buffers(&[iov]).expect("register buffers") };
            let fd = io_uring::types::Fd(f.as_raw_fd());
            let mut rng = Rng(0x1234_5678);
            let mut t0 = vec![Instant::now(); o.qd];
            let mut lat = histogram();
            let submit = |ring: &mut io_uring::IoUring, slot: usize, rng: &mut Rng| {
                let off = rng.next() % slots * o.size as u64;
                // SAFETY: slot `slot` of the registered buffer is ours until its completion.
                let ptr = unsafe { buf.add(slot * o.size) };
                let e = io_uring::opcode::ReadFixed::new(fd, ptr, o.size as u32, 0)
                    .offset(off)
                    .build()
                    .user_data(slot as u64);
                // SAFETY: the entry points into the registered buffer, which outlives the ring.
                unsafe { ring.submission().push(&e).expect("submission queue full") };
            };
            let start = Instant::now();
            for (s, t) in t0.iter_mut().enumerate() {
                *t = Instant::now();
                submit(&mut ring, s, &mut rng);
            }
            let mut inflight = o.qd;
            let mut ios = 0u64;
            while inflight > 0 {
                ring.submit_and_wait(1).expect("io_uring_enter");
                let done: Vec<(usize, i32)> = ring.completion().map(|c| (c.user_data() as usize, c.result())).collect();
                let now = Instant::now();
                for (slot, res) in done {
                    assert_eq!(res, o.size as i32, "read failed: {res}");
                    lat.saturating_record(now.duration_since(t0[slot]).as_nanos() as u64);
                    ios += 1;
                    inflight -= 1;
                    if start.elapsed() < dur {
                        t0[slot] = Instant::now();
                        submit(&mut ring, slot, &mut rng);
                        inflight += 1;
                    }
                }
            }
            let el = start.elapsed();
            report(&o.engine, &o, ios, el, &lat);
        }
        other => {
            eprintln!("ugds-kbench: unknown engine {other}");
            std::process::exit(2);
        }
    }
}
