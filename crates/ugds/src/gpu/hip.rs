//! HIP, through `libamdhip64.so` and the HSA runtime, loaded at run time.
//!
//! The same roles as [`cuda`](super::cuda): pointer classification for
//! registration, the copy engine for the emulated controller, dma-buf export
//! (`hsa_amd_portable_export_dmabuf`) and stream-ordered I/O with
//! `hipLaunchHostFunc` + `hipStreamWaitValue32`. The types follow ROCm 6's
//! headers (`hipPointerAttribute_t`, `hipMemoryType` numbered as CUDA's).
//! No AMD GPU has been at hand: this has been built, not run on one.

use super::dl::Library;
use super::stream::{GpuStream, StreamBackend, WordPool, WORD_PAGE};
use super::{DeviceMemory, DeviceRuntime, DmabufExport};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

type Res = i32;
type RawStream = *mut c_void;
type HostFn = unsafe extern "C" fn(*mut c_void);

const SUCCESS: Res = 0;
const ERROR_INVALID_VALUE: Res = 1;
const ERROR_NOT_SUPPORTED: Res = 801;
const MEMORY_TYPE_UNREGISTERED: i32 = 0;
const MEMORY_TYPE_HOST: i32 = 1;
const MEMORY_TYPE_DEVICE: i32 = 2;
const STREAM_NON_BLOCKING: u32 = 1;
const STREAM_WAIT_VALUE_GTE: u32 = 0;
const HOST_MALLOC_PORTABLE: u32 = 1;
const HOST_MALLOC_MAPPED: u32 = 2;

/// `hipPointerAttribute_t` as ROCm 6 lays it out.
#[repr(C)]
#[derive(Default)]
struct PointerAttributes {
    memory_type: i32,
    device: i32,
    device_pointer: usize,
    host_pointer: usize,
    is_managed: i32,
    allocation_flags: u32,
}

#[allow(clippy::type_complexity)]
struct Api {
    init: unsafe extern "C" fn(u32) -> Res,
    get_error_name: unsafe extern "C" fn(Res) -> *const c_char,
    get_device: unsafe extern "C" fn(*mut i32) -> Res,
    set_device: unsafe extern "C" fn(i32) -> Res,
    pointer_get_attributes: unsafe extern "C" fn(*mut PointerAttributes, *const c_void) -> Res,
    mem_get_address_range: unsafe extern "C" fn(*mut usize, *mut usize, usize) -> Res,
    memcpy_htod_async: unsafe extern "C" fn(usize, *const c_void, usize, RawStream) -> Res,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, usize, usize, RawStream) -> Res,
    stream_create_with_flags: unsafe extern "C" fn(*mut RawStream, u32) -> Res,
    stream_synchronize: unsafe extern "C" fn(RawStream) -> Res,
    launch_host_func: unsafe extern "C" fn(RawStream, HostFn, *mut c_void) -> Res,
    stream_wait_value32: unsafe extern "C" fn(RawStream, *mut c_void, u32, u32, u32) -> Res,
    stream_write_value32: unsafe extern "C" fn(RawStream, *mut c_void, u32, u32) -> Res,
    host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> Res,
    host_get_device_pointer: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u32) -> Res,
    host_free: unsafe extern "C" fn(*mut c_void) -> Res,
    host_register: unsafe extern "C" fn(*mut c_void, usize, u32) -> Res,
    host_unregister: unsafe extern "C" fn(*mut c_void) -> Res,
    export_dmabuf: unsafe extern "C" fn(*const c_void, usize, *mut i32, *mut u64) -> i32,
}

/// The HIP runtime, loaded and initialised.
pub struct Hip {
    api: Api,
    _libs: (Library, Library),
    devices: Mutex<HashMap<i32, Arc<HipDevice>>>,
    /// Stream support (it owns the word pool), made at the first stream.
    streams: OnceLock<Arc<HipStreamBackend>>,
}

impl std::fmt::Debug for Hip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hip").finish_non_exhaustive()
    }
}

static HIP: OnceLock<std::result::Result<Arc<Hip>, String>> = OnceLock::new();

