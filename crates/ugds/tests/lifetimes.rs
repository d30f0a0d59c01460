//! In-flight references: nothing is released while the device may use it.

mod common;
use common::*;
use std::time::{Duration, Instant};
use ugds::{Drain, Error, HandleState};
use ugds_emu::{Fault, FaultAction, FaultTarget};

#[test]
fn close_and_deregister_during_a_synchronous_read() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 4096);
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_millis(400))));
    let fetched = emu.stats().commands;
    std::thread::scope(|s| {
        let reader = s.spawn(|| h.read(&b.token, 4096, 0, 0));
        wait_for("the read to reach the device", || emu.stats().commands > fetched);
        assert!(h.inflight() >= 1);
        // Non-blocking: refused, nothing changed.
        assert!(matches!(h.close(Drain::NoWait), Err(Error::Busy { what: "handle", inflight: 1 })));
        assert_eq!(h.state(), HandleState::Open);
        assert!(matches!(d.deregister(&b.token), Err(Error::Busy { what: "buffer", inflight: 1 })));
        // Bounded wait shorter than the stall: refused too.
        let t = Instant::now();
        assert!(matches!(h.close(Drain::Timeout(Duration::from_millis(50))), Err(Error::Busy { .. })));
        assert!(t.elapsed() >= Duration::from_millis(50));
        assert_eq!(h.state(), HandleState::Open);
        // The handle still serves I/O meanwhile (another buffer, another queue).
        let other = Buf::new(&d, 4096);
        h.write(&other.token, 4096, 8192, 0).unwrap();
        drop(other);
        // Blocking: waits for the read, then closes.
        h.close(Drain::Forever).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), 4096);
    });
    assert_eq!(h.state(), HandleState::Closed);
}

#[test]
fn a_bounded_wait_that_is_long_enough_closes() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 4096);
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_millis(100))));
    let fetched = emu.stats().commands;
    std::thread::scope(|s| {
        let reader = s.spawn(|| h.read(&b.token, 4096, 0, 0));
        wait_for("the read to reach the device", || emu.stats().commands > fetched);
        h.close(Drain::Timeout(Duration::from_secs(5))).unwrap();
        reader.join().unwrap().unwrap();
    });
}

#[test]
fn force_after_reset_is_only_for_wedged_handles_and_refuses_busy_ones() {
    let (d, h, _emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 4096);
    let q = h.io_queue().unwrap();
    // Open and busy: ForceAfterReset does not reset a working handle.
    assert!(matches!(h.close(Drain::ForceAfterReset), Err(Error::Busy { .. })));
    drop(q);
    drop(b);
    h.close(Drain::ForceAfterReset).unwrap();
    assert_eq!(h.state(), HandleState::Closed);
}

#[test]
fn a_wedged_handle_dropped_without_reset_keeps_its_buffers_mapped() {
    let o = opts().timeout(Duration::from_millis(100));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 4096);
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::LoseCompletion));
    assert!(matches!(h.read(&b.token, 4096, 0, 0), Err(Error::Timeout { .. })));
    drop(h);
    // The stuck command's buffer is still referenced: it cannot go.
    assert!(matches!(d.deregister(&b.token), Err(Error::Busy { .. })));
    std::mem::forget(b);
}

/// A just-in-time registration is private to the call that made it: found
/// only by its token, it neither conflicts with nor can be taken for a
/// registration of the same memory.
#[test]
fn private_registrations_are_found_only_by_their_token() {
    let (d, h, _e) = open(small_emu(), opts());
    let mut mem = ugds::HostBuffer::new(1 << 20).unwrap();
    let p = mem.as_mut_ptr();
    // SAFETY: `mem` outlives every registration (all removed below).
    let (a, b) = unsafe { (d.register_private(p, 1 << 20).unwrap(), d.register_private(p, 1 << 20).unwrap()) };
    assert_eq!(d.token_at(p), None);
    assert_eq!(d.token_containing(p), None);
    // SAFETY: as above.
    let public = unsafe { d.register(p, 1 << 20) }.unwrap();
    assert_eq!(d.token_at(p), Some(public));
    h.write(&a, 4096, 0, 0).unwrap();
    h.read(&b, 4096, 0, 4096).unwrap();
    d.deregister(&public).unwrap();
    h.read(&a, 4096, 0, 0).unwrap(); // unaffected by the public one's removal
    assert_eq!(d.private_registrations(), (2, 0));
    d.deregister(&a).unwrap();
    assert!(matches!(d.deregister(&a), Err(Error::NotRegistered { .. })));
    assert!(matches!(h.read(&a, 4096, 0, 0), Err(Error::NotRegistered { .. })));
    d.deregister(&b).unwrap();
    assert_eq!(d.private_registrations(), (0, 0));
}

