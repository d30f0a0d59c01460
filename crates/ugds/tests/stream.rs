//! Stream-ordered I/O on the host stream executor.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use ugds::{BatchOp, Drain, Error, HostStream, StreamIo};
use ugds_emu::{Fault, FaultAction, FaultTarget};

#[test]
fn write_then_read_in_stream_order() {
    let (d, h, _e) = open(small_emu(), opts());
    let mut b = Buf::new(&d, 1 << 20);
    b.mem[..512 << 10].copy_from_slice(&pattern(7, 4096, 512 << 10));
    let s = HostStream::new();
    let (w, wr) = StreamIo::new(512 << 10, 4096, 0);
    h.write_async(&b.token, w, &s).unwrap();
    // Read it back into the other half, in order after the write.
    let (r, rr) = StreamIo::new(512 << 10, 4096, 512 << 10);
    h.read_async(&b.token, r, &s).unwrap();
    s.synchronize();
    assert_eq!(wr.bytes(), 512 << 10);
    assert_eq!(rr.bytes(), 512 << 10);
    assert!(rr.is_done());
    assert!(b.mem[512 << 10..] == pattern(7, 4096, 512 << 10)[..]);
}

#[test]
fn values_are_bound_when_the_stream_reaches_the_operation() {
    let (d, h, _e) = open(small_emu(), opts());
    let mut b = Buf::new(&d, 65536);
    b.mem.copy_from_slice(&pattern(3, 0, 65536));
    h.write(&b.token, 65536, 1 << 20, 0).unwrap();
    b.mem.fill(0);
    let s = HostStream::new();
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    s.enqueue(move || gate_rx.recv().unwrap());
    let size = Arc::new(AtomicU64::new(0)); // invalid if read now
    let file_offset = Arc::new(AtomicU64::new(7)); // misaligned if read now
    let buf_offset = Arc::new(AtomicU64::new(1 << 40));
    let (io, res) = StreamIo::late(size.clone(), file_offset.clone(), buf_offset.clone());
    h.read_async(&b.token, io, &s).unwrap();
    // Change the values after enqueue, before the stream gets there.
    size.store(8192, Ordering::Release);
    file_offset.store((1 << 20) + 4096, Ordering::Release);
    buf_offset.store(512, Ordering::Release);
    gate_tx.send(()).unwrap();
    s.synchronize();
    assert_eq!(res.bytes(), 8192, "{:?}", res.take_error());
    assert!(b.mem[512..512 + 8192] == pattern(3, 4096, 8192)[..]);
    assert!(b.mem[..512].iter().all(|&x| x == 0));
}

#[test]
fn later_work_sees_the_result_and_the_data() {
    let (d, h, _e) = open(small_emu(), opts());
    let mut b = Buf::new(&d, 65536);
    b.mem.fill(0x3c);
    h.write(&b.token, 65536, 0, 0).unwrap();
    b.mem.fill(0);
    let s = HostStream::new();
    let before_ran = Arc::new(AtomicBool::new(false));
    let (io, res) = StreamIo::new(65536, 0, 0);
    {
        let br = before_ran.clone();
        let res = res.clone();
        s.enqueue(move || {
            assert!(!res.is_done(), "the read ran before earlier work");
            br.store(true, Ordering::Release);
        });
    }
    h.read_async(&b.token, io, &s).unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    {
        let (res, seen) = (res.clone(), seen.clone());
        let base = b.mem.as_ptr() as usize;
        s.enqueue(move || {
            assert!(res.is_done(), "later work ran before the read finished");
            // SAFETY: the read has completed; the buffer lives until the
            // stream is synchronized below.
            let first = unsafe { *(base as *const u8) };
            seen.store(res.bytes() as u64 | (first as u64) << 32, Ordering::Release);
        });
    }
    s.synchronize();
    assert!(before_ran.load(Ordering::Acquire));
    assert_eq!(seen.load(Ordering::Acquire), 65536 | 0x3c << 32);
}

