//! The emulated controller as a device: the spec's checks, DMA faults and
//! doorbell errors, driven through the engine's public types.

mod common;
use common::*;
use std::sync::Arc;
use ugds::engine::{Controller, NvmeQueue, Owner, QueuePair, Transport};
use ugds::nvme::cmd::NvmOpcode;
use ugds::nvme::status::{command_specific as cs, generic};
use ugds::nvme::{regs, Cid, Lba, Nsid, PrpPlan, Qid, Sqe};
use ugds::Error;
use ugds_emu::{EmuPlatform, NamespaceConfig};

fn controller(cfg: ugds_emu::EmuConfig, queues: u16) -> (Controller, ugds_emu::EmuControl) {
    let emu = EmuPlatform::new(cfg).unwrap();
    let c = emu.control();
    (Controller::bring_up(Arc::new(emu), queues).unwrap(), c)
}

fn expect_status(r: Result<ugds::nvme::Cqe, Error>, sct: u8, sc: u8) {
    match r {
        Err(Error::Nvme { status, .. }) => assert_eq!((status.sct, status.sc), (sct, sc), "{status}"),
        other => panic!("expected status {sct:#x}/{sc:#x}, got {other:?}"),
    }
}

#[test]
fn identify_reports_the_configuration() {
    let cfg = small_emu()
        .mdts(3)
        .mqes(255)
        .namespaces(vec![NamespaceConfig::memory(1 << 20, 512), NamespaceConfig::memory(4 << 20, 4096)]);
    let (c, _) = controller(cfg, 4);
    let i = c.info();
    assert_eq!(i.cap.mqes(), 255);
    assert!(i.cap.cqr());
    assert_eq!(i.max_transfer, Some(32 << 10));
    assert_eq!(i.identify.nn, 2);
    assert_eq!(i.version.to_string(), "1.4.0");
    assert_eq!(i.namespaces.len(), 2);
    assert_eq!((i.namespaces[1].nsid, i.namespaces[1].block_size, i.namespaces[1].blocks), (2, 4096, 1024));
    assert_eq!(i.io_queues, 4);
}

#[test]
fn queues_are_granted_up_to_the_controllers_limit() {
    let (c, _) = controller(small_emu().max_io_queues(2), 8);
    assert_eq!(c.info().io_queues, 2);
}

#[test]
fn queue_creation_follows_the_spec() {
    let (c, _) = controller(small_emu().max_io_queues(2).mqes(15), 2);
    let p = c.platform().clone();
    let qp = NvmeQueue::new(p.clone(), Qid(1), 16, 0, None).unwrap();
    // SQ before its CQ: Completion Queue Invalid.
    expect_status(c.admin_command(Sqe::create_io_sq(Cid(0), Qid(1), 16, qp.sq_iova(), Qid(1)), "x"), 1, cs::INVALID_CQ);
    // More entries than MQES allows.
    expect_status(
        c.admin_command(Sqe::create_io_cq(Cid(0), Qid(1), 17, qp.cq_iova(), 0, false), "x"),
        1,
        cs::INVALID_QUEUE_SIZE,
    );
    // A queue id past the granted count, and queue 0.
    expect_status(
        c.admin_command(Sqe::create_io_cq(Cid(0), Qid(3), 16, qp.cq_iova(), 0, false), "x"),
        1,
        cs::INVALID_QID,
    );
    expect_status(
        c.admin_command(Sqe::create_io_cq(Cid(0), Qid(0), 16, qp.cq_iova(), 0, false), "x"),
        1,
        cs::INVALID_QID,
    );
    // A queue base that is not page aligned.
    expect_status(
        c.admin_command(Sqe::create_io_cq(Cid(0), Qid(1), 16, qp.cq_iova() + 64, 0, false), "x"),
        0,
        generic::INVALID_PRP_OFFSET,
    );
    // An interrupt vector that does not exist.
    expect_status(
        c.admin_command(Sqe::create_io_cq(Cid(0), Qid(1), 16, qp.cq_iova(), 999, true), "x"),
        1,
        cs::INVALID_INTERRUPT_VECTOR,
    );
    // Now properly: CQ, SQ; a second CQ with the same id is refused.
    c.admin_command(Sqe::create_io_cq(Cid(0), Qid(1), 16, qp.cq_iova(), 0, false), "x").unwrap();
    expect_status(
        c.admin_command(Sqe::create_io_cq(Cid(0), Qid(1), 16, qp.cq_iova(), 0, false), "x"),
        1,
        cs::INVALID_QID,
    );
    c.admin_command(Sqe::create_io_sq(Cid(0), Qid(1), 16, qp.sq_iova(), Qid(1)), "x").unwrap();
    // Number of queues cannot change once I/O queues exist.
    expect_status(c.admin_command(Sqe::set_num_queues(Cid(0), 1, 1), "x"), 0, generic::COMMAND_SEQUENCE_ERROR);
    // A CQ with an SQ still attached cannot be deleted.
    expect_status(c.admin_command(Sqe::delete_io_cq(Cid(0), Qid(1)), "x"), 1, cs::INVALID_QUEUE_DELETION);
    let qp = QueuePair::from(qp);
    c.delete_io_qpair(&qp).unwrap();
    expect_status(c.admin_command(Sqe::delete_io_sq(Cid(0), Qid(1)), "x"), 1, cs::INVALID_QID);
    // Unknown admin opcode.
    expect_status(c.admin_command(Sqe::new(0x7f, Cid(0)), "x"), 0, generic::INVALID_OPCODE);
}

