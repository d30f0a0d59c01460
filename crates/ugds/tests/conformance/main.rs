//! Conformance tests: the data paths of the public API against whatever
//! controller the environment names. By default the emulated controller;
//! with `UGDS_TEST_PCI=<bdf>` a controller bound to vfio-pci, with
//! `UGDS_TEST_DRV=/dev/ugds_drvN` one bound to our kernel module (both
//! QEMU's, in the conformance harness `scripts/qemu-conformance`); with
//! `UGDS_TEST_INTERRUPT=1` in interrupt completion mode; with
//! `UGDS_TEST_VFIO=group|cdev` through that vfio interface (auto otherwise);
//! with `UGDS_TEST_FILE_DIR=<dir>` the kernel path (`Driver::open_file`) on
//! a 64 MiB file of the test's process in that directory (`scripts/test`
//! runs the suite so on a disk filesystem and on tmpfs, which takes no
//! direct I/O); with `UGDS_TEST_KERNEL_DEV=<device>` the kernel path on a
//! namespace the kernel keeps: its block device (`/dev/nvme0n1`) or its
//! generic character device (`/dev/ng0n1`, NVMe passthrough through
//! io_uring), in the QEMU guest (`scripts/qemu-conformance`); with
//! `UGDS_TEST_TCP=<host:port>/<subsystem NQN>` a controller over NVMe/TCP
//! (Linux's nvmet-tcp in the QEMU guest), or with `UGDS_TEST_TCP=emu` the
//! emulated NVMe/TCP target (one per test process), header and data
//! digests on with `UGDS_TEST_TCP_DIGESTS=1`; with
//! `UGDS_TEST_RDMA=<address:port>/<subsystem NQN>` a controller over
//! NVMe/RDMA (nvmet-rdma over soft RoCE in the QEMU `rdma` guest); with
//! `UGDS_TEST_ATTACH=<socket>` the controller `ugds serve` serves there, as
//! an attached process (the guest runs it with ugds_drv's owner, which
//! imports the dma-buf test's memory).
//!
//! Run them one at a time (`--test-threads=1`) against a PCI device: each
//! test opens it, and a device can be opened by one process user at a time.
//! Everything adapts to the controller: block size, MDTS, queue count and
//! depth, namespaces.

#[path = "../common/mod.rs"]
mod common;
mod drv;
use common::*;
use std::sync::Arc;
use std::time::Duration;
use ugds::{BatchIo, BatchOp, BatchStatus, Completion, Driver, Error, Handle, HandleOptions, HostStream, StreamIo};
use ugds_emu::{EmuConfig, EmuControl, NamespaceConfig};

fn pci() -> Option<String> {
    std::env::var("UGDS_TEST_PCI").ok().filter(|s| !s.is_empty()).or_else(drv)
}

/// `UGDS_TEST_DRV=/dev/ugds_drvN`: the device through our kernel module.
fn drv() -> Option<String> {
    std::env::var("UGDS_TEST_DRV").ok().filter(|s| !s.is_empty())
}

/// `UGDS_TEST_FILE_DIR=<dir>`: this process's file there (created sparse
/// at its first use, kept for the process: nextest runs each test in a
/// process of its own, so a test that reopens its target finds its data).
fn file() -> Option<std::path::PathBuf> {
    let dir = std::env::var("UGDS_TEST_FILE_DIR").ok().filter(|s| !s.is_empty())?;
    let path = std::path::Path::new(&dir).join(format!("ugds-conformance-{}.img", std::process::id()));
    if !path.exists() {
        std::fs::File::create(&path).and_then(|f| f.set_len(64 << 20)).expect("create the test file");
    }
    Some(path)
}

fn test_opts(nsid: Option<u32>) -> HandleOptions {
    let interrupt = std::env::var("UGDS_TEST_INTERRUPT").is_ok_and(|v| v == "1");
    HandleOptions::default()
        .nsid(nsid)
        .completion(if interrupt { Completion::Interrupt } else { Completion::Poll })
        .sync_queues(2)
        .async_queues(1)
        .queue_depth(64)
        .timeout(Duration::from_secs(30))
        .shadow_doorbells(std::env::var("UGDS_TEST_SHADOW").map_or(true, |v| v != "0"))
}

fn emu_config() -> EmuConfig {
    EmuConfig::default()
        .namespaces(vec![NamespaceConfig::memory(32 << 20, 512), NamespaceConfig::memory(8 << 20, 4096)])
}

