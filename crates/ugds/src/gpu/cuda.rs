//! CUDA, through the driver API in `libcuda.so.1`, loaded at run time.
//!
//! [`Cuda::get`] loads the library and initialises it once per process.
//! Registration classifies a pointer with `cuPointerGetAttribute`: device
//! memory must be a plain device allocation, the range inside one
//! allocation, of the calling thread's context when it has one; host
//! memory (pinned or not) is registered as host memory.

#[cfg(feature = "gpu-tools")]
mod tools;
#[cfg(feature = "gpu-tools")]
pub use tools::{DeviceBuffer, Gate, OwnedContext, OwnedStream, PinnedBuffer, SpinKernel};

use super::dl::Library;
use super::stream::{GpuStream, StagePool, StreamBackend, WordPool, STAGE_HEADER, WORD_PAGE};
use super::{page_span, DeviceMemory, DeviceRuntime, DmabufExport};
use crate::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

type Res = i32;
type Ctx = *mut c_void;
type RawStream = *mut c_void;
type HostFn = unsafe extern "C" fn(*mut c_void);

const SUCCESS: Res = 0;
const ERROR_INVALID_VALUE: Res = 1;
const ERROR_INVALID_CONTEXT: Res = 201;
const ERROR_NOT_SUPPORTED: Res = 801;

const POINTER_ATTRIBUTE_CONTEXT: i32 = 1;
const POINTER_ATTRIBUTE_MEMORY_TYPE: i32 = 2;
const POINTER_ATTRIBUTE_IS_MANAGED: i32 = 8;
const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;
const MEMORYTYPE_ARRAY: u32 = 3;
const STREAM_NON_BLOCKING: u32 = 1;
const STREAM_WAIT_VALUE_GEQ: u32 = 0;
const MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: i32 = 1;
const MEMHOSTALLOC_PORTABLE: u32 = 1;
const MEMHOSTALLOC_DEVICEMAP: u32 = 2;
const DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: i32 = 124;

/// The driver API entry points ugds uses.
#[allow(clippy::type_complexity)]
#[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
struct Api {
    init: unsafe extern "C" fn(u32) -> Res,
    get_error_name: unsafe extern "C" fn(Res, *mut *const c_char) -> Res,
    device_get_count: unsafe extern "C" fn(*mut i32) -> Res,
    device_get: unsafe extern "C" fn(*mut i32, i32) -> Res,
    device_get_attribute: unsafe extern "C" fn(*mut i32, i32, i32) -> Res,
    primary_ctx_retain: unsafe extern "C" fn(*mut Ctx, i32) -> Res,
    ctx_set_current: unsafe extern "C" fn(Ctx) -> Res,
    ctx_get_current: unsafe extern "C" fn(*mut Ctx) -> Res,
    ctx_get_device: unsafe extern "C" fn(*mut i32) -> Res,
    ctx_synchronize: unsafe extern "C" fn() -> Res,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, i32, u64) -> Res,
    mem_get_address_range: unsafe extern "C" fn(*mut u64, *mut usize, u64) -> Res,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> Res,
    mem_free: unsafe extern "C" fn(u64) -> Res,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> Res,
    mem_host_get_device_pointer: unsafe extern "C" fn(*mut u64, *mut c_void, u32) -> Res,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> Res,
    mem_host_register: unsafe extern "C" fn(*mut c_void, usize, u32) -> Res,
    mem_host_unregister: unsafe extern "C" fn(*mut c_void) -> Res,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> Res,
    memcpy_htod_async: unsafe extern "C" fn(u64, *const c_void, usize, RawStream) -> Res,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, u64, usize, RawStream) -> Res,
    mem_get_handle_for_address_range: unsafe extern "C" fn(*mut c_void, u64, usize, i32, u64) -> Res,
    stream_create: unsafe extern "C" fn(*mut RawStream, u32) -> Res,
    stream_destroy: unsafe extern "C" fn(RawStream) -> Res,
    stream_synchronize: unsafe extern "C" fn(RawStream) -> Res,
    launch_host_func: unsafe extern "C" fn(RawStream, HostFn, *mut c_void) -> Res,
    stream_wait_value32: unsafe extern "C" fn(RawStream, u64, u32, u32) -> Res,
    stream_write_value32: unsafe extern "C" fn(RawStream, u64, u32, u32) -> Res,
    ctx_pop_current: unsafe extern "C" fn(*mut Ctx) -> Res,
    /// Optional (for tests): a context other than the primary one.
    ctx_create: Option<unsafe extern "C" fn(*mut Ctx, u32, i32) -> Res>,
    ctx_destroy: unsafe extern "C" fn(Ctx) -> Res,
    module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> Res,
    module_get_function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> Res,
    #[allow(clippy::type_complexity)]
    launch_kernel: unsafe extern "C" fn(
        *mut c_void,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        RawStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> Res,
}