fn io_qpair(c: &Controller) -> QueuePair {
    c.create_io_qpair(1, 16, None).unwrap()
}

fn run(qp: &mut QueuePair, sqe: Sqe, prp: Option<PrpPlan<'_>>) -> ugds::nvme::Cqe {
    qp.submit(sqe, prp, Owner::Own(42)).unwrap();
    qp.ring_sq_doorbell();
    let mut out = None;
    let t = std::time::Instant::now();
    while out.is_none() {
        qp.process_completions(1, |tag, cqe| {
            assert_eq!(tag, Owner::Own(42));
            out = Some(*cqe)
        });
        assert!(t.elapsed().as_secs() < 5, "no completion");
    }
    out.unwrap()
}

#[test]
fn unmapped_and_misaligned_prps_are_dma_faults() {
    let (c, emu) = controller(small_emu(), 1);
    let mut qp = io_qpair(&c);
    let read = |prp1, prp2, nlb| Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(1), Lba(0), nlb, prp1, prp2);
    // An address nobody mapped.
    let cqe = run(&mut qp, read(0x1000, 0, 8), None);
    assert_eq!(cqe.status().sc, generic::DATA_TRANSFER_ERROR);
    assert_eq!(emu.stats().dma_faults, 1);
    // PRP1 not dword aligned.
    let buf = c.platform().alloc_dma(16384).unwrap();
    let cqe = run(&mut qp, read(buf.iova(2), 0, 1), None);
    assert_eq!(cqe.status().sc, generic::INVALID_PRP_OFFSET);
    // PRP2 (a data page) with an offset.
    let cqe = run(&mut qp, read(buf.iova(0), buf.iova(4096 + 512), 16), None);
    assert_eq!(cqe.status().sc, generic::INVALID_PRP_OFFSET);
    // A PRP list pointer to unmapped memory.
    let cqe = run(&mut qp, read(buf.iova(0), 0xdead_0000, 24), None);
    assert_eq!(cqe.status().sc, generic::DATA_TRANSFER_ERROR);
    assert_eq!(emu.stats().dma_faults, 4);
    // A correct one works.
    let cqe = run(&mut qp, read(buf.iova(0), buf.iova(4096), 16), None);
    assert!(cqe.status().is_success());
    assert_eq!(emu.stats().dma_faults, 4);
    c.delete_io_qpair(&qp).unwrap();
}

