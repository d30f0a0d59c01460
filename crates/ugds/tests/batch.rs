//! Batch I/O through the public API.

mod common;
use common::*;
use std::collections::HashSet;
use std::time::Duration;
use ugds::{BatchEvent, BatchIo, BatchOp, BatchStatus, BufferToken, Drain, Error, HandleState};
use ugds_emu::{Fault, FaultAction, FaultTarget};

fn io(op: BatchOp, buf: &BufferToken, size: usize, file_offset: u64, buf_offset: usize, cookie: u64) -> BatchIo {
    BatchIo { op, buf: *buf, size, file_offset, buf_offset, cookie }
}

fn collect_all(b: &ugds::Batch, n: usize) -> Vec<BatchEvent> {
    let mut ev = Vec::new();
    let got = b.get_status(n, n, Some(Duration::from_secs(10)), &mut ev).unwrap();
    assert_eq!(got, n);
    ev
}

#[test]
fn a_batch_moves_data_with_one_doorbell() {
    let (d, h, _e) = open(small_emu(), opts());
    assert_eq!(h.batch_geometry(), Some((1024, 128)));
    let mut b = Buf::new(&d, 128 * 4096);
    b.mem.copy_from_slice(&pattern(1, 0, 128 * 4096));
    let batch = h.batch(128).unwrap();
    let writes: Vec<_> =
        (0..128u64).map(|i| io(BatchOp::Write, &b.token, 4096, i * 8192, i as usize * 4096, i)).collect();
    assert_eq!(batch.submit(&writes).unwrap(), 1, "one doorbell write for the whole batch");
    let ev = collect_all(&batch, 128);
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete && *e.result.as_ref().unwrap() == 4096));
    assert_eq!(ev.iter().map(|e| e.cookie).collect::<HashSet<_>>().len(), 128);
    b.mem.fill(0);
    let reads: Vec<_> =
        (0..128u64).map(|i| io(BatchOp::Read, &b.token, 4096, i * 8192, i as usize * 4096, 1000 + i)).collect();
    assert_eq!(batch.submit(&reads).unwrap(), 1);
    collect_all(&batch, 128);
    assert!(b.mem[..] == pattern(1, 0, 128 * 4096)[..]);
    assert_eq!(batch.outstanding(), 0);
}

#[test]
fn completions_out_of_order_are_matched_by_cookie() {
    let (d, h, _e) = open(small_emu().reverse_completions(true), opts());
    let mut b = Buf::new(&d, 64 * 4096);
    for i in 0..64u64 {
        b.mem[i as usize * 4096..(i as usize + 1) * 4096].copy_from_slice(&pattern(i as u8, i * 4096, 4096));
    }
    h.write(&b.token, 64 * 4096, 0, 0).unwrap();
    b.mem.fill(0);
    let batch = h.batch(64).unwrap();
    // Request i reads block 63-i into slot i.
    let reads: Vec<_> =
        (0..64u64).map(|i| io(BatchOp::Read, &b.token, 4096, (63 - i) * 4096, i as usize * 4096, i)).collect();
    batch.submit(&reads).unwrap();
    let ev = collect_all(&batch, 64);
    let order: Vec<u64> = ev.iter().map(|e| e.cookie).collect();
    assert_ne!(order, (0..64).collect::<Vec<_>>(), "the emulator was asked to complete in reverse");
    assert_eq!(order[0], 63, "the last submitted completes first");
    for i in 0..64u64 {
        let j = 63 - i;
        assert!(b.mem[i as usize * 4096..(i as usize + 1) * 4096] == pattern(j as u8, j * 4096, 4096)[..]);
    }
}

#[test]
fn a_batch_larger_than_the_queue_rings_reaps_and_continues() {
    let o = opts().batch_depth(16);
    let (d, h, _e) = open(small_emu(), o);
    assert_eq!(h.batch_geometry().unwrap().0, 16);
    let mut b = Buf::new(&d, 200 * 4096);
    b.mem.copy_from_slice(&pattern(2, 0, 200 * 4096));
    let batch = h.batch(200).unwrap();
    let writes: Vec<_> =
        (0..200u64).map(|i| io(BatchOp::Write, &b.token, 4096, i * 4096, i as usize * 4096, i)).collect();
    let doorbells = batch.submit(&writes).unwrap();
    assert!(doorbells > 1, "SQ exhaustion must ring mid-batch ({doorbells})");
    let ev = collect_all(&batch, 200);
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete));
    b.mem.fill(0);
    h.read(&b.token, 200 * 4096, 0, 0).unwrap();
    assert!(b.mem[..] == pattern(2, 0, 200 * 4096)[..]);
}