#[test]
fn the_callback_does_not_wait_for_the_io() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 4096);
    let s = HostStream::new();
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_millis(300))));
    let (io, res) = StreamIo::new(4096, 0, 0);
    h.read_async(&b.token, io, &s).unwrap();
    s.synchronize();
    assert_eq!(res.bytes(), 4096);
    assert!(s.longest_callback() < Duration::from_millis(100), "callback held for {:?}", s.longest_callback());
}

#[test]
fn many_streams_are_on_the_device_at_once() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 65536);
    emu.inject(Fault {
        target: FaultTarget::Io(None),
        skip: 0,
        count: 4,
        action: FaultAction::Stall(Duration::from_millis(400)),
    });
    let streams: Vec<HostStream> = (0..4).map(|_| HostStream::new()).collect();
    let fetched = emu.stats().commands;
    let results: Vec<_> = streams
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (io, r) = StreamIo::new(4096, i as u64 * 4096, i * 4096);
            h.read_async(&b.token, io, s).unwrap();
            r
        })
        .collect();
    // All four stalled reads are on the device together.
    wait_for("the four reads to reach the device", || emu.stats().commands >= fetched + 4);
    assert_eq!(h.inflight(), 4);
    assert!(results.iter().all(|r| !r.is_done()));
    for s in &streams {
        s.synchronize();
    }
    assert!(results.iter().all(|r| r.bytes() == 4096));
}

#[test]
fn bad_late_values_fail_the_operation_not_the_stream() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 8192);
    let s = HostStream::new();
    let before = emu.stats().commands;
    let (io, bad) = StreamIo::new(1000, 0, 0); // not a block multiple
    h.read_async(&b.token, io, &s).unwrap();
    let (io, past) = StreamIo::new(4096, 0, 8192); // outside the buffer
    h.read_async(&b.token, io, &s).unwrap();
    let (io, good) = StreamIo::new(4096, 0, 0);
    h.read_async(&b.token, io, &s).unwrap();
    s.synchronize();
    assert_eq!(bad.bytes(), -(libc_einval()));
    assert!(matches!(bad.take_error(), Some(Error::Misaligned { .. })));
    assert_eq!(past.bytes(), -(libc_einval()));
    assert_eq!(good.bytes(), 4096);
    assert_eq!(emu.stats().commands, before + 1, "only the good one reached the device");
    // Unregistered buffers are refused at enqueue.
    let (nowhere, _kept) = common::gone_token(&d);
    let (io, _) = StreamIo::new(4096, 0, 0);
    assert!(matches!(h.read_async(&nowhere, io, &s), Err(Error::NotRegistered { .. })));
}

fn libc_einval() -> i64 {
    22
}

#[test]
fn an_ordered_batch_runs_between_earlier_and_later_work() {
    let (d, h, _e) = open(small_emu().reverse_completions(true), opts());
    let mut b = Buf::new(&d, 32 * 4096);
    for i in 0..32u64 {
        b.mem[i as usize * 4096..(i as usize + 1) * 4096].copy_from_slice(&pattern(i as u8, i * 4096, 4096));
    }
    h.write(&b.token, 32 * 4096, 0, 0).unwrap();
    b.mem.fill(0);
    let s = HostStream::new();
    let mut results = Vec::new();
    let mut ios = Vec::new();
    for i in 0..32u64 {
        let (io, r) = StreamIo::new(4096, (31 - i) * 4096, i as usize * 4096);
        ios.push((BatchOp::Read, b.token, io));
        results.push(r);
    }
    h.batch_async(ios, &s).unwrap();
    let all_done = Arc::new(AtomicBool::new(false));
    {
        let (rs, flag) = (results.clone(), all_done.clone());
        s.enqueue(move || flag.store(rs.iter().all(|r| r.is_done() && r.bytes() == 4096), Ordering::Release));
    }
    s.synchronize();
    assert!(all_done.load(Ordering::Acquire));
    for i in 0..32u64 {
        let j = 31 - i;
        assert!(b.mem[i as usize * 4096..(i as usize + 1) * 4096] == pattern(j as u8, j * 4096, 4096)[..]);
    }
}

