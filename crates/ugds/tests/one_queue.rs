//! A controller that grants one I/O queue pair (QEMU's `max_ioqpairs=1`):
//! synchronous, batch, stream-ordered and queue-pair I/O all share it.

mod common;
use common::*;
use std::time::Duration;
use ugds::{BatchIo, BatchOp, Completion, Drain, Error, HandleOptions, HostStream, StreamIo};

fn one_queue(completion: Completion) -> HandleOptions {
    opts().completion(completion)
}

fn io(op: BatchOp, b: &Buf<'_>, size: usize, file_offset: u64, buf_offset: usize, cookie: u64) -> BatchIo {
    BatchIo { op, buf: b.token, size, file_offset, buf_offset, cookie }
}

fn collect(batch: &ugds::Batch, n: usize) {
    let mut ev = Vec::new();
    while ev.len() < n {
        batch.get_status(1, n - ev.len(), Some(Duration::from_secs(10)), &mut ev).unwrap();
    }
    for e in &ev {
        assert!(e.result.is_ok(), "cookie {}: {:?}", e.cookie, e.result);
    }
}

fn every_api(completion: Completion) {
    let (d, h, _e) = open(small_emu().max_io_queues(1), one_queue(completion));
    assert_eq!(h.controller().io_queues, 1);
    assert!(h.batch_queue_is_shared());
    let mut b = Buf::new(&d, 1 << 20);

    // Synchronous.
    b.mem[..65536].copy_from_slice(&pattern(1, 0, 65536));
    h.write(&b.token, 65536, 0, 0).unwrap();

    // Batch: 32 writes of 16 KiB, then read back.
    let batch = h.batch(64).unwrap();
    b.mem.copy_from_slice(&pattern(2, 1 << 20, 1 << 20));
    let ios: Vec<_> =
        (0..32).map(|i| io(BatchOp::Write, &b, 16384, (1 << 20) + i * 16384, i as usize * 16384, i)).collect();
    batch.submit(&ios).unwrap();
    collect(&batch, 32);
    b.mem.fill(0);
    let ios: Vec<_> =
        (0..32).map(|i| io(BatchOp::Read, &b, 16384, (1 << 20) + i * 16384, i as usize * 16384, i)).collect();
    batch.submit(&ios).unwrap();
    collect(&batch, 32);
    assert!(b.mem[..512 << 10] == pattern(2, 1 << 20, 512 << 10)[..]);
    drop(batch);

    // Stream-ordered.
    let s = HostStream::new();
    b.mem.fill(0);
    let (r, rr) = StreamIo::new(65536, 0, 0);
    h.read_async(&b.token, r, &s).unwrap();
    s.synchronize();
    assert_eq!(rr.bytes(), 65536);
    assert!(b.mem[..65536] == pattern(1, 0, 65536)[..]);

    // A queue of one's own is a context on the shared queue pair.
    let mut q = h.io_queue().unwrap();
    assert!(q.is_shared());
    assert!(q.depth() >= 32);
    b.mem.fill(0);
    for i in 0..32u64 {
        q.submit_read(&b.token, 16384, (1 << 20) + i * 16384, i as usize * 16384, i).unwrap();
    }
    q.ring();
    let mut done = 0;
    q.drain(|tag, r| {
        assert_eq!(r.unwrap(), 16384, "tag {tag}");
        done += 1;
    })
    .unwrap();
    assert_eq!(done, 32);
    assert!(b.mem[..512 << 10] == pattern(2, 1 << 20, 512 << 10)[..]);
    drop(q);
    h.close(Drain::NoWait).unwrap();
}

#[test]
fn every_api_works_on_one_queue_pair_polled() {
    every_api(Completion::Poll);
}

#[test]
fn every_api_works_on_one_queue_pair_with_interrupts() {
    every_api(Completion::Interrupt);
}

/// Threads doing synchronous and batch I/O at once on the one queue pair:
/// each side's completions, reaped by whichever thread looks, reach their
/// owners.
fn callers_share(completion: Completion) {
    let (d, h, _e) = open(small_emu().max_io_queues(1), one_queue(completion));
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let (d, h) = (&d, &h);
            sc.spawn(move || {
                let mut b = Buf::new(d, 65536);
                let base = t * (2 << 20);
                for round in 0..20u64 {
                    let seed = (t * 31 + round) as u8;
                    b.mem.copy_from_slice(&pattern(seed, base, 65536));
                    if t % 2 == 0 {
                        h.write(&b.token, 65536, base, 0).unwrap();
                        b.mem.fill(0);
                        h.read(&b.token, 65536, base, 0).unwrap();
                    } else {
                        let batch = h.batch(16).unwrap();
                        let w: Vec<_> = (0..16)
                            .map(|i| io(BatchOp::Write, &b, 4096, base + i * 4096, i as usize * 4096, i))
                            .collect();
                        batch.submit(&w).unwrap();
                        collect(&batch, 16);
                        b.mem.fill(0);
                        let r: Vec<_> = (0..16)
                            .map(|i| io(BatchOp::Read, &b, 4096, base + i * 4096, i as usize * 4096, i))
                            .collect();
                        batch.submit(&r).unwrap();
                        collect(&batch, 16);
                    }
                    assert!(b.mem[..] == pattern(seed, base, 65536)[..], "thread {t} round {round}");
                }
            });
        }
    });
    h.close(Drain::NoWait).unwrap();
}

#[test]
fn synchronous_and_batch_callers_share_the_queue_pair_polled() {
    callers_share(Completion::Poll);
}

#[test]
fn synchronous_and_batch_callers_share_the_queue_pair_with_interrupts() {
    callers_share(Completion::Interrupt);
}

#[test]
fn without_batch_contexts_nothing_can_be_lent_and_it_says_so() {
    let o = opts().batch_queue(false);
    let (_d, h, _e) = open(small_emu().max_io_queues(1), o);
    assert!(h.batch_geometry().is_none());
    match h.batch(4).err() {
        Some(Error::Unsupported(why)) => assert!(why.contains("batch_queue is off"), "{why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    match h.io_queue().err() {
        Some(Error::Unsupported(why)) => {
            assert!(why.contains("granted 1 I/O queue pair(s), taken by 1 synchronous and 0 batch"), "{why}")
        }
        Some(e) => panic!("expected Unsupported, got {e}"),
        None => panic!("a queue pair was lent from a handle with none to lend"),
    }
}

#[test]
fn with_no_queue_to_lend_a_queue_is_a_context_on_the_batch_queue() {
    // Two granted: one synchronous, one for batches, none to lend.
    let o = opts().sync_queues(1).async_queues(0);
    let (d, h, _e) = open(small_emu().max_io_queues(2), o);
    assert!(!h.batch_queue_is_shared());
    let mut b = Buf::new(&d, 8192);
    b.mem.copy_from_slice(&pattern(5, 0, 8192));
    h.write(&b.token, 8192, 0, 0).unwrap();
    b.mem.fill(0);
    let mut q = h.io_queue().unwrap();
    assert!(q.is_shared());
    q.submit_read(&b.token, 8192, 0, 0, 7).unwrap();
    let mut got = None;
    q.drain(|tag, r| got = Some((tag, r.unwrap()))).unwrap();
    assert_eq!(got, Some((7, 8192)));
    assert!(b.mem[..] == pattern(5, 0, 8192)[..]);
}
