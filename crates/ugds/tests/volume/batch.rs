//! A volume's batch contexts: one event per request whatever its pieces,
//! a member's failure or silence ending only the requests it held, bad
//! input and overflow refused with nothing submitted.

use super::*;

fn io(op: ugds::BatchOp, b: &Buf, size: usize, file_offset: u64, buf_offset: usize, cookie: u64) -> ugds::BatchIo {
    ugds::BatchIo { op, buf: b.token, size, file_offset, buf_offset, cookie }
}

#[test]
fn a_volume_batch_completes_each_request_as_one_event() {
    use ugds::{BatchOp, BatchStatus};
    let d = Driver::open();
    let hs = volume_members(&d, 3, 4 << 20);
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 16384 }).unwrap();
    let mut b = Buf::new(&d, 4 * MIB);
    let want = pattern(7, 0, 4 * MIB);
    b.mem.copy_from_slice(&want);
    let batch = v.batch(32).unwrap();
    // 16 writes of 4 KiB to 128 KiB at scattered offsets: some on one
    // member, most across two or three.
    let reqs: Vec<(usize, u64)> = (0..16).map(|i| (4096 * (1 + i * 2), (i as u64 * 131072) + 512 * i as u64)).collect();
    let ios: Vec<_> = reqs
        .iter()
        .enumerate()
        .map(|(i, &(len, off))| io(BatchOp::Write, &b, len, off, off as usize, i as u64))
        .collect();
    batch.submit(&ios).unwrap();
    let mut evs = Vec::new();
    assert_eq!(batch.get_status(16, 16, None, &mut evs).unwrap(), 16);
    let mut seen: Vec<u64> = evs.iter().map(|e| e.cookie).collect();
    seen.sort();
    assert_eq!(seen, (0..16).collect::<Vec<_>>(), "one event per request");
    for e in &evs {
        assert_eq!(e.status, BatchStatus::Complete, "{:?}", e.result);
        assert_eq!(*e.result.as_ref().unwrap(), reqs[e.cookie as usize].0);
    }
    // Read them back through the batch, into a zeroed buffer.
    b.mem.fill(0);
    let ios: Vec<_> = reqs
        .iter()
        .enumerate()
        .map(|(i, &(len, off))| io(BatchOp::Read, &b, len, off, off as usize, i as u64))
        .collect();
    batch.submit(&ios).unwrap();
    evs.clear();
    assert_eq!(batch.get_status(16, 16, None, &mut evs).unwrap(), 16);
    assert!(evs.iter().all(|e| e.status == BatchStatus::Complete));
    for &(len, off) in &reqs {
        let o = off as usize;
        assert!(b.mem[o..o + len] == want[o..o + len], "request at {off:#x}");
    }
    assert_eq!(batch.outstanding(), 0);
}

#[test]
fn a_volume_batch_fails_only_the_requests_a_member_failed() {
    use ugds::{BatchOp, BatchStatus};
    let d = Driver::open();
    let (hs, c) = members(&d, 3, 1 << 20);
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 4096 }).unwrap();
    let b = Buf::new(&d, 64 << 10);
    let media = Status { sct: 2, sc: 0x81, dnr: true, more: false, crd: 0 };
    c[2].inject(Fault::next(FaultTarget::Io(Some(0x02)), FaultAction::Status(media)));
    // Request 0 on member 0 alone, request 1 across all three (member 2's
    // part fails), request 2 on member 1 alone.
    let ios = [
        io(BatchOp::Read, &b, 4096, 0, 0, 10),
        io(BatchOp::Read, &b, 12288, 12288, 16384, 11),
        io(BatchOp::Read, &b, 4096, 4096, 4096, 12),
    ];
    let batch = v.batch(4).unwrap();
    batch.submit(&ios).unwrap();
    let mut evs = Vec::new();
    assert_eq!(batch.get_status(3, 3, None, &mut evs).unwrap(), 3);
    evs.sort_by_key(|e| e.cookie);
    assert_eq!(evs[0].status, BatchStatus::Complete);
    assert_eq!(evs[2].status, BatchStatus::Complete);
    assert_eq!(evs[1].status, BatchStatus::Failed);
    match &evs[1].result {
        Err(Error::Member { member: 2, .. }) => {}
        other => panic!("request 1: {other:?}"),
    }
}

