//! Volumes (`ugds::Volume`): several controllers (and a file through the
//! kernel) as one handle, striped or concatenated; data lands on the member
//! the layout names, a request spanning members completes as one, bad input
//! changes nothing on any member, and a member's failure fails the request
//! with the member named.
//!
//! By default the members are emulated controllers; with
//! `UGDS_TEST_VOLUME=<bdf>,<bdf>,...` the tests that need no injected fault
//! run on those controllers bound to vfio-pci (QEMU's, three of them behind
//! a PCIe switch and a root port, in `scripts/qemu-conformance volume`),
//! with `UGDS_TEST_INTERRUPT=1` in interrupt completion mode. Run them one
//! at a time there (`--test-threads=1`).

mod common;
use common::*;
use std::sync::Arc;
use std::time::Duration;
use ugds::nvme::Status;
use ugds::{Driver, Error, Handle, QueueStats, Segment, Volume, VolumeLayout};
use ugds_emu::{EmuConfig, EmuControl, Fault, FaultAction, FaultTarget, NamespaceConfig};

const MIB: usize = 1 << 20;

/// `UGDS_TEST_VOLUME`: the controllers to make volumes of.
fn pci_members() -> Option<Vec<String>> {
    let v = std::env::var("UGDS_TEST_VOLUME").ok().filter(|s| !s.is_empty())?;
    Some(v.split(',').map(str::to_string).collect())
}

/// The members of the tests that run on real controllers: those
/// `UGDS_TEST_VOLUME` names (at least `n` of them: the first `n`), or `n`
/// emulated ones of `bytes` each.
fn volume_members(d: &Driver, n: usize, bytes: u64) -> Vec<Handle> {
    match pci_members() {
        Some(bdfs) => {
            assert!(bdfs.len() >= n, "UGDS_TEST_VOLUME names {} controllers; the test needs {n}", bdfs.len());
            let interrupt = std::env::var("UGDS_TEST_INTERRUPT").is_ok_and(|v| v == "1");
            let o = opts().completion(if interrupt { ugds::Completion::Interrupt } else { ugds::Completion::Poll });
            bdfs[..n]
                .iter()
                .map(|b| {
                    let p = ugds::platform::vfio::VfioPlatform::open(b).unwrap_or_else(|e| panic!("open {b}: {e}"));
                    d.open_handle(Arc::new(p), o.clone()).unwrap_or_else(|e| panic!("handle on {b}: {e}"))
                })
                .collect()
        }
        None => members(d, n, bytes).0,
    }
}

/// Commands the members' queues have taken.
fn submitted(v: &Volume) -> Vec<u64> {
    (0..v.member_count()).map(|i| QueueStats::total(&v.member(i).queue_stats()).unwrap().submitted).collect()
}

fn emu(bytes: u64, block: u32) -> EmuConfig {
    EmuConfig::default().namespaces(vec![NamespaceConfig::memory(bytes, block)])
}

/// `n` emulated controllers of `bytes` each, opened by `d`.
fn members(d: &Driver, n: usize, bytes: u64) -> (Vec<Handle>, Vec<EmuControl>) {
    (0..n).map(|_| open_emulated(d, emu(bytes, 512), opts()).unwrap()).unzip()
}

#[test]
fn striping_puts_stripe_i_on_member_i_mod_n() {
    let d = Driver::open();
    let hs = volume_members(&d, 3, 4 << 20);
    let least = hs.iter().map(|h| h.capacity()).min().unwrap();
    let stripe = 64 << 10;
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: stripe as u64 }).unwrap();
    assert_eq!(v.capacity(), 3 * (least / stripe as u64 * stripe as u64));
    // 1 MiB from half a stripe in: every member, several rows each.
    let mut b = Buf::new(&d, MIB);
    let off = stripe as u64 / 2;
    let want = pattern(3, off, MIB);
    b.mem.copy_from_slice(&want);
    assert_eq!(v.write(&b.token, MIB, off, 0).unwrap(), MIB);
    b.mem.fill(0);
    assert_eq!(v.read(&b.token, MIB, off, 0).unwrap(), MIB);
    assert!(b.mem[..] == want[..], "read back through the volume");
    // Each stripe is where RAID 0 puts it, read from the member itself.
    let r = Buf::new(&d, stripe);
    for s in 0..(off as usize + MIB).div_ceil(stripe) {
        let (m, row) = (s % 3, s / 3);
        v.member(m).read(&r.token, stripe, (row * stripe) as u64, 0).unwrap();
        let lo = (s * stripe).max(off as usize);
        let hi = ((s + 1) * stripe).min(off as usize + MIB);
        let got = &r.mem[lo - s * stripe..hi - s * stripe];
        assert!(got == &want[lo - off as usize..hi - off as usize], "stripe {s} on member {m} row {row}");
    }
}