#[test]
fn io_command_checks() {
    let (c, _) = controller(small_emu().mdts(1), 1);
    let mut qp = io_qpair(&c);
    let buf = c.platform().alloc_dma(65536).unwrap();
    let pages: Vec<u64> = (0..16).map(|i| buf.iova(i * 4096)).collect();
    let blocks = c.info().namespaces[0].blocks;
    // Past the end of the namespace.
    let s = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(1), Lba(blocks - 1), 2, buf.iova(0), 0);
    assert_eq!(run(&mut qp, s, None).status().sc, generic::LBA_OUT_OF_RANGE);
    // Larger than MDTS (8 KiB).
    let plan = ugds::nvme::prp::plan(&pages, 4096, 0, 12288).unwrap();
    let s = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(1), Lba(0), 24, 0, 0);
    assert_eq!(run(&mut qp, s, Some(plan)).status().sc, generic::INVALID_FIELD);
    // A namespace that does not exist.
    let s = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(9), Lba(0), 1, buf.iova(0), 0);
    assert_eq!(run(&mut qp, s, None).status().sc, generic::INVALID_NAMESPACE);
    // An unknown I/O opcode.
    assert_eq!(run(&mut qp, Sqe::new(0x7e, Cid(0)), None).status().sc, generic::INVALID_OPCODE);
    // Dataset Management deallocates: the range reads back as zeros.
    buf.write_bytes(0, &[0xffu8; 8192]);
    let plan = ugds::nvme::prp::plan(&pages, 4096, 0, 8192).unwrap();
    let s = Sqe::rw(NvmOpcode::Write, Cid(0), Nsid(1), Lba(0), 16, 0, 0);
    assert!(run(&mut qp, s, Some(plan)).status().is_success());
    let range = ugds::nvme::cmd::DsmRange { cattr: 0, nlb: 8, slba: 0 };
    buf.write_bytes(32768, &range.to_bytes());
    let s = Sqe::dataset_management(Cid(0), Nsid(1), 1, buf.iova(32768), true);
    assert!(run(&mut qp, s, None).status().is_success());
    let plan = ugds::nvme::prp::plan(&pages, 4096, 0, 8192).unwrap();
    let s = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(1), Lba(0), 16, 0, 0);
    assert!(run(&mut qp, s, Some(plan)).status().is_success());
    let mut back = vec![0u8; 8192];
    buf.read_bytes(0, &mut back);
    assert!(back[..4096].iter().all(|&b| b == 0));
    assert!(back[4096..].iter().all(|&b| b == 0xff));
    c.delete_io_qpair(&qp).unwrap();
}

#[test]
fn doorbell_values_outside_the_queue_are_ignored_and_counted() {
    let (c, emu) = controller(small_emu(), 1);
    let qp = io_qpair(&c);
    // SAFETY: doorbells over no entries (the queue is empty), and one of a
    // queue that does not exist: nothing names memory.
    unsafe { c.platform().write32(regs::sq_tail_doorbell(1, 0), 16) }; // queue has 16 entries: 0..=15
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(emu.stats().invalid_doorbells, 1);
    // A doorbell for a queue the controller does not have.
    // SAFETY: as above.
    unsafe { c.platform().write32(regs::sq_tail_doorbell(500, 0), 1) };
    assert_eq!(emu.stats().invalid_doorbells, 2);
    // SAFETY: as above.
    unsafe { c.platform().write32(regs::sq_tail_doorbell(1, 0), 0) };
    c.delete_io_qpair(&qp).unwrap();
}

#[test]
fn completion_queue_wraps_many_times() {
    let (c, emu) = controller(small_emu(), 1);
    let mut qp = c.create_io_qpair(1, 4, None).unwrap();
    let buf = c.platform().alloc_dma(4096).unwrap();
    for i in 0..1000u64 {
        let s = Sqe::rw(NvmOpcode::Write, Cid(0), Nsid(1), Lba(i % 64), 1, buf.iova(0), 0);
        assert!(run(&mut qp, s, None).status().is_success());
    }
    assert_eq!(emu.stats().writes, 1000);
    assert_eq!(qp.protocol_errors(), 0);
    c.delete_io_qpair(&qp).unwrap();
}

#[test]
fn disable_then_enable_again() {
    let (c, emu) = controller(small_emu(), 1);
    c.shutdown().unwrap();
    assert!(!c.csts().rdy());
    assert_eq!(emu.stats().resets, 1);
    drop(c);
}

