//! GPU memory through the transports that copy it (the kernel path and
//! NVMe/TCP: pinned bounce buffers and the copy engine) and through the
//! emulated controller's I/O workers.
//!
//! These need a CUDA GPU. Where there is none (CI) every test prints why it
//! skipped and passes; run them on the GPU machine (see README, "GPU").
//! `UGDS_REQUIRE_GPU=1` turns a missing GPU into a failure.

mod common;
mod gpu_common;
use common::*;
use gpu_common::*;
use std::time::Duration;
use ugds::gpu::StreamWait;
use ugds::{BatchIo, BatchOp, BatchStatus, StreamIo};

#[test]
fn device_memory_through_emulator_io_workers() {
    // A file-backed namespace whose data 4 threads move at once, each with
    // its own pinned bounce buffer and the shared copy engine.
    let Some(cuda) = cuda() else { return };
    let path = std::env::temp_dir().join(format!("ugds-gpu-workers-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let cfg = ugds_emu::EmuConfig::default()
        .namespaces(vec![ugds_emu::NamespaceConfig::file(&path, 32 << 20, 4096)])
        .io_workers(4);
    let (d, h, _e) = open(cfg, opts());
    let mut host = Buf::new(&d, 8 << 20);
    host.mem.copy_from_slice(&pattern(12, 0, 8 << 20));
    h.write(&host.token, 8 << 20, 0, 0).unwrap();
    let gpu = kept(cuda.alloc(8 << 20).unwrap());
    // SAFETY: deregistered below.
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    let b = h.batch(128).unwrap();
    let ios: Vec<BatchIo> = (0..128)
        .map(|i| BatchIo {
            op: BatchOp::Read,
            buf: t,
            size: 65536,
            file_offset: (127 - i as u64) * 65536,
            buf_offset: i * 65536,
            cookie: i as u64,
        })
        .collect();
    b.submit(&ios).unwrap();
    let mut ev = Vec::new();
    b.get_status(128, 128, Some(Duration::from_secs(20)), &mut ev).unwrap();
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete), "{ev:?}");
    let all = download(&gpu, 0, 8 << 20);
    for i in 0..128usize {
        let want = pattern(12, ((127 - i) * 65536) as u64, 65536);
        assert!(all[i * 65536..(i + 1) * 65536] == want[..], "slot {i}");
    }
    drop(b);
    d.deregister(&t).unwrap();
    drop(h);
    let _ = std::fs::remove_file(&path);
}