impl Api {
    fn load(lib: &Library) -> Result<Api> {
        // SAFETY: each type below is the symbol's C prototype in cuda.h
        // (CUresult = int, CUdevice = int, CUdeviceptr = unsigned long long,
        // handles are pointers).
        unsafe {
            Ok(Api {
                init: lib.sym(c"cuInit")?,
                get_error_name: lib.sym(c"cuGetErrorName")?,
                device_get_count: lib.sym(c"cuDeviceGetCount")?,
                device_get: lib.sym(c"cuDeviceGet")?,
                device_get_attribute: lib.sym(c"cuDeviceGetAttribute")?,
                primary_ctx_retain: lib.sym(c"cuDevicePrimaryCtxRetain")?,
                ctx_set_current: lib.sym(c"cuCtxSetCurrent")?,
                ctx_get_current: lib.sym(c"cuCtxGetCurrent")?,
                ctx_get_device: lib.sym(c"cuCtxGetDevice")?,
                ctx_synchronize: lib.sym(c"cuCtxSynchronize")?,
                pointer_get_attribute: lib.sym(c"cuPointerGetAttribute")?,
                mem_get_address_range: lib.sym(c"cuMemGetAddressRange_v2")?,
                mem_alloc: lib.sym(c"cuMemAlloc_v2")?,
                mem_free: lib.sym(c"cuMemFree_v2")?,
                mem_host_alloc: lib.sym(c"cuMemHostAlloc")?,
                mem_host_get_device_pointer: lib.sym(c"cuMemHostGetDevicePointer_v2")?,
                mem_free_host: lib.sym(c"cuMemFreeHost")?,
                mem_host_register: lib.sym(c"cuMemHostRegister_v2")?,
                mem_host_unregister: lib.sym(c"cuMemHostUnregister")?,
                memcpy_dtoh: lib.sym(c"cuMemcpyDtoH_v2")?,
                memcpy_htod_async: lib.sym(c"cuMemcpyHtoDAsync_v2")?,
                memcpy_dtoh_async: lib.sym(c"cuMemcpyDtoHAsync_v2")?,
                mem_get_handle_for_address_range: lib.sym(c"cuMemGetHandleForAddressRange")?,
                stream_create: lib.sym(c"cuStreamCreate")?,
                stream_destroy: lib.sym(c"cuStreamDestroy_v2")?,
                stream_synchronize: lib.sym(c"cuStreamSynchronize")?,
                launch_host_func: lib.sym(c"cuLaunchHostFunc")?,
                stream_wait_value32: lib.sym_any(&[c"cuStreamWaitValue32_v2", c"cuStreamWaitValue32"])?,
                stream_write_value32: lib.sym_any(&[c"cuStreamWriteValue32_v2", c"cuStreamWriteValue32"])?,
                ctx_pop_current: lib.sym(c"cuCtxPopCurrent_v2")?,
                ctx_create: lib.sym(c"cuCtxCreate_v2").ok(),
                ctx_destroy: lib.sym(c"cuCtxDestroy_v2")?,
                module_load_data: lib.sym(c"cuModuleLoadData")?,
                module_get_function: lib.sym(c"cuModuleGetFunction")?,
                launch_kernel: lib.sym(c"cuLaunchKernel")?,
            })
        }
    }
}

