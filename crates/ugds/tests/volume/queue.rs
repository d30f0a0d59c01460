//! A volume's queues (`Volume::io_queue`): requests moved to the members
//! their ranges name, refusals that stage nothing, a member's failure or
//! silence, and the members' interrupts waited on together.

use super::*;

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
