//! In-flight references: nothing is released while the device may use it.

mod common;
use common::*;
use std::time::{Duration, Instant};
use ugds::platform::emu::{Fault, FaultAction, FaultTarget};
use ugds::{Drain, Error, HandleState};

#[test]
fn close_and_deregister_during_a_synchronous_read() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 4096);
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_millis(400))));
    std::thread::scope(|s| {
        let reader = s.spawn(|| h.read(&b.token, 4096, 0, 0));
        std::thread::sleep(Duration::from_millis(100));
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
    std::thread::scope(|s| {
        let reader = s.spawn(|| h.read(&b.token, 4096, 0, 0));
        std::thread::sleep(Duration::from_millis(30));
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
    let o = ugds::HandleOptions { timeout: Duration::from_millis(100), ..opts() };
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 4096);
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::LoseCompletion));
    assert!(matches!(h.read(&b.token, 4096, 0, 0), Err(Error::Timeout { .. })));
    drop(h);
    // The stuck command's buffer is still referenced: it cannot go.
    assert!(matches!(d.deregister(&b.token), Err(Error::Busy { .. })));
    std::mem::forget(b);
}
