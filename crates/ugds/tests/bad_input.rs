//! Bad input gets a clear, typed error, issues no command, changes nothing.

mod common;
use common::*;
use ugds::{Driver, Error, HostBuffer};
use ugds_emu::EmuControl;

/// Runs `f` and checks that the controller saw no command meanwhile.
fn no_command<T>(emu: &EmuControl, f: impl FnOnce() -> T) -> T {
    let before = emu.stats().commands;
    let r = f();
    assert_eq!(emu.stats().commands, before, "a command was issued for bad input");
    r
}

#[test]
fn misaligned_offsets_and_sizes() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 65536);
    no_command(&emu, || {
        assert!(matches!(
            h.read(&b.token, 4096, 100, 0),
            Err(Error::Misaligned { what: "file offset", value: 100, alignment: 512 })
        ));
        assert!(matches!(
            h.write(&b.token, 1000, 0, 0),
            Err(Error::Misaligned { what: "size", value: 1000, alignment: 512 })
        ));
        assert!(matches!(h.read(&b.token, 0, 0, 0), Err(Error::ZeroSize)));
        // The data pointer must be dword aligned for PRP1.
        assert!(matches!(
            h.read(&b.token, 512, 0, 2),
            Err(Error::Misaligned { what: "buffer address", alignment: 4, .. })
        ));
        assert!(matches!(h.write_zeroes(100, 0), Err(Error::Misaligned { .. })));
    });
}

#[test]
fn ranges_past_the_namespace() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 65536);
    let cap = h.capacity();
    no_command(&emu, || {
        assert!(matches!(h.read(&b.token, 4096, cap, 0), Err(Error::OutOfRange { .. })));
        assert!(
            matches!(h.write(&b.token, 8192, cap - 4096, 0), Err(Error::OutOfRange { offset, len: 8192, capacity }) if offset == cap - 4096 && capacity == cap)
        );
        assert!(matches!(h.read(&b.token, 512, u64::MAX - 511, 0), Err(Error::OutOfRange { .. })));
    });
    // The last block is fine.
    h.read(&b.token, 512, cap - 512, 0).unwrap();
}

#[test]
fn unregistered_and_out_of_buffer() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 8192);
    let (nowhere, _kept) = common::gone_token(&d);
    no_command(&emu, || {
        assert!(matches!(h.read(&nowhere, 4096, 0, 0), Err(Error::NotRegistered { base }) if base == nowhere.base()));
        assert!(matches!(
            h.read(&b.token, 8192, 0, 512),
            Err(Error::BufferRange { offset: 512, len: 8192, buffer_len: 8192, .. })
        ));
        assert!(matches!(h.write(&b.token, 512, 0, 8192), Err(Error::BufferRange { .. })));
        assert!(matches!(h.read(&b.token, 512, 0, usize::MAX - 10), Err(Error::BufferRange { .. })));
    });
    let mut q = h.io_queue().unwrap();
    no_command(&emu, || {
        assert!(matches!(q.submit_read(&nowhere, 4096, 0, 0, 0), Err(Error::NotRegistered { .. })));
        assert!(matches!(q.submit_write(&b.token, 4096, 3, 0, 0), Err(Error::Misaligned { .. })));
        q.ring();
    });
    assert_eq!(q.outstanding(), 0);
}

/// A lent queue checks a request of a page or less on its own path: each
/// refusal is the handle's precise error, and nothing reaches the device.
#[test]
fn a_lent_queue_refuses_a_bad_one_page_request_precisely() {
    let (d, h, emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 8192);
    let cap = h.capacity();
    let mut q = h.io_queue().unwrap();
    no_command(&emu, || {
        let t = &b.token;
        assert!(matches!(q.submit_read(t, 0, 0, 0, 0), Err(Error::ZeroSize)));
        assert!(matches!(q.submit_read(t, 4096, 512 + 3, 0, 0), Err(Error::Misaligned { what: "file offset", .. })));
        assert!(matches!(q.submit_read(t, 4000, 0, 0, 0), Err(Error::Misaligned { what: "size", .. })));
        assert!(matches!(q.submit_read(t, 512, 0, 2, 0), Err(Error::Misaligned { what: "buffer address", .. })));
        assert!(matches!(q.submit_read(t, 4096, cap - 512, 0, 0), Err(Error::OutOfRange { .. })));
        assert!(matches!(q.submit_read(t, 4096, cap, 0, 0), Err(Error::OutOfRange { .. })));
        // An end past 2^64 wraps to a small offset: still out of range.
        assert!(matches!(q.submit_read(t, 4096, u64::MAX - 511, 0, 0), Err(Error::OutOfRange { .. })));
        assert!(matches!(q.submit_read(t, 4096, 0, 8192 - 512, 0), Err(Error::BufferRange { .. })));
        q.ring();
    });
    assert_eq!(q.outstanding(), 0);
    // The last block of the namespace is in range.
    q.submit_read(&b.token, 512, cap - 512, 0, 7).unwrap();
    q.drain(|tag, r| assert_eq!((tag, r.unwrap()), (7, 512))).unwrap();
}

