//! Buffer registration, dma-buf export and RDMA registration.

use super::*;
use std::collections::BTreeMap;

/// The driver and the registration at `base`.
pub(crate) fn registered(base: *const c_void) -> Result<(ugds::Driver, BufferToken), uGDSError_t> {
    let driver = match state().as_ref() {
        Some(s) => s.driver.clone(),
        None => return Err(fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first")),
    };
    match driver.token_at(base.cast()) {
        Some(t) => Ok((driver, t)),
        None => Err(fail(op::MEMORY_NOT_REGISTERED, format!("nothing registered at {base:p}"))),
    }
}

/// Registers with the runtime that owns the memory: CUDA where it loads,
/// HIP when asked (NVM_MAP_DMABUF is what ROCm callers pass), else host.
pub(crate) fn register(base: *const c_void, len: size_t, backend: c_int, export: bool) -> uGDSError_t {
    if base.is_null() || len == 0 {
        return fail(op::INVALID_VALUE, "null base or zero length");
    }
    let driver = match state().as_ref() {
        Some(s) => s.driver.clone(),
        None => return fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first"),
    };
    // SAFETY: the C contract: the memory stays allocated until
    // uGDSBufDeregister succeeds.
    let r = unsafe {
        match backend {
            abi::BACKEND_CUDA => driver.register_cuda(base as u64, len),
            abi::BACKEND_HIP => driver.register_hip(base as u64, len),
            _ => match ugds::gpu::cuda::Cuda::get() {
                Ok(_) => driver.register_cuda(base as u64, len),
                Err(_) => driver.register(base as *mut u8, len),
            },
        }
    };
    match r {
        Ok(t) => {
            with_state!(s, fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed"));
            if export {
                s.exportable.insert(t.base());
            } else {
                s.exportable.remove(&t.base());
            }
            ok()
        }
        Err(e) => from_error(e),
    }
}

/// Registers memory (GPU or host) by base address.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
/// `base..base+len` must be memory the caller owns and keeps allocated until `uGDSBufDeregister` (host memory, or device memory of a loaded GPU runtime).
#[no_mangle]
pub unsafe extern "C" fn uGDSBufRegister(base: *const c_void, len: size_t, flags: c_int) -> uGDSError_t {
    guard(internal(), || {
        let backend = if flags & abi::NVM_MAP_FORCE_CUDA != 0 {
            abi::BACKEND_CUDA
        } else if flags & abi::NVM_MAP_DMABUF != 0 && ugds::gpu::cuda::Cuda::get().is_err() {
            abi::BACKEND_HIP
        } else {
            abi::BACKEND_DEFAULT
        };
        register(base, len, backend, false)
    })
}

/// Registers memory with an explicit backend; `enable_export` allows `uGDSExportDmabuf`.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
/// `base..base+len` must be memory the caller owns and keeps allocated until `uGDSBufDeregister` (host memory, or device memory of a loaded GPU runtime).
#[no_mangle]
pub unsafe extern "C" fn uGDSBufRegisterEx(
    base: *const c_void,
    len: size_t,
    config: *const abi::uGDSBufConfig_t,
) -> uGDSError_t {
    guard(internal(), || {
        if config.is_null() {
            return fail(op::INVALID_VALUE, "null config");
        }
        // SAFETY: non-null; the caller passes a valid config.
        let (backend, export) = unsafe { ((*config).backend, (*config).enable_export) };
        if !matches!(backend, abi::BACKEND_DEFAULT | abi::BACKEND_CUDA | abi::BACKEND_HIP) {
            return fail(op::INVALID_VALUE, format!("unknown backend {backend}"));
        }
        register(base, len, backend, export)
    })
}

/// Deregisters by base address; `UGDS_BUSY` while I/O is in flight.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSBufDeregister(base: *const c_void) -> uGDSError_t {
    guard(internal(), || {
        if base.is_null() {
            return fail(op::INVALID_VALUE, "null base");
        }
        let (driver, t) = match registered(base) {
            Ok(x) => x,
            Err(e) => return e,
        };
        match driver.deregister(&t) {
            Ok(()) => {
                if let Some(s) = state_mut().as_mut() {
                    s.exportable.remove(&t.base());
                }
                ok()
            }
            Err(e) => from_error(e),
        }
    })
}

/// Exports GPU memory registered for export as a dma-buf; the caller closes the fd.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSExportDmabuf(base: *const c_void, out: *mut abi::uGDSDmabufExport_t) -> uGDSError_t {
    guard(internal(), || {
        if base.is_null() || out.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        let (driver, t) = match registered(base) {
            Ok(x) => x,
            Err(e) => return e,
        };
        if !state().as_ref().is_some_and(|s| s.exportable.contains(&t.base())) {
            return fail(
                op::IO_NOT_SUPPORTED,
                format!("{base:p} was not registered for export (uGDSBufRegisterEx with enable_export = true)"),
            );
        }
        match driver.export_dmabuf(&t) {
            Ok(x) => {
                // SAFETY: non-null, checked above.
                unsafe {
                    *out = abi::uGDSDmabufExport_t {
                        fd: std::os::fd::IntoRawFd::into_raw_fd(x.fd),
                        offset: x.offset,
                        length: x.len,
                    }
                };
                ok()
            }
            Err(e) => from_error(e),
        }
    })
}

