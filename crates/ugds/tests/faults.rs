//! Injected faults: each reaches the caller as a clear error, and a command
//! that never completes wedges the handle without releasing what it holds.

mod common;
use common::*;
use std::time::Duration;
use ugds::nvme::status::{generic, media};
use ugds::nvme::Status;
use ugds::{Drain, Error, HandleState};
use ugds_emu::{Fault, FaultAction, FaultTarget};

const READ: u8 = 0x02;

/// Resets a wedged handle (which lets go of what its stuck commands held)
/// and deregisters the buffer those commands targeted.
fn force_release(d: &ugds::Driver, h: &ugds::Handle, b: Buf<'_>) {
    h.close(Drain::ForceAfterReset).unwrap();
    d.deregister(&b.token).unwrap();
    // Deregistered just above: its drop must not do it again.
    std::mem::forget(b);
}
const WRITE: u8 = 0x01;
/// Abort's admin opcode.
const ABORT: u8 = 0x08;

#[test]
fn error_status_reaches_the_caller_and_the_handle_goes_on() {
    let (d, h, emu) = open(small_emu(), opts());
    let mut b = Buf::new(&d, 1 << 20);
    let unrecovered = Status::new(2, media::UNRECOVERED_READ_ERROR);
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::Status(unrecovered)));
    match h.read(&b.token, 4096, 0, 0) {
        Err(Error::Nvme { op: "Read", status }) => {
            assert_eq!(status.sct, 2);
            assert_eq!(status.sc, media::UNRECOVERED_READ_ERROR);
            assert!(status.dnr);
            assert_eq!(status.name(), Some("Unrecovered Read Error"));
        }
        other => panic!("expected an NVMe error, got {other:?}"),
    }
    // A failure in the middle of a chunked request fails the request.
    emu.inject(Fault {
        target: FaultTarget::Io(Some(WRITE)),
        skip: 3,
        count: 1,
        action: FaultAction::Status(Status::generic(generic::INTERNAL_ERROR)),
    });
    assert!(
        matches!(h.write(&b.token, 1 << 20, 0, 0), Err(Error::Nvme { op: "Write", status }) if status.sc == generic::INTERNAL_ERROR)
    );
    // And the handle still works.
    b.mem.copy_from_slice(&pattern(4, 0, 1 << 20));
    h.write(&b.token, 1 << 20, 0, 0).unwrap();
    b.mem.fill(0);
    h.read(&b.token, 1 << 20, 0, 0).unwrap();
    assert!(b.mem[..] == pattern(4, 0, 1 << 20)[..]);
    assert_eq!(h.state(), HandleState::Open);
}

#[test]
fn error_status_on_an_io_queue_request() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 65536);
    emu.inject(Fault {
        target: FaultTarget::Io(None),
        skip: 2,
        count: 1,
        action: FaultAction::Status(Status::generic(generic::DATA_TRANSFER_ERROR)),
    });
    let mut q = h.io_queue().unwrap();
    for i in 0..4u64 {
        q.submit_read(&b.token, 4096, i * 4096, (i * 4096) as usize, i).unwrap();
    }
    let mut results = vec![None; 4];
    q.drain(|tag, r| results[tag as usize] = Some(r.is_ok())).unwrap();
    assert_eq!(results, vec![Some(true), Some(true), Some(false), Some(true)]);
}