#[test]
fn concatenation_crosses_members_in_order_and_mixes_platforms() {
    let d = Driver::open();
    let (mut hs, _c) = members(&d, 2, 1 << 20);
    // A file through the kernel as the third member.
    let path = std::env::temp_dir().join(format!("ugds-volume-{}.img", std::process::id()));
    std::fs::write(&path, vec![0u8; 2 << 20]).unwrap();
    hs.push(d.open_file(&path, opts()).unwrap());
    let v = Volume::new(hs, VolumeLayout::Concat).unwrap();
    assert_eq!(v.capacity(), 4 << 20);
    assert!(v.member_name(2).contains("namespace"));
    // 1.5 MiB from 768 KiB: the end of member 0, all of member 1, the
    // start of the file.
    let (off, len) = (768u64 << 10, 3 * MIB / 2);
    let mut b = Buf::new(&d, len);
    let want = pattern(5, off, len);
    b.mem.copy_from_slice(&want);
    assert_eq!(v.write(&b.token, len, off, 0).unwrap(), len);
    b.mem.fill(0);
    assert_eq!(v.read(&b.token, len, off, 0).unwrap(), len);
    assert!(b.mem[..] == want[..]);
    let file = std::fs::read(&path).unwrap();
    let into_file = (off as usize + len) - (2 << 20);
    assert!(file[..into_file] == want[len - into_file..], "the last part is in the file, from its start");
    drop(v);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn vectored_requests_split_across_members_and_segments() {
    let d = Driver::open();
    let hs = volume_members(&d, 3, 2 << 20);
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 4096 }).unwrap();
    let mut a = Buf::new(&d, 256 << 10);
    let mut b = Buf::new(&d, 64 << 10);
    // Segments of odd lengths (block multiples) that cross stripes.
    let segs = vec![
        Segment::new(&a.token, 1536, 9728),
        Segment::new(&b.token, 512, 5120),
        Segment::new(&a.token, 100 << 10, 70144),
    ];
    let total: usize = segs.iter().map(|s| s.len).sum();
    let off = 7 * 512;
    let want = pattern(11, off, total);
    let mut at = 0;
    for s in &segs {
        let mem = if s.buf.base() == a.token.base() { &mut a.mem } else { &mut b.mem };
        mem[s.offset..s.offset + s.len].copy_from_slice(&want[at..at + s.len]);
        at += s.len;
    }
    assert_eq!(v.writev(&segs, off).unwrap(), total);
    let r = Buf::new(&d, total.next_multiple_of(4096));
    assert_eq!(v.read(&r.token, total, off, 0).unwrap(), total);
    assert!(r.mem[..total] == want[..], "the segments are consecutive bytes of the volume");
    a.mem.fill(0);
    b.mem.fill(0);
    assert_eq!(v.readv(&segs, off).unwrap(), total);
    let mut at = 0;
    for (i, s) in segs.iter().enumerate() {
        let mem = if s.buf.base() == a.token.base() { &a.mem } else { &b.mem };
        assert!(mem[s.offset..s.offset + s.len] == want[at..at + s.len], "segment {i}");
        at += s.len;
    }
}

#[test]
fn a_request_needing_more_than_one_vectored_call_per_member_still_completes() {
    // 4 KiB stripes over 2 members: a 4 MiB request gives each member 512
    // pieces, more than one vectored call takes.
    let d = Driver::open();
    let hs = volume_members(&d, 2, 4 << 20);
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 4096 }).unwrap();
    let len = 4 * MIB;
    let mut b = Buf::new(&d, len);
    let want = pattern(1, 0, len);
    b.mem.copy_from_slice(&want);
    v.write(&b.token, len, 0, 0).unwrap();
    b.mem.fill(0);
    v.read(&b.token, len, 0, 0).unwrap();
    assert!(b.mem[..] == want[..]);
}

