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
use ugds_platform::Recover;

mod api;
mod ipc;
mod stream;

use api::*;
pub use ipc::IpcMemory;
use stream::CudaStreamBackend;

use super::dl::Library;
use super::stream::{GpuStream, StagePool, StreamBackend, WordPool, STAGE_HEADER, WORD_PAGE};
use super::{page_span, CopyTicket, DeviceMemory, DeviceRuntime, DmabufExport};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use ugds_platform::device::IpcExport;
use ugds_platform::{Error, Result};

/// The CUDA driver, loaded and initialised.
pub struct Cuda {
    api: Api,
    _lib: Library,
    /// One runtime object per context, shared by its registrations.
    contexts: Mutex<HashMap<usize, Arc<CudaContext>>>,
    /// Each device's primary context, retained once for the process.
    primaries: Mutex<HashMap<i32, usize>>,
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
/// streams. See [`CudaContext`] for why it is not the caller's context.
///
/// A copy waits for its stream, so copies from threads on one stream wait
/// for each other's too: each thread copies on a stream of its own
/// ([`copy_lane`]), one of `COPY_STREAMS` made with the context (the
/// context's hardware queues), so that several emulated controllers (each
/// copying on its own threads) move data side by side as several SSDs do.
/// They are made with the engine, never later: `cuStreamCreate` can wait
/// for the device under the driver's lock (see [`Cuda::copy_engine`]).
#[derive(Clone, Copy)]
struct CopyEngine {
    ctx: usize,
    streams: [usize; COPY_STREAMS],
}

/// Streams per copy engine: as many as a context has hardware queues by
/// default (`CUDA_DEVICE_MAX_CONNECTIONS`); more would share them.
const COPY_STREAMS: usize = 8;

/// The calling thread's lane among a copy engine's streams, given out
/// round robin as threads first copy.
fn copy_lane() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static LANE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % COPY_STREAMS);
    LANE.with(|l| *l)
}

static CUDA: OnceLock<std::result::Result<Arc<Cuda>, String>> = OnceLock::new();

