//! Vectored synchronous I/O (`Handle::readv`, `Handle::writev`): one range
//! of the namespace to or from many buffer segments, and every bad segment
//! list refused with nothing submitted.

mod common;
use common::*;
use ugds::{Error, QueueStats, Segment, MAX_SEGMENTS};

fn submitted(h: &ugds::Handle) -> u64 {
    QueueStats::total(&h.queue_stats()).unwrap().submitted
}

#[test]
fn segments_in_any_order_map_to_consecutive_bytes_of_the_namespace() {
    let (d, h, _e) = open(small_emu().mdts(2), opts()); // 16 KiB per command
    let mut a = Buf::new(&d, 1 << 20);
    let mut b = Buf::new(&d, 256 << 10);
    // 64 segments of 16 KiB, taken from the end of `a` backwards, then two
    // of `b` at odd (but dword-aligned) offsets that cross pages.
    let mut segs: Vec<Segment> = (0..64).map(|i| Segment::new(&a.token, (63 - i) * 16384, 16384)).collect();
    segs.push(Segment::new(&b.token, 4100, 8192));
    segs.push(Segment::new(&b.token, 65540, 4608));
    let total: usize = segs.iter().map(|s| s.len).sum();
    let want = pattern(9, 4096, total);
    // Lay the pattern out in the segments, in order.
    let mut at = 0;
    for s in &segs {
        let mem = if s.buf.base() == a.token.base() { &mut a.mem } else { &mut b.mem };
        mem[s.offset..s.offset + s.len].copy_from_slice(&want[at..at + s.len]);
        at += s.len;
    }
    assert_eq!(h.writev(&segs, 4096).unwrap(), total);
    // One contiguous read sees the segments back to back.
    let r = Buf::new(&d, total.next_multiple_of(4096));
    h.read(&r.token, total, 4096, 0).unwrap();
    assert!(r.mem[..total] == want[..], "the namespace holds the segments in order");
    // And a vectored read puts each piece where it came from.
    a.mem.fill(0);
    b.mem.fill(0);
    assert_eq!(h.readv(&segs, 4096).unwrap(), total);
    let mut at = 0;
    for (i, s) in segs.iter().enumerate() {
        let mem = if s.buf.base() == a.token.base() { &a.mem } else { &b.mem };
        assert!(mem[s.offset..s.offset + s.len] == want[at..at + s.len], "segment {i}");
        at += s.len;
    }
    assert_eq!(b.mem[4096..4100], [0; 4], "nothing outside the segments is written");
}

#[test]
fn a_bad_segment_list_is_refused_with_nothing_submitted() {
    let (d, h, _e) = open(small_emu(), opts());
    let a = Buf::new(&d, 65536);
    let before = submitted(&h);
    let one = |off, len| Segment::new(&a.token, off, len);
    let too_many = vec![one(0, 512); MAX_SEGMENTS + 1];
    let cases: Vec<(&str, Vec<Segment>, u64)> = vec![
        ("no segments", vec![], 0),
        ("too many", too_many, 0),
        ("an empty segment", vec![one(0, 4096), one(4096, 0)], 0),
        ("a length not of whole blocks", vec![one(0, 4096), one(4096, 1000)], 0),
        ("overlapping on a read", vec![one(0, 8192), one(4096, 4096)], 0),
        ("outside the registration", vec![one(0, 4096), one(65536 - 512, 1024)], 0),
        ("not dword-aligned", vec![one(2, 512)], 0),
        ("past the namespace", vec![one(0, 8192)], (16 << 20) - 4096),
        ("a misaligned namespace offset", vec![one(0, 512)], 100),
    ];
    for (what, segs, off) in cases {
        let e = h.readv(&segs, off).unwrap_err();
        assert!(!matches!(e, Error::Wedged | Error::Closed), "{what}: {e}");
        assert_eq!(e.errno(), libc::EINVAL, "{what}: {e}");
        assert_eq!(submitted(&h), before, "{what}: nothing submitted");
    }
    // A write may repeat bytes: the same segment twice is fine there.
    let segs = [one(0, 4096), one(0, 4096)];
    assert_eq!(h.writev(&segs, 0).unwrap(), 8192);
    // A deregistered buffer is refused too, after the others were claimed.
    let gone = Buf::new(&d, 4096);
    let token = gone.token;
    drop(gone);
    let before = submitted(&h);
    assert!(h.readv(&[one(0, 4096), Segment::new(&token, 0, 4096)], 0).is_err());
    assert_eq!(submitted(&h), before);
    // ...and the claims taken before the refusal were let go.
    d.deregister(&a.token).unwrap();
    std::mem::forget(a);
}

