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