impl Cuda {
    /// Loads `libcuda.so.1` and calls `cuInit` (once per process).
    pub fn get() -> Result<Arc<Cuda>> {
        CUDA.get_or_init(|| Cuda::load().map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(Error::GpuUnavailable)
    }

    /// The driver, where this process already uses it: loaded by
    /// [`Cuda::get`], or `libcuda.so.1` loaded and initialised by someone
    /// else (the CUDA runtime, torch) with a context current on this
    /// thread. Otherwise `None`, and nothing is loaded or initialised
    /// (`cuInit` can take hundreds of milliseconds; a library such as CuPy
    /// loads `libcuda.so.1` at import and initialises it only when used).
    pub(crate) fn if_loaded() -> Option<Arc<Cuda>> {
        if let Some(Ok(c)) = CUDA.get() {
            return Some(c.clone());
        }
        let in_use = Library::with_loaded(&["libcuda.so.1", "libcuda.so"], |lib| {
            // SAFETY: cuCtxGetCurrent's C type.
            let Ok(get_current) = (unsafe { lib.sym::<unsafe extern "C" fn(*mut Ctx) -> Res>(c"cuCtxGetCurrent") })
            else {
                return false;
            };
            let mut ctx: Ctx = std::ptr::null_mut();
            // SAFETY: writes one context handle; before `cuInit` it fails
            // (CUDA_ERROR_NOT_INITIALIZED) and initialises nothing.
            (unsafe { get_current(&mut ctx) }) == SUCCESS && !ctx.is_null()
        });
        if in_use != Some(true) {
            return None;
        }
        Cuda::get().ok()
    }

    /// Whether context `ctx`'s runtime object (and with it its device's
    /// copy engine) is made.
    pub(crate) fn has_context(&self, ctx: usize) -> bool {
        self.contexts.lock().recover().contains_key(&ctx)
    }

    /// The calling thread's current context, if it has one.
    pub(crate) fn context_of_thread(&self) -> Option<usize> {
        self.current().ok().filter(|c| !c.is_null()).map(|c| c as usize)
    }

    fn load() -> Result<Cuda> {
        let lib = Library::open(&["libcuda.so.1", "libcuda.so"])?;
        let api = Api::load(&lib)?;
        let cuda = Cuda {
            api,
            _lib: lib,
            contexts: Mutex::new(HashMap::new()),
            primaries: Mutex::new(HashMap::new()),
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
        let ctx = self.primary_context(dev)?;
        // SAFETY: a live context.
        self.check("cuCtxSetCurrent", unsafe { (self.api.ctx_set_current)(ctx) })
    }

    /// Device `dev`'s primary context, retained the first time it is asked
    /// for and never released (it lives as long as the process uses the
    /// device): one reference per device, however often it is asked for.
    pub(crate) fn primary_context(&self, dev: i32) -> Result<Ctx> {
        let mut primaries = self.primaries.lock().recover();
        if let Some(&ctx) = primaries.get(&dev) {
            return Ok(ctx as Ctx);
        }
        let mut ctx: Ctx = std::ptr::null_mut();
        // SAFETY: writes one context handle.
        self.check("cuDevicePrimaryCtxRetain", unsafe { (self.api.primary_ctx_retain)(&mut ctx, dev) })?;
        primaries.insert(dev, ctx as usize);
        Ok(ctx)
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

    /// The allocation holding device address `ptr`: its base and length
    /// (`cuMemGetAddressRange`, in the pointer's own context).
    pub fn allocation(&self, ptr: u64) -> Result<(u64, usize)> {
        let ctx: usize = self
            .attribute::<usize>(ptr, POINTER_ATTRIBUTE_CONTEXT)
            .map_err(|c| Error::GpuPointerInvalid { ptr, why: self.error_name(c) })?;
        let (mut base, mut size) = (0u64, 0usize);
        self.with_context(ctx as Ctx, || {
            // SAFETY: writes the allocation's base and size.
            self.check("cuMemGetAddressRange", unsafe { (self.api.mem_get_address_range)(&mut base, &mut size, ptr) })
        })
        .map_err(|e| Error::GpuPointerInvalid { ptr, why: e.to_string() })?;
        Ok((base, size))
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

    /// The runtime object of context `ctx`, made (with its device's copy
    /// engine) the first time.
    pub(crate) fn context(self: &Arc<Self>, ctx: usize) -> Result<Arc<CudaContext>> {
        let mut map = self.contexts.lock().recover();
        if let Some(c) = map.get(&ctx) {
            return Ok(c.clone());
        }
        let mut device = 0;
        self.with_context(ctx as Ctx, || {
            // SAFETY: writes one int.
            self.check("cuCtxGetDevice", unsafe { (self.api.ctx_get_device)(&mut device) })
        })?;
        let c = Arc::new(CudaContext {
            cuda: self.clone(),
            ctx,
            device,
            copy: OnceLock::new(),
            events: Mutex::new(Vec::new()),
            events_made: (AtomicU64::new(0), AtomicU64::new(0)),
            lanes_used: AtomicUsize::new(0),
            prepared: AtomicBool::new(false),
        });
        // The copy engine is made with the context's runtime object (at
        // the first registration, or while a handle opens: see
        // `driver::with_copies_prepared`), never at the first copy:
        // creating a context may wait for the device under the driver's
        // lock, which must not happen while a stream waits on an emulated
        // I/O that needs a copy.
        let _ = c.copy.set(self.copy_engine(device).map_err(|e| e.to_string()));
        map.insert(ctx, c.clone());
        Ok(c)
    }

    /// The copy engine of `device`, created at its first use: a context of
    /// ugds's own and its streams. Leaves the calling thread's current
    /// context as it was.
    ///
    /// The context is a green context over all of the device's SMs where
    /// the driver has them (CUDA 12.4 on), else a plain one: on the H200 a
    /// green context took about 1 ms to create against 100-130 ms for
    /// `cuCtxCreate`, and copies on its streams run while every hardware
    /// queue of the caller's context waits (bench/cuda-probes/green_ctx.c).
    /// `UGDS_COPY_CONTEXT=plain` asks for the plain one (another value
    /// fails the engine, and so every copy through it).
    fn copy_engine(&self, device: i32) -> Result<CopyEngine> {
        let mut map = self.copy_engines.lock().recover();
        if let Some(e) = map.get(&device) {
            return Ok(*e);
        }
        let plain = match std::env::var("UGDS_COPY_CONTEXT").ok().as_deref() {
            None | Some("") => false,
            Some("plain") => true,
            // Kept as the engine's error: every copy through it says so.
            Some(v) => return Err(Error::InvalidArgument(format!("UGDS_COPY_CONTEXT={v:?}: plain, or unset"))),
        };
        let green = if plain { None } else { self.green_context(device).map_err(|e| tracing::info!("{e}")).ok() };
        let (ctx, owned) = match green {
            Some(ctx) => {
                // SAFETY: a context of the device, pushed on this thread's
                // stack (popped below).
                self.check("cuCtxPushCurrent", unsafe { (self.api.ctx_push_current)(ctx) })?;
                (ctx, false)
            }
            None => {
                let create = self.api.ctx_create.ok_or_else(|| Error::GpuUnavailable("no cuCtxCreate_v2".into()))?;
                let mut ctx: Ctx = std::ptr::null_mut();
                // SAFETY: writes one context handle and pushes it on this
                // thread's context stack (popped below).
                self.check("cuCtxCreate", unsafe { create(&mut ctx, 0, device) })?;
                (ctx, true)
            }
        };
        let mut streams = [0usize; COPY_STREAMS];
        let made = streams.iter_mut().try_for_each(|slot| {
            let mut stream: RawStream = std::ptr::null_mut();
            // SAFETY: writes one stream handle, in the context just pushed.
            let r = unsafe { (self.api.stream_create)(&mut stream, STREAM_NON_BLOCKING) };
            self.check("cuStreamCreate", r).map(|()| *slot = stream as usize)
        });
        let mut popped: Ctx = std::ptr::null_mut();
        // SAFETY: pops the context pushed above.
        let popped_ok = self.check("cuCtxPopCurrent", unsafe { (self.api.ctx_pop_current)(&mut popped) });
        if let Err(e) = made.and(popped_ok) {
            if owned {
                // SAFETY: our context, with nothing in flight (its streams
                // go with it).
                unsafe { (self.api.ctx_destroy)(ctx) };
            }
            return Err(e);
        }
        let e = CopyEngine { ctx: ctx as usize, streams };
        map.insert(device, e);
        Ok(e)
    }

    /// A green context over all of `device`'s SMs, as a context (kept for
    /// the process).
    fn green_context(&self, device: i32) -> Result<Ctx> {
        let g = self.api.green.as_ref().ok_or_else(|| Error::Unsupported("CUDA: no green contexts".into()))?;
        // A `CUdevResource`, 8-byte aligned, larger than any version's.
        let mut res = [0u64; DEV_RESOURCE_BYTES / 8];
        let res_ptr = res.as_mut_ptr() as *mut c_void;
        // SAFETY: writes one CUdevResource into `res`, which is larger.
        let r = unsafe { (g.device_get_dev_resource)(device, res_ptr, DEV_RESOURCE_TYPE_SM) };
        self.check("cuDeviceGetDevResource", r)?;
        let mut desc: *mut c_void = std::ptr::null_mut();
        // SAFETY: one resource, as written above; writes one descriptor.
        let r = unsafe { (g.dev_resource_generate_desc)(&mut desc, res_ptr, 1) };
        self.check("cuDevResourceGenerateDesc", r)?;
        let mut green: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one green context; never destroyed.
        let r = unsafe { (g.green_ctx_create)(&mut green, desc, device, GREEN_CTX_DEFAULT_STREAM) };
        self.check("cuGreenCtxCreate", r)?;
        let mut ctx: Ctx = std::ptr::null_mut();
        // SAFETY: writes one context handle for the green context.
        self.check("cuCtxFromGreenCtx", unsafe { (g.ctx_from_green_ctx)(&mut ctx, green) })?;
        Ok(ctx)
    }

    /// Device `ordinal`'s name.
    pub fn device_name(&self, ordinal: usize) -> Result<String> {
        self.device_string(ordinal, "cuDeviceGetName", self.api.device_get_name)
    }

    /// Device `ordinal`'s PCI address (`0000:01:00.0`, lower case).
    pub fn pci_bus_id(&self, ordinal: usize) -> Result<String> {
        self.device_string(ordinal, "cuDeviceGetPCIBusId", self.api.device_get_pci_bus_id)
            .map(|s| s.to_ascii_lowercase())
    }

    fn device_string(
        &self,
        ordinal: usize,
        call: &'static str,
        f: unsafe extern "C" fn(*mut c_char, i32, i32) -> Res,
    ) -> Result<String> {
        let mut dev = 0;
        // SAFETY: writes one CUdevice.
        self.check("cuDeviceGet", unsafe { (self.api.device_get)(&mut dev, ordinal as i32) })?;
        let mut buf = [0 as c_char; 128];
        // SAFETY: writes a NUL-terminated string of at most `buf.len()` bytes.
        self.check(call, unsafe { f(buf.as_mut_ptr(), buf.len() as i32, dev) })?;
        // SAFETY: NUL-terminated within `buf` (the call's contract; the last byte is never written past).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
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
            .recover()
            .entry(ctx as usize)
            .or_insert_with(|| Arc::new(CudaStreamBackend::new(self.clone(), ctx as usize)))
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

    /// As [`alloc_mapped`](Self::alloc_mapped), in memory another process
    /// can map (a memfd, listed as shared memory), pinned and mapped for
    /// the device by registration: the staging blocks of a process attached
    /// to a controller another process owns, whose memory that owner maps
    /// for its controller (pinned memory of the runtime's own is private
    /// to this process). Freed by nobody either.
    fn alloc_mapped_shared(&self, len: usize) -> Result<(usize, u64)> {
        let mem = ugds_platform::sys::shared::SharedMemory::new(len)?;
        let host = mem.as_ptr().cast::<c_void>();
        let flags = MEMHOSTALLOC_PORTABLE | MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: `len` bytes of page-aligned memory of ours, never unmapped
        // once registered (forgotten below).
        self.check("cuMemHostRegister", unsafe { (self.api.mem_host_register)(host, len, flags) })?;
        // Kept mapped and listed for the process's life: the device and the
        // owner's controller may reach it from now on.
        std::mem::forget(mem);
        let mut dev = 0u64;
        // SAFETY: `host` is registered, device-mapped memory of this context.
        let r = unsafe { (self.api.mem_host_get_device_pointer)(&mut dev, host, 0) };
        self.check("cuMemHostGetDevicePointer", r)?;
        Ok((host as usize, dev))
    }

    /// The stream [`DeviceBuffer::upload`] copies on in the current
    /// context, created at its first use and kept.
    #[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
    fn upload_stream(&self) -> Result<RawStream> {
        let ctx = self.current()? as usize;
        let mut map = self.upload_streams.lock().recover();
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
///
/// The kernel path copies on the caller's thread: every copy leaves the
/// thread's current context as it found it, and its asynchronous copies
/// ([`DeviceRuntime::copy_to_device_start`]) record an event of a pool
/// (created in the copy engine's context, kept for the process) that
/// [`DeviceRuntime::copy_finished`] queries.
pub struct CudaContext {
    cuda: Arc<Cuda>,
    ctx: usize,
    device: i32,
    copy: OnceLock<std::result::Result<CopyEngine, String>>,
    events: Mutex<Vec<usize>>,
    /// Events made for the pool so far, and the time that took (ns).
    events_made: (AtomicU64, AtomicU64),
    /// The engine's streams that have had a copy (bit per lane).
    lanes_used: AtomicUsize,
    /// Whether `prepare_copies` ran (or runs now).
    prepared: AtomicBool,
}

impl std::fmt::Debug for CudaContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaContext").finish_non_exhaustive()
    }
}

impl CudaContext {
    /// The copy engine this context's copies run on.
    fn engine(&self) -> Result<CopyEngine> {
        self.copy
            .get_or_init(|| self.cuda.copy_engine(self.device).map_err(|e| e.to_string()))
            .clone()
            .map_err(Error::GpuUnavailable)
    }

    /// Runs `f` with the copy engine's context current and the calling
    /// thread's stream of it, restoring the thread's context after.
    fn on_engine<T>(&self, f: impl FnOnce(RawStream) -> Result<T>) -> Result<T> {
        let engine = self.engine()?;
        let lane = copy_lane();
        // A plain load on the hot path: the shared word is written only
        // while a lane has had no copy yet.
        let first = self.lanes_used.load(Ordering::Relaxed) & (1 << lane) == 0
            && self.lanes_used.fetch_or(1 << lane, Ordering::Relaxed) & (1 << lane) == 0;
        let started = first.then(std::time::Instant::now);
        let r = self.cuda.with_context(engine.ctx as Ctx, || f(engine.streams[lane] as RawStream));
        if let Some(t) = started {
            // What a stream's first copy costs (`UGDS_LOG=debug`): the
            // call, with its wait where it waits.
            tracing::debug!(lane, us = t.elapsed().as_micros() as u64, "first copy on a copy engine stream");
        }
        r
    }

    /// A copy event for the pool, made in the engine's context (current
    /// here) and kept for the process.
    fn new_event(&self) -> Result<Event> {
        let started = std::time::Instant::now();
        let mut e: Event = std::ptr::null_mut();
        // SAFETY: writes one event handle.
        let r = unsafe { (self.cuda.api.event_create)(&mut e, EVENT_DISABLE_TIMING) };
        self.cuda.check("cuEventCreate", r)?;
        let (made, ns) = &self.events_made;
        let took = started.elapsed().as_nanos() as u64;
        let ns = ns.fetch_add(took, Ordering::Relaxed) + took;
        let made = made.fetch_add(1, Ordering::Relaxed) + 1;
        // What copies in flight cost the first time (`UGDS_LOG=debug`):
        // each doubling of the pool.
        if made.is_power_of_two() {
            tracing::debug!(events = made, total_us = ns / 1000, "copy events made");
        }
        Ok(e)
    }

    /// A copy on the calling thread's stream of the engine, waited for.
    fn copy(&self, f: impl FnOnce(RawStream) -> (Res, &'static str)) -> Result<()> {
        self.on_engine(|stream| {
            let (r, call) = f(stream);
            self.cuda.check(call, r)?;
            // SAFETY: the copy engine's own stream.
            self.cuda.check("cuStreamSynchronize", unsafe { (self.cuda.api.stream_synchronize)(stream) })
        })
    }

    /// A copy on the calling thread's stream of the engine, not waited
    /// for: the event recorded after it is the ticket.
    fn start(&self, f: impl FnOnce(RawStream) -> (Res, &'static str)) -> Result<CopyTicket> {
        self.on_engine(|stream| {
            let pooled = self.events.lock().recover().pop();
            let event = match pooled {
                Some(e) => e as Event,
                None => self.new_event()?,
            };
            let (r, call) = f(stream);
            let recorded = self.cuda.check(call, r).and_then(|()| {
                // SAFETY: our event and the engine's stream, one context.
                self.cuda.check("cuEventRecord", unsafe { (self.cuda.api.event_record)(event, stream) })
            });
            if let Err(e) = recorded {
                // The copy may be queued without its event: wait for it
                // before the caller takes its memory back.
                // SAFETY: the copy engine's own stream.
                let _ = unsafe { (self.cuda.api.stream_synchronize)(stream) };
                self.events.lock().recover().push(event as usize);
                return Err(e);
            }
            Ok(CopyTicket::new(event as usize))
        })
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

    unsafe fn copy_to_device_start(&self, dst: u64, src: *const u8, len: usize) -> Result<CopyTicket> {
        self.start(|s| {
            // SAFETY: the caller keeps `src..src+len` until the ticket is
            // answered; `dst` lies in a registered allocation.
            let r = unsafe { (self.cuda.api.memcpy_htod_async)(dst, src.cast(), len, s) };
            (r, "cuMemcpyHtoDAsync")
        })
    }

    unsafe fn copy_from_device_start(&self, dst: *mut u8, src: u64, len: usize) -> Result<CopyTicket> {
        self.start(|s| {
            // SAFETY: as for copy_to_device_start, the other way.
            let r = unsafe { (self.cuda.api.memcpy_dtoh_async)(dst.cast(), src, len, s) };
            (r, "cuMemcpyDtoHAsync")
        })
    }

    fn copy_finished(&self, ticket: CopyTicket) -> Result<bool> {
        if ticket == CopyTicket::DONE {
            return Ok(true);
        }
        let event = ticket.raw() as Event;
        // SAFETY: an event of our pool, recorded by `start` (a query needs
        // no particular context current).
        let r = unsafe { (self.cuda.api.event_query)(event) };
        if r == ERROR_NOT_READY {
            return Ok(false);
        }
        self.events.lock().recover().push(event as usize);
        self.cuda.check("cuEventQuery", r).map(|()| true)
    }

    /// Each of the engine's streams copies `staging` to 4 KiB of device
    /// memory of the engine's and back, and records one of the pool's
    /// events: a handle's open or a registration, not the first read,
    /// pays for each stream's first copy and the first events.
    unsafe fn prepare_copies(&self, staging: *mut u8, len: usize) -> Result<()> {
        if self.prepared.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let engine = self.engine()?;
        let len = len.min(4096);
        let api = &self.cuda.api;
        self.cuda.with_context(engine.ctx as Ctx, || {
            let mut scratch = 0u64;
            // SAFETY: writes one device pointer. Kept for the process:
            // freeing may wait for the whole device.
            self.cuda.check("cuMemAlloc", unsafe { (api.mem_alloc)(&mut scratch, 4096) })?;
            let mut made = Vec::with_capacity(COPY_STREAMS);
            let queued = engine.streams.iter().try_for_each(|&s| {
                let s = s as RawStream;
                // SAFETY: `staging` is the caller's for the call, `scratch`
                // ours; both on the engine's streams.
                let r = unsafe { (api.memcpy_htod_async)(scratch, staging.cast(), len, s) };
                self.cuda.check("cuMemcpyHtoDAsync", r)?;
                // SAFETY: as above, the other way.
                let r = unsafe { (api.memcpy_dtoh_async)(staging.cast(), scratch, len, s) };
                self.cuda.check("cuMemcpyDtoHAsync", r)?;
                let e = self.new_event()?;
                made.push(e as usize);
                // SAFETY: our event and stream, one context.
                self.cuda.check("cuEventRecord", unsafe { (api.event_record)(e, s) })
            });
            // Every stream is waited for, whatever was queued: `staging`
            // goes back to its owner after.
            let waited = engine.streams.iter().try_for_each(|&s| {
                // SAFETY: the engine's own stream.
                self.cuda.check("cuStreamSynchronize", unsafe { (api.stream_synchronize)(s as RawStream) })
            });
            self.events.lock().recover().extend(made);
            queued.and(waited)
        })?;
        self.lanes_used.fetch_or((1 << COPY_STREAMS) - 1, Ordering::Relaxed);
        tracing::debug!(
            streams = COPY_STREAMS,
            us = started.elapsed().as_micros() as u64,
            "copy engine streams prepared (a copy each way, an event each)"
        );
        Ok(())
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

    fn export_ipc(&self, ptr: u64, len: usize) -> Result<IpcExport> {
        self.ipc_export(ptr, len)
    }
}