/// The kernel path (a file through io_uring) with GPU memory: reads land
/// in pinned bounce buffers and the copy engine moves them on; writes the
/// other way; synchronous, batch and stream-ordered.
#[test]
fn kernel_path_moves_gpu_memory() {
    let Some(cuda) = cuda() else { return };
    let path = std::env::temp_dir().join(format!("ugds-gpu-kernel-path-{}.img", std::process::id()));
    std::fs::write(&path, pattern(11, 0, 16 << 20)).unwrap();
    let d = ugds::Driver::open();
    let h = d.open_file(&path, opts()).unwrap();
    let gpu = kept(cuda.alloc(16 << 20).unwrap());
    // SAFETY: `gpu` outlives the registration (deregistered below).
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    // Synchronous: sizes across the command limit (512 KiB), unaligned offsets
    // into the GPU buffer. The copies run on this thread: its context is
    // left as it was.
    let ctx = cuda.current_context().unwrap();
    for &(size, file_off, buf_off) in
        &[(512usize, 0u64, 0usize), (4096, 4096, 512), (1 << 20, 1 << 20, 4096), (5 << 20, 3 << 20, 8192)]
    {
        assert_eq!(h.read(&t, size, file_off, buf_off).unwrap(), size);
        assert_eq!(cuda.current_context().unwrap(), ctx, "the caller's context after a read");
        assert!(download(&gpu, buf_off, size) == pattern(11, file_off, size), "read {size}@{file_off}");
    }
    let back = pattern(12, 0, 2 << 20);
    gpu.upload(0, &back).unwrap();
    assert_eq!(h.write(&t, 2 << 20, 8 << 20, 0).unwrap(), 2 << 20);
    assert_eq!(cuda.current_context().unwrap(), ctx, "the caller's context after a write");
    h.flush().unwrap();
    let disk = std::fs::read(&path).unwrap();
    assert!(disk[8 << 20..10 << 20] == back[..], "GPU write reached the file");
    // A batch of 4 KiB reads into GPU memory.
    let batch = h.batch(128).unwrap();
    let ios: Vec<_> = (0..128u64)
        .map(|i| BatchIo {
            op: BatchOp::Read,
            buf: t,
            size: 4096,
            file_offset: i * 65536,
            buf_offset: (i * 4096) as usize,
            cookie: i,
        })
        .collect();
    batch.submit(&ios).unwrap();
    let mut ev = Vec::new();
    while ev.len() < 128 {
        batch.get_status(1, 128, Some(Duration::from_secs(10)), &mut ev).unwrap();
    }
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete), "{ev:?}");
    let got = download(&gpu, 0, 128 * 4096);
    let want = disk_pattern_rows(&std::fs::read(&path).unwrap());
    assert!(got == want, "batch reads into GPU memory");
    drop(batch);
    // Stream-ordered on a CUDA stream.
    let raw = new_stream();
    // SAFETY: `raw` outlives `s`.
    let s = unsafe { cuda.stream(raw.raw(), StreamWait::DeviceSide) }.unwrap();
    let (io, res) = StreamIo::new(1 << 20, 12 << 20, 1 << 20);
    h.read_async(&t, io, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(res.bytes(), 1 << 20, "{:?}", res.take_error());
    assert!(download(&gpu, 1 << 20, 1 << 20) == pattern(11, 12 << 20, 1 << 20));
    // Large reads are copied out piece by piece as their I/O completes:
    // 8 MiB in 1 MiB pieces, and 5 MiB and 4 KiB (pieces of 1088 KiB, the
    // last shorter), back to back.
    let (io, big) = StreamIo::new(8 << 20, 4 << 20, 0);
    h.read_async(&t, io, &s).unwrap();
    let odd_len = (5 << 20) + 4096;
    let (io, odd) = StreamIo::new(odd_len, 8192, 8 << 20);
    h.read_async(&t, io, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(big.bytes(), 8 << 20, "{:?}", big.take_error());
    assert_eq!(odd.bytes(), odd_len as i64, "{:?}", odd.take_error());
    assert!(download(&gpu, 0, 8 << 20) == disk[4 << 20..12 << 20], "8 MiB read in pieces");
    assert!(download(&gpu, 8 << 20, odd_len) == pattern(11, 8192, odd_len), "an odd size in pieces");
    // A read refused when its values are bound (past the end of the file)
    // copies nothing: the buffer keeps what it held.
    let before = download(&gpu, 0, 8 << 20);
    let (io, past) = StreamIo::new(8 << 20, 12 << 20, 0);
    h.read_async(&t, io, &s).unwrap();
    s.synchronize().unwrap();
    assert!(past.bytes() < 0, "a read past the end moved {} bytes", past.bytes());
    assert!(download(&gpu, 0, 8 << 20) == before, "a refused read changed the buffer");
    drop(s);
    d.deregister(&t).unwrap();
    std::fs::remove_file(&path).unwrap();
}

/// Four threads reading a file into one GPU buffer with interrupt
/// completion: each read completes only when its copy to the device is
/// done, which no interrupt announces; no waiter may sleep through it.
#[test]
fn kernel_path_gpu_reads_with_interrupts_from_several_threads() {
    let Some(cuda) = cuda() else { return };
    let path = std::env::temp_dir().join(format!("ugds-gpu-kernel-irq-{}.img", std::process::id()));
    std::fs::write(&path, pattern(13, 0, 8 << 20)).unwrap();
    // Written back now, not by the first O_DIRECT read (which waited for
    // it past the 100 ms cap once on a virtio disk).
    std::fs::File::open(&path).and_then(|f| f.sync_all()).unwrap();
    let d = ugds::Driver::open();
    let h = d.open_file(&path, opts().completion(ugds::Completion::Interrupt)).unwrap();
    let gpu = kept(cuda.alloc(8 << 20).unwrap());
    // SAFETY: `gpu` outlives the registration (deregistered below).
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let (h, t, cuda) = (&h, &t, &cuda);
            s.spawn(move || {
                cuda.use_device(0).unwrap();
                for i in 0..16u64 {
                    // Each thread its own 2 MiB of the buffer; sizes 4 KiB to 2 MiB.
                    let size = 4096usize << (i % 10);
                    let off = ((th * 16 + i) * 4096) % (6 << 20);
                    assert_eq!(h.read(t, size, off, (th as usize) << 21).unwrap(), size);
                }
            });
        }
    });
    for th in 0..4u64 {
        let (size, off) = (4096usize << 5, ((th * 16 + 15) * 4096) % (6 << 20));
        assert!(download(&gpu, (th as usize) << 21, size) == pattern(13, off, size), "thread {th}'s last read");
    }
    // A disk quiet for 100 ms caps a wait and loses nothing; a waiter
    // asleep through a finished copy finds it waiting when it wakes.
    eprintln!("interrupt waits that reached their cap: {}", h.interrupt_waits_capped());
    assert_eq!(h.interrupt_wakeups_lost(), 0, "no waiter slept through a finished copy");
    d.deregister(&t).unwrap();
    std::fs::remove_file(&path).unwrap();
}