impl Hip {
    /// Loads `libamdhip64.so` and the HSA runtime and calls `hipInit` (once).
    pub fn get() -> Result<Arc<Hip>> {
        HIP.get_or_init(|| Hip::load().map(Arc::new).map_err(|e| e.to_string())).clone().map_err(Error::GpuUnavailable)
    }

    fn load() -> Result<Hip> {
        let hip = Library::open(&["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"])?;
        let hsa = Library::open(&["libhsa-runtime64.so.1", "libhsa-runtime64.so"])?;
        // SAFETY: each type is the symbol's prototype in ROCm 6's
        // hip_runtime_api.h / hsa_ext_amd.h (hipError_t = int).
        let api = unsafe {
            Api {
                init: hip.sym(c"hipInit")?,
                get_error_name: hip.sym(c"hipGetErrorName")?,
                get_device: hip.sym(c"hipGetDevice")?,
                set_device: hip.sym(c"hipSetDevice")?,
                pointer_get_attributes: hip.sym(c"hipPointerGetAttributes")?,
                mem_get_address_range: hip.sym(c"hipMemGetAddressRange")?,
                memcpy_htod_async: hip.sym(c"hipMemcpyHtoDAsync")?,
                memcpy_dtoh_async: hip.sym(c"hipMemcpyDtoHAsync")?,
                stream_create_with_flags: hip.sym(c"hipStreamCreateWithFlags")?,
                stream_synchronize: hip.sym(c"hipStreamSynchronize")?,
                launch_host_func: hip.sym(c"hipLaunchHostFunc")?,
                stream_wait_value32: hip.sym(c"hipStreamWaitValue32")?,
                stream_write_value32: hip.sym(c"hipStreamWriteValue32")?,
                host_malloc: hip.sym(c"hipHostMalloc")?,
                host_get_device_pointer: hip.sym(c"hipHostGetDevicePointer")?,
                host_free: hip.sym(c"hipHostFree")?,
                host_register: hip.sym(c"hipHostRegister")?,
                host_unregister: hip.sym(c"hipHostUnregister")?,
                export_dmabuf: hsa.sym(c"hsa_amd_portable_export_dmabuf")?,
            }
        };
        let h = Hip { api, _libs: (hip, hsa), devices: Mutex::new(HashMap::new()), streams: OnceLock::new() };
        // SAFETY: flags 0.
        h.check("hipInit", unsafe { (h.api.init)(0) })?;
        Ok(h)
    }

