//! The floor under ugds's synchronous path: one queue pair driven directly
//! (submit, ring, spin on the phase tag, ring the completion doorbell), no
//! registry, no locks, no chunking. `scripts/qemu-bench` runs it beside
//! `ugds bench` to show what the layers above the queue pair cost.
//!
//! Usage: raw_qd1 <pci-bdf> [seconds]     (emulated controller when the BDF is "emu")

use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::engine::Controller;
use ugds::nvme::{Cid, Lba, Nsid, NvmOpcode, PrpPlan, Sqe};
use ugds::platform::Platform;

fn main() -> Result<(), ugds::Error> {
    let mut args = std::env::args().skip(1);
    let bdf = args.next().unwrap_or_else(|| "emu".into());
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let platform: Arc<dyn Platform> = if bdf == "emu" {
        Arc::new(ugds::platform::emu::EmuPlatform::new(ugds::platform::emu::EmuConfig::default().null(true))?)
    } else {
        Arc::new(ugds::platform::vfio::VfioPlatform::open(&bdf)?)
    };
    let ctrl = Controller::bring_up(platform.clone(), 1)?;
    let ns = ctrl.info().namespaces[0];
    let mut qp = ctrl.create_io_qpair(1, 64, None)?;
    let buf = platform.alloc_dma(4096)?;
    let blocks = 4096 / ns.block_size;
    let span = ns.blocks / blocks as u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let (mut n, mut lat_sum) = (0u64, 0u128);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let t0 = Instant::now();
        for _ in 0..64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let lba = x % span * blocks as u64;
            let sqe = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(ns.nsid), Lba(lba), blocks, 0, 0);
            qp.submit(sqe, Some(PrpPlan::One { prp1: buf.iova(0) }), 0)?;
            qp.ring_sq_doorbell();
            while qp.process_completions(1, |_, cqe| assert!(cqe.status().is_success())) == 0 {}
            n += 1;
        }
        // Timed per 64 reads, not per read: two clock reads per I/O would
        // be a visible part of the cost under emulation.
        lat_sum += t0.elapsed().as_nanos();
    }
    let el = start.elapsed().as_secs_f64();
    println!("raw_qd1 {} 4 KiB reads: {:.0} IOPS, mean {:.2} us", n, n as f64 / el, lat_sum as f64 / n as f64 / 1000.0);
    ctrl.delete_io_qpair(&qp)?;
    ctrl.shutdown()?;
    Ok(())
}