/// Opens the target for `nsid` (first namespace when `None`).
/// `UGDS_TEST_KERNEL_DEV=<device>`: a namespace the kernel keeps.
fn kernel_dev() -> Option<String> {
    std::env::var("UGDS_TEST_KERNEL_DEV").ok().filter(|s| !s.is_empty())
}

/// `UGDS_TEST_TCP`: the NVMe/TCP target to run on.
fn tcp() -> Option<ugds::fabrics::TcpTarget> {
    static EMU: std::sync::OnceLock<ugds_emu::tcp::EmuTcpTarget> = std::sync::OnceLock::new();
    let v = std::env::var("UGDS_TEST_TCP").ok().filter(|s| !s.is_empty())?;
    let mut t = if v == "emu" {
        let emu = EMU.get_or_init(|| {
            let cfg = ugds_emu::tcp::EmuTcpConfig { blocks: 16384, block_size: 4096, ..Default::default() };
            ugds_emu::tcp::EmuTcpTarget::start(cfg).expect("start the emulated NVMe/TCP target")
        });
        ugds::fabrics::TcpTarget::new(emu.addr(), emu.nqn())
    } else {
        let (addr, nqn) = v.split_once('/').expect("UGDS_TEST_TCP is host:port/nqn or emu");
        ugds::fabrics::TcpTarget::new(addr, nqn)
    };
    if std::env::var("UGDS_TEST_TCP_DIGESTS").is_ok_and(|v| v == "1") {
        t.digests = ugds::fabrics::Digests { header: true, data: true };
    }
    Some(t)
}

/// `UGDS_TEST_RDMA`: the NVMe/RDMA target to run on.
fn rdma() -> Option<ugds::fabrics::RdmaTarget> {
    let v = std::env::var("UGDS_TEST_RDMA").ok().filter(|s| !s.is_empty())?;
    let (addr, nqn) = v.split_once('/').expect("UGDS_TEST_RDMA is address:port/nqn");
    let mut t = ugds::fabrics::RdmaTarget::new(addr, nqn);
    // UGDS_TEST_RDMA_COPY=1: no buffer registered, all data copied.
    t.register_memory = std::env::var("UGDS_TEST_RDMA_COPY").map_or(true, |v| v != "1");
    Some(t)
}

/// `UGDS_TEST_ATTACH=<socket>`: the controller `ugds serve` serves there,
/// reached as an attached process (queue pairs of its own).
fn attach() -> Option<String> {
    std::env::var("UGDS_TEST_ATTACH").ok().filter(|s| !s.is_empty())
}

fn target_ns(d: &Driver, nsid: Option<u32>) -> (Handle, Option<EmuControl>) {
    if let Some(sock) = attach() {
        let p = ugds::platform::attach::AttachPlatform::connect(std::path::Path::new(&sock)).expect("attach");
        return (d.open_handle(Arc::new(p), test_opts(nsid)).expect("open a handle on the served controller"), None);
    }
    if let Some(t) = rdma() {
        return (d.open_rdma(&t, test_opts(nsid)).expect("open a handle over NVMe/RDMA"), None);
    }
    if let Some(t) = tcp() {
        return (d.open_tcp(&t, test_opts(nsid)).expect("open a handle over NVMe/TCP"), None);
    }
    if let Some(dev) = kernel_dev() {
        return (d.open_file(&dev, test_opts(nsid)).expect("open a handle on the kernel's namespace"), None);
    }
    if let Some(path) = file() {
        return (d.open_file(&path, test_opts(nsid)).expect("open a handle on the file"), None);
    }
    if let Some(path) = drv() {
        let p = ugds::platform::ugds_drv::UgdsDrvPlatform::open(&path).expect("open the ugds_drv device");
        return (d.open_handle(Arc::new(p), test_opts(nsid)).expect("open a handle through ugds_drv"), None);
    }
    match pci() {
        Some(bdf) => {
            let via = std::env::var("UGDS_TEST_VFIO").unwrap_or_else(|_| "auto".into());
            let via = via.parse().expect("UGDS_TEST_VFIO is auto, group or cdev");
            let p = ugds::platform::vfio::VfioPlatform::open_with(&bdf, via).expect("open the vfio device");
            (d.open_handle(Arc::new(p), test_opts(nsid)).expect("open a handle on the vfio device"), None)
        }
        None => {
            let (h, c) = open_emulated(d, emu_config(), test_opts(nsid)).expect("open emulated");
            (h, Some(c))
        }
    }
}