#[test]
fn prp_pool_exhaustion_mid_batch() {
    let o = opts().batch_prp_pages(4);
    let (d, h, _e) = open(small_emu(), o);
    assert_eq!(h.batch_geometry(), Some((1024, 4)));
    let mut b = Buf::new(&d, 32 * 65536);
    b.mem.copy_from_slice(&pattern(3, 0, 32 * 65536));
    let batch = h.batch(32).unwrap();
    // 64 KiB each: 16 pages, so every command needs a list page.
    let writes: Vec<_> =
        (0..32u64).map(|i| io(BatchOp::Write, &b.token, 65536, i * 65536, i as usize * 65536, i)).collect();
    let doorbells = batch.submit(&writes).unwrap();
    assert!(doorbells > 1, "PRP pool exhaustion must ring mid-batch ({doorbells})");
    collect_all(&batch, 32);
    b.mem.fill(0);
    let reads: Vec<_> =
        (0..32u64).map(|i| io(BatchOp::Read, &b.token, 65536, i * 65536, i as usize * 65536, i)).collect();
    batch.submit(&reads).unwrap();
    let ev = collect_all(&batch, 32);
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete));
    assert!(b.mem[..] == pattern(3, 0, 32 * 65536)[..]);
}

#[test]
fn mixed_reads_and_writes_across_prp_boundaries() {
    let (d, h, _e) = open(small_emu().mdts(2), opts()); // 16 KiB per command
    let mut src = Buf::new(&d, 1 << 20);
    let mut dst = Buf::new(&d, 1 << 20);
    // Sizes on both sides of one page, two pages, a list, and MDTS; buffer
    // offsets that move the page boundaries.
    let cases: Vec<(usize, usize)> = vec![
        (512, 0),
        (4096, 0),
        (4096, 512),
        (4608, 0),
        (8192, 0),
        (8192, 512),
        (8704, 0),
        (12288, 0),
        (16384, 0),
        (16896, 0),
        (65536, 4),
    ];
    let mut file_off = 0u64;
    let mut plan = Vec::new();
    for (k, &(size, bo)) in cases.iter().enumerate() {
        let bo_src = k * 70_000 + bo;
        src.mem[bo_src..bo_src + size].copy_from_slice(&pattern(k as u8, file_off, size));
        plan.push((size, bo, bo_src, file_off));
        file_off += size.next_multiple_of(4096) as u64 + 4096;
    }
    // Prefill the read targets so that reads and writes mix in one batch.
    let batch = h.batch(64).unwrap();
    let half = cases.len() / 2;
    for &(size, _, bo_src, off) in &plan[..half] {
        h.write(&src.token, size, off, bo_src).unwrap();
    }
    let mut ios = Vec::new();
    for (k, &(size, bo, bo_src, off)) in plan.iter().enumerate() {
        if k < half {
            ios.push(io(BatchOp::Read, &dst.token, size, off, k * 70_000 + bo, k as u64));
        } else {
            ios.push(io(BatchOp::Write, &src.token, size, off, bo_src, k as u64));
        }
    }
    batch.submit(&ios).unwrap();
    let ev = collect_all(&batch, cases.len());
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete), "{ev:?}");
    for (k, &(size, bo, _, off)) in plan.iter().enumerate() {
        if k >= half {
            h.read(&dst.token, size, off, k * 70_000 + bo).unwrap();
        }
        let at = k * 70_000 + bo;
        assert!(
            dst.mem[at..at + size] == pattern(k as u8, off, size)[..],
            "case {k}: {size} bytes at buffer offset {bo}"
        );
    }
    dst.mem.fill(0);
    src.mem.fill(0);
}

#[test]
fn capacity_and_bad_input_submit_nothing() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 65536);
    let batch = h.batch(4).unwrap();
    let five: Vec<_> = (0..5u64).map(|i| io(BatchOp::Read, &b.token, 4096, 0, 0, i)).collect();
    let before = emu.stats().commands;
    assert!(matches!(batch.submit(&five), Err(Error::CapacityExceeded { capacity: 4, requested: 5, .. })));
    let mut bad = five[..3].to_vec();
    bad[2].file_offset = 100;
    assert!(matches!(batch.submit(&bad), Err(Error::Misaligned { .. })));
    bad[2] = io(BatchOp::Write, &b.token, 4096, 0, 65536, 2);
    assert!(matches!(batch.submit(&bad), Err(Error::BufferRange { .. })));
    assert!(matches!(batch.submit(&[]), Err(Error::InvalidArgument(_))));
    assert_eq!(emu.stats().commands, before, "nothing reached the device");
    assert_eq!(batch.outstanding(), 0);
    // The context is still good.
    batch.submit(&five[..4]).unwrap();
    collect_all(&batch, 4);
    assert!(matches!(h.batch(0), Err(Error::InvalidArgument(_))));
}

