//! The tests only ugds_drv runs (`UGDS_TEST_DRV`, in the QEMU guests):
//! the module's ledger of mappings, dma-bufs imported through it (udmabuf),
//! its lifecycle against mmap and unbind, the pinned memory charged to the
//! process, and NVIDIA's peer-to-peer calls through the guests' fake
//! nvidia_p2p. Each says skipped and passes elsewhere.

use super::*;

/// Through ugds_drv only: the module's ledger refuses overlapping ranges and
/// stale handles, and its counters return to zero.
#[test]
fn drv_ledger_refuses_overlaps_and_stale_handles() {
    let Some(path) = drv() else {
        eprintln!("skipped: not on ugds_drv");
        return;
    };
    use ugds::platform::Platform;
    let p = ugds::platform::ugds_drv::UgdsDrvPlatform::open(&path).unwrap();
    let before = p.counters().unwrap();
    let mut mem = ugds::HostBuffer::new(64 << 10).unwrap();
    let base = mem.as_mut_ptr();
    // SAFETY: `mem` outlives the mappings (all removed below).
    let m = unsafe { p.map_host(base, 64 << 10) }.unwrap();
    assert_eq!(m.pages().len(), 16);
    assert!(m.pages().iter().all(|a| a % 4096 == 0));
    assert_eq!(p.counters().unwrap().pinned_pages, before.pinned_pages + 16);
    // SAFETY: as above.
    assert!(unsafe { p.map_host(base, 4096) }.is_err(), "the same range twice");
    // SAFETY: as above.
    assert!(unsafe { p.map_host(base.add(60 << 10), 8192) }.is_err(), "an overlapping range");
    // SAFETY: a mapping of no pages under a handle the module never gave:
    // the module must refuse it, and nothing is reachable through it.
    let stale = unsafe { ugds::platform::HostMapping::from_parts(Vec::new().into(), 0, 999_999) };
    // SAFETY: checks the module's own refusal of unknown and stale handles;
    // `m` is used by no command.
    unsafe {
        assert!(p.unmap_host(&stale).is_err(), "an unknown handle");
        p.unmap_host(&m).unwrap();
        assert!(p.unmap_host(&m).is_err(), "a handle already released");
    }
    let after = p.counters().unwrap();
    assert_eq!((after.pinned_pages, after.live_mappings), (before.pinned_pages, before.live_mappings));
    assert!(p.map_dmabuf(-1, 0, 4096).is_err(), "a bad dma-buf descriptor");
    // A module built without NVIDIA's sources has no nvidia_p2p.
    let e = p.map_nvidia_p2p(0x7f00_0000_0000, 65536).unwrap_err();
    assert!(e.to_string().contains("not supported") || e.to_string().contains("95"), "{e}");
}

/// A memfd of `len` bytes turned into a dma-buf by udmabuf, and a shared
/// CPU view of the memfd; None where there is no /dev/udmabuf.
fn udmabuf(len: usize) -> Option<(std::os::fd::OwnedFd, std::os::fd::OwnedFd, *mut u8)> {
    use std::os::fd::AsRawFd;
    let (memfd, buf) = match ugds::platform::sys::udmabuf(len) {
        Ok(x) => x,
        Err(ugds::Error::Unsupported(_)) => return None,
        Err(e) => panic!("udmabuf: {e}"),
    };
    // SAFETY: a shared mapping of the memfd we own, `len` bytes.
    let view = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd.as_raw_fd(),
            0,
        )
    } as *mut u8;
    assert!(view as isize != -1);
    Some((memfd, buf, view))
}

