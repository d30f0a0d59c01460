//! Per-queue statistics (`Handle::queue_stats`): every command, byte,
//! error, timeout, doorbell write and interrupt is counted once, on the
//! queue pair that carried it, and the figures agree with the emulated
//! controller's own counters.

mod common;
use common::*;
use std::time::Duration;
use ugds::nvme::status::media;
use ugds::nvme::Status;
use ugds::{Completion, QueueRole, QueueStats};
use ugds_emu::{Fault, FaultAction, FaultTarget};

const READ: u8 = 0x02;
const WRITE: u8 = 0x01;

fn total(h: &ugds::Handle) -> QueueStats {
    QueueStats::total(&h.queue_stats()).expect("a handle has I/O queues")
}

#[test]
fn every_command_byte_and_doorbell_is_counted_on_its_queue() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 1 << 20);
    assert_eq!(h.queue_stats().len(), h.queues().len(), "one entry per queue, in the same order");
    for (s, q) in h.queue_stats().iter().zip(h.queues()) {
        assert_eq!((s.qid, s.role), (q.qid, q.role));
        assert_eq!((s.submitted, s.completed, s.doorbell_writes), (0, 0, 0), "nothing before any I/O");
    }
    let doorbells = emu.stats().doorbell_writes;
    for i in 0..10u64 {
        h.read(&b.token, 4096, i * 4096, 0).unwrap();
    }
    for i in 0..3u64 {
        h.write(&b.token, 8192, i * 8192, 0).unwrap();
    }
    // A lent queue: 16 reads, rung once.
    let mut q = h.io_queue().unwrap();
    for i in 0..16u64 {
        q.submit_read(&b.token, 4096, i * 4096, (i * 4096) as usize, i).unwrap();
    }
    q.ring();
    q.drain(|_, r| assert_eq!(r.unwrap(), 4096)).unwrap();
    drop(q);
    let t = total(&h);
    assert_eq!((t.submitted, t.completed, t.in_flight), (29, 29, 0));
    assert_eq!((t.bytes_read, t.bytes_written), (26 * 4096, 3 * 8192));
    assert_eq!((t.errors, t.timeouts, t.interrupts), (0, 0, 0), "a polled handle with no faults");
    assert_eq!(t.doorbell_writes, emu.stats().doorbell_writes - doorbells, "every doorbell the controller saw");
    let lent: Vec<_> =
        h.queue_stats().into_iter().filter(|s| s.role == QueueRole::Lendable && s.submitted > 0).collect();
    assert_eq!(lent.len(), 1, "the lent queue's reads are on it alone");
    assert_eq!((lent[0].submitted, lent[0].bytes_read), (16, 16 * 4096));
    // Sixteen submissions, one doorbell for them (plus completion heads).
    assert!(lent[0].doorbell_writes < 16, "{} doorbell writes for one ring of 16", lent[0].doorbell_writes);
    let sync: u64 = h.queue_stats().iter().filter(|s| s.role == QueueRole::Sync).map(|s| s.submitted).sum();
    assert_eq!(sync, 13);
}

#[test]
fn errors_and_timeouts_are_counted_where_they_happened() {
    let o = opts().timeout(Duration::from_millis(100));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 4096);
    emu.inject(Fault::next(
        FaultTarget::Io(Some(READ)),
        FaultAction::Status(Status::new(2, media::UNRECOVERED_READ_ERROR)),
    ));
    assert!(h.read(&b.token, 4096, 0, 0).is_err());
    let t = total(&h);
    assert_eq!((t.completed, t.errors, t.timeouts), (1, 1, 0));
    // Held past the timeout, then aborted: one command escalated.
    emu.inject(Fault::next(FaultTarget::Io(Some(WRITE)), FaultAction::Stall(Duration::from_secs(3))));
    assert!(h.write(&b.token, 4096, 0, 0).is_err());
    let t = total(&h);
    assert_eq!(t.timeouts, 1);
    assert_eq!((t.submitted, t.completed, t.in_flight, t.errors), (2, 2, 0, 2), "the aborted write is an error too");
}

#[test]
fn interrupts_that_woke_a_waiter_are_counted() {
    let o = opts().completion(Completion::Interrupt).sync_queues(1).async_queues(1);
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 4096);
    // Each read held 50 ms: its caller sleeps until the interrupt (one that
    // was kept off the CPU past the completion finds it by polling, so
    // under load not every read need count one).
    for _ in 0..5 {
        emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::Stall(Duration::from_millis(50))));
        h.read(&b.token, 4096, 0, 0).unwrap();
    }
    let t = total(&h);
    assert!(t.interrupts >= 1, "5 reads held 50 ms each on an interrupt-driven queue: {t:?}");
    assert!(t.interrupts <= emu.stats().interrupts, "no more than the controller signalled");
}