#[test]
fn lost_completion_wedges_until_forced_teardown() {
    let o = opts().timeout(Duration::from_millis(300));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 65536);
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::LoseCompletion));
    match h.read(&b.token, 4096, 0, 0) {
        Err(Error::Timeout { qid, after, .. }) => {
            assert!(qid >= 1);
            assert_eq!(after, Duration::from_millis(300));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(emu.stats().lost_completions, 1);
    assert_eq!(h.state(), HandleState::Wedged);
    // Everything is refused now.
    assert!(matches!(h.read(&b.token, 4096, 0, 0), Err(Error::Wedged)));
    assert!(matches!(h.write(&b.token, 4096, 0, 0), Err(Error::Wedged)));
    assert!(matches!(h.io_queue(), Err(Error::Wedged)));
    // The buffer the stuck command may still write is not released...
    assert!(matches!(d.deregister(&b.token), Err(Error::Busy { what: "buffer", inflight: 1 })));
    // ...nor is the handle, short of a reset.
    assert!(matches!(h.close(Drain::NoWait), Err(Error::Wedged)));
    assert!(matches!(h.close(Drain::Forever), Err(Error::Wedged)));
    let resets = emu.stats().resets;
    h.close(Drain::ForceAfterReset).unwrap();
    assert_eq!(emu.stats().resets, resets + 1);
    assert_eq!(h.state(), HandleState::Closed);
    // Now the buffer can go (Buf's drop deregisters it).
    d.deregister(&b.token).unwrap();
    std::mem::forget(b);
}

#[test]
fn lost_completion_on_an_io_queue_wedges() {
    let o = opts().timeout(Duration::from_millis(200));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 65536);
    emu.inject(Fault { target: FaultTarget::Io(None), skip: 1, count: 1, action: FaultAction::LoseCompletion });
    let mut q = h.io_queue().unwrap();
    for i in 0..3u64 {
        q.submit_read(&b.token, 4096, 0, (i * 4096) as usize, i).unwrap();
    }
    let mut oks = 0;
    let mut timeouts = 0;
    let r = q.drain(|_, r| match r {
        Ok(_) => oks += 1,
        Err(Error::Timeout { .. }) => timeouts += 1,
        Err(e) => panic!("{e}"),
    });
    assert!(matches!(r, Err(Error::Wedged)));
    assert_eq!((oks, timeouts), (2, 1));
    drop(q);
    assert_eq!(h.state(), HandleState::Wedged);
    assert!(matches!(d.deregister(&b.token), Err(Error::Busy { .. })));
    force_release(&d, &h, b);
}

#[test]
fn a_stall_shorter_than_the_timeout_is_only_slow() {
    let o = opts().timeout(Duration::from_secs(5));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 4096);
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::Stall(Duration::from_millis(100))));
    let t = std::time::Instant::now();
    h.read(&b.token, 4096, 0, 0).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert_eq!(h.state(), HandleState::Open);
}

#[test]
fn a_stall_longer_than_the_timeout_is_aborted_and_the_handle_goes_on() {
    let o = opts().timeout(Duration::from_millis(100));
    let (d, h, emu) = open(small_emu(), o);
    let mut b = Buf::new(&d, 4096);
    emu.inject(Fault::next(FaultTarget::Io(Some(WRITE)), FaultAction::Stall(Duration::from_secs(3))));
    let t = std::time::Instant::now();
    // Past the deadline the engine sends Abort; the controller aborts the
    // held command, so the request fails without wedging the handle.
    match h.write(&b.token, 4096, 0, 0) {
        Err(Error::Nvme { op: "Write", status }) => assert_eq!((status.sct, status.sc), (0, generic::ABORT_REQUESTED)),
        other => panic!("expected an aborted write, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(2), "it waited for the stall instead of aborting");
    assert_eq!(h.state(), HandleState::Open);
    b.mem.fill(3);
    h.write(&b.token, 4096, 0, 0).unwrap();
    b.mem.fill(0);
    h.read(&b.token, 4096, 0, 0).unwrap();
    assert!(b.mem.iter().all(|&x| x == 3));
}

#[test]
fn a_command_the_controller_will_not_abort_wedges_and_reset_clears_it() {
    let o = opts().timeout(Duration::from_millis(100));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 4096);
    // A lost completion cannot be aborted (the controller no longer has it).
    emu.inject(Fault::next(FaultTarget::Io(Some(WRITE)), FaultAction::LoseCompletion));
    assert!(matches!(h.write(&b.token, 4096, 0, 0), Err(Error::Timeout { .. })));
    assert_eq!(h.state(), HandleState::Wedged);
    force_release(&d, &h, b);
}

#[test]
fn controller_fatal_status() {
    let o = opts().timeout(Duration::from_millis(200));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 4096);
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::Fatal));
    assert!(matches!(h.read(&b.token, 4096, 0, 0), Err(Error::ControllerFatal)));
    assert_eq!(h.state(), HandleState::Wedged);
    force_release(&d, &h, b);
}

