//! Stream-ordered I/O on CUDA streams: the words, staging blocks and copy
//! kernel of one context (see `gpu::stream`).

use super::*;

pub(super) struct CudaStreamBackend {
    cuda: Arc<Cuda>,
    ctx: usize,
    pool: Mutex<WordPool>,
    stages: Mutex<StagePool>,
    /// The staging copy kernel (a `CUfunction`), loaded once per context.
    copy_kernel: OnceLock<std::result::Result<usize, String>>,
    /// Each staging block's header's twin in device memory (by the
    /// header's device-mapped address), allocated at the block's first copy
    /// and kept as the block is.
    device_headers: Mutex<std::collections::HashMap<u64, u64>>,
    /// Each staging block by its device address: the bytes its current
    /// operation moves at most (see `stage_lent`).
    stage_blocks: Mutex<std::collections::BTreeMap<u64, usize>>,
}

/// The staging copy: `len` bytes from `src` to `dst`, read from the header
/// its argument points at when the kernel runs (by one thread per block,
/// from the header's twin in device memory that the stream copied just
/// before); 16 bytes per thread and step where all three are multiples of
/// 16 (four such loads in flight per thread while they fit: reads of host
/// memory are bound by their latency), bytes otherwise. `membar.sys` makes
/// writes to host memory (a write's staging) visible to the host after the
/// kernel.
const STAGE_COPY_PTX: &CStr = c"
.version 7.0
.target sm_50
.address_size 64
.visible .entry ugds_stage_copy(.param .u64 header)
{
    .reg .pred %p<4>;
    .reg .b32 %r<21>;
    .reg .b64 %rd<23>;
    .shared .align 8 .b64 hdr[3];
    mov.u32 %r3, %tid.x;
    setp.ne.u32 %p3, %r3, 0;
    @%p3 bra LOADED;
    ld.param.u64 %rd1, [header];
    ld.volatile.global.u64 %rd2, [%rd1];
    ld.volatile.global.u64 %rd3, [%rd1+8];
    ld.volatile.global.u64 %rd4, [%rd1+16];
    st.shared.u64 [hdr], %rd2;
    st.shared.u64 [hdr+8], %rd3;
    st.shared.u64 [hdr+16], %rd4;
LOADED:
    bar.sync 0;
    ld.shared.u64 %rd2, [hdr];
    ld.shared.u64 %rd3, [hdr+8];
    ld.shared.u64 %rd4, [hdr+16];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd5, %r1, %r2;
    cvt.u64.u32 %rd6, %r3;
    add.u64 %rd5, %rd5, %rd6;
    mul.wide.u32 %rd7, %r4, %r2;
    or.b64 %rd8, %rd2, %rd3;
    or.b64 %rd8, %rd8, %rd4;
    and.b64 %rd8, %rd8, 15;
    setp.ne.u64 %p1, %rd8, 0;
    @%p1 bra BYTES;
    shr.u64 %rd9, %rd4, 4;
    shl.b64 %rd13, %rd7, 4;
    mul.lo.u64 %rd14, %rd7, 3;
    shl.b64 %rd15, %rd7, 2;
WIDE4:
    add.u64 %rd16, %rd5, %rd14;
    setp.ge.u64 %p2, %rd16, %rd9;
    @%p2 bra WIDE;
    shl.b64 %rd10, %rd5, 4;
    add.u64 %rd11, %rd3, %rd10;
    add.u64 %rd17, %rd11, %rd13;
    add.u64 %rd18, %rd17, %rd13;
    add.u64 %rd19, %rd18, %rd13;
    ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd11];
    ld.global.v4.u32 {%r9, %r10, %r11, %r12}, [%rd17];
    ld.global.v4.u32 {%r13, %r14, %r15, %r16}, [%rd18];
    ld.global.v4.u32 {%r17, %r18, %r19, %r20}, [%rd19];
    add.u64 %rd12, %rd2, %rd10;
    add.u64 %rd20, %rd12, %rd13;
    add.u64 %rd21, %rd20, %rd13;
    add.u64 %rd22, %rd21, %rd13;
    st.global.v4.u32 [%rd12], {%r5, %r6, %r7, %r8};
    st.global.v4.u32 [%rd20], {%r9, %r10, %r11, %r12};
    st.global.v4.u32 [%rd21], {%r13, %r14, %r15, %r16};
    st.global.v4.u32 [%rd22], {%r17, %r18, %r19, %r20};
    add.u64 %rd5, %rd5, %rd15;
    bra WIDE4;