#[test]
fn dmabuf_registered_through_the_public_api() {
    use std::os::fd::AsFd;
    const LEN: usize = 2 << 20;
    let Some((_memfd, dmabuf, view)) = udmabuf(LEN) else {
        eprintln!("skipped: no /dev/udmabuf");
        return;
    };
    let d = Driver::open();
    let (h, _emu) = target(&d);
    // A range that does not start on a page: offsets count from it.
    let r = d.register_dmabuf(dmabuf.as_fd(), 4096 + 512, LEN - 8192);
    if pci().is_some() && drv().is_none() {
        // vfio cannot import dma-bufs (iommufd does not as of Linux 6.19).
        assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
        return;
    }
    if let (Some(_), Err(e)) = (rdma(), &r) {
        // Over NVMe/RDMA a dma-buf is registered with the RDMA device
        // (ibv_reg_dmabuf_mr); a device without dma-buf memory regions
        // (soft RoCE) refuses it, and the refusal says so.
        assert!(matches!(e, Error::Unsupported(m) if m.contains("NVMe/RDMA")), "{e:?}");
        eprintln!("skipped: {e}");
        return;
    }
    let t = r.unwrap();
    let data = pattern(23, 0, 1 << 20);
    // SAFETY: within the memfd view; no I/O is in flight.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), view.add(4096 + 512 + 8192), 1 << 20) };
    let off = 24 << 20;
    assert_eq!(h.write(&t, 1 << 20, off, 8192).unwrap(), 1 << 20);
    assert_eq!(h.read(&t, 1 << 20, off, 16384 + 4096).unwrap(), 1 << 20);
    // SAFETY: the read completed; within the view.
    let back = unsafe { std::slice::from_raw_parts(view.add(4096 + 512 + 16384 + 4096), 1 << 20) };
    assert!(back == &data[..], "data through the registered dma-buf differs");
    // It can be handed on, as registered GPU memory can.
    let x = d.export_dmabuf(&t).unwrap();
    assert_eq!((x.offset, x.len), (4096 + 512, LEN - 8192));
    drop(x);
    d.deregister(&t).unwrap();
    h.close(ugds::Drain::NoWait).unwrap();
    // SAFETY: our mapping, no longer used.
    unsafe { libc::munmap(view.cast(), LEN) };
}

/// `UGDS_TEST_DRV_BDF=<bdf>` (with `UGDS_TEST_DRV`): the module's lifecycle
/// tests, which unbind and rebind that function; a step of their own in the
/// conformance guest.
fn drv_lifecycle() -> Option<(String, String)> {
    let bdf = std::env::var("UGDS_TEST_DRV_BDF").ok().filter(|s| !s.is_empty());
    match (drv(), bdf) {
        (Some(path), Some(bdf)) => Some((path, bdf)),
        _ => {
            eprintln!("SKIPPED: UGDS_TEST_DRV and UGDS_TEST_DRV_BDF are not both set (runs in the QEMU guest)");
            None
        }
    }
}

/// Aborts the process if `f` takes longer than `limit` (a deadlock would
/// otherwise hang the guest until the harness's timeout).
fn within<T>(limit: Duration, what: &str, f: impl FnOnce() -> T) -> T {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let what = what.to_string();
    let dog = std::thread::spawn(move || {
        if rx.recv_timeout(limit) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            eprintln!("{what}: still running after {limit:?}: deadlocked");
            std::process::abort();
        }
    });
    let r = f();
    drop(tx);
    let _ = dog.join();
    r
}

/// One thread maps DMA memory into the process (mmap, under mmap_lock)
/// while another pins fresh host memory (MAP, which takes mmap_lock to pin):
/// the module must not hold its lock around either (it used to, an ABBA
/// deadlock).
#[test]
fn drv_lifecycle_1_mmap_races_map() {
    use ugds::platform::Platform;
    let Some((path, _)) = drv_lifecycle() else { return };
    let p = Arc::new(ugds::platform::ugds_drv::UgdsDrvPlatform::open(&path).unwrap());
    let before = p.counters().unwrap();
    within(Duration::from_secs(60), "mmap against MAP", || {
        std::thread::scope(|s| {
            let q = p.clone();
            s.spawn(move || {
                for _ in 0..2000 {
                    let b = q.alloc_dma(8192).unwrap();
                    b.write_u32(0, 1);
                }
            });
            for _ in 0..2000 {
                // Fresh pages never touched: pinning them faults them in,
                // which takes mmap_lock (the slow path of GUP).
                let len = 64 << 10;
                // SAFETY: a new private anonymous mapping, unmapped below.
                let mem = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                };
                assert_ne!(mem, libc::MAP_FAILED);
                // SAFETY: `mem` outlives the mapping, removed just below.
                let m = unsafe { p.map_host(mem.cast(), len) }.unwrap();
                // SAFETY: its mapping, used by no command in flight.
                unsafe { p.unmap_host(&m) }.unwrap();
                // SAFETY: ours, no longer mapped for the device.
                unsafe { libc::munmap(mem, len) };
            }
        })
    });
    let c = p.counters().unwrap();
    assert_eq!((c.pinned_pages, c.live_mappings), (0, before.live_mappings), "{c:?}");
}