#[test]
fn a_batch_of_vectored_requests_completes_each_as_one_event() {
    let (d, h, _e) = open(small_emu().mdts(2), opts());
    let mut a = Buf::new(&d, 1 << 20);
    a.mem.copy_from_slice(&pattern(4, 0, 1 << 20));
    h.write(&a.token, 1 << 20, 0, 0).unwrap();
    a.mem.fill(0);
    // Four requests, each 48 KiB of the namespace into three scattered
    // pieces of `a` (one crossing the 16 KiB command limit).
    let segs: Vec<Vec<Segment>> = (0..4usize)
        .map(|r| {
            let base = r * 200_704; // 196 KiB apart
            vec![
                Segment::new(&a.token, base + 65536, 8192),
                Segment::new(&a.token, base, 20480),
                Segment::new(&a.token, base + 131072, 20480),
            ]
        })
        .collect();
    let ios: Vec<ugds::BatchIov> = segs
        .iter()
        .enumerate()
        .map(|(r, s)| ugds::BatchIov {
            op: ugds::BatchOp::Read,
            segments: s,
            file_offset: r as u64 * 49152,
            cookie: r as u64,
        })
        .collect();
    let batch = h.batch(8).unwrap();
    batch.submit_vectored(&ios).unwrap();
    let mut ev = Vec::new();
    while ev.len() < 4 {
        batch.get_status(1, 4, Some(std::time::Duration::from_secs(10)), &mut ev).unwrap();
    }
    assert!(ev.iter().all(|e| e.result.as_ref().is_ok_and(|&n| n == 49152)), "{ev:?}");
    for (r, s) in segs.iter().enumerate() {
        let mut at = r * 49152;
        for (i, seg) in s.iter().enumerate() {
            assert!(
                a.mem[seg.offset..seg.offset + seg.len] == pattern(4, at as u64, seg.len)[..],
                "request {r} piece {i}"
            );
            at += seg.len;
        }
    }
    assert_eq!(batch.stats().bytes_read, 4 * 49152);
    // One bad request (overlapping pieces) refuses the whole submission.
    let before = submitted(&h);
    let bad = [Segment::new(&a.token, 0, 8192), Segment::new(&a.token, 4096, 4096)];
    let ios2 = [ios[0], ugds::BatchIov { segments: &bad, ..ios[1] }];
    let e = batch.submit_vectored(&ios2).unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");
    assert_eq!(submitted(&h), before, "nothing submitted");
    assert_eq!(batch.outstanding(), 0);
}

/// On a controller that takes SGLs, a vectored request that fits one
/// command goes as one command (an SGL of its segments); with
/// `HandleOptions::sgl(false)`, on a controller without SGLs, or when it is
/// larger than MDTS, as PRP windows (a command or more per segment). The
/// data lands the same way each time.
#[test]
fn vectored_requests_go_as_one_sgl_command_where_they_can() {
    let cases = [
        ("sgl", small_emu().mdts(5), opts(), 1),
        ("sgl off", small_emu().mdts(5), opts().sgl(false), 8),
        ("no sgl on the controller", small_emu().mdts(5).sgl(false), opts(), 8),
        ("larger than mdts", small_emu().mdts(1), opts(), 16),
    ];
    for (what, cfg, o, commands) in cases {
        let (d, h, _e) = open(cfg, o);
        let mut a = Buf::new(&d, 256 << 10);
        // Eight 16 KiB segments, backwards, every other slot of `a`; the
        // last one at a dword (not page) offset.
        let segs: Vec<Segment> =
            (0..8).map(|i| Segment::new(&a.token, (7 - i) * 32768 + if i == 7 { 1028 } else { 0 }, 16384)).collect();
        let want = pattern(13, 0, 8 * 16384);
        for (i, s) in segs.iter().enumerate() {
            a.mem[s.offset..s.offset + s.len].copy_from_slice(&want[i * 16384..(i + 1) * 16384]);
        }
        let before = submitted(&h);
        assert_eq!(h.writev(&segs, 65536).unwrap(), 8 * 16384, "{what}");
        assert_eq!(submitted(&h) - before, commands, "{what}: commands for one writev");
        let r = Buf::new(&d, 8 * 16384);
        h.read(&r.token, 8 * 16384, 65536, 0).unwrap();
        assert!(r.mem[..] == want[..], "{what}: the namespace holds the segments in order");
        a.mem.fill(0);
        let before = submitted(&h);
        assert_eq!(h.readv(&segs, 65536).unwrap(), 8 * 16384, "{what}");
        assert_eq!(submitted(&h) - before, commands, "{what}: commands for one readv");
        for (i, s) in segs.iter().enumerate() {
            assert!(a.mem[s.offset..s.offset + s.len] == want[i * 16384..(i + 1) * 16384], "{what}: segment {i}");
        }
        // In a batch, and in stream order: the same commands.
        a.mem.fill(0);
        let b = h.batch(4).unwrap();
        let before = submitted(&h);
        let iov = ugds::BatchIov { op: ugds::BatchOp::Read, segments: &segs, file_offset: 65536, cookie: 5 };
        b.submit_vectored(&[iov]).unwrap();
        let mut ev = Vec::new();
        b.get_status(1, 1, Some(std::time::Duration::from_secs(10)), &mut ev).unwrap();
        assert_eq!((ev.len(), ev[0].cookie), (1, 5), "{what}");
        assert!(ev[0].result.as_ref().is_ok_and(|&n| n == 8 * 16384), "{what}: {ev:?}");
        assert_eq!(submitted(&h) - before, commands, "{what}: commands for one batch request");
        assert!(a.mem[segs[3].offset..segs[3].offset + 16384] == want[3 * 16384..4 * 16384], "{what}: batch");
        a.mem.fill(0);
        let s = ugds::HostStream::new();
        let before = submitted(&h);
        let (io, r) = ugds::StreamIo::new(8 * 16384, 65536, 0);
        h.readv_async(&segs, io, &s).unwrap();
        s.synchronize();
        assert_eq!(r.bytes(), 8 * 16384, "{what}");
        assert_eq!(submitted(&h) - before, commands, "{what}: commands for one stream operation");
        assert!(a.mem[segs[7].offset..segs[7].offset + 16384] == want[7 * 16384..], "{what}: stream");
    }
}