/// The CUDA driver, loaded and initialised.
pub struct Cuda {
    api: Api,
    _lib: Library,
    /// One runtime object per context, shared by its registrations.
    contexts: Mutex<HashMap<usize, Arc<CudaContext>>>,
    /// The copy engine's own context and stream, per device.
    copy_engines: Mutex<HashMap<i32, CopyEngine>>,
    /// Stream support per context (it owns the context's word pool).
    stream_backends: Mutex<HashMap<usize, Arc<CudaStreamBackend>>>,
    /// [`DeviceBuffer::upload`]'s stream, per context.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    upload_streams: Mutex<HashMap<usize, usize>>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda").finish_non_exhaustive()
    }
}

/// A context ugds creates for the emulated controller's copies, and its
/// stream. See [`CudaContext`] for why it is not the caller's context.
#[derive(Clone, Copy)]
struct CopyEngine {
    ctx: usize,
    stream: usize,
}

static CUDA: OnceLock<std::result::Result<Arc<Cuda>, String>> = OnceLock::new();

impl Cuda {
    /// Loads `libcuda.so.1` and calls `cuInit` (once per process).
    pub fn get() -> Result<Arc<Cuda>> {
        CUDA.get_or_init(|| Cuda::load().map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(Error::GpuUnavailable)
    }

    fn load() -> Result<Cuda> {
        let lib = Library::open(&["libcuda.so.1", "libcuda.so"])?;
        let api = Api::load(&lib)?;
        let cuda = Cuda {
            api,
            _lib: lib,
            contexts: Mutex::new(HashMap::new()),
            copy_engines: Mutex::new(HashMap::new()),
            stream_backends: Mutex::new(HashMap::new()),
            upload_streams: Mutex::new(HashMap::new()),
        };
        // SAFETY: cuInit takes flags 0.
        cuda.check("cuInit", unsafe { (cuda.api.init)(0) })?;
        Ok(cuda)
    }

    fn error_name(&self, code: Res) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: writes a pointer to a static string, or fails.
        if unsafe { (self.api.get_error_name)(code, &mut p) } != SUCCESS || p.is_null() {
            return format!("CUresult {code}");
        }
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn check(&self, call: &'static str, code: Res) -> Result<()> {
        if code == SUCCESS {
            Ok(())
        } else {
            Err(Error::GpuDriver { call, code, name: self.error_name(code) })
        }
    }

    /// Number of CUDA devices.
    pub fn device_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: writes one int.
        self.check("cuDeviceGetCount", unsafe { (self.api.device_get_count)(&mut n) })?;
        Ok(n as usize)
    }

    /// Makes device `ordinal`'s primary context current on this thread
    /// (as the CUDA runtime and torch do), retaining it for the process.
    pub fn use_device(&self, ordinal: usize) -> Result<()> {
        let mut dev = 0;
        // SAFETY: writes one CUdevice.
        self.check("cuDeviceGet", unsafe { (self.api.device_get)(&mut dev, ordinal as i32) })?;
        let mut ctx: Ctx = std::ptr::null_mut();
        // SAFETY: writes one context; the retain is never released (the
        // primary context lives as long as the process uses the device).
        self.check("cuDevicePrimaryCtxRetain", unsafe { (self.api.primary_ctx_retain)(&mut ctx, dev) })?;
        // SAFETY: a live context.
        self.check("cuCtxSetCurrent", unsafe { (self.api.ctx_set_current)(ctx) })
    }

    fn current(&self) -> Result<Ctx> {
        let mut ctx: Ctx = std::ptr::null_mut();
        // SAFETY: writes one context handle (null when none).
        self.check("cuCtxGetCurrent", unsafe { (self.api.ctx_get_current)(&mut ctx) })?;
        Ok(ctx)
    }

    fn set_current(&self, ctx: Ctx) -> Result<()> {
        // SAFETY: a context handle this process retains.
        self.check("cuCtxSetCurrent", unsafe { (self.api.ctx_set_current)(ctx) })
    }