#[test]
fn get_status_honours_min_nr_and_timeout() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 65536);
    let batch = h.batch(8).unwrap();
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_millis(400))));
    let ios: Vec<_> = (0..4u64).map(|i| io(BatchOp::Read, &b.token, 4096, i * 4096, i as usize * 4096, i)).collect();
    batch.submit(&ios).unwrap();
    let mut ev = Vec::new();
    // The three unstalled ones arrive; the fourth does not within 50 ms.
    let t = std::time::Instant::now();
    let got = batch.get_status(4, 8, Some(Duration::from_millis(50)), &mut ev).unwrap();
    assert!(t.elapsed() < Duration::from_millis(390));
    assert_eq!(got, 3);
    assert!(!ev.iter().any(|e| e.cookie == 0), "the stalled request was first");
    // min_nr 0 does not wait.
    assert_eq!(batch.get_status(0, 8, None, &mut ev).unwrap(), 0);
    // Waiting without a timeout gets it.
    assert_eq!(batch.get_status(1, 8, None, &mut ev).unwrap(), 1);
    assert_eq!(ev.last().unwrap().cookie, 0);
    assert!(matches!(batch.get_status(3, 2, None, &mut ev), Err(Error::InvalidArgument(_))));
}

#[test]
fn cancel_waits_for_commands_in_flight() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 65536);
    let batch = h.batch(8).unwrap();
    emu.inject(Fault {
        target: FaultTarget::Io(None),
        skip: 0,
        count: 4,
        action: FaultAction::Stall(Duration::from_millis(200)),
    });
    let ios: Vec<_> = (0..8u64).map(|i| io(BatchOp::Read, &b.token, 4096, i * 4096, i as usize * 4096, i)).collect();
    batch.submit(&ios).unwrap();
    // While they are on the device, the buffer cannot go.
    assert!(matches!(d.deregister(&b.token), Err(Error::Busy { what: "buffer", .. })));
    batch.cancel().unwrap();
    // Everything came back before cancel returned; the events are there.
    let mut ev = Vec::new();
    assert_eq!(batch.get_status(8, 8, Some(Duration::ZERO), &mut ev).unwrap(), 8);
    assert!(matches!(batch.submit(&ios[..1]), Err(Error::Canceled)));
    drop(batch);
    assert_eq!(h.state(), HandleState::Open);
}

#[test]
fn dropping_a_batch_with_commands_in_flight_waits() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 65536);
    let batch = h.batch(8).unwrap();
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_millis(150))));
    let ios: Vec<_> = (0..8u64).map(|i| io(BatchOp::Write, &b.token, 4096, i * 4096, i as usize * 4096, i)).collect();
    batch.submit(&ios).unwrap();
    drop(batch);
    // Nothing is in flight any more: the buffer and the handle can go.
    drop(b);
    h.close(Drain::NoWait).unwrap();
}

#[test]
fn a_lost_completion_in_a_batch_times_out_and_wedges() {
    let o = opts().timeout(Duration::from_millis(200));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 65536);
    let batch = h.batch(8).unwrap();
    emu.inject(Fault { target: FaultTarget::Io(None), skip: 2, count: 1, action: FaultAction::LoseCompletion });
    let ios: Vec<_> = (0..4u64).map(|i| io(BatchOp::Read, &b.token, 4096, i * 4096, i as usize * 4096, i)).collect();
    batch.submit(&ios).unwrap();
    let mut ev = Vec::new();
    batch.get_status(4, 4, None, &mut ev).unwrap();
    let lost: Vec<_> = ev.iter().filter(|e| e.status == BatchStatus::Timeout).collect();
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].cookie, 2);
    assert!(matches!(lost[0].result, Err(Error::Timeout { .. })));
    assert_eq!(h.state(), HandleState::Wedged);
    assert!(matches!(batch.submit(&ios[..1]), Err(Error::Wedged)));
    assert!(matches!(d.deregister(&b.token), Err(Error::Busy { .. })));
    drop(batch);
    h.close(Drain::ForceAfterReset).unwrap();
    d.deregister(&b.token).unwrap();
    std::mem::forget(b);
}

