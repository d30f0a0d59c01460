//! CUDA objects for the GPU tests and `ugds gpu-bench`, not for users of
//! the library: device and pinned buffers, owned contexts and streams, a
//! gate streams can be held at, a kernel that keeps the GPU busy. Built only
//! with the `gpu-tools` feature (the CLI and the library's own tests turn it
//! on).

use super::*;

impl Cuda {
    /// Device memory for tests and benchmarks: `cuMemAlloc` in the current
    /// context, freed on drop.
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<DeviceBuffer> {
        let mut ptr = 0u64;
        // SAFETY: writes one device pointer.
        self.check("cuMemAlloc", unsafe { (self.api.mem_alloc)(&mut ptr, len) })?;
        Ok(DeviceBuffer { cuda: self.clone(), ptr, len })
    }

    /// A new context on device `ordinal`, current on this thread until
    /// another is made current; destroyed on drop. For tests of context
    /// checks (applications use the primary context, as torch does).
    pub fn create_context(self: &Arc<Self>, ordinal: usize) -> Result<OwnedContext> {
        let create = self.api.ctx_create.ok_or_else(|| Error::GpuUnavailable("no cuCtxCreate_v2".into()))?;
        let mut dev = 0;
        // SAFETY: writes one CUdevice.
        self.check("cuDeviceGet", unsafe { (self.api.device_get)(&mut dev, ordinal as i32) })?;
        let mut ctx: Ctx = std::ptr::null_mut();
        // SAFETY: writes one context handle.
        self.check("cuCtxCreate", unsafe { create(&mut ctx, 0, dev) })?;
        Ok(OwnedContext { cuda: self.clone(), ctx: ctx as usize })
    }

    /// The calling thread's current context (0: none), to check that the
    /// library leaves it as it was.
    pub fn current_context(&self) -> Result<usize> {
        self.current().map(|c| c as usize)
    }

    /// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
    pub fn alloc_pinned(self: &Arc<Self>, len: usize) -> Result<PinnedBuffer> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one host pointer.
        self.check("cuMemHostAlloc", unsafe { (self.api.mem_host_alloc)(&mut p, len, MEMHOSTALLOC_PORTABLE) })?;
        Ok(PinnedBuffer { cuda: self.clone(), ptr: p as usize, len })
    }

    /// A closed gate streams can be held at (tests): a device-mapped word
    /// of the current context, never freed.
    pub fn gate(self: &Arc<Self>) -> Result<Gate> {
        let (host, dev) = self.alloc_mapped(64)?;
        Ok(Gate { cuda: self.clone(), host, dev })
    }

    /// A new non-blocking stream in the current context, destroyed on drop.
    pub fn create_stream(self: &Arc<Self>) -> Result<OwnedStream> {
        let mut s: RawStream = std::ptr::null_mut();
        // SAFETY: writes one stream handle.
        self.check("cuStreamCreate", unsafe { (self.api.stream_create)(&mut s, STREAM_NON_BLOCKING) })?;
        Ok(OwnedStream { cuda: self.clone(), raw: s as usize })
    }

    /// A kernel that keeps one GPU thread busy for a given time, standing in
    /// for compute in benchmarks (PTX, compiled by the driver at load).
    pub fn spin_kernel(self: &Arc<Self>) -> Result<SpinKernel> {
        const PTX: &CStr = c"
.version 7.0
.target sm_50
.address_size 64
.visible .entry ugds_spin(.param .u64 ns)
{
    .reg .pred %p;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [ns];
    mov.u64 %rd2, %globaltimer;
LOOP:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra LOOP;
    ret;
}
";
        let mut module: *mut c_void = std::ptr::null_mut();
        // SAFETY: a NUL-terminated PTX image.
        self.check("cuModuleLoadData", unsafe { (self.api.module_load_data)(&mut module, PTX.as_ptr().cast()) })?;
        let mut f: *mut c_void = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        let r = unsafe { (self.api.module_get_function)(&mut f, module, c"ugds_spin".as_ptr()) };
        self.check("cuModuleGetFunction", r)?;
        Ok(SpinKernel { cuda: self.clone(), f: f as usize })
    }
}

/// Device memory from `cuMemAlloc`, freed on drop (tests and benchmarks).
pub struct DeviceBuffer {
    cuda: Arc<Cuda>,
    ptr: u64,
    len: usize,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer").finish_non_exhaustive()
    }
}

impl DeviceBuffer {
    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `src` into the buffer at `offset`; the bytes are in device
    /// memory when it returns. (`cuMemcpyHtoD` from pageable memory may
    /// return before its DMA has landed; a copy from another context, or a
    /// controller's DMA, could then read the old bytes.)
    pub fn upload(&self, offset: usize, src: &[u8]) -> Result<()> {
        assert!(offset + src.len() <= self.len);
        let stream = self.cuda.upload_stream()?;
        // SAFETY: in bounds of our allocation; `src` lives until the
        // stream is synchronized below.
        let r = unsafe {
            (self.cuda.api.memcpy_htod_async)(self.ptr + offset as u64, src.as_ptr().cast(), src.len(), stream)
        };
        self.cuda.check("cuMemcpyHtoDAsync", r)?;
        // SAFETY: our stream.
        self.cuda.check("cuStreamSynchronize", unsafe { (self.cuda.api.stream_synchronize)(stream) })
    }