/// A member's command that never completes ends its volume request as
/// timed out after the member's timeout (its memory kept, as a handle
/// keeps it), never a wait without end; the other member's request
/// completes.
#[test]
fn a_volume_batch_times_out_a_request_a_member_never_completes() {
    use ugds::{BatchOp, BatchStatus};
    let d = Driver::open();
    let o = opts().timeout(Duration::from_millis(300));
    let (hs, c): (Vec<Handle>, Vec<EmuControl>) =
        (0..2).map(|_| open_emulated(&d, emu(1 << 20, 512), o.clone()).unwrap()).unzip();
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 4096 }).unwrap();
    let b = Buf::new(&d, 64 << 10);
    c[1].inject(Fault::next(FaultTarget::Io(Some(0x02)), FaultAction::LoseCompletion));
    let batch = v.batch(4).unwrap();
    // Request 20 on member 0, request 21 on member 1 (whose read is lost).
    batch.submit(&[io(BatchOp::Read, &b, 4096, 0, 0, 20), io(BatchOp::Read, &b, 4096, 4096, 4096, 21)]).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut evs = Vec::new();
            let r = batch.get_status(2, 2, None, &mut evs);
            tx.send((r.map_err(|e| e.to_string()), evs)).unwrap();
        });
        let (r, mut evs) = match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(x) => x,
            Err(_) => {
                // Unblock the waiter (cancel ends the lost command's wait)
                // before failing, so that the scope can end.
                let _ = batch.cancel();
                panic!("get_status did not return within 10 s of a 300 ms member timeout");
            }
        };
        assert_eq!(r, Ok(2));
        evs.sort_by_key(|e| e.cookie);
        assert_eq!(evs[0].status, BatchStatus::Complete, "{:?}", evs[0].result);
        assert_eq!(evs[1].status, BatchStatus::Timeout, "{:?}", evs[1].result);
        match &evs[1].result {
            Err(Error::Member { member: 1, .. }) => {}
            other => panic!("request 21: {other:?}"),
        }
    });
}

#[test]
fn a_volume_batch_refuses_bad_input_and_overflow_with_nothing_submitted() {
    use ugds::BatchOp;
    let d = Driver::open();
    let hs = volume_members(&d, 2, 1 << 20);
    let first = hs[0].capacity();
    let v = Volume::new(hs, VolumeLayout::Concat).unwrap();
    let b = Buf::new(&d, 64 << 10);
    let batch = v.batch(2).unwrap();
    let before = submitted(&v);
    let good = io(BatchOp::Write, &b, 8192, first - 4096, 0, 1);
    let bad = io(BatchOp::Write, &b, 8192, 100, 0, 2);
    assert!(matches!(batch.submit(&[good, bad]), Err(Error::Misaligned { .. })));
    let e = batch.submit(&[good, good, good]).unwrap_err();
    assert!(matches!(e, Error::CapacityExceeded { .. }), "{e}");
    assert!(batch.submit(&[]).is_err());
    assert_eq!(submitted(&v), before, "nothing reached a member");
    assert_eq!(batch.outstanding(), 0);
    batch.submit(&[good]).unwrap();
    let mut evs = Vec::new();
    batch.get_status(1, 1, None, &mut evs).unwrap();
    assert_eq!(evs[0].result.as_ref().ok(), Some(&8192));
    assert_eq!(submitted(&v), vec![before[0] + 1, before[1] + 1], "one part, one command, on each member");
}

/// Requests that each lie within one stripe go whole to their members (no
/// parts cut): checked whole first all the same (one bad request submits
/// none), each on the member its stripe names, one event each, the data
/// where a plain read of the volume finds it.
#[test]
fn a_volume_batch_sends_requests_within_a_stripe_whole_to_their_member() {
    use ugds::{BatchOp, BatchStatus};
    let d = Driver::open();
    let hs = volume_members(&d, 3, 1 << 20);
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 8192 }).unwrap();
    let mut b = Buf::new(&d, 64 << 10);
    let want = pattern(21, 0, 64 << 10);
    b.mem.copy_from_slice(&want);
    let batch = v.batch(8).unwrap();
    let before = submitted(&v);
    // Stripes 0, 1, 2, 4 (members 0, 1, 2, 1), 4 KiB each within them.
    let ios: Vec<_> = [0u64, 8192 + 4096, 16384, 32768]
        .iter()
        .enumerate()
        .map(|(i, &off)| io(BatchOp::Write, &b, 4096, off, off as usize, i as u64))
        .collect();
    let mut beyond = ios[3];
    beyond.buf_offset = 64 << 10; // past the registered buffer
    let e = batch.submit(&[ios[0], ios[1], beyond]).unwrap_err();
    assert!(matches!(e, Error::BufferRange { .. }), "{e}");
    assert_eq!(submitted(&v), before, "nothing reached a member");
    batch.submit(&ios).unwrap();
    let mut evs = Vec::new();
    assert_eq!(batch.get_status(4, 4, None, &mut evs).unwrap(), 4);
    assert!(evs.iter().all(|e| e.status == BatchStatus::Complete && e.result.as_ref().ok() == Some(&4096)), "{evs:?}");
    let after = submitted(&v);
    assert_eq!(
        (0..3).map(|m| after[m] - before[m]).collect::<Vec<_>>(),
        vec![1, 2, 1],
        "one command per request, on its stripe's member"
    );
    let r = Buf::new(&d, 64 << 10);
    v.read(&r.token, 40960, 0, 0).unwrap();
    for &off in &[0usize, 8192 + 4096, 16384, 32768] {
        assert!(r.mem[off..off + 4096] == want[off..off + 4096], "the write at {off:#x}");
    }
    assert_eq!(batch.outstanding(), 0);
}