#[test]
fn statistics_published_to_a_file_follow_the_handle_and_go_with_it() {
    let dir = std::env::temp_dir().join(format!("ugds-stats-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (d, h, _emu) = open(small_emu(), opts().stats_dir(Some(dir.clone())));
    let files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "stats"))
            .collect()
    };
    let f = files();
    assert_eq!(f.len(), 1, "one file, there once the handle is open: {f:?}");
    let first = ugds::publish::parse(&std::fs::read_to_string(&f[0]).unwrap()).expect("a statistics file");
    assert_eq!((first.pid, first.queues.len()), (std::process::id(), h.queues().len()));
    let b = Buf::new(&d, 4096);
    for _ in 0..7 {
        h.read(&b.token, 4096, 0, 0).unwrap();
    }
    // Rewritten within a period or two.
    let give_up = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&f[0]).unwrap();
        let p = ugds::publish::parse(&text).expect("never half a file");
        if QueueStats::total(&p.queues).unwrap().completed == 7 {
            break;
        }
        assert!(std::time::Instant::now() < give_up, "not published within 5 s: {text}");
        std::thread::sleep(ugds::publish::PERIOD / 4);
    }
    drop(b);
    h.close(ugds::Drain::NoWait).unwrap();
    assert!(files().is_empty(), "the file goes with the handle");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The sync queue's entry of `h.trace()`.
fn sync_trace(h: &ugds::Handle) -> Vec<ugds::TraceEvent> {
    let t = h.trace();
    assert_eq!(t.iter().filter(|q| q.role == QueueRole::Sync).count(), 1, "one synchronous queue: {t:?}");
    t.into_iter().find(|q| q.role == QueueRole::Sync).unwrap().events
}

#[test]
fn a_traced_queue_keeps_its_last_commands_with_status_and_latency() {
    let (d, h, emu) = open(small_emu(), opts().sync_queues(1).trace(4));
    let bs = h.namespace().block_size as u64;
    let b = Buf::new(&d, 8192);
    for i in 0..6u64 {
        h.read(&b.token, 4096, i * 4096, 0).unwrap();
    }
    emu.inject(Fault::next(
        FaultTarget::Io(Some(READ)),
        FaultAction::Status(Status::new(2, media::UNRECOVERED_READ_ERROR)),
    ));
    assert!(h.read(&b.token, 4096, 7 * 4096, 0).is_err());
    emu.inject(Fault::next(FaultTarget::Io(Some(WRITE)), FaultAction::Stall(Duration::from_millis(30))));
    h.write(&b.token, 8192, 8 * 4096, 0).unwrap();
    let ev = sync_trace(&h);
    // The last four, oldest first: reads at 4 and 5 KiB-pages, the failed
    // read, the stalled write.
    let what: Vec<_> = ev.iter().map(|e| (e.opcode, e.slba, e.blocks)).collect();
    let page = 4096 / bs;
    assert_eq!(
        what,
        [
            (READ, 4 * page, page as u32),
            (READ, 5 * page, page as u32),
            (READ, 7 * page, page as u32),
            (WRITE, 8 * page, 2 * page as u32)
        ]
    );
    let st: Vec<_> = ev.iter().map(|e| e.status.map(|s| (s.sct, s.sc))).collect();
    assert_eq!(st, [Some((0, 0)), Some((0, 0)), Some((2, media::UNRECOVERED_READ_ERROR)), Some((0, 0))]);
    assert!(ev.windows(2).all(|w| w[0].completed.unwrap() <= w[1].submitted), "one synchronous caller: in order");
    let write = ev[3];
    assert!(write.completed.unwrap() - write.submitted >= Duration::from_millis(30), "{write}");
    // Latencies: every command of the handle, once, on its queue.
    let lat = h.queue_latency();
    assert_eq!(lat.len(), h.queues().len(), "every queue traced");
    for (l, s) in lat.iter().zip(h.queue_stats()) {
        assert_eq!((l.qid, l.latency.count()), (s.qid, s.completed), "queue {}", s.qid);
    }
    let sync = &lat.iter().find(|l| l.role == QueueRole::Sync).unwrap().latency;
    assert_eq!(sync.count(), 8);
    assert!(sync.quantile(1.0).unwrap() >= Duration::from_millis(30), "the stalled write is the slowest");
    assert!(sync.quantile(0.5).unwrap() < Duration::from_millis(30));
}

