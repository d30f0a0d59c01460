//! GPU memory through the public API: CUDA registration, the emulated
//! controller reaching device memory through the copy engine, batch,
//! dma-buf export and stream-ordered I/O on CUDA streams. The transports
//! that copy (the kernel path, NVMe/TCP) and the emulator's I/O workers are
//! in gpu_transports.rs; processes attached to an owner in gpu_attach.rs.
//!
//! These need a CUDA GPU. Where there is none (CI) every test prints why it
//! skipped and passes; run them on the GPU machine (see README, "GPU").
//! `UGDS_REQUIRE_GPU=1` turns a missing GPU into a failure.

mod common;
mod gpu_common;
use common::*;
use gpu_common::*;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use ugds::gpu::StreamWait;
use ugds::{BatchIo, BatchOp, BatchStatus, Error, StreamIo};
use ugds_emu::{Fault, FaultAction, FaultTarget};

#[test]
fn device_memory_reads_and_writes_across_prp_boundaries() {
    let Some(cuda) = cuda() else { return };
    let (d, h, _e) = open(small_emu(), opts());
    let gpu = kept(cuda.alloc(4 << 20).unwrap());
    // SAFETY: `gpu` outlives the registration (deregistered below).
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    assert!(d.device_memory(&t).unwrap().is_some(), "registered as device memory");
    let mut host = Buf::new(&d, 4 << 20);
    for (i, &(size, buf_off)) in
        [(512, 0), (4096, 0), (4096, 512), (8192, 4096), (12288, 1024), (1 << 20, 0), (3 << 20, 8192)]
            .iter()
            .enumerate()
    {
        let file_off = (i as u64) << 20;
        // Host -> namespace -> GPU.
        host.mem[..size].copy_from_slice(&pattern(i as u8, file_off, size));
        assert_eq!(h.write(&host.token, size, file_off, 0).unwrap(), size);
        assert_eq!(h.read(&t, size, file_off, buf_off).unwrap(), size);
        assert!(download(&gpu, buf_off, size) == pattern(i as u8, file_off, size), "GPU read {size}@{buf_off}");
        // GPU -> namespace -> host.
        let back = pattern(i as u8 ^ 0x5a, file_off, size);
        gpu.upload(buf_off, &back).unwrap();
        assert_eq!(h.write(&t, size, file_off, buf_off).unwrap(), size);
        host.mem[..size].fill(0);
        assert_eq!(h.read(&host.token, size, file_off, 0).unwrap(), size);
        assert!(host.mem[..size] == back[..], "GPU write {size}@{buf_off}");
    }
    d.deregister(&t).unwrap();
}

/// KV-cache blocks scattered in GPU memory: one range of the namespace read
/// into 32 segments of 16 KiB in reverse order, and written back from them,
/// on the emulated controller and on the kernel path.
#[test]
fn vectored_io_scatters_into_and_gathers_from_gpu_memory() {
    let Some(cuda) = cuda() else { return };
    let path = std::env::temp_dir().join(format!("ugds-gpu-vectored-{}.img", std::process::id()));
    std::fs::write(&path, pattern(21, 0, 4 << 20)).unwrap();
    let d = ugds::Driver::open();
    let (emu_h, _e) = open_emulated(&d, small_emu(), opts()).unwrap();
    let kernel_h = d.open_file(&path, opts()).unwrap();
    let gpu = kept(cuda.alloc(2 << 20).unwrap());
    // SAFETY: `gpu` outlives the registration (deregistered below).
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    let segs: Vec<ugds::Segment> = (0..32).map(|i| ugds::Segment::new(&t, (31 - i) * 32768 + 4096, 16384)).collect();
    let mut host = Buf::new(&d, 512 << 10);
    for (name, h) in [("emulated", &emu_h), ("kernel path", &kernel_h)] {
        if name == "emulated" {
            host.mem.copy_from_slice(&pattern(21, 1 << 20, 512 << 10));
            h.write(&host.token, 512 << 10, 1 << 20, 0).unwrap();
        }
        assert_eq!(h.readv(&segs, 1 << 20).unwrap(), 512 << 10, "{name}");
        for (i, s) in segs.iter().enumerate() {
            let want = pattern(21, (1 << 20) + (i * 16384) as u64, 16384);
            assert!(download(&gpu, s.offset, 16384) == want, "{name}: segment {i}");
        }
        // Gathered back to another range, then read as one piece.
        assert_eq!(h.writev(&segs, 3 << 20).unwrap(), 512 << 10, "{name}");
        let mut back = Buf::new(&d, 512 << 10);
        back.mem.fill(0);
        h.read(&back.token, 512 << 10, 3 << 20, 0).unwrap();
        assert!(back.mem[..] == pattern(21, 1 << 20, 512 << 10)[..], "{name}: gathered");
    }
    d.deregister(&t).unwrap();
    std::fs::remove_file(&path).unwrap();
}