#[test]
fn registration_rules() {
    let d = Driver::open();
    let mut mem = HostBuffer::new(1 << 20).unwrap();
    let p = mem.as_mut_ptr();
    // SAFETY: `mem` outlives every registration below (all deregistered).
    unsafe {
        let t = d.register(p, 65536).unwrap();
        assert!(matches!(d.register(p, 4096), Err(Error::AlreadyRegistered { .. })));
        assert!(matches!(d.register(p.add(4096), 4096), Err(Error::Overlap { .. })));
        assert!(matches!(d.register(p.add(65536 - 512), 4096), Err(Error::Overlap { .. })));
        let before = d.register(p.add(65536), 4096).unwrap(); // adjacent: fine
        assert!(matches!(d.register(std::ptr::null_mut(), 4096), Err(Error::InvalidArgument(_))));
        assert!(matches!(d.register(p.add(200_000), 0), Err(Error::ZeroSize)));
        d.deregister(&t).unwrap();
        assert!(matches!(d.deregister(&t), Err(Error::NotRegistered { .. })));
        // Same address again: the old token is stale.
        let t2 = d.register(p, 65536).unwrap();
        assert!(t2.generation() > t.generation());
        assert!(
            matches!(d.deregister(&t), Err(Error::StaleToken { got, current, .. }) if got == t.generation() && current == t2.generation())
        );
        assert_eq!(d.token_at(p), Some(t2));
        d.deregister(&t2).unwrap();
        d.deregister(&before).unwrap();
        assert_eq!(d.token_at(p), None);
    }
}

#[test]
fn stale_token_refused_for_io() {
    let (d, h, emu) = open(small_emu(), opts());
    let mut mem = HostBuffer::new(65536).unwrap();
    // SAFETY: `mem` outlives the registrations (deregistered below).
    let old = unsafe { d.register(mem.as_mut_ptr(), 65536) }.unwrap();
    d.deregister(&old).unwrap();
    // SAFETY: as above.
    let new = unsafe { d.register(mem.as_mut_ptr(), 65536) }.unwrap();
    no_command(&emu, || {
        assert!(matches!(h.read(&old, 4096, 0, 0), Err(Error::StaleToken { .. })));
    });
    h.read(&new, 4096, 0, 0).unwrap();
    d.deregister(&new).unwrap();
}

#[test]
fn closed_handle_refuses_everything() {
    let (d, h, _emu) = open(small_emu(), opts());
    let b = Buf::new(&d, 8192);
    h.close(ugds::Drain::NoWait).unwrap();
    assert!(matches!(h.read(&b.token, 4096, 0, 0), Err(Error::Closed)));
    assert!(matches!(h.write(&b.token, 4096, 0, 0), Err(Error::Closed)));
    assert!(matches!(h.flush(), Err(Error::Closed)));
    assert!(matches!(h.io_queue(), Err(Error::Closed)));
    assert!(matches!(h.close(ugds::Drain::NoWait), Err(Error::Closed)));
    assert_eq!(h.state(), ugds::HandleState::Closed);
}

#[test]
fn unknown_namespace_is_refused_at_open() {
    let d = Driver::open();
    let r = open_emulated(&d, small_emu(), opts().nsid(Some(7)));
    assert!(matches!(r, Err(Error::InvalidArgument(m)) if m.contains("namespace 7")));
}

#[test]
fn bad_emulator_configs_are_refused() {
    use ugds_emu::{EmuConfig, NamespaceConfig};
    let d = Driver::open();
    let bad = [
        EmuConfig::default().namespaces(vec![]),
        EmuConfig::default().namespaces(vec![NamespaceConfig::memory(1 << 20, 1024)]),
        EmuConfig::default().namespaces(vec![NamespaceConfig::memory(100, 512)]),
        EmuConfig::default().max_io_queues(0),
        EmuConfig::default().mqes(0),
    ];
    for cfg in bad {
        assert!(matches!(open_emulated(&d, cfg, opts()), Err(Error::InvalidArgument(_))));
    }
}