fn target(d: &Driver) -> (Handle, Option<EmuControl>) {
    target_ns(d, None)
}

/// The vfio interface asked for is the one used; without a vfio cdev (a
/// kernel without CONFIG_VFIO_DEVICE_CDEV) asking for it is a clear error
/// and the group interface still opens.
#[test]
fn vfio_interface_is_the_one_asked_for() {
    use ugds::platform::vfio::{VfioInterface, VfioPlatform};
    use ugds::platform::Platform;
    let Some(bdf) = std::env::var("UGDS_TEST_PCI").ok().filter(|s| !s.is_empty()) else {
        eprintln!("SKIPPED: no UGDS_TEST_PCI");
        return;
    };
    let has_cdev = std::fs::read_dir(format!("/sys/bus/pci/devices/{bdf}/vfio-dev"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::path::Path::new("/dev/vfio/devices").join(e.file_name()).exists())
        && std::path::Path::new("/dev/iommu").exists();
    eprintln!("vfio cdev and /dev/iommu present: {has_cdev}");
    let auto = VfioPlatform::open(&bdf).expect("open with the interface chosen");
    assert_eq!(auto.interface(), if has_cdev { VfioInterface::Cdev } else { VfioInterface::Group });
    drop(auto);
    let group = VfioPlatform::open_with(&bdf, VfioInterface::Group).expect("the group interface");
    assert_eq!(group.interface(), VfioInterface::Group);
    drop(group);
    match VfioPlatform::open_with(&bdf, VfioInterface::Cdev) {
        Ok(p) => {
            assert!(has_cdev, "a cdev open succeeded without a vfio cdev");
            assert_eq!(p.interface(), VfioInterface::Cdev);
            assert!(p.describe().contains("iommufd"), "{}", p.describe());
        }
        Err(e) => {
            assert!(!has_cdev, "the cdev is there but did not open: {e}");
            assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
            assert!(e.to_string().contains("CONFIG_VFIO_DEVICE_CDEV"), "{e}");
        }
    }
    if let Ok(via) = std::env::var("UGDS_TEST_VFIO") {
        let want: VfioInterface = via.parse().expect("UGDS_TEST_VFIO is auto, group or cdev");
        let p = VfioPlatform::open_with(&bdf, want).expect("open as asked");
        assert!(want == VfioInterface::Auto || p.interface() == want);
    }
}

#[test]
fn identify_is_sane() {
    eprintln!("identify_is_sane: opening");
    let d = Driver::open();
    let (h, _) = target(&d);
    let c = h.controller();
    assert!(c.io_queues >= 1);
    assert!(!c.namespaces.is_empty());
    for ns in &c.namespaces {
        assert!(ns.block_size == 512 || ns.block_size == 4096, "block size {}", ns.block_size);
        assert!(ns.blocks > 0);
    }
    if let Some(m) = c.max_transfer {
        assert!(m >= 4096 && m.is_power_of_two());
    }
    eprintln!(
        "conformance target: {} {:?} mdts {:?} queues {}",
        c.platform, c.identify.mn, c.max_transfer, c.io_queues
    );
    h.close(ugds::Drain::NoWait).unwrap();
}

#[test]
fn round_trips_across_prp_and_mdts_boundaries() {
    let d = Driver::open();
    let (h, _) = target(&d);
    let bs = h.namespace().block_size as usize;
    let mdts = h.controller().max_transfer.unwrap_or(1 << 20).min(1 << 20);
    let mut sizes = vec![bs, 4096, 4096 + bs, 8192, 8192 + bs, 12288, 65536, mdts, mdts + bs, 1 << 20];
    sizes.retain(|s| s % bs == 0);
    let mut b = Buf::new(&d, 3 << 20);
    let mut off = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        for (j, &bo) in [0usize, 4, 512, 4096 - 512].iter().enumerate() {
            let data = pattern((i * 5 + j) as u8, off, size);
            b.mem[bo..bo + size].copy_from_slice(&data);
            assert_eq!(h.write(&b.token, size, off, bo).unwrap(), size);
            let ro = (1 << 20) + 8 + bo;
            h.read(&b.token, size, off, ro).unwrap();
            assert!(b.mem[ro..ro + size] == data[..], "size {size} buffer offset {bo} file offset {off}");
            off += size.next_multiple_of(4096) as u64;
        }
    }
    drop(b);
    h.close(ugds::Drain::NoWait).unwrap();
}