#[test]
fn raw_pointer_parameters() {
    let (d, h, _e) = open(small_emu(), opts());
    let mut b = Buf::new(&d, 8192);
    b.mem.fill(0x42);
    h.write(&b.token, 8192, 0, 0).unwrap();
    b.mem.fill(0);
    let s = HostStream::new();
    let size: Box<usize> = Box::new(4096);
    let file_offset: Box<i64> = Box::new(4096);
    let buf_offset: Box<i64> = Box::new(0);
    let mut bytes: Box<isize> = Box::new(-1);
    // SAFETY: the boxes outlive the synchronize below.
    let io = unsafe { StreamIo::from_raw(&*size, &*file_offset, &*buf_offset, &mut *bytes) };
    h.read_async(&b.token, io, &s).unwrap();
    s.synchronize();
    assert_eq!(*bytes, 4096);
    assert!(b.mem[..4096].iter().all(|&x| x == 0x42));
    let neg: Box<i64> = Box::new(-4096);
    let mut bytes2: Box<isize> = Box::new(0);
    // SAFETY: as above.
    let io = unsafe { StreamIo::from_raw(&*size, &*neg, &*buf_offset, &mut *bytes2) };
    h.read_async(&b.token, io, &s).unwrap();
    s.synchronize();
    assert_eq!(*bytes2, -22);
}

#[test]
fn pending_stream_operations_keep_buffer_and_handle_busy() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 4096);
    let s = HostStream::new();
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    s.enqueue(move || gate_rx.recv().unwrap());
    let (io, res) = StreamIo::new(4096, 0, 0);
    h.read_async(&b.token, io, &s).unwrap();
    // Enqueued, not yet reached: the buffer and the handle are held.
    assert!(matches!(d.deregister(&b.token), Err(Error::Busy { what: "buffer", .. })));
    assert!(matches!(h.close(Drain::NoWait), Err(Error::Busy { what: "handle", .. })));
    gate_tx.send(()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !res.is_done() {
        assert!(std::time::Instant::now() < deadline, "the first read completes");
        std::thread::yield_now();
    }
    // On the device (stalled for 2 s once fetched): still held.
    let fetched = emu.stats().commands;
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_secs(2))));
    let (io2, res2) = StreamIo::new(4096, 0, 0);
    h.read_async(&b.token, io2, &s).unwrap();
    while emu.stats().commands == fetched {
        assert!(std::time::Instant::now() < deadline, "the second read reaches the device");
        std::thread::yield_now();
    }
    assert!(!res2.is_done(), "the stalled read is on the device");
    assert!(matches!(d.deregister(&b.token), Err(Error::Busy { .. })));
    s.synchronize();
    assert_eq!((res.bytes(), res2.bytes()), (4096, 4096));
    drop(b);
    h.close(Drain::NoWait).unwrap();
}

#[test]
fn dropping_the_handle_with_operations_pending_finishes_them() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 4096);
    let s = HostStream::new();
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_millis(100))));
    let (io, res) = StreamIo::new(4096, 0, 0);
    h.read_async(&b.token, io, &s).unwrap();
    drop(h);
    s.synchronize();
    assert_eq!(res.bytes(), 4096);
    // The handle goes away on the engine's own thread, which shuts the
    // controller down; then nothing holds the buffer.
    wait_for("the controller to be shut down", || emu.stats().resets >= 1);
    d.deregister(&b.token).expect("nothing holds the buffer once the handle is gone");
}

