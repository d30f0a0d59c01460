//! What opening a handle on a file costs (`Driver::open_file`, the kernel
//! path), with `N` synchronous queue pairs (as a machine with `N` CPUs
//! gets by default; 5 more for the batch and lendable queues): the median
//! and the fastest of `REPS` opens in a row, each handle closed before the
//! next.
//!
//!     cargo run --release -p ugds --example open_cost -- FILE [N] [REPS]
//!
//! N defaults to 16 (the GPU machine's CPUs), REPS to 100.

use std::time::Instant;

fn main() -> ugds::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: open_cost FILE [N] [REPS]");
    let n: u16 = args.next().map_or(16, |v| v.parse().expect("N: a number of queue pairs"));
    let reps: usize = args.next().map_or(100, |v| v.parse().expect("REPS: a number of opens"));
    let d = ugds::Driver::open();
    let mut ms = Vec::with_capacity(reps);
    let mut queues = 0;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let h = d.open_file(&path, ugds::HandleOptions::default().sync_queues(n))?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        queues = h.queues().len();
        drop(h);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "{} opens, {queues} queue pairs each: median {:.3} ms, fastest {:.3} ms",
        ms.len(),
        ms[ms.len() / 2],
        ms[0]
    );
    Ok(())
}