/// Vectored operations in stream order into and out of GPU memory on a
/// CUDA stream, on the emulated controller and the kernel path (both reach
/// device memory through the stream's staging blocks: a request per
/// segment, one result).
#[test]
fn vectored_stream_ordered_io_with_gpu_memory() {
    let Some(cuda) = cuda() else { return };
    let path = std::env::temp_dir().join(format!("ugds-gpu-vectored-async-{}.img", std::process::id()));
    std::fs::write(&path, pattern(23, 0, 4 << 20)).unwrap();
    let d = ugds::Driver::open();
    let (emu_h, _e) = open_emulated(&d, small_emu(), opts()).unwrap();
    let kernel_h = d.open_file(&path, opts()).unwrap();
    let gpu = kept(cuda.alloc(1 << 20).unwrap());
    // SAFETY: `gpu` outlives the registration (deregistered below).
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    let segs: Vec<ugds::Segment> = (0..8).map(|i| ugds::Segment::new(&t, (7 - i) * 65536 + 4096, 16384)).collect();
    let raw = new_stream();
    // SAFETY: `raw` outlives `s`.
    let s = unsafe { cuda.stream(raw.raw(), StreamWait::DeviceSide) }.unwrap();
    let mut host = Buf::new(&d, 128 << 10);
    for (name, h) in [("emulated", &emu_h), ("kernel path", &kernel_h)] {
        if name == "emulated" {
            host.mem.copy_from_slice(&pattern(23, 1 << 20, 128 << 10));
            h.write(&host.token, 128 << 10, 1 << 20, 0).unwrap();
        }
        let (io, read) = StreamIo::new(128 << 10, 1 << 20, 0);
        h.readv_async(&segs, io, &s).unwrap();
        let (io, written) = StreamIo::new(128 << 10, 3 << 20, 0);
        h.writev_async(&segs, io, &s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(read.bytes(), 128 << 10, "{name}: {:?}", read.take_error());
        assert_eq!(written.bytes(), 128 << 10, "{name}: {:?}", written.take_error());
        for (i, seg) in segs.iter().enumerate() {
            let want = pattern(23, (1 << 20) + (i * 16384) as u64, 16384);
            assert!(download(&gpu, seg.offset, 16384) == want, "{name}: segment {i}");
        }
        host.mem.fill(0);
        h.read(&host.token, 128 << 10, 3 << 20, 0).unwrap();
        assert!(host.mem[..] == pattern(23, 1 << 20, 128 << 10)[..], "{name}: gathered");
        // A late size that is not the total fails the whole operation.
        let (io, bad) = StreamIo::new(4096, 1 << 20, 0);
        h.readv_async(&segs, io, &s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(bad.bytes(), -(libc::EINVAL as i64), "{name}");
    }
    drop(s);
    d.deregister(&t).unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn registration_checks_cuda_pointers() {
    let Some(cuda) = cuda() else { return };
    let d = ugds::Driver::open();
    let gpu = kept(cuda.alloc(1 << 20).unwrap());
    // A range running past the allocation.
    // SAFETY: refused; nothing is registered.
    let e = unsafe { d.register_cuda(gpu.ptr() + 4096, 1 << 20) }.unwrap_err();
    assert!(matches!(e, Error::GpuPointerRange { .. }), "{e}");
    // SAFETY: refused.
    let e = unsafe { d.register_cuda(0, 4096) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // A sub-range inside the allocation is fine, and overlap is refused.
    // SAFETY: `gpu` outlives both registrations.
    let t = unsafe { d.register_cuda(gpu.ptr() + 4096, 8192) }.unwrap();
    // SAFETY: refused.
    let e = unsafe { d.register_cuda(gpu.ptr(), 1 << 20) }.unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    d.deregister(&t).unwrap();
    // Pinned host memory registers as host memory.
    let pinned = kept(cuda.alloc_pinned(1 << 20).unwrap());
    // SAFETY: `pinned` outlives the registration.
    let t = unsafe { d.register_cuda(pinned.as_ptr() as u64, pinned.len()) }.unwrap();
    assert!(d.device_memory(&t).unwrap().is_none());
    d.deregister(&t).unwrap();
}

#[test]
fn pinned_host_memory_does_io() {
    let Some(cuda) = cuda() else { return };
    let (d, h, _e) = open(small_emu(), opts());
    let mut pinned = kept(cuda.alloc_pinned(1 << 20).unwrap());
    // SAFETY: `pinned` outlives the registration.
    let t = unsafe { d.register_cuda(pinned.as_ptr() as u64, pinned.len()) }.unwrap();
    pinned.copy_from_slice(&pattern(9, 0, 1 << 20));
    h.write(&t, 1 << 20, 0, 0).unwrap();
    pinned.fill(0);
    h.read(&t, 1 << 20, 0, 0).unwrap();
    assert!(pinned[..] == pattern(9, 0, 1 << 20)[..]);
    d.deregister(&t).unwrap();
}

#[test]
fn batch_on_device_memory_mixed_reads_and_writes() {
    let Some(cuda) = cuda() else { return };
    let (d, h, _e) = open(small_emu(), opts());
    let gpu = kept(cuda.alloc(128 * 8192).unwrap());
    // SAFETY: deregistered below, before `gpu` is freed.
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    let src: Vec<u8> = (0..128).flat_map(|i| pattern(i as u8, 0, 8192)).collect();
    gpu.upload(0, &src).unwrap();
    let b = h.batch(128).unwrap();
    // Even slots written from the GPU, then every slot read back shifted.
    let writes: Vec<BatchIo> = (0..64)
        .map(|i| BatchIo {
            op: BatchOp::Write,
            buf: t,
            size: 8192,
            file_offset: (2 * i as u64) * 8192,
            buf_offset: 2 * i * 8192,
            cookie: i as u64,
        })
        .collect();
    b.submit(&writes).unwrap();
    let mut ev = Vec::new();
    b.get_status(64, 128, Some(Duration::from_secs(10)), &mut ev).unwrap();
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete), "{ev:?}");
    let reads: Vec<BatchIo> = (0..64)
        .map(|i| BatchIo {
            op: BatchOp::Read,
            buf: t,
            size: 8192,
            file_offset: (2 * i as u64) * 8192,
            buf_offset: (2 * i + 1) * 8192,
            cookie: 100 + i as u64,
        })
        .collect();
    b.submit(&reads).unwrap();
    ev.clear();
    b.get_status(64, 128, Some(Duration::from_secs(10)), &mut ev).unwrap();
    assert_eq!(ev.len(), 64);
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete && e.result.as_ref().ok() == Some(&8192)));
    let all = download(&gpu, 0, 128 * 8192);
    for i in 0..64 {
        assert!(all[(2 * i + 1) * 8192..(2 * i + 2) * 8192] == src[2 * i * 8192..(2 * i + 1) * 8192], "slot {i}");
    }
    drop(b);
    d.deregister(&t).unwrap();
}