    fn check(&self, call: &'static str, code: Res) -> Result<()> {
        if code == SUCCESS {
            return Ok(());
        }
        // SAFETY: returns a static string (or null).
        let p = unsafe { (self.api.get_error_name)(code) };
        let name = if p.is_null() {
            format!("hipError_t {code}")
        } else {
            // SAFETY: a static NUL-terminated string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(Error::GpuDriver { call, code, name })
    }

    /// What `ptr..ptr+len` is; see [`Cuda::classify`](super::cuda::Cuda::classify).
    pub fn classify(self: &Arc<Self>, ptr: u64, len: usize) -> Result<super::cuda::Memory> {
        use super::cuda::Memory;
        if ptr == 0 {
            return Err(Error::InvalidArgument("null buffer".into()));
        }
        if len == 0 {
            return Err(Error::ZeroSize);
        }
        let mut a = PointerAttributes::default();
        // SAFETY: writes one attribute struct.
        let r = unsafe { (self.api.pointer_get_attributes)(&mut a, ptr as *const c_void) };
        if r == ERROR_INVALID_VALUE {
            return Ok(Memory::Host);
        }
        self.check("hipPointerGetAttributes", r)?;
        if a.is_managed != 0 {
            return Err(Error::GpuMemoryType { ptr, kind: "managed" });
        }
        match a.memory_type {
            MEMORY_TYPE_UNREGISTERED | MEMORY_TYPE_HOST => return Ok(Memory::Host),
            MEMORY_TYPE_DEVICE => {}
            _ => return Err(Error::GpuMemoryType { ptr, kind: "HIP array or unified" }),
        }
        let mut current = 0;
        // SAFETY: writes one int.
        self.check("hipGetDevice", unsafe { (self.api.get_device)(&mut current) })?;
        if current != a.device {
            return Err(Error::GpuContextMismatch { ptr });
        }
        let (mut base, mut size) = (0usize, 0usize);
        // SAFETY: writes base and size.
        let r = unsafe { (self.api.mem_get_address_range)(&mut base, &mut size, ptr as usize) };
        self.check("hipMemGetAddressRange", r).map_err(|e| Error::GpuPointerInvalid { ptr, why: e.to_string() })?;
        if ptr.checked_add(len as u64).is_none_or(|end| end > (base + size) as u64) {
            return Err(Error::GpuPointerRange { ptr, len, alloc_base: base as u64, alloc_len: size });
        }
        Ok(Memory::Device(DeviceMemory { ptr, len, runtime: self.device(a.device)? }))
    }

    fn device(self: &Arc<Self>, device: i32) -> Result<Arc<HipDevice>> {
        let mut map = self.devices.lock().recover();
        if let Some(d) = map.get(&device) {
            return Ok(d.clone());
        }
        let mut s: RawStream = std::ptr::null_mut();
        // SAFETY: writes one stream handle, on the current device (checked
        // by the caller to be `device`).
        self.check("hipStreamCreateWithFlags", unsafe {
            (self.api.stream_create_with_flags)(&mut s, STREAM_NON_BLOCKING)
        })?;
        let d = Arc::new(HipDevice { hip: self.clone(), device, copy_stream: s as usize });
        map.insert(device, d.clone());
        Ok(d)
    }

    /// A stream-ordered I/O target on `stream` (a `hipStream_t`; null is
    /// the default stream) of the current device.
    ///
    /// # Safety
    /// `stream` must be a live stream that outlives the returned value.
    pub unsafe fn stream(self: &Arc<Self>, stream: *mut c_void, wait: super::StreamWait) -> Result<GpuStream> {
        let backend = self
            .streams
            .get_or_init(|| Arc::new(HipStreamBackend { hip: self.clone(), pool: Mutex::default() }))
            .clone();
        GpuStream::new(backend, stream as usize, wait)
    }
}

/// The runtime object of one HIP device.
pub struct HipDevice {
    hip: Arc<Hip>,
    device: i32,
    copy_stream: usize,
}

impl std::fmt::Debug for HipDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipDevice").finish_non_exhaustive()
    }
}

impl HipDevice {
    fn copy(&self, call: &'static str, f: impl FnOnce(RawStream) -> Res) -> Result<()> {
        // SAFETY: selects the device for this thread.
        self.hip.check("hipSetDevice", unsafe { (self.hip.api.set_device)(self.device) })?;
        let s = self.copy_stream as RawStream;
        self.hip.check(call, f(s))?;
        // SAFETY: our stream.
        self.hip.check("hipStreamSynchronize", unsafe { (self.hip.api.stream_synchronize)(s) })
    }
}

impl DeviceRuntime for HipDevice {
    fn name(&self) -> &'static str {
        "HIP"
    }

    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: a live slice and a registered device range.
        self.copy("hipMemcpyHtoDAsync", |s| unsafe {
            (self.hip.api.memcpy_htod_async)(dst as usize, src.as_ptr().cast(), src.len(), s)
        })
    }

    unsafe fn copy_from_device(&self, dst: &mut [u8], src: u64) -> Result<()> {
        // SAFETY: as above, the other way.
        self.copy("hipMemcpyDtoHAsync", |s| unsafe {
            (self.hip.api.memcpy_dtoh_async)(dst.as_mut_ptr().cast(), src as usize, dst.len(), s)
        })
    }

    fn host_register(&self, ptr: *mut u8, len: usize) -> bool {
        // SAFETY: the caller's live mapping, unregistered before unmapping.
        unsafe { (self.hip.api.host_register)(ptr.cast(), len, HOST_MALLOC_PORTABLE) == SUCCESS }
    }

    fn host_unregister(&self, ptr: *mut u8) {
        // SAFETY: registered by host_register.
        unsafe { (self.hip.api.host_unregister)(ptr.cast()) };
    }

    fn export_dmabuf(&self, ptr: u64, len: usize) -> Result<DmabufExport> {
        let (mut fd, mut offset) = (-1i32, 0u64);
        // SAFETY: writes the fd and the offset of `ptr` in the dma-buf.
        let r = unsafe { (self.hip.api.export_dmabuf)(ptr as *const c_void, len, &mut fd, &mut offset) };
        if r != 0 {
            return Err(Error::GpuDriver {
                call: "hsa_amd_portable_export_dmabuf",
                code: r,
                name: format!("hsa_status {r:#x}"),
            });
        }
        // SAFETY: a new descriptor handed to us.
        Ok(DmabufExport { fd: unsafe { OwnedFd::from_raw_fd(fd) }, offset, len })
    }
}