/// The last buffer a thread or lent queue used is remembered so that the
/// next request on it skips the registry's lock; deregistration must still
/// win, and a second handle must get its own mapping.
#[test]
fn a_buffer_just_used_is_refused_once_deregistered() {
    let (d, h, emu) = open(small_emu(), opts());
    let mut mem = HostBuffer::new(65536).unwrap();
    // SAFETY: `mem` outlives the registrations (deregistered below).
    let old = unsafe { d.register(mem.as_mut_ptr(), 65536) }.unwrap();
    h.write(&old, 4096, 0, 0).unwrap();
    h.read(&old, 4096, 0, 0).unwrap();
    let mut q = h.io_queue().unwrap();
    q.submit_read(&old, 4096, 4096, 0, 1).unwrap();
    q.drain(|_, r| assert!(r.is_ok())).unwrap();
    d.deregister(&old).unwrap();
    no_command(&emu, || {
        assert!(matches!(h.read(&old, 4096, 0, 0), Err(Error::NotRegistered { .. })));
        assert!(matches!(q.submit_read(&old, 4096, 0, 0, 2), Err(Error::NotRegistered { .. })));
    });
    // SAFETY: as above.
    let new = unsafe { d.register(mem.as_mut_ptr(), 65536) }.unwrap();
    no_command(&emu, || {
        assert!(matches!(h.read(&old, 4096, 0, 0), Err(Error::StaleToken { .. })));
        assert!(matches!(q.submit_read(&old, 4096, 0, 0, 3), Err(Error::StaleToken { .. })));
        // The range is still checked against the registration.
        assert!(matches!(h.read(&new, 4096, 0, 65536 - 512), Err(Error::BufferRange { .. })));
    });
    h.read(&new, 4096, 0, 0).unwrap();
    q.submit_read(&new, 4096, 0, 4096, 4).unwrap();
    q.drain(|_, r| assert!(r.is_ok())).unwrap();
    // In flight through the remembered entry: deregistration is refused.
    q.submit_read(&new, 4096, 0, 0, 5).unwrap();
    q.ring();
    assert!(matches!(d.deregister(&new), Err(Error::Busy { what: "buffer", .. })));
    q.drain(|_, r| assert!(r.is_ok())).unwrap();
    drop(q);

    // A second handle on the same driver, same thread, same buffer: it
    // must use its own controller's mapping (the other one's addresses
    // mean nothing there, and the emulator reports a DMA fault).
    let (h2, emu2) = open_emulated(&d, small_emu(), opts()).unwrap();
    mem[..4096].copy_from_slice(&pattern(7, 0, 4096));
    h2.write(&new, 4096, 8192, 0).unwrap();
    mem[..4096].fill(0);
    h.read(&new, 4096, 0, 0).unwrap();
    h2.read(&new, 4096, 8192, 0).unwrap();
    assert_eq!(&mem[..4096], &pattern(7, 0, 4096)[..]);
    assert_eq!(emu2.stats().dma_faults, 0);
    assert_eq!(emu.stats().dma_faults, 0);
    h2.close(ugds::Drain::NoWait).unwrap();
    d.deregister(&new).unwrap();
}

/// Two drivers in one process, the same memory registered in both, used
/// from one thread: each request must go through its own driver's
/// registration and its own controller's mapping (handle ids and
/// generations are unique in the process, so a remembered registration of
/// one driver never matches a request of the other).
#[test]
fn two_drivers_never_share_a_remembered_registration() {
    let (d1, h1, emu1) = open(small_emu(), opts());
    let (d2, h2, emu2) = open(small_emu(), opts());
    let mut mem = HostBuffer::new(8192).unwrap();
    // SAFETY: `mem` outlives both registrations (deregistered below).
    let t1 = unsafe { d1.register(mem.as_mut_ptr(), 8192) }.unwrap();
    // SAFETY: as above.
    let t2 = unsafe { d2.register(mem.as_mut_ptr(), 8192) }.unwrap();
    assert_ne!(t1, t2);
    mem[..4096].copy_from_slice(&pattern(1, 0, 4096));
    h1.write(&t1, 4096, 0, 0).unwrap();
    mem[..4096].copy_from_slice(&pattern(2, 0, 4096));
    h2.write(&t2, 4096, 0, 0).unwrap();
    for _ in 0..2 {
        h1.read(&t1, 4096, 0, 4096).unwrap();
        assert_eq!(&mem[4096..], &pattern(1, 0, 4096)[..]);
        h2.read(&t2, 4096, 0, 4096).unwrap();
        assert_eq!(&mem[4096..], &pattern(2, 0, 4096)[..]);
    }
    // A token of one driver means nothing to the other.
    no_command(&emu2, || assert!(h2.read(&t1, 4096, 0, 0).is_err()));
    assert_eq!(emu1.stats().dma_faults + emu2.stats().dma_faults, 0);
    d1.deregister(&t1).unwrap();
    d2.deregister(&t2).unwrap();
}