/// Vectored requests: segments of whole blocks at page and dword offsets,
/// written from one buffer and read back into another in a different
/// order. A controller that takes SGLs (QEMU's does) gets one command with
/// an SGL when the request fits one command; the others, PRP windows.
#[test]
fn vectored_requests_round_trip() {
    let d = Driver::open();
    let (h, _) = target(&d);
    let bs = h.namespace().block_size as usize;
    let seg = 4 * bs.max(1024);
    let total = 6 * seg;
    let one_command = h.controller().max_transfer.is_none_or(|m| total <= m);
    eprintln!(
        "vectored: sgl {} (SGLS {:#x}), {total} bytes in one command: {one_command}",
        h.sgl(),
        h.controller().identify.sgls
    );
    let (mut a, mut b) = (Buf::new(&d, 256 << 10), Buf::new(&d, 256 << 10));
    // Backwards in `a`, some at dword (not page) offsets that cross pages.
    let offs = [5 * 32768, 4 * 32768 + 4, 3 * 32768, 2 * 32768 + 2052, 32768, 0];
    let segs: Vec<ugds::Segment> = offs.iter().map(|&o| ugds::Segment::new(&a.token, o, seg)).collect();
    let want = pattern(31, 0, total);
    for (i, s) in segs.iter().enumerate() {
        a.mem[s.offset..s.offset + seg].copy_from_slice(&want[i * seg..(i + 1) * seg]);
    }
    let submitted = |h: &Handle| ugds::QueueStats::total(&h.queue_stats()).unwrap().submitted;
    let before = submitted(&h);
    assert_eq!(h.writev(&segs, 2 << 20).unwrap(), total);
    if h.sgl() && one_command {
        assert_eq!(submitted(&h) - before, 1, "one SGL command");
    }
    h.read(&b.token, total, 2 << 20, 0).unwrap();
    assert!(b.mem[..total] == want[..], "the range holds the segments in order");
    // Read back into `b` in another order: pairs swapped, at 4-byte offsets.
    b.mem.fill(0);
    let back: Vec<ugds::Segment> =
        (0..6).map(|i| ugds::Segment::new(&b.token, (i ^ 1) * (seg + 4096) + 4, seg)).collect();
    assert_eq!(h.readv(&back, 2 << 20).unwrap(), total);
    for (i, s) in back.iter().enumerate() {
        assert!(b.mem[s.offset..s.offset + seg] == want[i * seg..(i + 1) * seg], "segment {i}");
    }
    drop((a, b));
    h.close(ugds::Drain::NoWait).unwrap();
}

#[test]
fn data_survives_a_handle_reopen() {
    let d = Driver::open();
    let mut b = Buf::new(&d, 65536);
    let off = 8 << 20;
    {
        let (h, _) = target(&d);
        if pci().is_none() && file().is_none() && kernel_dev().is_none() {
            return; // the emulator's memory namespaces live with their handle
        }
        b.mem.copy_from_slice(&pattern(77, off, 65536));
        h.write(&b.token, 65536, off, 0).unwrap();
        h.flush().unwrap();
        h.close(ugds::Drain::NoWait).unwrap();
    }
    let (h, _) = target(&d);
    b.mem.fill(0);
    h.read(&b.token, 65536, off, 0).unwrap();
    assert!(b.mem[..] == pattern(77, off, 65536)[..]);
}

#[test]
fn threads_share_the_queues() {
    let d = Driver::open();
    let (h, _) = target(&d);
    let bs = h.namespace().block_size as u64;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (d, h) = (&d, &h);
            s.spawn(move || {
                let mut b = Buf::new(d, 32768);
                for i in 0..16u64 {
                    let off = (16 << 20) + (t * 16 + i) * 16384;
                    let off = off - off % bs;
                    let data = pattern((t * 16 + i) as u8, off, 16384);
                    b.mem[..16384].copy_from_slice(&data);
                    h.write(&b.token, 16384, off, 0).unwrap();
                    h.read(&b.token, 16384, off, 16384).unwrap();
                    assert!(b.mem[16384..] == data[..]);
                }
            });
        }
    });
}