#[test]
fn bad_input_changes_nothing_on_any_member() {
    let d = Driver::open();
    let hs = volume_members(&d, 3, 1 << 20);
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 8192 }).unwrap();
    let b = Buf::new(&d, 64 << 10);
    let before = submitted(&v);
    let stale = {
        let x = Buf::new(&d, 4096);
        x.token
    };
    let cap = v.capacity();
    let cases: Vec<(&str, Result<usize, Error>)> = vec![
        ("misaligned offset", v.write(&b.token, 8192, 100, 0)),
        ("misaligned size", v.write(&b.token, 1000, 0, 0)),
        ("zero size", v.write(&b.token, 0, 0, 0)),
        ("past the end", v.write(&b.token, 16384, cap - 8192, 0)),
        ("outside the buffer", v.write(&b.token, 32768, 0, 48 << 10)),
        ("buffer not dword-aligned", v.write(&b.token, 16384, 0, 2)),
        ("deregistered buffer", v.write(&stale, 4096, 0, 0)),
        (
            "second segment outside its buffer",
            v.writev(&[Segment::new(&b.token, 0, 8192), Segment::new(&b.token, 60 << 10, 8192)], 0),
        ),
    ];
    for (what, r) in cases {
        let e = r.expect_err(what);
        assert!(!matches!(e, Error::Member { .. }), "{what}: refused before any member saw it: {e}");
    }
    assert_eq!(submitted(&v), before, "no member was given a command");
}

#[test]
fn a_members_failure_fails_the_request_and_names_the_member() {
    let d = Driver::open();
    let (hs, c) = members(&d, 3, 1 << 20);
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 4096 }).unwrap();
    let b = Buf::new(&d, 64 << 10);
    let media = Status { sct: 2, sc: 0x81, dnr: true, more: false, crd: 0 };
    c[1].inject(Fault::next(FaultTarget::Io(Some(0x02)), FaultAction::Status(media)));
    // 48 KiB: four stripes on each member, at once.
    let e = v.read(&b.token, 48 << 10, 0, 0).expect_err("a member failed its part");
    match &e {
        Error::Member { member: 1, name, source } => {
            assert!(name.contains("namespace 1"), "{name}");
            assert!(matches!(**source, Error::Nvme { .. }), "{source}");
        }
        other => panic!("not the member's error: {other}"),
    }
    assert!(e.to_string().contains("volume member 1"), "{e}");
    // A request on that member alone fails the same way.
    c[1].inject(Fault::next(FaultTarget::Io(Some(0x01)), FaultAction::Status(media)));
    let e = v.write(&b.token, 4096, 4096, 0).unwrap_err();
    assert!(matches!(e, Error::Member { member: 1, .. }), "{e}");
    // And the volume goes on.
    assert_eq!(v.read(&b.token, 48 << 10, 0, 0).unwrap(), 48 << 10);
}

#[test]
fn members_must_share_a_driver_and_a_block_size() {
    let d = Driver::open();
    let (mut hs, _c) = members(&d, 1, 1 << 20);
    hs.push(open_emulated(&d, emu(1 << 20, 4096), opts()).unwrap().0);
    let e = Volume::new(hs, VolumeLayout::Concat).unwrap_err();
    assert!(e.to_string().contains("block"), "{e}");
    let other = Driver::open();
    let (mut hs, _c) = members(&d, 1, 1 << 20);
    hs.push(open_emulated(&other, emu(1 << 20, 512), opts()).unwrap().0);
    let e = Volume::new(hs, VolumeLayout::Concat).unwrap_err();
    assert!(e.to_string().contains("another Driver"), "{e}");
    assert!(Volume::new(Vec::new(), VolumeLayout::Concat).is_err());
    let (hs, _c) = members(&d, 2, 1 << 20);
    let e = Volume::new(hs, VolumeLayout::Striped { stripe: 3 << 12 }).unwrap_err();
    assert!(e.to_string().contains("power of two"), "{e}");
}

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

