//! The scheduler (`HandleOptions::placement`, `chunk_bytes`,
//! `Handle::read_with_priority`): where synchronous requests go, and how
//! large ones make room for small ones, read back from the queues' own
//! statistics and command traces.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use ugds::{Placement, Priority, QueueRole, TraceEvent};
use ugds_emu::{Fault, FaultAction, FaultTarget, LatencyModel};

const READ: u8 = 0x02;

/// Commands submitted on each synchronous queue, by qid.
fn sync_submitted(h: &ugds::Handle) -> Vec<(u16, u64)> {
    h.queue_stats().iter().filter(|s| s.role == QueueRole::Sync).map(|s| (s.qid, s.submitted)).collect()
}

/// Another thread's request held on the device: with least-loaded
/// placement every read of this thread goes to the other queue; round robin
/// puts half of them behind it.
#[test]
fn requests_go_to_the_queue_with_the_fewest_bytes_on_it() {
    for (placement, on_busy) in [(Placement::LeastLoaded, 0), (Placement::RoundRobin, 5)] {
        let o = opts().sync_queues(2).placement(placement);
        let (d, h, emu) = open(small_emu(), o);
        let (a, b) = (Buf::new(&d, 65536), Buf::new(&d, 4096));
        let held = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::Stall(Duration::from_millis(300))));
                held.store(true, Ordering::SeqCst);
                h.read(&a.token, 65536, 0, 0).unwrap();
            });
            while !held.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            // Wait until the held read is on its queue.
            while sync_submitted(&h).iter().all(|&(_, n)| n == 0) {
                std::thread::yield_now();
            }
            let busy = sync_submitted(&h).iter().find(|&&(_, n)| n > 0).unwrap().0;
            for i in 0..10u64 {
                h.read(&b.token, 4096, (1 << 20) + i * 4096, 0).unwrap();
            }
            let on = sync_submitted(&h).iter().find(|&&(q, _)| q == busy).unwrap().1 - 1;
            assert_eq!(on, on_busy, "{placement:?}: this thread's reads on the busy queue");
        });
    }
}

/// The commands in `trace` of the reads of `blocks` blocks.
fn of_size(trace: &[TraceEvent], blocks: u32) -> Vec<TraceEvent> {
    trace.iter().filter(|e| e.blocks == blocks && e.opcode == READ).copied().collect()
}

/// For each of the large request's commands staged while a small read was
/// on the device, how many of the large request's commands were then on it.
fn windows(large: &[TraceEvent], small: &[TraceEvent]) -> Vec<usize> {
    let on = |e: &TraceEvent, t: Duration| e.submitted <= t && e.completed.is_none_or(|c| c > t);
    large
        .iter()
        .filter(|a| small.iter().any(|b| on(b, a.submitted)))
        .map(|a| large.iter().filter(|x| on(x, a.submitted)).count())
        .collect()
}