/// Vectored operations in stream order: three segments written from one
/// buffer and read back in reverse into another, each as one request; the
/// namespace offset is read when the stream reaches the operation.
#[test]
fn vectored_operations_in_stream_order() {
    let (d, h, _e) = open(small_emu(), opts());
    let (mut a, mut b) = (Buf::new(&d, 65536), Buf::new(&d, 65536));
    a.mem.copy_from_slice(&pattern(11, 0, 65536));
    let s = HostStream::new();
    let segs = [ugds::Segment::new(&a.token, 8192, 4096), ugds::Segment::new(&a.token, 0, 8192)];
    let (w, wr) = StreamIo::new(12288, 1 << 20, 0);
    h.writev_async(&segs, w, &s).unwrap();
    let at = Arc::new(AtomicU64::new(7)); // misaligned if read now
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    s.enqueue(move || gate_rx.recv().unwrap());
    let (r, rr) = StreamIo::late(Arc::new(AtomicU64::new(12288)), at.clone(), Arc::new(AtomicU64::new(0)));
    let back = [ugds::Segment::new(&b.token, 40960, 8192), ugds::Segment::new(&b.token, 4096, 4096)];
    h.readv_async(&back, r, &s).unwrap();
    at.store(1 << 20, Ordering::Release);
    gate_tx.send(()).unwrap();
    s.synchronize();
    assert_eq!(wr.bytes(), 12288, "{:?}", wr.take_error());
    assert_eq!(rr.bytes(), 12288, "{:?}", rr.take_error());
    // Range: a[8192..12288] then a[0..8192]; read back: the first 8 KiB of
    // it into b[40960..], the last 4 KiB into b[4096..].
    let p = pattern(11, 0, 65536);
    assert!(b.mem[40960..40960 + 4096] == p[8192..12288]);
    assert!(b.mem[40960 + 4096..49152] == p[0..4096]);
    assert!(b.mem[4096..8192] == p[4096..8192]);
    b.mem.fill(0);
    drop(a);

    // A bad list is refused at enqueue, with nothing enqueued.
    let submitted = h.queue_stats().iter().map(|q| q.submitted).sum::<u64>();
    let bad: [&[ugds::Segment]; 4] = [
        &[],
        &[ugds::Segment::new(&b.token, 0, 100)],
        &[ugds::Segment::new(&b.token, 0, 8192), ugds::Segment::new(&b.token, 4096, 4096)],
        &[ugds::Segment::new(&b.token, 61440, 8192)],
    ];
    for segs in bad {
        let (io, res) = StreamIo::new(8192, 0, 0);
        let e = h.readv_async(segs, io, &s).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e:?}");
        assert!(!res.is_done());
    }
    // A size that is not the segments' total, read late: -EINVAL, nothing submitted.
    let (io, res) = StreamIo::new(4096, 0, 0);
    h.readv_async(&[ugds::Segment::new(&b.token, 0, 8192)], io, &s).unwrap();
    s.synchronize();
    assert_eq!(res.bytes(), -(libc::EINVAL as i64));
    assert_eq!(h.queue_stats().iter().map(|q| q.submitted).sum::<u64>(), submitted);
    assert!(b.mem.iter().all(|&x| x == 0));
}

/// A stream's totals over two handles add up: what the requests moved
/// equals what the handles' queues moved for them, a refused request counts
/// as an error, and another stream's totals stay apart.
#[test]
fn stream_totals_add_up_over_handles() {
    let d = ugds::Driver::open();
    let (h1, _e1) = open_emulated(&d, small_emu(), opts()).unwrap();
    let (h2, _e2) = open_emulated(&d, small_emu(), opts()).unwrap();
    let b = Buf::new(&d, 1 << 20);
    let (s, other) = (HostStream::new(), HostStream::new());
    let (io, _) = StreamIo::new(65536, 0, 0);
    h1.write_async(&b.token, io, &s).unwrap();
    let reads = (0..4).map(|i| (BatchOp::Read, b.token, StreamIo::new(4096, i * 4096, 65536 + i as usize * 4096).0));
    h1.batch_async(reads.collect(), &s).unwrap();
    let (io, _) = StreamIo::new(8192, 1 << 20, 0);
    h2.write_async(&b.token, io, &s).unwrap();
    let segs = [ugds::Segment::new(&b.token, 131072, 8192), ugds::Segment::new(&b.token, 196608, 4096)];
    let (io, _) = StreamIo::new(12288, 0, 0);
    h2.readv_async(&segs, io, &s).unwrap();
    let (io, bad) = StreamIo::new(4096, 7, 0);
    h2.read_async(&b.token, io, &s).unwrap();
    s.synchronize();
    assert_eq!(bad.bytes(), -(libc::EINVAL as i64));
    let t = s.stats();
    assert_eq!((t.submitted, t.ended, t.in_flight), (8, 8, 0), "{t:?}");
    assert_eq!((t.bytes_written, t.bytes_read, t.errors, t.timeouts), (65536 + 8192, 16384 + 12288, 1, 0), "{t:?}");
    let moved = |h: &ugds::Handle| {
        let q = ugds::QueueStats::total(&h.queue_stats()).unwrap();
        (q.bytes_written, q.bytes_read)
    };
    let ((w1, r1), (w2, r2)) = (moved(&h1), moved(&h2));
    assert_eq!((w1 + w2, r1 + r2), (t.bytes_written, t.bytes_read), "the queues moved what the stream counted");
    assert_eq!(other.stats(), ugds::RequestStats::default());
}