/// The 4 KiB at each 64 KiB of `disk`, end to end.
fn disk_pattern_rows(disk: &[u8]) -> Vec<u8> {
    (0..128).flat_map(|i| disk[i * 65536..i * 65536 + 4096].to_vec()).collect()
}

/// NVMe over TCP with GPU memory (against the emulated NVMe/TCP target):
/// a read's data lands in a pinned bounce buffer and is copied to the
/// device before the read completes; a write's is copied off the device
/// first; synchronous and batch.
#[test]
fn tcp_moves_gpu_memory() {
    let Some(cuda) = cuda() else { return };
    let target = ugds_emu::tcp::EmuTcpTarget::start(ugds_emu::tcp::EmuTcpConfig::default()).unwrap();
    target.fill(0, &pattern(13, 0, 16 << 20));
    let d = ugds::Driver::open();
    let h = d.open_tcp(&ugds::fabrics::TcpTarget::new(target.addr(), target.nqn()), opts()).unwrap();
    let gpu = kept(cuda.alloc(16 << 20).unwrap());
    // SAFETY: `gpu` outlives the registration (deregistered below).
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    for &(size, file_off, buf_off) in &[(4096usize, 0u64, 0usize), (8192, 4096, 512), (1 << 20, 1 << 20, 4096)] {
        assert_eq!(h.read(&t, size, file_off, buf_off).unwrap(), size);
        assert!(download(&gpu, buf_off, size) == pattern(13, file_off, size), "read {size}@{file_off}");
    }
    let back = pattern(14, 0, 2 << 20);
    gpu.upload(0, &back).unwrap();
    assert_eq!(h.write(&t, 2 << 20, 8 << 20, 0).unwrap(), 2 << 20);
    assert!(target.read_back(8 << 20, 2 << 20) == back, "GPU write reached the target");
    let batch = h.batch(64).unwrap();
    let ios: Vec<_> = (0..64u64)
        .map(|i| BatchIo {
            op: BatchOp::Read,
            buf: t,
            size: 4096,
            file_offset: i * 4096,
            buf_offset: (i * 4096) as usize,
            cookie: i,
        })
        .collect();
    batch.submit(&ios).unwrap();
    let mut ev = Vec::new();
    while ev.len() < 64 {
        batch.get_status(1, 64, Some(Duration::from_secs(10)), &mut ev).unwrap();
    }
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete), "{ev:?}");
    assert!(download(&gpu, 0, 64 * 4096) == pattern(13, 0, 64 * 4096), "batch reads into GPU memory");
    assert_eq!(target.stats().host_errors, 0);
    drop(batch);
    d.deregister(&t).unwrap();
}