    fn attribute<T: Default>(&self, ptr: u64, attr: i32) -> std::result::Result<T, Res> {
        let mut v = T::default();
        // SAFETY: `T` is the attribute's C type, chosen by the caller below.
        let r = unsafe { (self.api.pointer_get_attribute)(&mut v as *mut T as *mut c_void, attr, ptr) };
        if r == SUCCESS {
            Ok(v)
        } else {
            Err(r)
        }
    }

    /// What `ptr..ptr+len` is: host memory (pinned or not), or device
    /// memory checked for registration.
    pub fn classify(self: &Arc<Self>, ptr: u64, len: usize) -> Result<Memory> {
        if ptr == 0 {
            return Err(Error::InvalidArgument("null buffer".into()));
        }
        if len == 0 {
            return Err(Error::ZeroSize);
        }
        let mem_type: u32 = match self.attribute(ptr, POINTER_ATTRIBUTE_MEMORY_TYPE) {
            Ok(t) => t,
            // Memory CUDA has never seen: plain host memory (asked with no
            // context current, CUDA says the context is invalid instead).
            Err(ERROR_INVALID_VALUE | ERROR_INVALID_CONTEXT) => return Ok(Memory::Host),
            Err(code) => {
                return Err(Error::GpuDriver { call: "cuPointerGetAttribute", code, name: self.error_name(code) })
            }
        };
        let managed: u32 = self.attribute(ptr, POINTER_ATTRIBUTE_IS_MANAGED).unwrap_or(0);
        if managed != 0 {
            return Err(Error::GpuMemoryType { ptr, kind: "managed" });
        }
        match mem_type {
            MEMORYTYPE_HOST => return Ok(Memory::Host),
            MEMORYTYPE_DEVICE => {}
            MEMORYTYPE_ARRAY => return Err(Error::GpuMemoryType { ptr, kind: "CUDA array" }),
            _ => return Err(Error::GpuMemoryType { ptr, kind: "unified" }),
        }
        let ctx: usize = self
            .attribute::<usize>(ptr, POINTER_ATTRIBUTE_CONTEXT)
            .map_err(|c| Error::GpuPointerInvalid { ptr, why: self.error_name(c) })?;
        let current = self.current()? as usize;
        if current != 0 && current != ctx {
            return Err(Error::GpuContextMismatch { ptr });
        }
        let (mut base, mut size) = (0u64, 0usize);
        self.with_context(ctx as Ctx, || {
            // SAFETY: writes the allocation's base and size.
            self.check("cuMemGetAddressRange", unsafe { (self.api.mem_get_address_range)(&mut base, &mut size, ptr) })
        })
        .map_err(|e| Error::GpuPointerInvalid { ptr, why: e.to_string() })?;
        if ptr.checked_add(len as u64).is_none_or(|end| end > base + size as u64) {
            return Err(Error::GpuPointerRange { ptr, len, alloc_base: base, alloc_len: size });
        }
        Ok(Memory::Device(DeviceMemory { ptr, len, runtime: self.context(ctx)? }))
    }

    /// Runs `f` with `ctx` current on this thread, restoring what was.
    fn with_context<T>(&self, ctx: Ctx, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let before = self.current()?;
        if before == ctx {
            return f();
        }
        self.set_current(ctx)?;
        let r = f();
        self.set_current(before)?;
        r
    }

    fn context(self: &Arc<Self>, ctx: usize) -> Result<Arc<CudaContext>> {
        let mut map = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(&ctx) {
            return Ok(c.clone());
        }
        let mut device = 0;
        self.with_context(ctx as Ctx, || {
            // SAFETY: writes one int.
            self.check("cuCtxGetDevice", unsafe { (self.api.ctx_get_device)(&mut device) })
        })?;
        let c = Arc::new(CudaContext { cuda: self.clone(), ctx, device, copy: OnceLock::new() });
        // The copy engine is made now, at the first registration, rather
        // than at the first copy: creating a context may wait for the
        // device under the driver's lock, which must not happen while a
        // stream waits on an emulated I/O that needs a copy.
        let _ = c.copy.set(self.copy_engine(device).map_err(|e| e.to_string()));
        map.insert(ctx, c.clone());
        Ok(c)
    }

