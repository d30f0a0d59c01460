//! What the CUDA test binaries (gpu.rs, gpu_transports.rs) share: the
//! fixture made once per process before any test runs I/O, and helpers.
#![allow(dead_code)]

use std::io::Write;
use std::sync::Arc;
use ugds::gpu::cuda::{Cuda, DeviceBuffer, OwnedStream};
use ugds::gpu::StreamWait;
use ugds::Error;

/// What the tests share, made once before any of them runs I/O.
///
/// Some CUDA calls wait for the device while holding the driver's
/// process-wide lock (measured on an H200: `cuMemFree`, `cuMemFreeHost`,
/// `cuModuleLoadData`, `cuStreamCreate`, `cuCtxCreate` at times), and every
/// other CUDA call in the process waits meanwhile. ugds's I/O never needs
/// CUDA to complete (stream-ordered I/O through the emulated controller is
/// staged, see `gpu::stream`), so this only delays; but tests that check
/// that one stream is not held up by another's stalled I/O check timing,
/// and a test running alongside would hold them up. So the suite makes
/// such calls only here: streams come from a pool, the kernel and the
/// second context are made once, device and pinned memory is kept ([`kept`]),
/// and the test that makes such calls on purpose runs in a process of its
/// own.
pub struct Fixture {
    pub spin: ugds::gpu::cuda::SpinKernel,
    pub streams: std::sync::Mutex<Vec<OwnedStream>>,
    pub other: Option<ugds::gpu::cuda::OwnedContext>,
}

/// Streams in the pool: enough for every test of the suite at once.
const POOL_STREAMS: usize = 80;

pub static FIXTURE: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();

/// The kernel that stands in for compute.
pub fn spin() -> &'static ugds::gpu::cuda::SpinKernel {
    &FIXTURE.get().expect("cuda() makes it").spin
}

/// A stream of the pool (destroyed when dropped; never created by a test).
pub fn new_stream() -> OwnedStream {
    let f = FIXTURE.get().expect("cuda() makes it");
    f.streams.lock().unwrap().pop().expect("the pool has a stream for every test (POOL_STREAMS)")
}

/// CUDA with device 0 current, or `Err` saying why there is none.
pub fn cuda_device() -> Result<Arc<Cuda>, Error> {
    Cuda::get().and_then(|c| {
        if c.device_count()? == 0 {
            return Err(Error::GpuUnavailable("no CUDA device".into()));
        }
        c.use_device(0)?;
        Ok(c)
    })
}

/// What a test without a GPU does: fail under `UGDS_REQUIRE_GPU`, else say
/// SKIPPED.
pub fn skip_without_gpu(e: Error) {
    if std::env::var_os("UGDS_REQUIRE_GPU").is_some() {
        panic!("UGDS_REQUIRE_GPU is set: {e}");
    }
    // Not eprintln!: that is captured; this reaches the terminal.
    let _ = writeln!(std::io::stderr(), "SKIPPED: no CUDA GPU here ({e})");
}

/// CUDA with the suite's fixture made, or `None` (said) without a GPU.
pub fn cuda() -> Option<Arc<Cuda>> {
    match cuda_device() {
        Ok(c) => {
            FIXTURE.get_or_init(|| {
                let spin = c.spin_kernel().unwrap();
                let streams: Vec<_> = (0..POOL_STREAMS).map(|_| c.create_stream().unwrap()).collect();
                spin.launch(&streams[0], 0).unwrap();
                streams[0].synchronize().unwrap();
                // The first GPU stream loads ugds's staging kernel; the first
                // registration makes the emulated controller's copy context.
                // SAFETY: the stream outlives the GpuStream.
                drop(unsafe { c.stream(streams[0].raw(), StreamWait::DeviceSide) }.unwrap());
                let d = ugds::Driver::open();
                let mem = kept(c.alloc(4096).unwrap());
                // The first upload makes the upload stream.
                mem.upload(0, &[0; 16]).unwrap();
                // SAFETY: deregistered at once.
                d.deregister(&unsafe { d.register_cuda(mem.ptr(), 4096) }.unwrap()).unwrap();
                // A second context (current after creation), for the test of
                // context checks.
                let other = c.create_context(0).ok();
                c.use_device(0).unwrap();
                Fixture { spin, streams: std::sync::Mutex::new(streams), other }
            });
            Some(c)
        }
        Err(e) => {
            skip_without_gpu(e);
            None
        }
    }
}

/// Device and pinned memory of these tests is never freed (see [`Fixture`]).
pub fn kept<T>(x: T) -> std::mem::ManuallyDrop<T> {
    std::mem::ManuallyDrop::new(x)
}

/// Every stream operation in `results` moved `size` bytes.
pub fn assert_all_moved(results: &[Arc<ugds::StreamResult>], size: usize) {
    let bad: Vec<_> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.bytes() != size as i64)
        .map(|(i, r)| (i, r.bytes(), r.take_error()))
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
}

pub fn download(b: &DeviceBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    b.download(off, &mut v).unwrap();
    v
}