#[test]
fn dmabuf_export_of_registered_memory() {
    let Some(cuda) = cuda() else { return };
    if !cuda.dmabuf_supported(0).unwrap() {
        eprintln!("SKIPPED: this GPU cannot export dma-bufs");
        return;
    }
    let d = ugds::Driver::open();
    let gpu = kept(cuda.alloc(4 << 20).unwrap());
    // An unaligned sub-range: the export covers its pages, with an offset.
    // SAFETY: deregistered below.
    let t = unsafe { d.register_cuda(gpu.ptr() + 4096 + 512, 65536) }.unwrap();
    let x = d.export_dmabuf(&t).unwrap();
    assert_eq!(x.offset, 512);
    assert_eq!(x.len, 65536);
    let link = std::fs::read_link(format!("/proc/self/fd/{}", x.fd.as_raw_fd())).unwrap();
    assert!(link.to_string_lossy().contains("dmabuf"), "{link:?}");
    // SAFETY: lseek on a descriptor we own.
    let size = unsafe { libc::lseek(x.fd.as_raw_fd(), 0, libc::SEEK_END) };
    assert_eq!(size, 65536 + 4096, "the dma-buf spans the pages of the range");
    drop(x);
    // Host memory has no dma-buf to give.
    let host = Buf::new(&d, 4096);
    assert!(matches!(d.export_dmabuf(&host.token), Err(Error::Unsupported(_))));
    d.deregister(&t).unwrap();
}