/// Unbinding while a process has BAR0 and DMA memory mapped stops the
/// device and takes the mappings away: an access afterwards gets SIGBUS
/// (not reused pages), the open file gets ENODEV, closing it after the
/// unbind is harmless, and a rebound device starts with nothing held.
#[test]
fn drv_lifecycle_2_unbind_while_mapped() {
    use ugds::platform::Platform;
    let Some((path, bdf)) = drv_lifecycle() else { return };
    let p = ugds::platform::ugds_drv::UgdsDrvPlatform::open(&path).unwrap();
    let cap = p.read64(0);
    assert_ne!(cap, u64::MAX, "BAR0 reads");
    let dma = p.alloc_dma(8192).unwrap();
    dma.write_u32(0, 0x5a5a_5a5a);
    std::fs::write("/sys/bus/pci/drivers/ugds_drv/unbind", &bdf).unwrap();
    // In a child each (the access kills it): BAR0, then the DMA memory.
    for what in ["BAR0", "DMA memory"] {
        // SAFETY: the child only reads through mappings and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let v = if what == "BAR0" { p.read32(0x1c) } else { dma.read_u32(0) };
            // Reached only if the access did not fault.
            // SAFETY: ends the child without running the parent's state down.
            unsafe { libc::_exit(if v == 0x5a5a_5a5a { 3 } else { 2 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
            "{what} after unbind: status {status:#x} (exit 3: the old contents were still readable)"
        );
    }
    assert!(p.counters().is_err(), "the open file answers ENODEV after unbind");
    drop(dma);
    drop(p); // close after unbind
    std::fs::write("/sys/bus/pci/drivers_probe", &bdf).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::path::Path::new(&path).exists() {
        assert!(std::time::Instant::now() < deadline, "{path} did not come back after rebinding");
        std::thread::sleep(Duration::from_millis(50));
    }
    let p = ugds::platform::ugds_drv::UgdsDrvPlatform::open(&path).unwrap();
    let c = p.counters().unwrap();
    assert_eq!((c.total_pinned_pages, c.total_mappings), (0, 0), "{c:?}");
}

/// Through ugds_drv only: pinned host memory is charged to the process's
/// locked memory (RLIMIT_MEMLOCK, VmLck), as vfio charges it, and given back
/// when the mapping goes.
#[test]
fn drv_pinned_memory_is_charged_to_the_process() {
    use ugds::platform::Platform;
    let Some(path) = drv() else {
        eprintln!("SKIPPED: UGDS_TEST_DRV is not set (runs in the QEMU guest)");
        return;
    };
    fn vm_lck_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let l = s.lines().find(|l| l.starts_with("VmLck:")).expect("VmLck in /proc/self/status");
        l.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
    let p = ugds::platform::ugds_drv::UgdsDrvPlatform::open(&path).unwrap();
    let mut host = ugds::HostBuffer::new(1 << 20).unwrap();
    let before = vm_lck_kib();
    // SAFETY: `host` outlives the mapping, removed below.
    let m = unsafe { p.map_host(host.as_mut_ptr(), host.len()) }.unwrap();
    assert_eq!(vm_lck_kib(), before + 1024, "1 MiB pinned is charged");
    // SAFETY: its mapping, used by no command in flight.
    unsafe { p.unmap_host(&m) }.unwrap();
    assert_eq!(vm_lck_kib(), before, "and given back");
}

/// ugds_drv's GPU-memory path against nv_p2p_fake (kmod/test), the NVIDIA
/// driver's stand-in: its debugfs directory and the drv node, when the
/// debug guest loaded it and the module built against it.
fn nv_p2p_fake() -> Option<(String, std::path::PathBuf, bool)> {
    match (drv(), std::env::var_os("UGDS_TEST_NV_P2P")) {
        (Some(path), Some(dir)) => {
            let p = std::fs::read_to_string("/sys/module/nv_p2p_fake/parameters/persistent").unwrap();
            Some((path, dir.into(), p.trim() == "Y"))
        }
        _ => {
            eprintln!("SKIPPED: UGDS_TEST_NV_P2P is not set (runs in the QEMU debug guest, with nv_p2p_fake)");
            None
        }
    }
}

/// The stand-in's live ranges (GPU memory it has handed out).
fn fake_ranges(dir: &std::path::Path) -> usize {
    std::fs::read_to_string(dir.join("ranges")).unwrap().trim().parse().unwrap()
}

/// Takes the range at `va` back, as the NVIDIA driver does when the memory
/// is freed under a mapping: its free callback runs before this returns.
fn fake_revoke(dir: &std::path::Path, va: u64) -> std::io::Result<()> {
    std::fs::write(dir.join("revoke"), format!("{va:#x}"))
}

const P2P_VA: u64 = 0x7000_0000_0000;
const P2P_LEN: usize = 1 << 20;

/// The NVIDIA driver's free callback racing UNMAP, racing MAP (the mapping
/// half built), and after it UNMAP: no use after free, no double put, no
/// lock inversion (the stand-in calls back holding the lock its put_pages
/// takes, as the driver does; the debug kernel's lockdep and KASAN watch),
/// and every range given back. With persistent pages there is no callback:
/// taking the memory back is refused while it is mapped.
#[test]
fn drv_nvidia_p2p_1_free_callback_races_unmap_and_map() {
    use ugds::platform::Platform;
    let Some((path, dir, persistent)) = nv_p2p_fake() else { return };
    let p = ugds::platform::ugds_drv::UgdsDrvPlatform::open(&path).unwrap();
    let before = p.counters().unwrap();
    within(Duration::from_secs(300), "nvidia_p2p callback against UNMAP and MAP", || {
        for round in 0..300u64 {
            let va = P2P_VA + (round % 8) * P2P_LEN as u64;
            match round % 3 {
                0 => {
                    let m = p.map_nvidia_p2p(va, P2P_LEN).unwrap();
                    std::thread::scope(|s| {
                        let d = &dir;
                        s.spawn(move || {
                            let r = fake_revoke(d, va);
                            assert!(!persistent || r.is_err(), "persistent pages were taken back");
                        });
                        // SAFETY: its mapping, used by no command in flight.
                        unsafe { p.unmap_host(&m) }.unwrap();
                    });
                }
                1 => std::thread::scope(|s| {
                    let d = &dir;
                    s.spawn(move || {
                        for _ in 0..200 {
                            if fake_revoke(d, va).is_ok() {
                                break;
                            }
                        }
                    });
                    // Taken back while half built, MAP fails; else it is ours.
                    if let Ok(m) = p.map_nvidia_p2p(va, P2P_LEN) {
                        // SAFETY: its mapping, used by no command in flight.
                        unsafe { p.unmap_host(&m) }.unwrap();
                    }
                }),
                _ => {
                    let m = p.map_nvidia_p2p(va, P2P_LEN).unwrap();
                    assert_eq!(fake_revoke(&dir, va).is_ok(), !persistent);
                    // SAFETY: its mapping, used by no command in flight.
                    unsafe { p.unmap_host(&m) }.unwrap();
                }
            }
        }
    });
    assert_eq!(fake_ranges(&dir), 0, "every range was given back");
    assert_eq!(p.counters().unwrap().live_mappings, before.live_mappings);
}

/// When the NVIDIA driver takes memory back under a live mapping, the free
/// callback stops the controller before it returns: CC.EN and CSTS.RDY read
/// 0 and bus mastering is off once the driver's call returns. With
/// persistent pages nothing is taken back and the controller runs on.
#[test]
fn drv_nvidia_p2p_2_taken_back_stops_the_controller() {
    use ugds::platform::Platform;
    let Some((path, dir, persistent)) = nv_p2p_fake() else { return };
    let bdf = std::env::var("UGDS_TEST_DRV_BDF").expect("the guest sets UGDS_TEST_DRV_BDF");
    let bus_master = || std::fs::read(format!("/sys/bus/pci/devices/{bdf}/config")).unwrap()[4] & 4 != 0;
    let p = ugds::platform::ugds_drv::UgdsDrvPlatform::open(&path).unwrap();
    // Enabled with an (idle) admin queue pair: no command is needed.
    let (asq, acq) = (p.alloc_dma(4096).unwrap(), p.alloc_dma(4096).unwrap());
    // SAFETY: the admin queues are DMA buffers of this platform, kept
    // until the controller is disabled below.
    unsafe {
        p.write32(0x24, 15 << 16 | 15);
        p.write64(0x28, asq.iova(0));
        p.write64(0x30, acq.iova(0));
        p.write32(0x14, 4 << 20 | 6 << 16 | 1);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while p.read32(0x1c) & 1 == 0 {
        assert!(std::time::Instant::now() < deadline, "the controller did not become ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(bus_master(), "bus mastering is on while the file is open");
    let m = p.map_nvidia_p2p(P2P_VA, P2P_LEN).unwrap();
    let taken = fake_revoke(&dir, P2P_VA);
    let (cc, csts) = (p.read32(0x14), p.read32(0x1c));
    if persistent {
        assert!(taken.is_err(), "persistent pages were taken back");
        assert_eq!((cc & 1, csts & 1), (1, 1), "the controller runs on");
    } else {
        taken.unwrap();
        assert_eq!((cc & 1, csts & 1), (0, 0), "stopped before the callback returned (CC {cc:#x}, CSTS {csts:#x})");
        assert!(!bus_master(), "bus mastering is off");
    }
    // SAFETY: its mapping, used by no command in flight.
    unsafe { p.unmap_host(&m) }.unwrap();
    assert_eq!(fake_ranges(&dir), 0, "the range was given back once");
}