#[test]
fn a_batch_keeps_its_handle_open() {
    let (d, h, _e) = open(small_emu(), opts());
    let mut b = Buf::new(&d, 8192);
    let batch = h.batch(2).unwrap();
    assert!(matches!(h.close(Drain::NoWait), Err(Error::Busy { what: "handle", .. })));
    assert!(matches!(h.close(Drain::Timeout(Duration::from_millis(20))), Err(Error::Busy { .. })));
    // Dropping the Handle does not tear the controller down under the batch.
    drop(h);
    b.mem.fill(9);
    batch.submit(&[io(BatchOp::Write, &b.token, 8192, 0, 0, 1)]).unwrap();
    collect_all(&batch, 1);
    b.mem.fill(0);
    batch.submit(&[io(BatchOp::Read, &b.token, 8192, 0, 0, 2)]).unwrap();
    collect_all(&batch, 1);
    assert!(b.mem.iter().all(|&x| x == 9));
    drop(batch);
}

/// A submission refused for one bad request keeps no claim on the buffers
/// of the good requests before it: they deregister at once.
#[test]
fn a_refused_submission_keeps_no_buffer() {
    let (d, h, _e) = open(small_emu(), opts());
    let (a, b) = (Buf::new(&d, 65536), Buf::new(&d, 65536));
    let batch = h.batch(8).unwrap();
    let good = io(BatchOp::Read, &a.token, 4096, 0, 0, 1);
    let bad = io(BatchOp::Read, &b.token, 100, 0, 0, 2);
    assert!(batch.submit(&[good, bad]).is_err());
    let segs = [ugds::Segment::new(&a.token, 0, 4096)];
    let bad_segs = [ugds::Segment::new(&b.token, 0, 100)];
    let v = [
        ugds::BatchIov { op: BatchOp::Read, segments: &segs, file_offset: 0, cookie: 3 },
        ugds::BatchIov { op: BatchOp::Read, segments: &bad_segs, file_offset: 0, cookie: 4 },
    ];
    assert!(batch.submit_vectored(&v).is_err());
    assert_eq!(batch.outstanding(), 0);
    d.deregister(&a.token).unwrap();
    std::mem::forget(a);
}

#[test]
fn batch_contexts_spread_over_the_batch_queues() {
    let (d, h, _e) = open(small_emu(), opts().batch_queues(3));
    assert_eq!(h.batch_queues(), 3);
    let batch_qids: Vec<u16> = h.queues().iter().filter(|q| q.role == ugds::QueueRole::Batch).map(|q| q.qid).collect();
    assert_eq!(batch_qids.len(), 3, "{:?}", h.queues());
    assert!(batch_qids.iter().all(|q| h.queues().iter().find(|i| i.qid == *q).unwrap().vector.is_none()));
    let mut b = Buf::new(&d, 4 * 16 * 4096);
    b.mem.copy_from_slice(&pattern(7, 0, 4 * 16 * 4096));
    // The stream engine's context is on the first queue: three contexts
    // go to the other two and the first, one each, and a fourth to a queue
    // with one context already.
    let batches: Vec<ugds::Batch> = (0..4).map(|_| h.batch(16).unwrap()).collect();
    let per_queue = |h: &ugds::Handle| -> Vec<u64> {
        let s = h.queue_stats();
        batch_qids.iter().map(|q| s.iter().find(|x| x.qid == *q).unwrap().submitted).collect()
    };
    let before = per_queue(&h);
    for (k, batch) in batches.iter().enumerate() {
        let writes: Vec<_> = (0..16u64)
            .map(|i| {
                let at = (k as u64 * 16 + i) * 4096;
                io(BatchOp::Write, &b.token, 4096, at, at as usize, i)
            })
            .collect();
        batch.submit(&writes).unwrap();
    }
    for batch in &batches {
        let ev = collect_all(batch, 16);
        assert!(ev.iter().all(|e| e.status == BatchStatus::Complete), "{ev:?}");
    }
    let after = per_queue(&h);
    let used: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(used.iter().sum::<u64>(), 64, "{used:?}");
    assert!(used.iter().all(|&n| n >= 16), "every batch queue took a context's commands: {used:?}");
    b.mem.fill(0);
    h.read(&b.token, 4 * 16 * 4096, 0, 0).unwrap();
    assert!(b.mem[..] == pattern(7, 0, 4 * 16 * 4096)[..]);
    drop(batches);
    h.close(Drain::NoWait).unwrap();
}