/// A device that transfers one command at a time (the emulator's bandwidth
/// model) while one thread reads 4 MiB at a time and another 4 KiB: the
/// large reads keep at most `chunk_bytes` (two 128 KiB commands) on the
/// device while a small read waits, one command when they are background
/// and the small reads latency-critical, and all they can when the small
/// reads are background or the chunk is 0.
#[test]
fn large_requests_keep_a_window_on_the_device_while_small_ones_wait() {
    let model = LatencyModel::new(Duration::from_micros(20), 1_000_000_000);
    // (chunk, class of the small reads, class of the large, window expected)
    let cases = [
        (256 << 10, Priority::Normal, Priority::Normal, Some(2)),
        (256 << 10, Priority::Critical, Priority::Background, Some(1)),
        (256 << 10, Priority::Background, Priority::Normal, None),
        (0, Priority::Normal, Priority::Normal, None),
    ];
    for (chunk, small_prio, large_prio, window) in cases {
        let o = opts().sync_queues(2).chunk_bytes(chunk).trace(4096);
        let (d, h, _emu) = open(small_emu().mdts(5).latency(Some(model)), o);
        let (a, b) = (Buf::new(&d, 4 << 20), Buf::new(&d, 4096));
        let (done, started) = (AtomicBool::new(false), AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                // The small reads run first: every large read overlaps them.
                while !started.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                for _ in 0..4 {
                    h.read_with_priority(&a.token, 4 << 20, 0, 0, large_prio).unwrap();
                }
                done.store(true, Ordering::SeqCst);
            });
            let mut i = 0u64;
            while !done.load(Ordering::SeqCst) {
                h.read_with_priority(&b.token, 4096, (8 << 20) + (i % 64) * 4096, 0, small_prio).unwrap();
                started.store(true, Ordering::SeqCst);
                i += 1;
            }
        });
        let trace: Vec<TraceEvent> = h.trace().into_iter().flat_map(|t| t.events).collect();
        let (large, small) = (of_size(&trace, 256), of_size(&trace, 8));
        assert_eq!(large.len(), 128, "four 4 MiB reads of 128 KiB commands, all traced");
        let on = windows(&large, &small);
        let case = format!("chunk {chunk}, small {small_prio:?}, large {large_prio:?}: on the device {on:?}");
        assert!(on.len() >= 12, "{case}: too few large commands staged while a small read waited to judge");
        match window {
            // A large request looks for small ones on the other queue
            // before it stages a command and stamps it after: a small read
            // staged in between (the large request's thread preempted
            // there) finds more than a window on the device, once per
            // large request (from its next look it yields to its end).
            Some(w) => {
                let over = on.iter().filter(|&&n| n > w).count();
                assert!(
                    over <= 4,
                    "{case}: {over} commands beyond a window of {w}, at most one per large read expected"
                );
            }
            None => assert!(on.iter().any(|&n| n > 2), "{case}, more than a window expected"),
        }
    }
}

#[test]
fn the_scheduler_s_options_are_checked() {
    let o = opts().sync_queues(1).chunk_bytes(4096).placement(Placement::RoundRobin);
    let (d, h, _emu) = open(small_emu(), o);
    // One queue, chunk of one page: still every byte lands.
    let mut b = Buf::new(&d, 1 << 20);
    b.mem.copy_from_slice(&pattern(3, 0, 1 << 20));
    h.write_with_priority(&b.token, 1 << 20, 0, 0, Priority::Background).unwrap();
    let mut r = Buf::new(&d, 1 << 20);
    h.read_with_priority(&r.token, 1 << 20, 0, 0, Priority::Critical).unwrap();
    assert!(r.mem[..] == pattern(3, 0, 1 << 20)[..]);
    r.mem.fill(0);
    h.read(&r.token, 1 << 20, 0, 0).unwrap();
    assert!(r.mem[..] == pattern(3, 0, 1 << 20)[..]);
}

/// Two threads reading 4 MiB at a time: large requests do not make room for
/// each other (that would only add waits), so each keeps more than a
/// window's two commands on the device while the other's are there too.
#[test]
fn large_requests_do_not_yield_to_each_other() {
    let model = LatencyModel::new(Duration::from_micros(20), 1_000_000_000);
    let o = opts().sync_queues(2).trace(4096);
    let (d, h, _emu) = open(small_emu().mdts(5).latency(Some(model)), o);
    let (a, b) = (Buf::new(&d, 4 << 20), Buf::new(&d, 4 << 20));
    std::thread::scope(|s| {
        for (buf, at) in [(&a, 0u64), (&b, 8 << 20)] {
            let h = &h;
            s.spawn(move || {
                for _ in 0..4 {
                    h.read(&buf.token, 4 << 20, at, 0).unwrap();
                }
            });
        }
    });
    let trace: Vec<TraceEvent> = h.trace().into_iter().flat_map(|t| t.events).collect();
    let reads = of_size(&trace, 256);
    let (first, second): (Vec<TraceEvent>, Vec<TraceEvent>) = reads.iter().partition(|e| e.slba < (8 << 20) / 512);
    assert_eq!((first.len(), second.len()), (128, 128));
    let on = windows(&first, &second);
    assert!(on.len() >= 4, "too few commands staged while the other's were on the device ({on:?}) to judge");
    assert!(on.iter().any(|&n| n > 2), "{on:?}: commands of one large read on the device beside the other's");
}