/// Registers the exported dma-buf with an RDMA protection domain (`ibv_reg_dmabuf_mr`).
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSRDMARegister(
    base: *const c_void,
    ibv_pd: *mut c_void,
    access: c_int,
    region: *mut abi::uGDSRDMARegion_t,
) -> uGDSError_t {
    guard(internal(), || {
        if base.is_null() || ibv_pd.is_null() || region.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        let mut x = abi::uGDSDmabufExport_t { fd: -1, offset: 0, length: 0 };
        // SAFETY: the caller's base, and a live local for the result.
        let e = unsafe { uGDSExportDmabuf(base, &mut x) };
        if e.err != op::SUCCESS {
            return e;
        }
        // SAFETY: a descriptor the export just gave us.
        let fd = unsafe { OwnedFd::from_raw_fd(x.fd) };
        match rdma::reg_dmabuf_mr(ibv_pd, x.offset, x.length, base as u64, &fd, access) {
            Ok((mr, lkey, rkey)) => {
                // SAFETY: non-null, checked above.
                unsafe {
                    *region = abi::uGDSRDMARegion_t { mr, iova: base as u64, lkey, rkey, token: base as u64 };
                }
                ok()
            }
            Err(e) => e,
        }
    })
}

/// Undoes `uGDSRDMARegister`.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSRDMAUnregister(base: *const c_void, region: *mut abi::uGDSRDMARegion_t) -> uGDSError_t {
    guard(internal(), || {
        if base.is_null() || region.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        // SAFETY: non-null; the region uGDSRDMARegister filled in.
        let r = unsafe { &mut *region };
        if r.mr.is_null() || r.token != base as u64 {
            return fail(op::INVALID_VALUE, "the region was not registered for this base");
        }
        match rdma::dereg_mr(r.mr) {
            Ok(()) => {
                r.mr = std::ptr::null_mut();
                ok()
            }
            Err(e) => e,
        }
    })
}

/// libibverbs, loaded at run time for the RDMA calls.
mod rdma {
    use super::*;

    type RegDmabufMr = unsafe extern "C" fn(*mut c_void, u64, size_t, u64, c_int, c_int) -> *mut c_void;
    type DeregMr = unsafe extern "C" fn(*mut c_void) -> c_int;

