//! GPU memory through the public API: CUDA registration, the emulated
//! controller reaching device memory through the copy engine, batch,
//! dma-buf export and stream-ordered I/O on CUDA streams.
//!
//! These need a CUDA GPU. Where there is none (CI) every test prints why it
//! skipped and passes; run them on the GPU machine (see README, "GPU").
//! `UGDS_REQUIRE_GPU=1` turns a missing GPU into a failure.

mod common;
use common::*;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use ugds::gpu::cuda::{Cuda, DeviceBuffer};
use ugds::gpu::StreamWait;
use ugds::platform::emu::{Fault, FaultAction, FaultTarget};
use ugds::{BatchIo, BatchOp, BatchStatus, Error, StreamIo};

static SPIN: std::sync::OnceLock<ugds::gpu::cuda::SpinKernel> = std::sync::OnceLock::new();

/// The kernel that stands in for compute (loaded by `cuda()`).
fn spin() -> &'static ugds::gpu::cuda::SpinKernel {
    SPIN.get().expect("cuda() loads it")
}

fn cuda() -> Option<Arc<Cuda>> {
    let c = Cuda::get().and_then(|c| {
        if c.device_count()? == 0 {
            return Err(Error::GpuUnavailable("no CUDA device".into()));
        }
        c.use_device(0)?;
        Ok(c)
    });
    match c {
        Ok(c) => {
            // Loaded once, before any test has a stream waiting: loading a
            // module waits for every stream of the context while holding the
            // driver's lock, which would stall other tests' emulated I/O.
            SPIN.get_or_init(|| {
                let k = c.spin_kernel().unwrap();
                let s = c.create_stream().unwrap();
                k.launch(&s, 0).unwrap();
                s.synchronize().unwrap();
                std::mem::forget(s);
                k
            });
            Some(c)
        }
        Err(e) if std::env::var_os("UGDS_REQUIRE_GPU").is_some() => panic!("UGDS_REQUIRE_GPU is set: {e}"),
        Err(e) => {
            // Not eprintln!: that is captured; this reaches the terminal.
            let _ = writeln!(std::io::stderr(), "SKIPPED: no CUDA GPU here ({e})");
            None
        }
    }
}

/// Device and pinned memory of these tests is never freed: cuMemFree and
/// cuMemFreeHost wait for every stream of the context while holding the
/// CUDA driver's process-wide lock (measured on an H200: a copy in another
/// context cannot even be enqueued meanwhile), so a test freeing memory
/// would stall the emulated controller's copies for the tests running
/// alongside, whose streams wait on that I/O, until they time out. See
/// docs/architecture.md, "GPU streams and the emulated controller".
fn kept<T>(x: T) -> std::mem::ManuallyDrop<T> {
    std::mem::ManuallyDrop::new(x)
}

fn download(b: &DeviceBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    b.download(off, &mut v).unwrap();
    v
}

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
    let raw = cuda.create_stream().unwrap();
    // SAFETY: `raw` outlives `s`.
    let s = unsafe { cuda.stream(raw.raw(), wait) }.unwrap();
    assert_eq!(s.wait_mode(), wait);
    // Late binding: the stream is held behind a kernel (not a blocking host
    // function: CUDA runs every stream's host functions on one thread, and
    // holding it would stall tests running alongside); values change after
    // enqueue and before the stream reaches the read.
    let spin = spin();
    spin.launch(&raw, 300_000_000).unwrap();
    let size = Arc::new(AtomicU64::new(0));
    let file_offset = Arc::new(AtomicU64::new(3));
    let buf_offset = Arc::new(AtomicU64::new(1 << 40));
    let (io, res) = StreamIo::late(size.clone(), file_offset.clone(), buf_offset.clone());
    h.read_async(&t, io, &s).unwrap();
    // Ordering: a host function after the read sees its result written.
    let seen = Arc::new(AtomicBool::new(false));
    let (r2, s2) = (res.clone(), seen.clone());
    raw.enqueue_host(move || s2.store(r2.is_done() && r2.bytes() == 256 << 10, Ordering::Release)).unwrap();
    size.store(256 << 10, Ordering::Release);
    file_offset.store((1 << 20) + 8192, Ordering::Release);
    buf_offset.store(4096, Ordering::Release);
    assert!(!res.is_done(), "the read ran before the kernel ahead of it");
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
    let (ra, rb) = (cuda.create_stream().unwrap(), cuda.create_stream().unwrap());
    // SAFETY: the raw streams outlive these.
    let a = unsafe { cuda.stream(ra.raw(), StreamWait::DeviceSide) }.unwrap();
    e.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_secs(3))));
    let (io, res) = StreamIo::new(4096, 0, 0);
    h.read_async(&t, io, &a).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (tx, rx) = mpsc::channel();
    rb.enqueue_host(move || tx.send(()).unwrap()).unwrap();
    let ran = rx.recv_timeout(Duration::from_secs(2));
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
    let raws: Vec<_> = (0..N).map(|_| cuda.create_stream().unwrap()).collect();
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
    let bad: Vec<_> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.bytes() != SZ as i64)
        .map(|(i, r)| (i, r.bytes(), r.take_error()))
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
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
        let raw = cuda.create_stream().unwrap();
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
    let raw = cuda.create_stream().unwrap();
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
    let raw = cuda.create_stream().unwrap();
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

#[test]
fn memory_of_another_context_is_refused_until_that_context_is_current() {
    let Some(cuda) = cuda() else { return };
    let ctx = match cuda.create_context(0) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "SKIPPED: cannot create a second context ({e})");
            return;
        }
    };
    // Allocated in the new context (current after creation).
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
    // Not destroyed: cuCtxDestroy may wait for the device under the
    // driver's lock, as cuMemFree does (see `kept`).
    std::mem::forget(ctx);
}

#[test]
fn device_memory_through_emulator_io_workers() {
    // A file-backed namespace whose data 4 threads move at once, each with
    // its own pinned bounce buffer and the shared copy engine.
    let Some(cuda) = cuda() else { return };
    let path = std::env::temp_dir().join(format!("ugds-gpu-workers-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let cfg = ugds::platform::emu::EmuConfig::default()
        .namespaces(vec![ugds::platform::emu::NamespaceConfig::file(&path, 32 << 20, 4096)])
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