    /// Copies the buffer's bytes at `offset` into `dst` (synchronous).
    pub fn download(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        assert!(offset + dst.len() <= self.len);
        // SAFETY: in bounds of our allocation.
        let r = unsafe { (self.cuda.api.memcpy_dtoh)(dst.as_mut_ptr().cast(), self.ptr + offset as u64, dst.len()) };
        self.cuda.check("cuMemcpyDtoH", r)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: our allocation; the owner deregistered it first.
        unsafe { (self.cuda.api.mem_free)(self.ptr) };
    }
}

/// A context made by [`Cuda::create_context`].
pub struct OwnedContext {
    cuda: Arc<Cuda>,
    ctx: usize,
}

impl std::fmt::Debug for OwnedContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedContext").finish_non_exhaustive()
    }
}

impl OwnedContext {
    /// Makes it the calling thread's current context.
    pub fn make_current(&self) -> Result<()> {
        self.cuda.set_current(self.ctx as Ctx)
    }
}

impl Drop for OwnedContext {
    fn drop(&mut self) {
        // SAFETY: our context; its allocations were freed by their owners.
        unsafe { (self.cuda.api.ctx_destroy)(self.ctx as Ctx) };
    }
}

/// See [`Cuda::gate`].
pub struct Gate {
    cuda: Arc<Cuda>,
    host: usize,
    dev: u64,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").finish_non_exhaustive()
    }
}

impl Gate {
    fn word(&self) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: the gate's word, never freed, aligned.
        unsafe { &*(self.host as *const std::sync::atomic::AtomicU32) }
    }

    /// Holds `stream` here until [`open`](Self::open), on the GPU (no host
    /// thread is held).
    pub fn hold(&self, stream: &OwnedStream) -> Result<()> {
        // SAFETY: a live stream and the gate's device-mapped word.
        let r = unsafe { (self.cuda.api.stream_wait_value32)(stream.raw(), self.dev, 1, STREAM_WAIT_VALUE_GEQ) };
        self.cuda.check("cuStreamWaitValue32", r)
    }

    /// Lets every stream held at the gate go on.
    pub fn open(&self) {
        // Release: what the caller wrote before is visible to the work
        // after the gate.
        self.word().store(1, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // Opened, so that no stream stays held; the word is kept (a stream
        // may still read it, and freeing pinned memory waits for the device).
        self.open();
    }
}

/// See [`Cuda::spin_kernel`].
pub struct SpinKernel {
    cuda: Arc<Cuda>,
    f: usize,
}

impl std::fmt::Debug for SpinKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpinKernel").finish_non_exhaustive()
    }
}

impl SpinKernel {
    /// Launches the kernel on `stream`: it runs for `ns` nanoseconds of GPU time.
    pub fn launch(&self, stream: &OwnedStream, ns: u64) -> Result<()> {
        let mut arg = ns;
        let mut params = [&mut arg as *mut u64 as *mut c_void];
        // SAFETY: one u64 parameter, as the kernel declares; the driver
        // copies parameters at launch.
        let r = unsafe {
            (self.cuda.api.launch_kernel)(
                self.f as *mut c_void,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream.raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.cuda.check("cuLaunchKernel", r)
    }
}

/// Page-locked host memory from [`Cuda::alloc_pinned`]; derefs to bytes.
pub struct PinnedBuffer {
    cuda: Arc<Cuda>,
    ptr: usize,
    len: usize,
}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer").finish_non_exhaustive()
    }
}

impl std::ops::Deref for PinnedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: our live allocation of `len` bytes.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl std::ops::DerefMut for PinnedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` is the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: our allocation; the owner deregistered it first.
        unsafe { (self.cuda.api.mem_free_host)(self.ptr as *mut c_void) };
    }
}

/// A stream made by [`Cuda::create_stream`], destroyed on drop.
pub struct OwnedStream {
    cuda: Arc<Cuda>,
    raw: usize,
}

impl std::fmt::Debug for OwnedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedStream").finish_non_exhaustive()
    }
}

impl OwnedStream {
    /// The `CUstream`.
    pub fn raw(&self) -> *mut c_void {
        self.raw as *mut c_void
    }

    /// Waits for the stream's work.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: our live stream.
        self.cuda.check("cuStreamSynchronize", unsafe { (self.cuda.api.stream_synchronize)(self.raw()) })
    }

    /// Enqueues a host function (runs on CUDA's callback thread, must not call CUDA).
    pub fn enqueue_host(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        unsafe extern "C" fn run(data: *mut c_void) {
            // SAFETY: boxed below, run once.
            let f = unsafe { Box::from_raw(data as *mut Box<dyn FnOnce() + Send>) };
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        }
        let b: Box<Box<dyn FnOnce() + Send>> = Box::new(Box::new(f));
        let data = Box::into_raw(b) as *mut c_void;
        // SAFETY: a live stream; `run` takes `data`.
        let r = unsafe { (self.cuda.api.launch_host_func)(self.raw(), run, data) };
        if r != SUCCESS {
            // SAFETY: not launched, still ours.
            drop(unsafe { Box::from_raw(data as *mut Box<dyn FnOnce() + Send>) });
        }
        self.cuda.check("cuLaunchHostFunc", r)
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: our stream; destroying it lets queued work finish.
        unsafe { (self.cuda.api.stream_destroy)(self.raw()) };
    }
}