/// Drains `q`, returning each reported request's tag and result, sorted
/// by tag.
fn drained(q: &mut ugds::VolumeQueue<'_>) -> (ugds::Result<()>, Vec<(u64, ugds::Result<usize>)>) {
    let mut got = Vec::new();
    let r = q.drain(|tag, res| got.push((tag, res)));
    got.sort_by_key(|(t, _)| *t);
    (r, got)
}

/// A volume's queue (`Volume::io_queue`): requests within a stripe go whole
/// to their member, longer ones are cut across members; each is reported
/// once, with its bytes, and the data lies where the volume's own reads
/// find it.
#[test]
fn a_volume_queue_moves_each_request_to_the_members_its_range_names() {
    let d = Driver::open();
    let hs = volume_members(&d, 3, 4 << 20);
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 16384 }).unwrap();
    let mut b = Buf::new(&d, 4 * MIB);
    let want = pattern(9, 0, 4 * MIB);
    b.mem.copy_from_slice(&want);
    let mut q = v.io_queue().unwrap();
    // Four within a stripe (members 0, 1, 2, 0), then 12 of 4 KiB to 92 KiB
    // across two to six stripes.
    let mut reqs: Vec<(usize, u64)> = vec![(4096, 0), (8192, 16384 + 4096), (16384, 32768), (4096, 49152 + 12288)];
    reqs.extend((0..12).map(|i| (4096 * (1 + i * 2), 65536 + i as u64 * 200_704 + 512 * i as u64)));
    let before = submitted(&v);
    for (i, &(len, off)) in reqs.iter().enumerate().take(4) {
        q.submit_write(&b.token, len, off, off as usize, i as u64).unwrap();
    }
    q.ring();
    let (r, got) = drained(&mut q);
    r.unwrap();
    let after = submitted(&v);
    assert_eq!(
        (0..3).map(|m| after[m] - before[m]).collect::<Vec<_>>(),
        vec![2, 1, 1],
        "one command per request within a stripe, on the stripe's member"
    );
    assert_eq!(got.len(), 4);
    for (i, &(len, off)) in reqs.iter().enumerate().skip(4) {
        q.submit_write(&b.token, len, off, off as usize, i as u64).unwrap();
    }
    assert_eq!(q.outstanding(), 12);
    let (r, more) = drained(&mut q);
    r.unwrap();
    let got: Vec<_> = got.into_iter().chain(more).collect();
    assert_eq!(got.iter().map(|(t, _)| *t).collect::<Vec<_>>(), (0..16).collect::<Vec<_>>(), "each once");
    for (t, res) in &got {
        assert_eq!(res.as_ref().ok(), Some(&reqs[*t as usize].0), "request {t}");
    }
    // The volume's own read finds each write; the queue reads them back.
    let r = Buf::new(&d, 4 * MIB);
    for &(len, off) in &reqs {
        v.read(&r.token, len, off, off as usize).unwrap();
        let o = off as usize;
        assert!(r.mem[o..o + len] == want[o..o + len], "write at {off:#x} read by the volume");
    }
    b.mem.fill(0);
    for (i, &(len, off)) in reqs.iter().enumerate() {
        q.submit_read(&b.token, len, off, off as usize, 100 + i as u64).unwrap();
    }
    let (res, got) = drained(&mut q);
    res.unwrap();
    assert_eq!(got.len(), 16);
    assert!(got.iter().all(|(t, r)| r.as_ref().ok() == Some(&reqs[*t as usize - 100].0)), "{got:?}");
    for &(len, off) in &reqs {
        let o = off as usize;
        assert!(b.mem[o..o + len] == want[o..o + len], "read at {off:#x}");
    }
    assert_eq!(q.outstanding(), 0);
}