#[test]
fn synchronous_queues_complete_as_asked() {
    // Interrupts: every synchronous queue has a vector, shared when the
    // controller has fewer than queues (QEMU's msix_qsize); polling: none.
    let d = Driver::open();
    let (h, _) = target(&d);
    let interrupt = test_opts(None).completion == Completion::Interrupt;
    let vectors = h.queues().iter().filter(|q| q.role == ugds::QueueRole::Sync).map(|q| q.vector);
    eprintln!("queues: {:?}", h.queues());
    for v in vectors {
        assert_eq!(v.is_some(), interrupt, "{:?}", h.queues());
    }
}

#[test]
fn an_io_queue_keeps_requests_in_flight() {
    let d = Driver::open();
    let (h, _) = target(&d);
    // A queue pair of its own, or (none to lend) a context on the batch queue.
    let mut q = h.io_queue().unwrap();
    let n = q.depth().min(32) as u64;
    let mut b = Buf::new(&d, (2 * n as usize) * 4096);
    b.mem[..n as usize * 4096].copy_from_slice(&pattern(9, 0, n as usize * 4096));
    h.write(&b.token, n as usize * 4096, 1 << 20, 0).unwrap();
    let half = n as usize * 4096;
    for i in 0..n {
        q.submit_read(&b.token, 4096, (1 << 20) + (n - 1 - i) * 4096, half + i as usize * 4096, i).unwrap();
    }
    let mut seen = 0;
    q.drain(|_, r| {
        assert_eq!(r.unwrap(), 4096);
        seen += 1;
    })
    .unwrap();
    assert_eq!(seen, n);
    drop(q);
    let wrong: Vec<String> = (0..n as usize)
        .filter(|&i| {
            let j = n as usize - 1 - i;
            b.mem[half + i * 4096..half + (i + 1) * 4096] != b.mem[j * 4096..(j + 1) * 4096]
        })
        .map(|i| {
            format!("read {i} (block {}): {}", n as usize - 1 - i, what_block(&b.mem[half + i * 4096..][..4096], 9, n))
        })
        .collect();
    if !wrong.is_empty() {
        // Whether the disk or the reads are wrong: the blocks read again,
        // one synchronous read.
        let c = Buf::new(&d, half);
        h.read(&c.token, half, 1 << 20, 0).unwrap();
        let disk: Vec<String> = (0..n as usize)
            .filter(|&j| c.mem[j * 4096..(j + 1) * 4096] != b.mem[j * 4096..(j + 1) * 4096])
            .map(|j| format!("block {j}: {}", what_block(&c.mem[j * 4096..][..4096], 9, n)))
            .collect();
        panic!("{} of {n} reads returned wrong data: {wrong:?}; read again in one read, the disk's blocks that differ: {disk:?}", wrong.len());
    }
}

/// A handle's first write lands whole: each of a dozen handles, opened in
/// turn, writes 32 blocks over the last one's (a seed of its own) and
/// reads them back. Through NVMe passthrough, blocks an earlier process
/// left dirty in the block device's page cache once reached the disk after
/// such writes (see `KernelPlatform`'s `write_back_block_device`); the
/// guest step `passthrough-after-page-cache` runs this test with blocks
/// held dirty there.
#[test]
fn fresh_handles_write_what_they_are_given() {
    let d = Driver::open();
    let n = 32u64;
    let len = n as usize * 4096;
    let mut b = Buf::new(&d, 2 * len);
    for round in 0..12u8 {
        let (h, _) = target(&d);
        let seed = 40 + round;
        b.mem[..len].copy_from_slice(&pattern(seed, 0, len));
        h.write(&b.token, len, 2 << 20, 0).unwrap();
        h.read(&b.token, len, 2 << 20, len).unwrap();
        let wrong: Vec<String> = (0..n as usize)
            .filter(|&j| b.mem[len + j * 4096..][..4096] != b.mem[j * 4096..][..4096])
            .map(|j| format!("block {j}: {}", what_block(&b.mem[len + j * 4096..][..4096], seed, n)))
            .collect();
        assert!(wrong.is_empty(), "handle {round}: {} of {n} blocks read back wrong: {wrong:?}", wrong.len());
    }
}