#[test]
fn admin_failure_at_bring_up_is_reported() {
    let d = ugds::Driver::open();
    let emu = ugds_emu::EmuPlatform::new(small_emu()).unwrap();
    // The first admin command is Identify Controller.
    emu.control().inject(Fault::next(
        FaultTarget::Admin(Some(0x06)),
        FaultAction::Status(Status::generic(generic::INTERNAL_ERROR)),
    ));
    let r = d.open_handle(std::sync::Arc::new(emu), opts());
    assert!(matches!(r, Err(Error::Nvme { op: "Identify", status }) if status.sc == generic::INTERNAL_ERROR));
}

#[test]
fn fatal_at_bring_up_is_reported() {
    let d = ugds::Driver::open();
    let emu = ugds_emu::EmuPlatform::new(small_emu()).unwrap();
    emu.control().inject(Fault::next(FaultTarget::Admin(None), FaultAction::Fatal));
    let r = d.open_handle(std::sync::Arc::new(emu), opts());
    assert!(matches!(r, Err(Error::ControllerFatal)), "{r:?}");
}

/// A controller that repeats a completion after the host gave its CID to
/// the next command: the repeat names the slot's earlier generation and is
/// ignored. Without generations it completed the next command, with the
/// first one's status, before that command's own completion.
#[test]
fn a_repeated_completion_does_not_complete_the_next_command_of_its_slot() {
    let (d, h, emu) = open(small_emu(), opts().sync_queues(1));
    let b = Buf::new(&d, 65536);
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::Duplicate));
    h.read(&b.token, 4096, 0, 0).unwrap();
    // The next command on the queue takes the same slot; it fails, and its
    // failure must be what the caller sees.
    let unrecovered = Status::new(2, media::UNRECOVERED_READ_ERROR);
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::Status(unrecovered)));
    let r = h.read(&b.token, 4096, 4096, 0);
    assert!(
        matches!(r, Err(Error::Nvme { op: "Read", status }) if status.sc == media::UNRECOVERED_READ_ERROR),
        "the repeated completion was taken for the next command: {r:?}"
    );
    h.read(&b.token, 4096, 8192, 0).unwrap();
    assert_eq!(h.state(), HandleState::Open);
}

/// A lent queue reports a stuck request as timed out (the controller
/// refuses the Abort and the grace period passes); when the controller
/// completes it after all, the completion is ignored (it used to be
/// counted down from zero: a panic in debug builds).
#[test]
fn a_completion_after_its_timeout_is_ignored() {
    let o = opts().timeout(Duration::from_millis(200));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 65536);
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::Stall(Duration::from_millis(2500))));
    emu.inject(Fault::next(
        FaultTarget::Admin(Some(ABORT)),
        FaultAction::Status(Status::generic(generic::INTERNAL_ERROR)),
    ));
    let mut q = h.io_queue().unwrap();
    q.submit_read(&b.token, 4096, 0, 0, 7).unwrap();
    let mut got = Vec::new();
    while got.is_empty() {
        q.poll(16, |t, r| got.push((t, r)));
    }
    assert!(matches!(got[0], (7, Err(Error::Timeout { .. }))), "{got:?}");
    // The Abort's completion is in already: the next entry is the read's.
    let posted = emu.stats().completions_posted;
    wait_for("the stalled read's late completion", || emu.stats().completions_posted > posted);
    assert_eq!(q.poll(16, |t, r| got.push((t, r))), 0, "the late completion is not reported");
    assert_eq!(got.len(), 1);
    drop(q);
    force_release(&d, &h, b);
}