    /// The copy engine of `device`, created at its first use: a context of
    /// ugds's own (`cuCtxCreate`) and a stream in it. Leaves the calling
    /// thread's current context as it was.
    fn copy_engine(&self, device: i32) -> Result<CopyEngine> {
        let mut map = self.copy_engines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = map.get(&device) {
            return Ok(*e);
        }
        let create = self.api.ctx_create.ok_or_else(|| Error::GpuUnavailable("no cuCtxCreate_v2".into()))?;
        let mut ctx: Ctx = std::ptr::null_mut();
        // SAFETY: writes one context handle and pushes it on this thread's
        // context stack (popped below).
        self.check("cuCtxCreate", unsafe { create(&mut ctx, 0, device) })?;
        let mut stream: RawStream = std::ptr::null_mut();
        // SAFETY: writes one stream handle, in the context just pushed.
        let made = self.check("cuStreamCreate", unsafe { (self.api.stream_create)(&mut stream, STREAM_NON_BLOCKING) });
        let mut popped: Ctx = std::ptr::null_mut();
        // SAFETY: pops the context pushed above.
        let popped_ok = self.check("cuCtxPopCurrent", unsafe { (self.api.ctx_pop_current)(&mut popped) });
        if let Err(e) = made.and(popped_ok) {
            // SAFETY: our context, with nothing in flight.
            unsafe { (self.api.ctx_destroy)(ctx) };
            return Err(e);
        }
        let e = CopyEngine { ctx: ctx as usize, stream: stream as usize };
        map.insert(device, e);
        Ok(e)
    }

    /// Whether device `ordinal` can export dma-bufs.
    pub fn dmabuf_supported(&self, ordinal: usize) -> Result<bool> {
        let (mut dev, mut v) = (0, 0);
        // SAFETY: writes one CUdevice / one int.
        self.check("cuDeviceGet", unsafe { (self.api.device_get)(&mut dev, ordinal as i32) })?;
        // SAFETY: as above.
        let r = unsafe { (self.api.device_get_attribute)(&mut v, DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) };
        self.check("cuDeviceGetAttribute", r)?;
        Ok(v != 0)
    }

    /// A stream-ordered I/O target on `stream` (a `CUstream`; null is the
    /// legacy default stream), in the calling thread's current context.
    ///
    /// # Safety
    /// `stream` must be a live stream of the current context, and must
    /// outlive the returned value.
    pub unsafe fn stream(self: &Arc<Self>, stream: *mut c_void, wait: super::StreamWait) -> Result<GpuStream> {
        let ctx = self.current()?;
        if ctx.is_null() {
            return Err(Error::InvalidArgument("no CUDA context is current on this thread".into()));
        }
        let backend = self
            .stream_backends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(ctx as usize)
            .or_insert_with(|| {
                Arc::new(CudaStreamBackend {
                    cuda: self.clone(),
                    ctx: ctx as usize,
                    pool: Mutex::default(),
                    stages: Mutex::default(),
                    copy_kernel: OnceLock::new(),
                })
            })
            .clone();
        // Loaded with the context's first stream, before any operation
        // waits: loading a module waits for the device.
        if let Err(e) = backend.copy_kernel() {
            tracing::warn!("CUDA: staging copy kernel not loaded ({e}); stream-ordered I/O is not staged");
        }
        GpuStream::new(backend, stream as usize, wait)
    }

    /// `len` bytes of device-mapped pinned memory of the current context,
    /// zeroed: (host address, device address). Freed by nobody: freeing
    /// pinned memory waits for the device.
    fn alloc_mapped(&self, len: usize) -> Result<(usize, u64)> {
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = MEMHOSTALLOC_PORTABLE | MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: writes one host pointer.
        self.check("cuMemHostAlloc", unsafe { (self.api.mem_host_alloc)(&mut host, len, flags) })?;
        // SAFETY: `len` bytes just allocated.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, len) };
        let mut dev = 0u64;
        // SAFETY: `host` is mapped memory of this context.
        let r = unsafe { (self.api.mem_host_get_device_pointer)(&mut dev, host, 0) };
        if let Err(e) = self.check("cuMemHostGetDevicePointer", r) {
            // SAFETY: ours, never given to a stream.
            unsafe { (self.api.mem_free_host)(host) };
            return Err(e);
        }
        Ok((host as usize, dev))
    }