/// What a 4 KiB block holds, against `pattern(seed)`'s first `n` blocks.
fn what_block(got: &[u8], seed: u8, n: u64) -> String {
    if let Some(k) = (0..n).find(|&k| got == &pattern(seed, k * 4096, 4096)[..]) {
        return format!("pattern block {k}");
    }
    // Another test's data (only on failure: 256 seeds are slow to try).
    for other in 0..=255u8 {
        if let Some(k) = (0..n).find(|&k| got[..64] == pattern(other, k * 4096, 64)[..]) {
            return format!("seed {other}'s block {k} (first 64 bytes)");
        }
    }
    if got.iter().all(|&x| x == got[0]) {
        return format!("all {:#04x}", got[0]);
    }
    let same = (0..n)
        .map(|k| (k, got.iter().zip(pattern(seed, k * 4096, 4096)).filter(|(a, b)| **a == *b).count()))
        .max_by_key(|x| x.1);
    format!("no whole block (nearest: block {:?} bytes alike; first bytes {:02x?})", same, &got[..8])
}

#[test]
fn batches_larger_than_the_queue() {
    let d = Driver::open();
    let (h, _) = target(&d);
    let Some((entries, _)) = h.batch_geometry() else {
        eprintln!("skipped: no batch queue");
        return;
    };
    let n = (entries * 2).clamp(8, 256);
    let mut b = Buf::new(&d, n * 8192);
    b.mem[..n * 4096].copy_from_slice(&pattern(11, 0, n * 4096));
    let batch = h.batch(n).unwrap();
    let base = 24u64 << 20;
    let writes: Vec<_> = (0..n)
        .map(|i| BatchIo {
            op: BatchOp::Write,
            buf: b.token,
            size: 4096,
            file_offset: base + i as u64 * 4096,
            buf_offset: i * 4096,
            cookie: i as u64,
        })
        .collect();
    batch.submit(&writes).unwrap();
    let mut ev = Vec::new();
    assert_eq!(batch.get_status(n, n, None, &mut ev).unwrap(), n);
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete), "{ev:?}");
    // Read back in one batch, mixed with writes of a second region.
    let mut mixed = Vec::new();
    for i in 0..n {
        mixed.push(BatchIo {
            op: BatchOp::Read,
            buf: b.token,
            size: 4096,
            file_offset: base + i as u64 * 4096,
            buf_offset: n * 4096 + i * 4096,
            cookie: i as u64,
        });
    }
    batch.submit(&mixed).unwrap();
    ev.clear();
    batch.get_status(n, n, None, &mut ev).unwrap();
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete), "{ev:?}");
    assert!(b.mem[n * 4096..] == pattern(11, 0, n * 4096)[..]);
}

#[test]
fn stream_ordered_io_with_late_binding() {
    let d = Driver::open();
    let (h, _) = target(&d);
    if h.batch_geometry().is_none() {
        eprintln!("skipped: no batch queue for the stream engine");
        return;
    }
    let mut b = Buf::new(&d, 1 << 20);
    b.mem[..256 << 10].copy_from_slice(&pattern(13, 0, 256 << 10));
    let s = HostStream::new();
    let (w, wr) = StreamIo::new(256 << 10, 4 << 20, 0);
    h.write_async(&b.token, w, &s).unwrap();
    let size = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let foff = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let boff = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (r, rr) = StreamIo::late(size.clone(), foff.clone(), boff.clone());
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    s.enqueue(move || rx.recv().unwrap());
    h.read_async(&b.token, r, &s).unwrap();
    size.store(256 << 10, std::sync::atomic::Ordering::Release);
    foff.store(4 << 20, std::sync::atomic::Ordering::Release);
    boff.store(512 << 10, std::sync::atomic::Ordering::Release);
    tx.send(()).unwrap();
    s.synchronize();
    assert_eq!(wr.bytes(), 256 << 10);
    assert_eq!(rr.bytes(), 256 << 10, "{:?}", rr.take_error());
    assert!(b.mem[512 << 10..768 << 10] == pattern(13, 0, 256 << 10)[..]);
}

#[test]
fn write_zeroes_and_flush() {
    let d = Driver::open();
    let (h, _) = target(&d);
    if h.controller().identify.oncs & ugds::nvme::IdentifyController::ONCS_WRITE_ZEROES == 0 {
        eprintln!("skipped: no Write Zeroes");
        return;
    }
    let mut b = Buf::new(&d, 16384);
    b.mem.fill(0xa5);
    let off = 12 << 20;
    h.write(&b.token, 16384, off, 0).unwrap();
    h.write_zeroes(8192, off + 4096).unwrap();
    h.flush().unwrap();
    h.read(&b.token, 16384, off, 0).unwrap();
    assert!(b.mem[..4096].iter().all(|&x| x == 0xa5));
    assert!(b.mem[4096..12288].iter().all(|&x| x == 0));
    assert!(b.mem[12288..].iter().all(|&x| x == 0xa5));
}