fn stream_checks(wait: StreamWait) {
    let Some(cuda) = cuda() else { return };
    let (d, h, _e) = open(small_emu(), opts());
    let gpu = kept(cuda.alloc(1 << 20).unwrap());
    // SAFETY: deregistered below.
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    let host = Buf::new(&d, 1 << 20);
    let mut hm = host;
    hm.mem.copy_from_slice(&pattern(4, 0, 1 << 20));
    h.write(&hm.token, 1 << 20, 1 << 20, 0).unwrap();
    let raw = new_stream();
    // SAFETY: `raw` outlives `s`.
    let s = unsafe { cuda.stream(raw.raw(), wait) }.unwrap();
    assert_eq!(s.wait_mode(), wait);
    // Late binding: the values are invalid when the read is enqueued and
    // set by a host function the stream runs before it.
    let size = Arc::new(AtomicU64::new(0));
    let file_offset = Arc::new(AtomicU64::new(3));
    let buf_offset = Arc::new(AtomicU64::new(1 << 40));
    let (io, res) = StreamIo::late(size.clone(), file_offset.clone(), buf_offset.clone());
    raw.enqueue_host(move || {
        size.store(256 << 10, Ordering::Release);
        file_offset.store((1 << 20) + 8192, Ordering::Release);
        buf_offset.store(4096, Ordering::Release);
    })
    .unwrap();
    h.read_async(&t, io, &s).unwrap();
    // Ordering: a host function after the read sees its result written.
    let seen = Arc::new(AtomicBool::new(false));
    let (r2, s2) = (res.clone(), seen.clone());
    raw.enqueue_host(move || s2.store(r2.is_done() && r2.bytes() == 256 << 10, Ordering::Release)).unwrap();
    s.synchronize().unwrap();
    assert_eq!(res.bytes(), 256 << 10, "{:?}", res.take_error());
    assert!(seen.load(Ordering::Acquire), "work after the operation ran before its result was written");
    assert!(download(&gpu, 4096, 256 << 10) == pattern(4, 8192, 256 << 10), "data read on the stream");
    // An ordered batch of writes from GPU memory, then reads back to host.
    let ios: Vec<_> = (0..16)
        .map(|i| {
            let (io, r) = StreamIo::new(16384, (8 << 20) + i * 16384, 4096 + (i as usize % 4) * 16384);
            ((BatchOp::Write, t, io), r)
        })
        .collect();
    let (ios, results): (Vec<_>, Vec<_>) = ios.into_iter().unzip();
    h.batch_async(ios, &s).unwrap();
    s.synchronize().unwrap();
    assert!(results.iter().all(|r| r.bytes() == 16384));
    h.read(&hm.token, 16384, (8 << 20) + 5 * 16384, 0).unwrap();
    assert!(hm.mem[..16384] == pattern(4, 8192 + 16384, 16384)[..]);
    // A bad late value fails that operation alone, with -EINVAL.
    let (io, bad) = StreamIo::new(4096, 7, 0);
    h.read_async(&t, io, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(bad.bytes(), -(libc::EINVAL as i64));
    drop(s);
    d.deregister(&t).unwrap();
}

#[test]
fn cuda_stream_ordered_io_device_side_wait() {
    stream_checks(StreamWait::DeviceSide);
}

#[test]
fn cuda_stream_ordered_io_blocking_fallback() {
    stream_checks(StreamWait::BlockingCallback);
}

#[test]
fn a_stalled_io_does_not_hold_other_streams() {
    // With the device-side wait, stream A's stalled I/O leaves CUDA's
    // callback thread free: a host function on stream B runs meanwhile.
    let Some(cuda) = cuda() else { return };
    let (d, h, e) = open(small_emu(), opts());
    let gpu = kept(cuda.alloc(1 << 20).unwrap());
    // SAFETY: deregistered below.
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    let (ra, rb) = (new_stream(), new_stream());
    // SAFETY: the raw streams outlive these.
    let a = unsafe { cuda.stream(ra.raw(), StreamWait::DeviceSide) }.unwrap();
    // Stalled for long enough that B's host function runs first even when
    // tests alongside hold CUDA's lock for a while (freeing memory waits
    // for the device), and not so long that the I/O times out (10 s).
    e.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_secs(5))));
    let (io, res) = StreamIo::new(4096, 0, 0);
    h.read_async(&t, io, &a).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (tx, rx) = mpsc::channel();
    rb.enqueue_host(move || tx.send(()).unwrap()).unwrap();
    let ran = rx.recv_timeout(Duration::from_secs(4));
    assert!(ran.is_ok(), "stream B's host function waited for stream A's I/O");
    assert!(!res.is_done(), "A's I/O is still stalled: {} {:?}", res.bytes(), res.take_error());
    a.synchronize().unwrap();
    assert_eq!(res.bytes(), 4096);
    drop(a);
    d.deregister(&t).unwrap();
}