/// Bad input is refused as such (not as a member's failure) with nothing
/// staged; a request that a member has no room for is refused whole with
/// `QueueFull`, no piece of it staged on the members that had room.
#[test]
fn a_volume_queue_refuses_bad_input_and_a_full_member_with_nothing_staged() {
    let d = Driver::open();
    let hs = volume_members(&d, 3, 1 << 20);
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 8192 }).unwrap();
    let b = Buf::new(&d, 64 << 10);
    let stale = Buf::new(&d, 4096).token;
    let mut q = v.io_queue().unwrap();
    let before = submitted(&v);
    let cap = v.capacity();
    let cases = [
        ("misaligned offset", q.submit_write(&b.token, 8192, 100, 0, 1)),
        ("misaligned size", q.submit_write(&b.token, 1000, 0, 0, 2)),
        ("zero size", q.submit_write(&b.token, 0, 0, 0, 3)),
        ("past the end", q.submit_write(&b.token, 16384, cap - 8192, 0, 4)),
        ("outside the buffer", q.submit_write(&b.token, 32768, 0, 48 << 10, 5)),
        ("buffer not dword-aligned", q.submit_write(&b.token, 16384, 0, 2, 6)),
    ];
    for (what, r) in cases {
        let e = r.expect_err(what);
        assert!(!matches!(e, Error::Member { .. }), "{what}: refused before any member saw it: {e}");
    }
    drop(b);
    let b = Buf::new(&d, 64 << 10);
    assert!(q.submit_read(&stale, 4096, 0, 0, 7).is_err(), "a deregistered buffer");
    // 1.5 MiB: 64 pieces on each member, whose queues hold 63.
    let big = Buf::new(&d, 3 * MIB / 2);
    match q.submit_read(&big.token, 3 * MIB / 2, 0, 0, 8) {
        Err(Error::Member { member: 0, source, .. }) => {
            assert!(matches!(*source, Error::InvalidArgument(_)), "{source}")
        }
        other => panic!("more pieces than a member's queue holds: {other:?}"),
    }
    assert_eq!(q.outstanding(), 0);
    q.ring();
    assert_eq!(submitted(&v), before, "nothing reached a member");
    // Fill member 0's queue with reads of its first stripe.
    let mut n = 0;
    loop {
        match q.submit_read(&b.token, 4096, 0, 0, 1000 + n) {
            Ok(()) => n += 1,
            Err(Error::QueueFull) => break,
            Err(e) => panic!("filling member 0: {e}"),
        }
        assert!(n < 100_000, "member 0's queue never filled");
    }
    // 24 KiB across members 0, 1 and 2: member 0 has no room.
    let e = q.submit_read(&b.token, 24576, 0, 0, 1).unwrap_err();
    assert!(matches!(e, Error::QueueFull), "{e}");
    assert_eq!(q.outstanding(), n as usize);
    let (r, got) = drained(&mut q);
    r.unwrap();
    assert_eq!(got.len(), n as usize);
    let after = submitted(&v);
    assert_eq!(after[0] - before[0], n, "member 0: the reads that fit");
    assert_eq!((after[1] - before[1], after[2] - before[2]), (0, 0), "no piece of the refused request");
    // With room again, the same request goes on all three.
    q.submit_read(&b.token, 24576, 0, 0, 1).unwrap();
    let (r, got) = drained(&mut q);
    r.unwrap();
    assert_eq!(got[0].1.as_ref().ok(), Some(&24576));
}

/// A member's failed piece fails its request, naming the member (the
/// others' pieces still end first); requests the failure did not touch
/// complete; the queue goes on.
#[test]
fn a_volume_queue_fails_the_requests_a_member_failed_and_names_it() {
    let d = Driver::open();
    let (hs, c) = members(&d, 3, 1 << 20);
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 4096 }).unwrap();
    let b = Buf::new(&d, 64 << 10);
    let media = Status { sct: 2, sc: 0x81, dnr: true, more: false, crd: 0 };
    c[2].inject(Fault::next(FaultTarget::Io(Some(0x02)), FaultAction::Status(media)));
    let mut q = v.io_queue().unwrap();
    // 10 on member 0 alone, 11 across all three (member 2's piece fails),
    // 12 on member 1 alone.
    q.submit_read(&b.token, 4096, 0, 0, 10).unwrap();
    q.submit_read(&b.token, 12288, 12288, 16384, 11).unwrap();
    q.submit_read(&b.token, 4096, 4096, 4096, 12).unwrap();
    let (r, got) = drained(&mut q);
    r.unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].1.as_ref().ok(), Some(&4096));
    assert_eq!(got[2].1.as_ref().ok(), Some(&4096));
    match &got[1].1 {
        Err(Error::Member { member: 2, source, .. }) => assert!(matches!(**source, Error::Nvme { .. }), "{source}"),
        other => panic!("request 11: {other:?}"),
    }
    q.submit_read(&b.token, 12288, 12288, 16384, 13).unwrap();
    let (r, got) = drained(&mut q);
    r.unwrap();
    assert_eq!(got[0].1.as_ref().ok(), Some(&12288));
}