struct HipStreamBackend {
    hip: Arc<Hip>,
    pool: Mutex<WordPool>,
}

impl StreamBackend for HipStreamBackend {
    fn alloc_page(&self) -> Result<(usize, u64)> {
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        let r = unsafe { (self.hip.api.host_malloc)(&mut host, WORD_PAGE, HOST_MALLOC_PORTABLE | HOST_MALLOC_MAPPED) };
        self.hip.check("hipHostMalloc", r)?;
        // SAFETY: WORD_PAGE bytes just allocated.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, WORD_PAGE) };
        let mut dev: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` is mapped host memory.
        let r = unsafe { (self.hip.api.host_get_device_pointer)(&mut dev, host, 0) };
        if let Err(e) = self.hip.check("hipHostGetDevicePointer", r) {
            // SAFETY: ours, never given to a stream.
            unsafe { (self.hip.api.host_free)(host) };
            return Err(e);
        }
        Ok((host as usize, dev as u64))
    }

    fn pool(&self) -> &Mutex<WordPool> {
        &self.pool
    }

    fn launch_host_fn(&self, stream: usize, f: HostFn, data: *mut c_void) -> Result<()> {
        // SAFETY: a live stream; `f` takes `data`.
        self.hip.check("hipLaunchHostFunc", unsafe { (self.hip.api.launch_host_func)(stream as RawStream, f, data) })
    }

    fn wait_value32(&self, stream: usize, addr: u64, value: u32) -> Result<bool> {
        // SAFETY: a live stream and a mapped word we own.
        let r = unsafe {
            (self.hip.api.stream_wait_value32)(
                stream as RawStream,
                addr as *mut c_void,
                value,
                STREAM_WAIT_VALUE_GTE,
                u32::MAX,
            )
        };
        if r == ERROR_NOT_SUPPORTED {
            return Ok(false);
        }
        self.hip.check("hipStreamWaitValue32", r).map(|()| true)
    }

    fn write_value32(&self, stream: usize, addr: u64, value: u32) -> Result<bool> {
        // SAFETY: a stream the caller just enqueued on, and a mapped word of
        // the pool (never freed).
        let r = unsafe { (self.hip.api.stream_write_value32)(stream as RawStream, addr as *mut c_void, value, 0) };
        if r == ERROR_NOT_SUPPORTED {
            return Ok(false);
        }
        self.hip.check("hipStreamWriteValue32", r).map(|()| true)
    }

    fn synchronize(&self, stream: usize) -> Result<()> {
        // SAFETY: a live stream.
        self.hip.check("hipStreamSynchronize", unsafe { (self.hip.api.stream_synchronize)(stream as RawStream) })
    }

    fn name(&self) -> &'static str {
        "HIP"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_attributes_match_rocm6_layout() {
        // hipMemoryType, int device, two pointers, int isManaged, unsigned flags.
        assert_eq!(std::mem::size_of::<PointerAttributes>(), 32);
        assert_eq!(std::mem::offset_of!(PointerAttributes, device_pointer), 8);
        assert_eq!(std::mem::offset_of!(PointerAttributes, is_managed), 24);
    }

    #[test]
    fn without_rocm_loading_is_a_clear_error() {
        match Hip::get() {
            Ok(_) => eprintln!("ROCm is installed here; nothing to check"),
            Err(e) => assert!(matches!(e, Error::GpuUnavailable(ref m) if m.contains("libamdhip64")), "{e}"),
        }
    }
}