    /// The stream [`DeviceBuffer::upload`] copies on in the current
    /// context, created at its first use and kept.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    fn upload_stream(&self) -> Result<RawStream> {
        let ctx = self.current()? as usize;
        let mut map = self.upload_streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&s) = map.get(&ctx) {
            return Ok(s as RawStream);
        }
        let mut s: RawStream = std::ptr::null_mut();
        // SAFETY: writes one stream handle; never destroyed.
        self.check("cuStreamCreate", unsafe { (self.api.stream_create)(&mut s, STREAM_NON_BLOCKING) })?;
        map.insert(ctx, s as usize);
        Ok(s)
    }

    /// Waits for all work of the current context.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: no arguments.
        self.check("cuCtxSynchronize", unsafe { (self.api.ctx_synchronize)() })
    }

    /// The ordinal of the current context's device.
    pub fn current_device(&self) -> Result<usize> {
        let mut d = 0;
        // SAFETY: writes one int.
        self.check("cuCtxGetDevice", unsafe { (self.api.ctx_get_device)(&mut d) })?;
        Ok(d as usize)
    }
}

/// What a pointer is, as far as registration cares.
#[derive(Debug)]
#[non_exhaustive]
pub enum Memory {
    /// Host memory: pageable, or pinned by CUDA (it has a host address).
    Host,
    /// Device memory, checked.
    Device(DeviceMemory),
}

/// The runtime object of one CUDA context: the emulated controller's copy
/// engine and dma-buf exports for memory of that context.
///
/// The copy engine runs in a context of its own, not the caller's. A stream
/// waiting for I/O (`cuStreamWaitValue32`) blocks the hardware queue it is
/// mapped to, and a context's streams share a few such queues (8 unless
/// `CUDA_DEVICE_MAX_CONNECTIONS` says otherwise): a copy on a stream of the
/// caller's context deadlocks once it lands behind a wait for the I/O it
/// serves (measured on an H200: the 8th waiting stream stalls a copy on a
/// stream created before it). Another context has its own queues, and the
/// driver time-slices contexts, so the copy runs while the caller's streams
/// wait. With a real controller there is no copy: the SSD writes GPU memory.
pub struct CudaContext {
    cuda: Arc<Cuda>,
    ctx: usize,
    device: i32,
    copy: OnceLock<std::result::Result<CopyEngine, String>>,
}

impl std::fmt::Debug for CudaContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaContext").finish_non_exhaustive()
    }
}

impl CudaContext {
    fn copy(&self, f: impl FnOnce(RawStream) -> (Res, &'static str)) -> Result<()> {
        let engine = self
            .copy
            .get_or_init(|| self.cuda.copy_engine(self.device).map_err(|e| e.to_string()))
            .clone()
            .map_err(Error::GpuUnavailable)?;
        // The emulator's thread makes the copy context current once and keeps it.
        if self.cuda.current()? as usize != engine.ctx {
            self.cuda.set_current(engine.ctx as Ctx)?;
        }
        let stream = engine.stream as RawStream;
        let (r, call) = f(stream);
        self.cuda.check(call, r)?;
        // SAFETY: the copy engine's own stream.
        self.cuda.check("cuStreamSynchronize", unsafe { (self.cuda.api.stream_synchronize)(stream) })
    }
}

impl DeviceRuntime for CudaContext {
    fn name(&self) -> &'static str {
        "CUDA"
    }