/// The one escalation on a lent queue: a request past its deadline is
/// aborted, comes back with its status, and the queue and the handle go on.
#[test]
fn a_stall_on_an_io_queue_is_aborted_and_the_queue_goes_on() {
    let o = opts().timeout(Duration::from_millis(100));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 65536);
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::Stall(Duration::from_secs(5))));
    let mut q = h.io_queue().unwrap();
    for i in 0..4u64 {
        q.submit_read(&b.token, 4096, i * 4096, (i * 4096) as usize, i).unwrap();
    }
    let t = std::time::Instant::now();
    let mut got = Vec::new();
    q.drain(|tag, r| got.push((tag, r))).unwrap();
    assert!(t.elapsed() < Duration::from_secs(3), "it waited for the stall instead of aborting");
    got.sort_by_key(|g| g.0);
    let aborted: Vec<_> = got.iter().filter(|(_, r)| r.is_err()).collect();
    assert_eq!(aborted.len(), 1, "{got:?}");
    assert!(
        matches!(aborted[0].1, Err(Error::Nvme { status, .. }) if status.sc == generic::ABORT_REQUESTED),
        "{got:?}"
    );
    q.submit_read(&b.token, 4096, 0, 0, 9).unwrap();
    q.drain(|_, r| assert!(r.is_ok())).unwrap();
    drop(q);
    assert_eq!(h.state(), HandleState::Open);
}

/// The same escalation for a batch: the late request is aborted and comes
/// back canceled; the handle goes on.
#[test]
fn a_stall_in_a_batch_is_aborted_and_the_handle_goes_on() {
    let o = opts().timeout(Duration::from_millis(100));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 65536);
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::Stall(Duration::from_secs(5))));
    let batch = h.batch(4).unwrap();
    let ios: Vec<_> = (0..4u64)
        .map(|i| ugds::BatchIo {
            op: ugds::BatchOp::Read,
            buf: b.token,
            size: 4096,
            file_offset: i * 4096,
            buf_offset: (i * 4096) as usize,
            cookie: i,
        })
        .collect();
    batch.submit(&ios).unwrap();
    let t = std::time::Instant::now();
    let mut ev = Vec::new();
    while ev.len() < 4 {
        batch.get_status(1, 4, Some(Duration::from_secs(10)), &mut ev).unwrap();
    }
    assert!(t.elapsed() < Duration::from_secs(3), "it waited for the stall instead of aborting");
    let canceled: Vec<_> = ev.iter().filter(|e| e.status == ugds::BatchStatus::Canceled).collect();
    assert_eq!(canceled.len(), 1, "{ev:?}");
    drop(batch);
    assert_eq!(h.state(), HandleState::Open);
    h.read(&b.token, 4096, 0, 0).unwrap();
}

/// A controller removed by surprise (a hot unplug): every register reads
/// all ones and nothing completes. A request fails with DeviceGone once its
/// deadline passes (no hang, no panic), later ones fail too, and tearing the
/// handle down ends.
#[test]
fn surprise_removal_is_a_typed_error() {
    let o = opts().timeout(Duration::from_millis(300));
    let (d, h, emu) = open(small_emu(), o);
    let b = Buf::new(&d, 65536);
    h.read(&b.token, 4096, 0, 0).unwrap();
    emu.surprise_remove();
    let r = h.read(&b.token, 4096, 0, 0);
    assert!(matches!(r, Err(Error::DeviceGone)), "{r:?}");
    assert!(h.read(&b.token, 4096, 4096, 0).is_err());
    // A reset cannot be confirmed on a device that is gone: said so, and
    // what the stuck command holds stays held.
    assert!(matches!(h.close(Drain::ForceAfterReset), Err(Error::DeviceGone)));
    std::mem::forget(b);
}