    fn lib() -> Result<*mut c_void, uGDSError_t> {
        // SAFETY: dlopen with a literal name.
        let h = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW) };
        if h.is_null() {
            return Err(fail(op::PLATFORM_NOT_SUPPORTED, "libibverbs.so.1 is not installed"));
        }
        Ok(h)
    }

    fn sym<T: Copy>(h: *mut c_void, n: &std::ffi::CStr) -> Result<T, uGDSError_t> {
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, n.as_ptr()) };
        if p.is_null() {
            return Err(fail(op::PLATFORM_NOT_SUPPORTED, format!("libibverbs lacks {}", n.to_string_lossy())));
        }
        // SAFETY: the caller names the symbol's C type.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }

    /// `ibv_reg_dmabuf_mr`; returns the MR and its keys (`struct ibv_mr`:
    /// context, pd, addr, length, handle, lkey, rkey).
    pub fn reg_dmabuf_mr(
        pd: *mut c_void,
        offset: u64,
        len: usize,
        iova: u64,
        fd: &OwnedFd,
        access: c_int,
    ) -> Result<(*mut c_void, u32, u32), uGDSError_t> {
        let f: RegDmabufMr = sym(lib()?, c"ibv_reg_dmabuf_mr")?;
        let raw = std::os::fd::AsRawFd::as_raw_fd(fd);
        // SAFETY: the caller's protection domain and our dma-buf.
        let mr = unsafe { f(pd, offset, len, iova, raw, access) };
        if mr.is_null() {
            return Err(fail(op::INTERNAL_ERROR, format!("ibv_reg_dmabuf_mr: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: a live ibv_mr; lkey and rkey follow three pointers, a
        // size_t and a u32.
        let (lkey, rkey) = unsafe {
            let p = mr as *const u8;
            ((p.add(36) as *const u32).read(), (p.add(40) as *const u32).read())
        };
        Ok((mr, lkey, rkey))
    }

    pub fn dereg_mr(mr: *mut c_void) -> Result<(), uGDSError_t> {
        let f: DeregMr = sym(lib()?, c"ibv_dereg_mr")?;
        // SAFETY: an MR from reg_dmabuf_mr.
        match unsafe { f(mr) } {
            0 => Ok(()),
            e => Err(fail(op::RDMA_MR_STILL_ACTIVE, format!("ibv_dereg_mr: errno {e}"))),
        }
    }
}

/// Host buffers handed out by `uGDSHostAlloc`, by address.
static HOST_BUFFERS: std::sync::Mutex<BTreeMap<usize, ugds::HostBuffer>> = std::sync::Mutex::new(BTreeMap::new());

/// Allocates `size` bytes of page-aligned host memory for I/O: shared
/// memory in a process attached to a served controller (`UGDS_ATTACH`).
///
/// # Safety
/// `ptr` is null (refused) or valid for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn uGDSHostAlloc(ptr: *mut *mut c_void, size: size_t) -> uGDSError_t {
    guard(internal(), || {
        if ptr.is_null() || size == 0 {
            return fail(op::INVALID_VALUE, "null pointer or zero size");
        }
        match ugds::HostBuffer::new(size) {
            Ok(mut b) => {
                let p = b.as_mut_ptr();
                HOST_BUFFERS.lock().unwrap_or_else(|e| e.into_inner()).insert(p as usize, b);
                // SAFETY: non-null, checked above; the caller passes a valid pointer.
                unsafe { *ptr = p.cast() };
                ok()
            }
            Err(e) => from_error(e),
        }
    })
}

/// Frees memory from `uGDSHostAlloc`; refused while it is registered.
///
/// # Safety
/// `ptr` came from `uGDSHostAlloc` and is not used after this succeeds.
#[no_mangle]
pub unsafe extern "C" fn uGDSHostFree(ptr: *mut c_void) -> uGDSError_t {
    guard(internal(), || {
        let registered = state().as_ref().and_then(|s| s.driver.token_containing(ptr.cast()));
        if registered.is_some() {
            return fail(op::INVALID_VALUE, format!("{ptr:p} is registered: uGDSBufDeregister it first"));
        }
        match HOST_BUFFERS.lock().unwrap_or_else(|e| e.into_inner()).remove(&(ptr as usize)) {
            Some(b) => {
                drop(b);
                ok()
            }
            None => fail(op::INVALID_VALUE, format!("{ptr:p} did not come from uGDSHostAlloc")),
        }
    })
}