#[test]
fn polled_queues_report_the_cq_head_lazily_and_never_fill_the_cq() {
    use std::time::{Duration, Instant};
    // 16-entry queues: at most 15 commands in flight, and completions
    // reported every quarter ring; a full queue must keep moving.
    let cfg = small_emu().mqes(15);
    let o = opts().queue_depth(16);
    let (d, h, emu) = open(cfg, o);
    let b = Buf::new(&d, 15 * 4096);
    let mut q = h.io_queue().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut submitted, mut done) = (0u64, 0u64);
    let before = emu.stats().doorbell_writes;
    while done < 3000 {
        while q.outstanding() < 15 && submitted < 3000 {
            let slot = (submitted % 15) as usize;
            q.submit_read(&b.token, 4096, (submitted % 1000) * 4096, slot * 4096, submitted).unwrap();
            submitted += 1;
        }
        done += q.poll(usize::MAX, |_, r| assert_eq!(r.unwrap(), 4096)) as u64;
        assert!(Instant::now() < deadline, "stuck at {done} of 3000: a completion had no CQ slot");
    }
    drop(q);
    // Sequential synchronous reads: one submission doorbell each, and the
    // completion doorbell only every few.
    let before_sync = emu.stats().doorbell_writes;
    for i in 0..400u64 {
        h.read(&b.token, 4096, i * 4096, 0).unwrap();
    }
    let sync_writes = emu.stats().doorbell_writes - before_sync;
    assert!((400..600).contains(&sync_writes), "{sync_writes} doorbell writes for 400 reads");
    assert!(emu.stats().doorbell_writes - before < 2 * 3000 + 2 * 400);
}