/// 64 streams at once, each with a kernel before, a read, a kernel, a
/// write back and a kernel after: every read and write checked. More
/// streams wait on I/O than the context has hardware queues, so this
/// deadlocked while the emulator's copies ran in the caller's context.
#[test]
fn sixty_four_streams_read_and_write_at_once() {
    let Some(cuda) = cuda() else { return };
    const N: usize = 64;
    const SZ: usize = 65536;
    let (d, h, _e) = open(small_emu(), opts());
    let gpu = kept(cuda.alloc(N * SZ).unwrap());
    // SAFETY: deregistered below.
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    let mut hb = Buf::new(&d, N * SZ);
    hb.mem.copy_from_slice(&pattern(6, 0, N * SZ));
    h.write(&hb.token, N * SZ, 0, 0).unwrap();
    let spin = spin();
    let raws: Vec<_> = (0..N).map(|_| new_stream()).collect();
    // SAFETY: each raw stream outlives its GpuStream (dropped first below).
    let streams: Vec<_> =
        raws.iter().map(|r| unsafe { cuda.stream(r.raw(), StreamWait::DeviceSide) }.unwrap()).collect();
    let mut results = Vec::new();
    for (i, (s, raw)) in streams.iter().zip(&raws).enumerate() {
        let off = i * SZ;
        spin.launch(raw, 20_000).unwrap();
        let (io, r) = StreamIo::new(SZ, off as u64, off);
        h.read_async(&t, io, s).unwrap();
        results.push(r);
        spin.launch(raw, 20_000).unwrap();
        let back = (8 << 20) + off as u64;
        let (io, w) = StreamIo::new(SZ, back, off);
        h.write_async(&t, io, s).unwrap();
        results.push(w);
        spin.launch(raw, 20_000).unwrap();
    }
    for raw in &raws {
        raw.synchronize().unwrap();
    }
    assert_all_moved(&results, SZ);
    assert!(download(&gpu, 0, N * SZ) == pattern(6, 0, N * SZ), "reads on the streams");
    h.read(&hb.token, N * SZ, 8 << 20, 0).unwrap();
    assert!(hb.mem[..] == pattern(6, 0, N * SZ)[..], "writes on the streams");
    drop(streams);
    d.deregister(&t).unwrap();
}