/// A background stream's operation waits while another stream's is on the
/// device (its command is staged only after the other's completed); a
/// normal stream's does not wait.
#[test]
fn a_background_stream_waits_for_other_streams() {
    use ugds_emu::LatencyModel;
    let model = LatencyModel::new(Duration::from_millis(30), 0);
    for (class, waits) in [(ugds::Priority::Background, true), (ugds::Priority::Normal, false)] {
        let (d, h, _e) = open(small_emu().latency(Some(model)), opts().trace(64));
        let b = Buf::new(&d, 65536);
        let (first, second) = (HostStream::new(), HostStream::new());
        second.set_service(ugds::StreamService::new(class, None));
        let (io, r1) = StreamIo::new(4096, 0, 0);
        h.read_async(&b.token, io, &first).unwrap();
        // The first is on the device before the second is enqueued.
        while h.queue_stats().iter().map(|q| q.submitted).sum::<u64>() == 0 {
            std::thread::yield_now();
        }
        let (io, r2) = StreamIo::new(4096, 1 << 20, 4096);
        h.read_async(&b.token, io, &second).unwrap();
        first.synchronize();
        second.synchronize();
        assert_eq!((r1.bytes(), r2.bytes()), (4096, 4096));
        let trace: Vec<ugds::TraceEvent> = h.trace().into_iter().flat_map(|t| t.events).collect();
        let at = |lba| trace.iter().find(|e| e.slba == lba).copied().unwrap();
        let (a, b2) = (at(0), at((1 << 20) / 512));
        let staged_after = b2.submitted >= a.completed.unwrap();
        assert_eq!(
            staged_after, waits,
            "{class:?}: staged at {:?}, the first completed at {:?}",
            b2.submitted, a.completed
        );
    }
}

/// A stream whose mode is adaptive teaches it the operations' times (1 MiB
/// reads at 100 MB/s: about 10 ms); the mode then sleeps, and the engine
/// naps while they are in flight; the data is right throughout.
#[test]
fn a_stream_s_mode_learns_from_its_operations() {
    use ugds_emu::LatencyModel;
    let model = LatencyModel::new(Duration::ZERO, 100_000_000);
    let (d, h, _e) = open(small_emu().latency(Some(model)), opts());
    let mut b = Buf::new(&d, 1 << 20);
    b.mem.copy_from_slice(&pattern(17, 0, 1 << 20));
    h.write(&b.token, 1 << 20, 0, 0).unwrap();
    let adaptive = Arc::new(ugds::mode::Adaptive::new(Duration::from_millis(1), Duration::from_millis(2)));
    let s = HostStream::new();
    s.set_service(ugds::StreamService::new(ugds::Priority::Normal, Some(adaptive.clone())));
    for _ in 0..8 {
        b.mem.fill(0);
        let (io, r) = StreamIo::new(1 << 20, 0, 0);
        h.read_async(&b.token, io, &s).unwrap();
        s.synchronize();
        assert_eq!(r.bytes(), 1 << 20);
        assert!(b.mem[..] == pattern(17, 0, 1 << 20)[..]);
    }
    let avg = adaptive.average(1 << 20).expect("measured");
    assert!(avg >= Duration::from_millis(9), "{avg:?} for 1 MiB at 100 MB/s");
    assert!(adaptive.sleeps(1 << 20), "switched to sleeping after four slow operations");
}