/// A namespace on a descriptor serves the file the descriptor names, even
/// once its name is gone, and never creates or extends a file.
#[test]
fn a_namespace_on_a_descriptor_serves_that_file() {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::OwnedFd;
    let path = std::env::temp_dir().join(format!("ugds-emu-fd-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.write_all(&pattern(4, 0, 1 << 20)).unwrap();
    std::fs::remove_file(&path).unwrap();
    let fd = OwnedFd::from(f.try_clone().unwrap());
    let too_big = NamespaceConfig::descriptor(fd.try_clone().unwrap(), 2 << 20, 512);
    assert!(matches!(
        EmuPlatform::new(ugds_emu::EmuConfig::default().namespaces(vec![too_big])),
        Err(Error::InvalidArgument(_))
    ));
    let cfg = ugds_emu::EmuConfig::default().namespaces(vec![NamespaceConfig::descriptor(fd, 1 << 20, 512)]);
    let (d, h, _e) = open(cfg, opts());
    let mut b = Buf::new(&d, 8192);
    h.read(&b.token, 8192, 4096, 0).unwrap();
    assert!(b.mem[..] == pattern(4, 4096, 8192)[..]);
    b.mem.copy_from_slice(&pattern(5, 0, 8192));
    h.write(&b.token, 8192, 65536, 0).unwrap();
    drop(b);
    drop(h);
    let mut got = vec![0u8; 8192];
    f.seek(SeekFrom::Start(65536)).unwrap();
    f.read_exact(&mut got).unwrap();
    assert!(got == pattern(5, 0, 8192), "the write reached the caller's file");
    assert!(!path.exists(), "no file was made by name");
}

/// "GPU memory" for the emulator: bytes behind a made-up device address,
/// reached only through the runtime's copies, as CUDA memory is; with a
/// gate, each copy waits there once started (a command the controller is
/// still moving data for).
struct FakeGpu {
    base: u64,
    mem: std::sync::Mutex<Vec<u8>>,
    gate: Option<Gate>,
}

#[derive(Default)]
struct Gate {
    started: std::sync::atomic::AtomicBool,
    open: (std::sync::Mutex<bool>, std::sync::Condvar),
}

impl Gate {
    fn pass(&self) {
        self.started.store(true, std::sync::atomic::Ordering::Release);
        let (open, cv) = &self.open;
        let mut o = open.lock().unwrap();
        while !*o {
            o = cv.wait(o).unwrap();
        }
    }

    fn started(&self) -> bool {
        self.started.load(std::sync::atomic::Ordering::Acquire)
    }

    fn release(&self) {
        *self.open.0.lock().unwrap() = true;
        self.open.1.notify_all();
    }
}

impl FakeGpu {
    fn new(len: usize, gate: Option<Gate>) -> FakeGpu {
        FakeGpu { base: 0x10_0000_0000, mem: std::sync::Mutex::new(vec![0; len]), gate }
    }
}

impl ugds::gpu::DeviceRuntime for FakeGpu {
    fn name(&self) -> &'static str {
        "fake"
    }
    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> ugds::Result<()> {
        self.gate.as_ref().inspect(|g| g.pass());
        let off = (dst - self.base) as usize;
        self.mem.lock().unwrap()[off..off + src.len()].copy_from_slice(src);
        Ok(())
    }
    unsafe fn copy_from_device(&self, dst: &mut [u8], src: u64) -> ugds::Result<()> {
        self.gate.as_ref().inspect(|g| g.pass());
        let off = (src - self.base) as usize;
        dst.copy_from_slice(&self.mem.lock().unwrap()[off..off + dst.len()]);
        Ok(())
    }
    fn host_register(&self, _: *mut u8, _: usize) -> bool {
        false
    }
    fn host_unregister(&self, _: *mut u8) {}
    fn export_dmabuf(&self, _: u64, _: usize) -> ugds::Result<ugds::gpu::DmabufExport> {
        Err(Error::Unsupported("fake".into()))
    }
}

/// With device memory mapped, a command on GPU memory goes to the GPU copy
/// thread and one on host memory runs on the controller's thread, each
/// walked once; both move the right bytes.
#[test]
fn host_and_device_memory_side_by_side() {
    let (c, emu) = controller(small_emu(), 1);
    let p = c.platform().clone();
    let gpu = Arc::new(FakeGpu::new(8192, None));
    let mem = ugds::gpu::DeviceMemory { ptr: gpu.base, len: 8192, runtime: gpu.clone() };
    // SAFETY: the fake memory lives as long as `gpu`, past the unmap below.
    let dev = unsafe { p.map_device(&mem) }.unwrap();
    let host = p.alloc_dma(4096).unwrap();
    for i in 0..4096 {
        // SAFETY: within the 4096 bytes just allocated.
        unsafe { host.vaddr().add(i).write(i as u8 ^ 0x5a) };
    }
    let mut qp = io_qpair(&c);
    let rw = |op, lba, prp1| Sqe::rw(op, Cid(0), Nsid(1), Lba(lba), 8, prp1, 0);
    // Host -> namespace (the controller's thread), namespace -> GPU (the copy thread).
    assert!(run(&mut qp, rw(NvmOpcode::Write, 0, host.iova(0)), None).status().is_success());
    assert!(run(&mut qp, rw(NvmOpcode::Read, 0, dev.pages()[0]), None).status().is_success());
    let want: Vec<u8> = (0..4096).map(|i| i as u8 ^ 0x5a).collect();
    assert!(gpu.mem.lock().unwrap()[..4096] == want[..], "the GPU got the bytes");
    // GPU -> namespace -> host.
    gpu.mem.lock().unwrap()[4096..].fill(0xc3);
    assert!(run(&mut qp, rw(NvmOpcode::Write, 8, dev.pages()[1]), None).status().is_success());
    assert!(run(&mut qp, rw(NvmOpcode::Read, 8, host.iova(0)), None).status().is_success());
    // SAFETY: the 4096 bytes the read just filled.
    let back = unsafe { std::slice::from_raw_parts(host.vaddr(), 4096) };
    assert!(back.iter().all(|&b| b == 0xc3), "the host got the GPU's bytes");
    assert_eq!(emu.stats().dma_faults, 0);
    c.delete_io_qpair(&qp).unwrap();
    // SAFETY: its mapping, used by no command in flight.
    unsafe { p.unmap_host(&dev) }.unwrap();
}

/// Delete I/O Submission Queue completes only once the commands of that
/// queue have stopped moving data: the host may then unmap their memory
/// (what an owner does after an attached process dies mid-I/O, where the
/// memory is another process's GPU allocation). A read into GPU memory is
/// held in its copy while the queue is deleted.
#[test]
fn deleting_a_queue_waits_for_its_commands_still_moving_data() {
    let (c, emu) = controller(small_emu(), 1);
    let p = c.platform().clone();
    let gpu = Arc::new(FakeGpu::new(4096, Some(Gate::default())));
    let gate = gpu.gate.as_ref().expect("made with one");
    let mem = ugds::gpu::DeviceMemory { ptr: gpu.base, len: 4096, runtime: gpu.clone() };
    // SAFETY: the fake memory lives as long as `gpu`, past the unmap below.
    let dev = unsafe { p.map_device(&mem) }.unwrap();
    let mut qp = io_qpair(&c);
    let read = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(1), Lba(0), 8, dev.pages()[0], 0);
    qp.submit(read, None, Owner::Own(1)).unwrap();
    qp.ring_sq_doorbell();
    wait_for("the read's copy into GPU memory to start", || gate.started());
    let (early, deleted) = std::thread::scope(|s| {
        let del = s.spawn(|| c.admin_command(Sqe::delete_io_sq(Cid(0), Qid(1)), "Delete I/O Submission Queue"));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let early = del.is_finished();
        gate.release();
        (early, del.join().unwrap())
    });
    assert!(!early, "the queue was deleted while one of its commands was still copying into GPU memory");
    deleted.unwrap();
    c.admin_command(Sqe::delete_io_cq(Cid(0), Qid(1)), "Delete I/O Completion Queue").unwrap();
    drop(qp);
    // SAFETY: no command in flight reaches it (the delete waited for it).
    unsafe { p.unmap_host(&dev) }.unwrap();
    assert_eq!(emu.stats().dma_faults, 0);
    // The controller goes on: a new queue with the same id works.
    let mut qp = io_qpair(&c);
    let host = p.alloc_dma(4096).unwrap();
    let read = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(1), Lba(0), 8, host.iova(0), 0);
    assert!(run(&mut qp, read, None).status().is_success());
    c.delete_io_qpair(&qp).unwrap();
}