/// Streams belong to the caller: destroyed before ugds's side of them is
/// dropped (with and without work still queued), and then the buffer, the
/// handle and everything else torn down. Nothing may touch the streams.
#[test]
fn streams_destroyed_before_teardown() {
    let Some(cuda) = cuda() else { return };
    let (d, h, _e) = open(small_emu(), opts());
    let gpu = kept(cuda.alloc(1 << 20).unwrap());
    // SAFETY: deregistered below.
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    let spin = spin();
    let mut results = Vec::new();
    let mut kept = Vec::new();
    for round in 0..3 {
        let raw = new_stream();
        // SAFETY: the raw stream is destroyed first on purpose: what is
        // tested is that nothing uses it after its operations ran.
        let s = unsafe { cuda.stream(raw.raw(), StreamWait::DeviceSide) }.unwrap();
        spin.launch(&raw, 2_000_000).unwrap();
        for j in 0..4 {
            let (io, r) = StreamIo::new(4096, (round * 4 + j) * 4096, j as usize * 4096);
            h.read_async(&t, io, &s).unwrap();
            results.push(r);
        }
        match round {
            // Destroyed with the kernel and the reads still queued (CUDA
            // runs them, then frees the stream).
            0 => drop(raw),
            // Destroyed once its work is done.
            1 => {
                raw.synchronize().unwrap();
                drop(raw);
            }
            // Destroyed after ugds's side is dropped.
            _ => {
                drop(s);
                raw.synchronize().unwrap();
                drop(raw);
                continue;
            }
        }
        kept.push(s);
    }
    cuda.synchronize().unwrap();
    assert!(results.iter().all(|r| r.bytes() == 4096), "every queued read ran");
    drop(kept);
    // A new stream gets words no stream still reads, and works.
    let raw = new_stream();
    // SAFETY: `raw` outlives `s`.
    let s = unsafe { cuda.stream(raw.raw(), StreamWait::DeviceSide) }.unwrap();
    let (io, r) = StreamIo::new(4096, 0, 0);
    h.read_async(&t, io, &s).unwrap();
    raw.synchronize().unwrap();
    assert_eq!(r.bytes(), 4096);
    drop(s);
    d.deregister(&t).unwrap();
    h.close(ugds::Drain::Forever).unwrap();
}

#[test]
fn deregistration_is_refused_while_a_stream_holds_the_buffer() {
    let Some(cuda) = cuda() else { return };
    let (d, h, _e) = open(small_emu(), opts());
    let gpu = kept(cuda.alloc(1 << 20).unwrap());
    // SAFETY: deregistered below.
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    let raw = new_stream();
    // SAFETY: `raw` outlives `s`.
    let s = unsafe { cuda.stream(raw.raw(), StreamWait::DeviceSide) }.unwrap();
    // Held behind a kernel, so the read is queued, not yet run.
    spin().launch(&raw, 300_000_000).unwrap();
    let (io, res) = StreamIo::new(4096, 0, 0);
    h.read_async(&t, io, &s).unwrap();
    assert!(matches!(d.deregister(&t), Err(Error::Busy { .. })));
    s.synchronize().unwrap();
    assert_eq!(res.bytes(), 4096);
    d.deregister(&t).unwrap();
}