/// Lengths no machine could serve are refused before anything is allocated
/// for them (a page list for 2^45 bytes would abort the process).
#[test]
fn impossible_lengths_are_refused_before_allocating() {
    let (d, h, _e) = open(small_emu(), opts());
    let mut mem = ugds::HostBuffer::new(4096).unwrap();
    // SAFETY: refused; nothing is registered.
    let e = unsafe { d.register(mem.as_mut_ptr(), 1 << 45) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // SAFETY: as above.
    let e = unsafe { d.register_private(mem.as_mut_ptr(), 1 << 45) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(matches!(h.batch(ugds::Batch::MAX_CAPACITY + 1), Err(Error::InvalidArgument(_))));
    assert!(h.batch(ugds::Batch::MAX_CAPACITY).is_ok());
}

/// A lent queue takes one reference on the buffer its requests share,
/// held while any of them is staged or on the device and released by the
/// last to complete: the buffer cannot be deregistered under them and can
/// be once they are done, with the queue still lent. A request on another
/// buffer meanwhile holds its own reference; a request refused for want of
/// room holds nothing afterwards.
#[test]
fn a_lent_queue_holds_a_buffer_exactly_while_its_requests_are_in_flight() {
    let (d, h, _emu) = open(small_emu(), opts());
    let mut a = ugds::HostBuffer::new(64 * 4096).unwrap();
    let mut b = ugds::HostBuffer::new(4096).unwrap();
    // SAFETY: `a` outlives its registration (deregistered below).
    let ta = unsafe { d.register(a.as_mut_ptr(), a.len()) }.unwrap();
    // SAFETY: as for `a`.
    let tb = unsafe { d.register(b.as_mut_ptr(), b.len()) }.unwrap();
    let mut q = h.io_queue().unwrap();
    let depth = q.depth() as u64;
    for i in 0..depth - 1 {
        q.submit_read(&ta, 4096, i * 4096, (i % 64 * 4096) as usize, i).unwrap();
    }
    q.submit_read(&tb, 4096, 0, 0, 1000).unwrap();
    // Full: refused on either buffer, before anything is staged.
    assert!(matches!(q.submit_read(&ta, 4096, 0, 0, 1001), Err(Error::QueueFull)));
    assert!(matches!(q.submit_read(&tb, 4096, 0, 0, 1002), Err(Error::QueueFull)));
    // Staged, not yet rung: in flight as far as the buffers go.
    assert!(matches!(d.deregister(&ta), Err(Error::Busy { what: "buffer", inflight: 1 })));
    assert!(matches!(d.deregister(&tb), Err(Error::Busy { what: "buffer", inflight: 1 })));
    let mut done = 0;
    q.drain(|tag, r| {
        assert_eq!(r.unwrap(), 4096, "request {tag}");
        done += 1;
    })
    .unwrap();
    assert_eq!(done, depth);
    // Idle, still lent: nothing held.
    d.deregister(&ta).unwrap();
    d.deregister(&tb).unwrap();
    // The queue does not take the deregistered buffer for the one it held.
    assert!(matches!(q.submit_read(&ta, 4096, 0, 0, 1003), Err(Error::NotRegistered { .. })));
    assert_eq!(q.outstanding(), 0);
    drop(q);
    drop((a, b));
}