#[test]
fn batch_queues_leave_one_queue_pair_for_synchronous_io() {
    // Three queue pairs granted, five batch queues asked for: two batch
    // queues and one synchronous, none to lend.
    let (d, h, _e) = open(small_emu().max_io_queues(3), opts().batch_queues(5));
    assert_eq!(h.batch_queues(), 2);
    assert_eq!(h.queue_counts(), (1, 0));
    assert!(!h.batch_queue_is_shared());
    let mut b = Buf::new(&d, 8 * 4096);
    b.mem.copy_from_slice(&pattern(9, 0, 8 * 4096));
    let batches: Vec<ugds::Batch> = (0..2).map(|_| h.batch(4).unwrap()).collect();
    for (k, batch) in batches.iter().enumerate() {
        let w: Vec<_> = (0..4u64)
            .map(|i| io(BatchOp::Write, &b.token, 4096, (k as u64 * 4 + i) * 4096, (k * 4 + i as usize) * 4096, i))
            .collect();
        batch.submit(&w).unwrap();
        collect_all(batch, 4);
    }
    b.mem.fill(0);
    h.read(&b.token, 8 * 4096, 0, 0).unwrap();
    assert!(b.mem[..] == pattern(9, 0, 8 * 4096)[..]);
}

#[test]
fn io_queues_without_a_queue_pair_to_lend_spread_over_the_batch_queues() {
    let (d, h, _e) = open(small_emu(), opts().async_queues(0).batch_queues(2));
    let batch_qids: Vec<u16> = h.queues().iter().filter(|q| q.role == ugds::QueueRole::Batch).map(|q| q.qid).collect();
    assert_eq!(batch_qids.len(), 2);
    let mut b = Buf::new(&d, 16 * 4096);
    b.mem.copy_from_slice(&pattern(11, 0, 16 * 4096));
    h.write(&b.token, 16 * 4096, 0, 0).unwrap();
    let submitted = |h: &ugds::Handle| -> Vec<u64> {
        let s = h.queue_stats();
        batch_qids.iter().map(|q| s.iter().find(|x| x.qid == *q).unwrap().submitted).collect()
    };
    let before = submitted(&h);
    // The stream engine's context is on the first batch queue: the first
    // IoQueue goes to the second, the next to the first.
    let mut q1 = h.io_queue().unwrap();
    let mut q2 = h.io_queue().unwrap();
    assert!(q1.is_shared() && q2.is_shared());
    b.mem.fill(0);
    for (k, q) in [&mut q1, &mut q2].into_iter().enumerate() {
        for i in 0..8u64 {
            let at = (k as u64 * 8 + i) * 4096;
            q.submit_read(&b.token, 4096, at, at as usize, at).unwrap();
        }
        q.drain(|_, r| assert_eq!(r.unwrap(), 4096)).unwrap();
    }
    let used: Vec<u64> = submitted(&h).iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(used, vec![8, 8], "each IoQueue on a batch queue of its own");
    assert!(b.mem[..] == pattern(11, 0, 16 * 4096)[..]);
}

#[test]
fn a_batch_refuses_a_buffer_deregistered_since_its_last_submission() {
    // The context remembers the buffer it used last: a deregistered one
    // must not be reached through that memory.
    let (d, h, _e) = open(small_emu(), opts());
    let mut a = Buf::new(&d, 8192);
    a.mem.fill(5);
    let batch = h.batch(4).unwrap();
    batch.submit(&[io(BatchOp::Write, &a.token, 4096, 0, 0, 1)]).unwrap();
    collect_all(&batch, 1);
    d.deregister(&a.token).unwrap();
    let e = batch.submit(&[io(BatchOp::Read, &a.token, 4096, 0, 0, 2)]).unwrap_err();
    assert!(matches!(e, Error::NotRegistered { .. } | Error::StaleToken { .. }), "{e:?}");
    assert_eq!(batch.outstanding(), 0);
    // The same memory registered again is a new token; the old one stays refused.
    // SAFETY: `a.mem` outlives the registration (deregistered below).
    let again = unsafe { d.register(a.mem.as_mut_ptr(), a.mem.len()) }.unwrap();
    assert!(batch.submit(&[io(BatchOp::Read, &a.token, 4096, 0, 0, 3)]).is_err());
    a.mem.fill(0);
    batch.submit(&[io(BatchOp::Read, &again, 4096, 0, 4096, 4)]).unwrap();
    let ev = collect_all(&batch, 1);
    assert_eq!(ev[0].cookie, 4);
    assert!(a.mem[4096..].iter().all(|&x| x == 5) && a.mem[..4096].iter().all(|&x| x == 0));
    d.deregister(&again).unwrap();
    std::mem::forget(a);
}