/// Over NVMe/RDMA only: the target moves a registered buffer's data
/// itself (no command's data copied), or, with registration off
/// (`UGDS_TEST_RDMA_COPY=1`), every command's data is copied through the
/// queue's own memory; either way it round-trips, at page and dword
/// offsets into the buffer.
#[test]
fn rdma_data_goes_where_the_registration_says() {
    let Some(t) = rdma() else {
        eprintln!("skipped: not over NVMe/RDMA");
        return;
    };
    let d = Driver::open();
    let (h, _) = target(&d);
    let mut b = Buf::new(&d, 1 << 20);
    let before: (u64, u64) = h.queue_stats().iter().fold((0, 0), |a, q| (a.0 + q.copied, a.1 + q.submitted));
    let mut off = 20 << 20;
    for (i, &(size, bo)) in [(4096usize, 0usize), (65536, 4), (131072, 512)].iter().enumerate() {
        let data = pattern(0x40 + i as u8, off, size);
        b.mem[bo..bo + size].copy_from_slice(&data);
        assert_eq!(h.write(&b.token, size, off, bo).unwrap(), size);
        let ro = (512 << 10) + bo;
        h.read(&b.token, size, off, ro).unwrap();
        assert!(b.mem[ro..ro + size] == data[..], "size {size} at buffer offset {bo}");
        off += 1 << 20;
    }
    let after: (u64, u64) = h.queue_stats().iter().fold((0, 0), |a, q| (a.0 + q.copied, a.1 + q.submitted));
    let (copied, commands) = (after.0 - before.0, after.1 - before.1);
    assert!(commands >= 6, "{commands} commands for 3 writes and 3 reads");
    if t.register_memory {
        assert_eq!(copied, 0, "registered: the target reaches the buffer itself ({commands} commands)");
    } else {
        assert_eq!(copied, commands, "not registered: every command's data is copied");
    }
    drop(b);
    h.close(ugds::Drain::NoWait).unwrap();
}

#[test]
fn bad_input_is_refused_before_the_device() {
    let d = Driver::open();
    let (h, emu) = target(&d);
    let b = Buf::new(&d, 8192);
    let bs = h.namespace().block_size as u64;
    let before = emu.as_ref().map(|e| e.stats().commands);
    assert!(matches!(h.read(&b.token, 8192, bs / 2, 0), Err(Error::Misaligned { .. })));
    assert!(matches!(h.read(&b.token, bs as usize + 1, 0, 0), Err(Error::Misaligned { .. })));
    assert!(matches!(h.read(&b.token, 4096, h.capacity(), 0), Err(Error::OutOfRange { .. })));
    assert!(matches!(h.read(&b.token, 8192, 0, 4096), Err(Error::BufferRange { .. })));
    assert!(matches!(h.read(&b.token, 0, 0, 0), Err(Error::ZeroSize)));
    if let (Some(e), Some(n)) = (&emu, before) {
        assert_eq!(e.stats().commands, n);
    }
    // The handle is untouched by all that.
    h.read(&b.token, 4096, 0, 0).unwrap();
}

#[test]
fn namespaces_are_separate() {
    let d = Driver::open();
    let (h1, _) = target(&d);
    let Some(ns2) = h1.controller().namespaces.get(1).map(|n| n.nsid) else {
        eprintln!("skipped: one namespace");
        return;
    };
    let mut b = Buf::new(&d, 8192);
    b.mem.fill(0x11);
    h1.write(&b.token, 8192, 0, 0).unwrap();
    h1.close(ugds::Drain::NoWait).unwrap();
    drop(h1);
    let (h2, _) = target_ns(&d, Some(ns2));
    assert_eq!(h2.namespace().nsid, ns2);
    b.mem.fill(0x22);
    h2.write(&b.token, 8192, 0, 0).unwrap();
    h2.close(ugds::Drain::NoWait).unwrap();
    drop(h2);
    let (h1, _) = target(&d);
    b.mem.fill(0);
    h1.read(&b.token, 8192, 0, 0).unwrap();
    if pci().is_some() {
        // Emulated namespaces are memory that does not outlive the handle.
        assert!(b.mem.iter().all(|&x| x == 0x11), "namespace 2's write reached namespace 1");
    }
}