#[test]
fn a_controller_serves_a_second_handle_after_the_first_closed() {
    let emu = Arc::new(EmuPlatform::new(small_emu().max_io_queues(2)).unwrap());
    let d = ugds::Driver::open();
    let mut b = Buf::new(&d, 8192);
    for round in 0..3u8 {
        let h = d.open_handle(emu.clone(), opts()).unwrap();
        b.mem.copy_from_slice(&pattern(round, 4096 * round as u64, 8192));
        h.write(&b.token, 8192, 4096 * round as u64, 0).unwrap();
        b.mem.fill(0);
        h.read(&b.token, 8192, 4096 * round as u64, 0).unwrap();
        assert!(b.mem[..] == pattern(round, 4096 * round as u64, 8192)[..], "round {round}");
        h.close(ugds::Drain::NoWait).unwrap();
    }
}

#[test]
fn dropping_a_closed_handle_leaves_the_next_one_running() {
    // The old handle's controller object goes last, after a new handle
    // enabled the controller again: it must not disable it.
    let emu = Arc::new(EmuPlatform::new(small_emu().max_io_queues(2)).unwrap());
    let d = ugds::Driver::open();
    let mut b = Buf::new(&d, 8192);
    let old = d.open_handle(emu.clone(), opts()).unwrap();
    old.close(ugds::Drain::NoWait).unwrap();
    let new = d.open_handle(emu.clone(), opts()).unwrap();
    drop(old);
    b.mem.copy_from_slice(&pattern(9, 0, 8192));
    new.write(&b.token, 8192, 0, 0).unwrap();
    b.mem.fill(0);
    new.read(&b.token, 8192, 0, 0).unwrap();
    assert!(b.mem[..] == pattern(9, 0, 8192)[..]);
    new.close(ugds::Drain::NoWait).unwrap();
}

#[test]
fn a_completion_ring_view_outlives_its_queue_pair() {
    // The view shares the ring's memory: reading it after the queue pair
    // is gone reads memory still allocated, not freed (or unmapped) memory.
    let emu = EmuPlatform::new(small_emu()).unwrap();
    let p: Arc<dyn ugds::platform::Platform> = Arc::new(emu);
    let qp = NvmeQueue::new(p.clone(), Qid(1), 16, 0, None).unwrap();
    let view = qp.cq_view();
    drop(qp);
    assert!(!view.is_new(0, true), "a fresh ring has no new entry");
    // Outside the ring: a panic, in every build.
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| view.is_new(16, true))).is_err());
}