    fn context(&self) -> usize {
        self.ctx
    }

    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.copy(|s| {
            // SAFETY: `src` is a live slice; `dst` lies in a registered
            // allocation (the caller translated it through the IOVA table).
            let r = unsafe { (self.cuda.api.memcpy_htod_async)(dst, src.as_ptr().cast(), src.len(), s) };
            (r, "cuMemcpyHtoDAsync")
        })
    }

    unsafe fn copy_from_device(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.copy(|s| {
            // SAFETY: as for copy_to_device, the other way.
            let r = unsafe { (self.cuda.api.memcpy_dtoh_async)(dst.as_mut_ptr().cast(), src, dst.len(), s) };
            (r, "cuMemcpyDtoHAsync")
        })
    }

    fn host_register(&self, ptr: *mut u8, len: usize) -> bool {
        let r = self.cuda.with_context(self.ctx as Ctx, || {
            // SAFETY: the caller's live mapping of `len` bytes, unregistered
            // before it is unmapped.
            let r = unsafe { (self.cuda.api.mem_host_register)(ptr.cast(), len, MEMHOSTALLOC_PORTABLE) };
            self.cuda.check("cuMemHostRegister", r)
        });
        if let Err(e) = &r {
            tracing::debug!("bounce buffer not pinned: {e}");
        }
        r.is_ok()
    }

    fn host_unregister(&self, ptr: *mut u8) {
        let _ = self.cuda.with_context(self.ctx as Ctx, || {
            // SAFETY: registered by host_register.
            self.cuda.check("cuMemHostUnregister", unsafe { (self.cuda.api.mem_host_unregister)(ptr.cast()) })
        });
    }

    fn export_dmabuf(&self, ptr: u64, len: usize) -> Result<DmabufExport> {
        let (start, span) = page_span(ptr, len);
        let mut fd: i32 = -1;
        self.cuda.with_context(self.ctx as Ctx, || {
            // SAFETY: writes one int (the dma-buf fd) for this handle type.
            let r = unsafe {
                (self.cuda.api.mem_get_handle_for_address_range)(
                    &mut fd as *mut i32 as *mut c_void,
                    start,
                    span,
                    MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    0,
                )
            };
            if r == ERROR_NOT_SUPPORTED {
                return Err(Error::Unsupported("this GPU or kernel cannot export dma-bufs".into()));
            }
            self.cuda.check("cuMemGetHandleForAddressRange", r)
        })?;
        // SAFETY: a new descriptor the driver handed to us.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(DmabufExport { fd, offset: ptr - start, len })
    }
}

struct CudaStreamBackend {
    cuda: Arc<Cuda>,
    ctx: usize,
    pool: Mutex<WordPool>,
    stages: Mutex<StagePool>,
    /// The staging copy kernel (a `CUfunction`), loaded once per context.
    copy_kernel: OnceLock<std::result::Result<usize, String>>,
}

/// The staging copy: `len` bytes from `src` to `dst`, read from the header
/// its argument points at when the kernel runs (by one thread per block:
/// the header is in host memory, and a read of it crosses PCIe); 16 bytes
/// per thread and step where all three are multiples of 16, bytes
/// otherwise. `membar.sys` makes writes to host memory (a write's staging)
/// visible to the host function after the kernel.
const STAGE_COPY_PTX: &CStr = c"
.version 7.0
.target sm_50
.address_size 64
.visible .entry ugds_stage_copy(.param .u64 header)
{
    .reg .pred %p<4>;
    .reg .b32 %r<9>;
    .reg .b64 %rd<14>;
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

/// Grid of the staging copy: blocks of threads.
const STAGE_COPY_GRID: (u32, u32) = (64, 256);

impl CudaStreamBackend {
    /// The staging copy kernel of this context, loaded at the first call.
    fn copy_kernel(&self) -> std::result::Result<usize, String> {
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
        self.alloc_mapped(len)
    }

    fn stage_pool(&self) -> Option<&Mutex<StagePool>> {
        self.copy_kernel().is_ok().then_some(&self.stages)
    }

    fn launch_copy(&self, stream: usize, header: u64) -> Result<()> {
        let f = self.copy_kernel().map_err(Error::GpuUnavailable)?;
        let mut arg = header;
        let mut params = [&mut arg as *mut u64 as *mut c_void];
        let (blocks, threads) = STAGE_COPY_GRID;
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