/// A member's command that never completes ends its request after the
/// member's timeout, reported failed with the member named, never a wait
/// without end; the other member's request completes.
#[test]
fn a_volume_queue_ends_a_request_a_member_never_completes() {
    let d = Driver::open();
    let o = opts().timeout(Duration::from_millis(300));
    let (hs, c): (Vec<Handle>, Vec<EmuControl>) =
        (0..2).map(|_| open_emulated(&d, emu(1 << 20, 512), o.clone()).unwrap()).unzip();
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 4096 }).unwrap();
    let b = Buf::new(&d, 64 << 10);
    c[1].inject(Fault::next(FaultTarget::Io(Some(0x02)), FaultAction::LoseCompletion));
    let mut q = v.io_queue().unwrap();
    q.submit_read(&b.token, 4096, 0, 0, 20).unwrap();
    q.submit_read(&b.token, 8192, 4096, 4096, 21).unwrap();
    let t = std::time::Instant::now();
    let (r, got) = drained(&mut q);
    assert!(t.elapsed() < Duration::from_secs(10), "drained after {:?}", t.elapsed());
    assert!(matches!(r, Err(Error::Wedged)), "{r:?}: member 1's queue was given up on");
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].1.as_ref().ok(), Some(&4096));
    match &got[1].1 {
        Err(Error::Member { member: 1, source, .. }) => assert!(matches!(**source, Error::Timeout { .. }), "{source}"),
        other => panic!("request 21: {other:?}"),
    }
    drop(q);
    assert_eq!(v.member(1).state(), ugds::HandleState::Wedged, "member 1 keeps the buffer it may still write");
}

/// In interrupt mode a volume's queue waits on every member's interrupt at
/// once: while a read on member 0 is held 3 s by its controller, reads on
/// member 2 are each found as they complete, not when member 0's does.
#[test]
fn a_volume_queue_waits_on_every_members_interrupt() {
    let d = Driver::open();
    let o = opts().completion(ugds::Completion::Interrupt);
    let (hs, c): (Vec<Handle>, Vec<EmuControl>) =
        (0..3).map(|_| open_emulated(&d, emu(1 << 20, 512), o.clone()).unwrap()).unzip();
    let v = Volume::new(hs, VolumeLayout::Striped { stripe: 4096 }).unwrap();
    let b = Buf::new(&d, 64 << 10);
    c[0].inject(Fault::next(FaultTarget::Io(Some(0x02)), FaultAction::Stall(Duration::from_secs(3))));
    let mut q = v.io_queue().unwrap();
    q.submit_read(&b.token, 4096, 0, 0, 1000).unwrap();
    q.ring();
    let t = std::time::Instant::now();
    for round in 0..10u64 {
        // Stripe 2: member 2.
        q.submit_read(&b.token, 4096, 8192, 4096, round).unwrap();
        q.ring();
        let mut got = Vec::new();
        while got.is_empty() {
            q.wait(Duration::from_secs(5));
            q.poll(usize::MAX, |tag, r| got.push((tag, r)));
        }
        assert_eq!(got[0].0, round);
        assert_eq!(got[0].1.as_ref().ok(), Some(&4096));
    }
    assert!(t.elapsed() < Duration::from_secs(2), "ten reads took {:?}: a wait sat on member 0", t.elapsed());
    assert!(QueueStats::total(&v.member(2).queue_stats()).unwrap().interrupts > 0, "completions came by interrupt");
    let (r, got) = drained(&mut q);
    r.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].0, got[0].1.as_ref().ok()),
        (1000, Some(&4096)),
        "member 0's read, once its controller lets it go"
    );
}