/// SGL commands: data blocks in any order are walked; a list that does not
/// add up, a type the controller does not take and a segment of a bad
/// length get their statuses; a controller without SGLs refuses them.
#[test]
fn sgl_commands_are_walked_and_bad_lists_refused() {
    use ugds::nvme::sgl::{self, Descriptor, Piece};
    let (c, emu) = controller(small_emu(), 1);
    assert!(sgl::supported(c.info().identify.sgls), "the emulator says it takes SGLs");
    let mut qp = io_qpair(&c);
    let buf = c.platform().alloc_dma(65536).unwrap();
    let pages: Vec<u64> = (0..16).map(|i| buf.iova(i * 4096)).collect();
    let data = pattern(5, 0, 8192);
    buf.write_bytes(8192, &data[..4096]);
    buf.write_bytes(0, &data[4096..]);
    // Two pieces, out of order in memory: one command, a Last Segment of two blocks.
    let pieces = [Piece { pages: &pages, offset: 8192, len: 4096 }, Piece { pages: &pages, offset: 0, len: 4096 }];
    let w = Sqe::rw(NvmOpcode::Write, Cid(0), Nsid(1), Lba(64), 16, 0, 0);
    qp.submit_sgl(w, &pieces, Owner::Own(42)).unwrap();
    qp.ring_sq_doorbell();
    let mut done = None;
    while done.is_none() {
        qp.process_completions(1, |_, cqe| done = Some(*cqe));
    }
    assert!(done.unwrap().status().is_success(), "{:?}", done.unwrap().status());
    // Read back with PRPs.
    let plan = ugds::nvme::prp::plan(&pages, 4096, 16384, 8192).unwrap();
    let r = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(1), Lba(64), 16, 0, 0);
    assert!(run(&mut qp, r, Some(plan)).status().is_success());
    let mut back = vec![0u8; 8192];
    for (i, b) in back.iter_mut().enumerate() {
        *b = (buf.read_u64(16384 + i / 8 * 8) >> (8 * (i % 8))) as u8;
    }
    assert!(back == data, "the range holds the pieces in order");
    // Bad lists, by hand.
    let sgl_read = |d: Descriptor, nlb| {
        let mut s = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(1), Lba(0), nlb, 0, 0);
        (s.prp1, s.prp2) = d.to_dptr();
        s.cdw0 |= sgl::PSDT_SGL << 14;
        s
    };
    let faults = emu.stats().dma_faults;
    let short = sgl_read(Descriptor::data_block(buf.iova(0), 512), 2);
    assert_eq!(run(&mut qp, short, None).status().sc, generic::INVALID_SGL_LENGTH);
    let bucket = Descriptor { addr: 0, len: 512, id: sgl::kind::BIT_BUCKET << 4 };
    assert_eq!(run(&mut qp, sgl_read(bucket, 1), None).status().sc, generic::INVALID_SGL_TYPE);
    let odd = Descriptor { addr: buf.iova(4096), len: 20, id: sgl::kind::LAST_SEGMENT << 4 };
    assert_eq!(run(&mut qp, sgl_read(odd, 1), None).status().sc, generic::INVALID_SGL_SEGMENT);
    assert_eq!(emu.stats().dma_faults, faults + 3);
    c.delete_io_qpair(&qp).unwrap();
    // A controller that does not take SGLs says so, and refuses them.
    let (c, _) = controller(small_emu().sgl(false), 1);
    assert!(!sgl::supported(c.info().identify.sgls));
    let mut qp = io_qpair(&c);
    let mem = c.platform().alloc_dma(4096).unwrap();
    let one = sgl_read(Descriptor::data_block(mem.iova(0), 512), 1);
    assert_eq!(run(&mut qp, one, None).status().sc, generic::INVALID_FIELD);
    c.delete_io_qpair(&qp).unwrap();
}

/// A mapping that names a DMA buffer of the platform's own (queues, PRP
/// lists) is refused: only the buffer's drop frees that memory, and the
/// buffer stays usable.
#[test]
fn unmapping_the_platforms_own_dma_memory_is_refused() {
    use ugds::platform::{HostMapping, Platform};
    let emu = EmuPlatform::new(small_emu()).unwrap();
    let buf = emu.alloc_dma(4096).unwrap();
    // SAFETY: names the buffer's own IOVA: the platform must refuse to
    // unmap it, so the buffer's memory stays mapped.
    let forged = unsafe { HostMapping::from_parts(vec![buf.iova(0)].into(), 0, buf.iova(0)) };
    // SAFETY: as above; no command uses the buffer.
    let e = unsafe { emu.unmap_host(&forged) }.unwrap_err();
    assert!(e.to_string().contains("DMA buffer of the platform's own"), "{e}");
    buf.write_u32(0, 0x5a5a_5a5a);
    assert_eq!(buf.read_u32(0), 0x5a5a_5a5a, "the buffer is still mapped and usable");
    // A mapping of the caller's memory is removed, once.
    let mut mem = ugds::HostBuffer::new(4096).unwrap();
    // SAFETY: `mem` outlives the mapping, removed below.
    let m = unsafe { emu.map_host(mem.as_mut_ptr(), 4096) }.unwrap();
    // SAFETY: the mapping just made, used by no command.
    unsafe {
        emu.unmap_host(&m).unwrap();
        assert!(emu.unmap_host(&m).is_err(), "a mapping already removed");
    }
}
