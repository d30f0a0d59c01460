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

mod batch;
#[path = "../common/mod.rs"]
mod common;
mod queue;
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