/// CUDA calls that wait for the device while holding the driver's
/// process-wide lock (`cuMemFree`, `cuStreamCreate`), made while a stream
/// waits on emulated I/O. Before staging, the emulated controller needed
/// that lock for its copy, so the I/O stalled until it timed out (10 s);
/// now the stream copies, and the I/O needs nothing of CUDA. Runs in a
/// process of its own (see [`Fixture`]).
#[test]
fn driver_calls_that_wait_for_the_device_do_not_stall_stream_io() {
    let Some(cuda) = cuda() else { return };
    const CHILD: &str = "UGDS_GPU_TEST_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let name = "driver_calls_that_wait_for_the_device_do_not_stall_stream_io";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "in its own process:\n{text}");
        return;
    }
    const SZ: usize = 65536;
    let (d, h, _e) = open(small_emu(), opts());
    let mut hb = Buf::new(&d, 16 * SZ);
    hb.mem.copy_from_slice(&pattern(21, 0, 16 * SZ));
    h.write(&hb.token, 16 * SZ, 0, 0).unwrap();
    let gpu = kept(cuda.alloc(32 * SZ).unwrap());
    // SAFETY: deregistered before `gpu` is freed.
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    let raw = new_stream();
    // SAFETY: `raw` outlives `s`.
    let s = unsafe { cuda.stream(raw.raw(), StreamWait::DeviceSide) }.unwrap();
    let gate = cuda.gate().unwrap();
    gate.hold(&raw).unwrap();
    let mut results = Vec::new();
    // 16 operations: as many device-side waits as ugds lets a context have
    // pending (more would wait for these, which wait for the gate).
    for i in 0..8 {
        let (io, r) = StreamIo::new(SZ, (i * SZ) as u64, i * SZ);
        h.read_async(&t, io, &s).unwrap();
        results.push(r);
        // Written back from GPU memory, 8 MiB further on.
        let (io, w) = StreamIo::new(SZ, (8 << 20) + (i * SZ) as u64, i * SZ);
        h.write_async(&t, io, &s).unwrap();
        results.push(w);
    }
    // The I/O waits behind the gate while these wait for the device (the
    // gate opens once they are under way).
    let spare = cuda.alloc(4096).unwrap();
    let c = cuda.clone();
    let waiter = std::thread::spawn(move || {
        c.use_device(0).unwrap();
        drop(spare);
        c.create_stream().unwrap()
    });
    std::thread::sleep(Duration::from_millis(100));
    gate.open();
    let more = waiter.join().unwrap();
    raw.synchronize().unwrap();
    assert_all_moved(&results, SZ);
    assert!(download(&gpu, 0, 8 * SZ) == pattern(21, 0, 8 * SZ), "reads landed");
    h.read(&hb.token, 8 * SZ, 8 << 20, 0).unwrap();
    assert!(hb.mem[..8 * SZ] == pattern(21, 0, 8 * SZ)[..], "writes took the GPU's bytes");
    drop((s, more));
    d.deregister(&t).unwrap();
}

#[test]
fn memory_of_another_context_is_refused_until_that_context_is_current() {
    let Some(cuda) = cuda() else { return };
    let Some(ctx) = FIXTURE.get().and_then(|f| f.other.as_ref()) else {
        let _ = writeln!(std::io::stderr(), "SKIPPED: no second context could be created");
        return;
    };
    ctx.make_current().unwrap();
    let other = kept(cuda.alloc(1 << 20).unwrap());
    cuda.use_device(0).unwrap(); // the primary context again
    let (d, h, _e) = open(small_emu(), opts());
    // SAFETY: refused; nothing registered.
    let e = unsafe { d.register_cuda(other.ptr(), other.len()) }.unwrap_err();
    assert!(matches!(e, Error::GpuContextMismatch { .. }), "{e}");
    // With its own context current it registers, and I/O reaches it.
    ctx.make_current().unwrap();
    // SAFETY: `other` outlives the registration.
    let t = unsafe { d.register_cuda(other.ptr(), other.len()) }.unwrap();
    let mut host = Buf::new(&d, 65536);
    host.mem.copy_from_slice(&pattern(8, 0, 65536));
    h.write(&host.token, 65536, 0, 0).unwrap();
    h.read(&t, 65536, 0, 4096).unwrap();
    assert!(download(&other, 4096, 65536) == pattern(8, 0, 65536));
    d.deregister(&t).unwrap();
    cuda.use_device(0).unwrap();
}