/// Once a stream-ordered operation on a volume has let its stream go on,
/// the volume's stream thread holds nothing of the volume: dropping the
/// volume then leaves its members' handles to their other owners at once
/// (a controller is free to open again, not closed later by that thread).
#[test]
fn a_volume_stream_operation_holds_no_member_once_its_stream_goes_on() {
    use ugds::{HostStream, StreamIo};
    let d = Driver::open();
    let hs: Vec<Arc<Handle>> = members(&d, 2, 1 << 20).0.into_iter().map(Arc::new).collect();
    let b = Buf::new(&d, 64 << 10);
    let s = HostStream::new();
    for round in 0..200 {
        let v = Volume::with_shared(hs.clone(), VolumeLayout::Striped { stripe: 4096 }).unwrap();
        let (io, read) = StreamIo::new(8192, 0, 0);
        v.read_async(&b.token, io, &s).unwrap();
        s.synchronize();
        assert_eq!(read.bytes(), 8192);
        drop(v);
        for (m, h) in hs.iter().enumerate() {
            assert_eq!(Arc::strong_count(h), 1, "round {round}: member {m} still held after the volume was dropped");
        }
    }
}

/// In the QEMU guest of `scripts/qemu-conformance volume`
/// (`UGDS_TEST_VOLUME_TOPOLOGY=1`): members 0 and 1 sit under one emulated
/// PCIe switch, member 2 on a root port of its own; the members nearest a
/// device come first.
#[test]
fn members_near_follow_the_pcie_hierarchy() {
    use ugds::volume::topology::Affinity;
    if std::env::var("UGDS_TEST_VOLUME_TOPOLOGY").map_or(true, |v| v != "1") {
        eprintln!("SKIPPED: UGDS_TEST_VOLUME_TOPOLOGY is not set (runs in the QEMU guest of the volume configuration)");
        return;
    }
    let d = Driver::open();
    let v = Volume::new(volume_members(&d, 3, 1 << 20), VolumeLayout::Striped { stripe: 4096 }).unwrap();
    let at = |i: usize| v.member(i).pci_address().expect("a PCI function");
    assert_eq!(
        v.members_near(&at(1)),
        vec![(0, Affinity::SameSwitch), (1, Affinity::SameSwitch), (2, Affinity::SameHostBridge)]
    );
    assert_eq!(
        v.members_near(&at(2)),
        vec![(2, Affinity::SameRootPort), (0, Affinity::SameHostBridge), (1, Affinity::SameHostBridge)]
    );
}

#[test]
fn stream_ordered_io_on_a_volume_runs_in_order_with_late_values() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use ugds::{HostStream, StreamIo};
    let d = Driver::open();
    let v = Volume::new(volume_members(&d, 3, 4 << 20), VolumeLayout::Striped { stripe: 16384 }).unwrap();
    let mut b = Buf::new(&d, 2 * MIB);
    let want = pattern(8, 0, MIB);
    b.mem[..MIB].copy_from_slice(&want);
    let s = HostStream::new();
    // The write's offset is set by work placed on the stream before it.
    let (size, off, boff) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (io, wrote) = StreamIo::late(size.clone(), off.clone(), boff.clone());
    {
        let (size, off) = (size.clone(), off.clone());
        s.enqueue(move || {
            size.store(MIB as u64, Ordering::Release);
            off.store(96 << 10, Ordering::Release);
        });
    }
    v.write_async(&b.token, io, &s).unwrap();
    // Read back after it, in order, into the second half of the buffer.
    let (io, read) = StreamIo::new(MIB, 96 << 10, MIB);
    v.read_async(&b.token, io, &s).unwrap();
    // Past the end: refused when the stream reaches it, nothing moved.
    let (io, bad) = StreamIo::new(MIB, v.capacity() - 4096, 0);
    v.read_async(&b.token, io, &s).unwrap();
    s.synchronize();
    assert_eq!((wrote.bytes(), read.bytes()), (MIB as i64, MIB as i64));
    assert!(b.mem[MIB..] == want[..], "read back in stream order");
    assert!(bad.is_done() && bad.bytes() == -(libc::EINVAL as i64), "{}", bad.bytes());
    assert!(matches!(bad.take_error(), Some(Error::OutOfRange { .. })));
    // A deregistered buffer is refused at enqueue.
    let gone = Buf::new(&d, 4096).token;
    let (io, _) = StreamIo::new(4096, 0, 0);
    assert!(matches!(v.read_async(&gone, io, &s), Err(Error::NotRegistered { .. } | Error::StaleToken { .. })));
}