WIDE:
    setp.ge.u64 %p2, %rd5, %rd9;
    @%p2 bra DONE;
    shl.b64 %rd10, %rd5, 4;
    add.u64 %rd11, %rd3, %rd10;
    add.u64 %rd12, %rd2, %rd10;
    ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd11];
    st.global.v4.u32 [%rd12], {%r5, %r6, %r7, %r8};
    add.u64 %rd5, %rd5, %rd7;
    bra WIDE;
BYTES:
    setp.ge.u64 %p2, %rd5, %rd4;
    @%p2 bra DONE;
    add.u64 %rd11, %rd3, %rd5;
    add.u64 %rd12, %rd2, %rd5;
    ld.global.u8 %r5, [%rd11];
    st.global.u8 [%rd12], %r5;
    add.u64 %rd5, %rd5, %rd7;
    bra BYTES;
DONE:
    membar.sys;
    ret;
}
";

/// Threads per block of the staging copy.
const STAGE_COPY_THREADS: u32 = 256;

/// Blocks of the staging copy for `bytes` (what the operation asked for
/// when its block was lent): one per 512 KiB, from 2 to 16. A block keeps
/// 16 KiB of loads from host memory in flight (256 threads, four 16-byte
/// loads each), and the tail of a kernel launched on another stream
/// meanwhile (its launch call's too) grows with the sum of every copy's
/// loads in flight, not one copy's. On an H100 (2026-12-07,
/// `scripts/gpu-bench-ab`, two rounds cold) a kernel beside 4 streams of
/// 1 MiB reads had a p99 of 45-50 us with 8 blocks per 1 MiB, 29-31 with
/// 4 and 25-26 with 2 (idle 16-27), one stream of 16 MiB reads keeping
/// 94-100% of synchronous reads with each (`docs/benchmarks.md`, "The
/// neighbour's tail is the staging copies' loads").
fn stage_copy_blocks(bytes: usize) -> u32 {
    (bytes / (512 << 10)).clamp(2, 16) as u32
}

impl CudaStreamBackend {
    pub(super) fn new(cuda: Arc<Cuda>, ctx: usize) -> CudaStreamBackend {
        CudaStreamBackend {
            cuda,
            ctx,
            pool: Mutex::default(),
            stages: Mutex::default(),
            copy_kernel: OnceLock::new(),
            device_headers: Mutex::default(),
            stage_blocks: Mutex::default(),
        }
    }

    /// What the copy whose header is at device address `header` moves at
    /// most: the length its operation asked for when the block was lent
    /// (its copy parameters are set later, when the stream reaches the
    /// operation).
    fn copy_bytes(&self, header: u64) -> usize {
        let blocks = self.stage_blocks.lock().recover();
        blocks.range(..=header).next_back().map_or(0, |(_, &lent)| lent)
    }

    /// The staging copy kernel of this context, loaded at the first call.
    pub(super) fn copy_kernel(&self) -> std::result::Result<usize, String> {
        self.copy_kernel
            .get_or_init(|| {
                self.cuda
                    .with_context(self.ctx as Ctx, || {
                        let mut module: *mut c_void = std::ptr::null_mut();
                        // SAFETY: a NUL-terminated PTX image; the module is
                        // kept for the process's life.
                        let r =
                            unsafe { (self.cuda.api.module_load_data)(&mut module, STAGE_COPY_PTX.as_ptr().cast()) };
                        self.cuda.check("cuModuleLoadData", r)?;
                        let mut f: *mut c_void = std::ptr::null_mut();
                        // SAFETY: a loaded module and a NUL-terminated name.
                        let r =
                            unsafe { (self.cuda.api.module_get_function)(&mut f, module, c"ugds_stage_copy".as_ptr()) };
                        self.cuda.check("cuModuleGetFunction", r)?;
                        Ok(f as usize)
                    })
                    .map_err(|e| e.to_string())
            })
            .clone()
    }

    /// The device-memory twin of the staging header at `header`.
    /// `cuMemAlloc` does not wait for the device (bench/cuda-probes:
    /// driver_lock), so this may run while streams wait on I/O.
    fn device_header(&self, header: u64) -> Result<u64> {
        let mut map = self.device_headers.lock().recover();
        if let Some(&t) = map.get(&header) {
            return Ok(t);
        }
        let mut t = 0u64;
        self.cuda.with_context(self.ctx as Ctx, || {
            // SAFETY: writes one device pointer; never freed (the block
            // it serves is never freed either).
            self.cuda.check("cuMemAlloc", unsafe { (self.cuda.api.mem_alloc)(&mut t, 64) })
        })?;
        map.insert(header, t);
        Ok(t)
    }

