//! A broken or hostile controller: completions that name commands not in
//! flight, SQ heads outside what was submitted, a phase tag flipped before
//! its entry, Identify data that lies. Each ends in a typed error or a
//! wedge, never a panic, a wrong completion, or memory handed back while
//! the device may still use it.

mod common;
use common::*;
use std::time::Duration;
use ugds::{Drain, Driver, Error, HandleOptions, HandleState};
use ugds_emu::{Fault, FaultAction, FaultTarget, IdentifyLies, NamespaceConfig};

const READ: u8 = 0x02;

fn one_queue() -> HandleOptions {
    opts().sync_queues(1).async_queues(0).batch_queue(false)
}

/// Writes a pattern at `off`, then reads it back through `fault` and checks
/// the bytes.
fn read_back_through(fault: FaultAction, off: u64) -> (u64, HandleState) {
    let (d, h, emu) = open(small_emu(), one_queue());
    let mut b = Buf::new(&d, 8192);
    b.mem.copy_from_slice(&pattern(3, off, 8192));
    h.write(&b.token, 8192, off, 0).unwrap();
    b.mem.fill(0);
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), fault));
    h.read(&b.token, 8192, off, 0).unwrap();
    assert!(b.mem[..] == pattern(3, off, 8192)[..], "{fault:?}: wrong data");
    // The queue goes on: a few laps of its ring.
    for i in 0..200u64 {
        h.read(&b.token, 4096, (i % 64) * 4096, 0).unwrap();
    }
    (h.protocol_errors(), h.state())
}

#[test]
fn a_completion_naming_a_command_not_in_flight_is_ignored() {
    // Out of range of the queue's CIDs; in range but not in flight.
    for cid in [0xfff0, 5] {
        let (errors, state) = read_back_through(FaultAction::ExtraCompletion(cid), 1 << 20);
        assert_eq!((errors, state), (1, HandleState::Open), "CID {cid:#x}");
    }
}

#[test]
fn an_sq_head_outside_what_was_submitted_is_ignored() {
    // Outside the ring; ahead of the tail (slots not yet fetched would be
    // handed out again); behind the head reported before (moving backwards).
    for head in [0xffff, 40, 62] {
        let (errors, state) = read_back_through(FaultAction::SqHead(head), 0);
        assert_eq!((errors, state), (1, HandleState::Open), "SQ head {head}");
    }
}

#[test]
fn a_phase_tag_flipped_before_its_entry_ends_in_a_timeout() {
    let o = one_queue().timeout(Duration::from_millis(300));
    let (d, h, emu) = open(small_emu(), o);
    let mut b = Buf::new(&d, 8192);
    // Laps of the ring first: the stale entry names an earlier command.
    for i in 0..100u64 {
        h.read(&b.token, 4096, i * 4096, 0).unwrap();
    }
    b.mem.fill(0x5a);
    emu.inject(Fault::next(FaultTarget::Io(Some(READ)), FaultAction::EarlyPhase));
    let r = h.read(&b.token, 8192, 0, 0);
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(h.protocol_errors() >= 1);
    // The command may still be in the controller's hands: the handle is
    // wedged and the buffer stays registered until a reset.
    assert_eq!(h.state(), HandleState::Wedged);
    assert!(matches!(d.deregister(&b.token), Err(Error::Busy { .. })));
    h.close(Drain::ForceAfterReset).unwrap();
    d.deregister(&b.token).unwrap();
    std::mem::forget(b);
}

fn open_lying(lies: IdentifyLies) -> Result<(Driver, ugds::Handle, ugds_emu::EmuControl), Error> {
    let d = Driver::open();
    let cfg = small_emu().identify_lies(lies);
    let (h, c) = open_emulated(&d, cfg, opts())?;
    Ok((d, h, c))
}

#[test]
fn a_namespace_whose_format_or_size_is_impossible_is_not_used() {
    for lies in [IdentifyLies::lbads(30), IdentifyLies::lbads(4), IdentifyLies::flbas(7), IdentifyLies::nsze(u64::MAX)]
    {
        match open_lying(lies) {
            Err(Error::Unsupported(why)) => assert!(why.contains("no usable namespace"), "{lies:?}: {why}"),
            Err(e) => panic!("{lies:?}: expected Unsupported, got {e}"),
            Ok(_) => panic!("{lies:?}: a handle on an impossible namespace"),
        }
    }
    // The size that overflows is named as such.
    match open_lying(IdentifyLies::nsze((1 << 55) + 1)) {
        Err(e) => assert!(e.to_string().contains("overflows 64 bits"), "{e}"),
        Ok(_) => panic!("a handle on a namespace whose size overflows"),
    }
}

/// A namespace of another command set (a zoned one: writes only at each
/// zone's write pointer) is refused at open with one error naming it,
/// never driven as plain blocks.
#[test]
fn a_namespace_that_is_not_nvm_is_refused_at_open() {
    for (csi, name) in [(2, "Zoned Namespace"), (1, "Key Value")] {
        match open_lying(IdentifyLies::csi(csi)) {
            Err(Error::Unsupported(why)) => {
                assert!(why.contains(name) && why.contains("not NVM"), "CSI {csi}: {why}")
            }
            Err(e) => panic!("CSI {csi}: expected Unsupported, got {e}"),
            Ok(_) => panic!("CSI {csi}: a handle on a namespace of another command set"),
        }
    }
    // NVM named as such is used.
    open_lying(IdentifyLies::csi(0)).unwrap();
}

#[test]
fn a_namespace_larger_than_its_backing_fails_beyond_it() {
    // The backing is 16 MiB; Identify claims twice that.
    let (d, h, _e) = open_lying(IdentifyLies::nsze(2 * (16 << 20) / 512)).unwrap();
    assert_eq!(h.capacity(), 32 << 20);
    let b = Buf::new(&d, 8192);
    let r = h.read(&b.token, 8192, 24 << 20, 0);
    assert!(matches!(r, Err(Error::Nvme { .. })), "{r:?}");
    h.read(&b.token, 8192, 8 << 20, 0).unwrap();
    assert_eq!(h.state(), HandleState::Open);
}

#[test]
fn a_transfer_limit_larger_than_the_real_one_fails_cleanly() {
    // The controller takes at most 16 KiB per command but claims no limit,
    // or an absurd one.
    for lies in [IdentifyLies::mdts(0), IdentifyLies::mdts(255)] {
        let d = Driver::open();
        let cfg = EmuConfigExt::small_mdts(2).identify_lies(lies);
        let (h, _e) = open_emulated(&d, cfg, opts()).unwrap();
        let b = Buf::new(&d, 1 << 20);
        let r = h.read(&b.token, 1 << 20, 0, 0);
        assert!(matches!(r, Err(Error::Nvme { .. })), "{lies:?}: {r:?}");
        h.read(&b.token, 16384, 0, 0).unwrap();
        assert_eq!(h.state(), HandleState::Open);
    }
}

struct EmuConfigExt;
impl EmuConfigExt {
    fn small_mdts(mdts: u8) -> ugds_emu::EmuConfig {
        small_emu().namespaces(vec![NamespaceConfig::memory(16 << 20, 512)]).mdts(mdts)
    }
}