#[test]
fn a_lent_queue_shows_its_outstanding_commands_until_they_are_polled() {
    let (d, h, _emu) = open(small_emu(), opts().trace(16));
    let b = Buf::new(&d, 3 * 4096);
    let mut q = h.io_queue().unwrap();
    for i in 0..3u64 {
        q.submit_read(&b.token, 4096, i * 4096, (i * 4096) as usize, i).unwrap();
    }
    q.ring();
    let ev = q.trace().expect("traced");
    assert_eq!(ev.len(), 3);
    assert!(ev.iter().all(|e| e.completed.is_none() && e.status.is_none()), "none polled yet: {ev:?}");
    assert!(ev.windows(2).all(|w| w[0].submitted <= w[1].submitted && w[0].slba < w[1].slba));
    assert!(
        h.trace().iter().all(|t| t.role != QueueRole::Lendable || t.events.is_empty()),
        "the lent one is not the handle's to read"
    );
    q.drain(|_, r| assert_eq!(r.unwrap(), 4096)).unwrap();
    let ev = q.trace().unwrap();
    assert_eq!(ev.len(), 3);
    assert!(ev.iter().all(|e| e.status.is_some_and(|s| s.is_success()) && e.completed >= Some(e.submitted)));
    drop(q);
    // Back in the pool: the handle reads it now.
    let lent: Vec<_> =
        h.trace().into_iter().filter(|t| t.role == QueueRole::Lendable && !t.events.is_empty()).collect();
    assert_eq!(lent.len(), 1);
    assert_eq!(lent[0].events, ev);
}

#[test]
fn an_untraced_handle_keeps_nothing_and_a_trace_too_deep_is_refused() {
    let (d, h, _emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 4096);
    h.read(&b.token, 4096, 0, 0).unwrap();
    assert!(h.trace().is_empty() && h.queue_latency().is_empty());
    assert!(h.io_queue().unwrap().trace().is_none());
    let e = open_emulated(&d, small_emu(), opts().trace(ugds::MAX_TRACE + 1)).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(e.to_string().contains(&ugds::MAX_TRACE.to_string()), "{e}");
}

#[test]
fn a_wedged_handles_trace_shows_the_command_that_never_came_back() {
    let o = opts().sync_queues(1).timeout(Duration::from_millis(200)).trace(8);
    let (d, h, emu) = open(small_emu(), o);
    let bs = h.namespace().block_size as u64;
    let b = Buf::new(&d, 4096);
    h.read(&b.token, 4096, 0, 0).unwrap();
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::LoseCompletion));
    assert!(h.read(&b.token, 4096, 8192, 0).is_err());
    assert_eq!(h.state(), ugds::HandleState::Wedged);
    let ev = sync_trace(&h);
    let last = ev.last().unwrap();
    assert_eq!((last.slba, last.completed, last.status), (8192 / bs, None, None), "{ev:?}");
    assert!(ev[0].completed.is_some() && ev[0].slba == 0);
    h.close(ugds::Drain::ForceAfterReset).unwrap();
    d.deregister(&b.token).unwrap();
    std::mem::forget(b);
}

/// A batch context's own totals, the batch queue's counters and what the
/// caller saw agree: every request and byte counted once, the failed one
/// as an error.
#[test]
fn a_batch_contexts_totals_add_up_with_its_queue() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 1 << 20);
    let batch = h.batch(64).unwrap();
    assert_eq!(batch.stats(), ugds::RequestStats::default(), "nothing before any request");
    let queue_before = h.queue_stats().into_iter().find(|s| s.role == QueueRole::Batch).unwrap();
    emu.inject(Fault::next(
        FaultTarget::Io(Some(READ)),
        FaultAction::Status(Status::new(2, media::UNRECOVERED_READ_ERROR)),
    ));
    let ios: Vec<ugds::BatchIo> = (0..48u64)
        .map(|i| ugds::BatchIo {
            op: if i % 3 == 0 { ugds::BatchOp::Write } else { ugds::BatchOp::Read },
            buf: b.token,
            size: 8192,
            file_offset: i * 8192,
            buf_offset: (i as usize % 64) * 8192,
            cookie: i,
        })
        .collect();
    batch.submit(&ios).unwrap();
    let mut ev = Vec::new();
    while ev.len() < 48 {
        batch.get_status(1, 48, Some(Duration::from_secs(10)), &mut ev).unwrap();
    }
    let s = batch.stats();
    let moved = |op| ev.iter().filter(|e| e.result.is_ok() && ios[e.cookie as usize].op == op).count() as u64 * 8192;
    assert_eq!((s.submitted, s.ended, s.in_flight), (48, 48, 0));
    assert_eq!((s.errors, s.canceled, s.timeouts), (1, 0, 0), "{s:?}");
    assert_eq!(ev.iter().filter(|e| e.result.is_err()).count(), 1);
    assert_eq!((s.bytes_read, s.bytes_written), (moved(ugds::BatchOp::Read), moved(ugds::BatchOp::Write)));
    // One command per 8 KiB request, all on the batch queue.
    let q = h.queue_stats().into_iter().find(|s| s.role == QueueRole::Batch).unwrap();
    assert_eq!((q.completed - queue_before.completed, q.errors - queue_before.errors), (48, 1));
    assert_eq!(q.bytes_written - queue_before.bytes_written, s.bytes_written, "writes all succeeded");
    assert_eq!(
        q.bytes_read - queue_before.bytes_read,
        s.bytes_read + 8192,
        "the queue counts the failed read's bytes too"
    );
}