    /// `len` bytes of device-mapped pinned memory of this context, zeroed:
    /// (host address, device address).
    fn alloc_mapped(&self, len: usize) -> Result<(usize, u64)> {
        self.cuda.with_context(self.ctx as Ctx, || self.cuda.alloc_mapped(len))
    }
}

impl StreamBackend for CudaStreamBackend {
    fn alloc_page(&self) -> Result<(usize, u64)> {
        self.alloc_mapped(WORD_PAGE)
    }

    fn pool(&self) -> &Mutex<WordPool> {
        &self.pool
    }

    fn launch_host_fn(&self, stream: usize, f: HostFn, data: *mut c_void) -> Result<()> {
        // SAFETY: a live stream (GpuStream's contract); `f` takes `data`.
        let r = unsafe { (self.cuda.api.launch_host_func)(stream as RawStream, f, data) };
        self.cuda.check("cuLaunchHostFunc", r)
    }

    fn wait_value32(&self, stream: usize, addr: u64, value: u32) -> Result<bool> {
        // SAFETY: a live stream and a device-mapped host word we own.
        let r = unsafe { (self.cuda.api.stream_wait_value32)(stream as RawStream, addr, value, STREAM_WAIT_VALUE_GEQ) };
        if r == ERROR_NOT_SUPPORTED {
            return Ok(false);
        }
        self.cuda.check("cuStreamWaitValue32", r).map(|()| true)
    }

    fn write_value32(&self, stream: usize, addr: u64, value: u32) -> Result<bool> {
        // SAFETY: a stream the caller just enqueued on, and a device-mapped
        // host word of the pool (never freed).
        let r = unsafe { (self.cuda.api.stream_write_value32)(stream as RawStream, addr, value, 0) };
        if r == ERROR_NOT_SUPPORTED {
            return Ok(false);
        }
        self.cuda.check("cuStreamWriteValue32", r).map(|()| true)
    }

    fn synchronize(&self, stream: usize) -> Result<()> {
        // SAFETY: a live stream.
        self.cuda.check("cuStreamSynchronize", unsafe { (self.cuda.api.stream_synchronize)(stream as RawStream) })
    }

    fn name(&self) -> &'static str {
        "CUDA"
    }

    fn context(&self) -> usize {
        self.ctx
    }

    fn alloc_stage(&self, len: usize) -> Result<(usize, u64)> {
        debug_assert!(len > STAGE_HEADER);
        // A block is registered for I/O: in a process attached to another's
        // controller, that owner maps it for the device, which it can only
        // do with shared memory.
        let (host, dev) = if ugds_platform::sys::shared::sharing() {
            self.cuda.with_context(self.ctx as Ctx, || self.cuda.alloc_mapped_shared(len))?
        } else {
            self.alloc_mapped(len)?
        };
        self.stage_blocks.lock().recover().insert(dev, len);
        Ok((host, dev))
    }

    fn stage_pool(&self) -> Option<&Mutex<StagePool>> {
        self.copy_kernel().is_ok().then_some(&self.stages)
    }

    fn stage_lent(&self, dev: u64, bytes: usize) {
        if let Some(lent) = self.stage_blocks.lock().recover().get_mut(&dev) {
            *lent = bytes;
        }
    }

    fn launch_copy(&self, stream: usize, header: u64) -> Result<()> {
        let f = self.copy_kernel().map_err(Error::GpuUnavailable)?;
        // The kernel reads its parameters from device memory: the stream
        // copies the header there first. A kernel that read them from the
        // device-mapped header itself took about 200 us longer per
        // operation on the H200 (bench/cuda-probes/signal_paths.c).
        let twin = self.device_header(header)?;
        // SAFETY: 24 bytes of a staging header (device-mapped pinned
        // memory, never freed) into its twin (ours, never freed), on a live
        // stream; ordered before the kernel by the stream.
        let r = unsafe { (self.cuda.api.memcpy_async)(twin, header, 24, stream as RawStream) };
        self.cuda.check("cuMemcpyAsync", r)?;
        let mut arg = twin;
        let mut params = [&mut arg as *mut u64 as *mut c_void];
        let (blocks, threads) = (stage_copy_blocks(self.copy_bytes(header)), STAGE_COPY_THREADS);
        // SAFETY: one u64 parameter, as the kernel declares (the driver
        // copies it at launch); a live stream of this context (GpuStream's
        // contract); the header is in a staging block that is not reused
        // until the stream has passed this kernel.
        let r = unsafe {
            (self.cuda.api.launch_kernel)(
                f as *mut c_void,
                blocks,
                1,
                1,
                threads,
                1,
                1,
                0,
                stream as RawStream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.cuda.check("cuLaunchKernel", r)
    }
}
