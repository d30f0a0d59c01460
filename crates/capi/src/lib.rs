//! libugds: the C ABI of ugds, declared in `include/ugds.h`; a drop-in for
//! the existing uGDS C interface (names, values and layouts as it has them).
//!
//! Thin by design: each entry point checks its arguments, finds the objects
//! it names in one table, and calls the Rust library; no lock is held while
//! a device works. No panic crosses the boundary: each entry point catches
//! it and returns `UGDS_INTERNAL_ERROR` (or `-UGDS_INTERNAL_ERROR`).
//!
//! A handle is a small allocation whose first member is the registered fd,
//! as existing callers expect. It is never freed, so that a deregistered
//! handle's address is never reused and any later use of it is reported as
//! `UGDS_HANDLE_NOT_REGISTERED` rather than reaching another handle.
//!
//! Entry points that take a caller's pointers are `unsafe extern "C"`: from
//! Rust they can be called only in an `unsafe` block, under the contract in
//! their `# Safety` section.
//!
//! ```compile_fail
//! let mut buf = [0u8; 4096];
//! // error[E0133]: call to unsafe function
//! ugds_capi::uGDSRead(std::ptr::null_mut(), buf.as_mut_ptr().cast(), 4096, 0, 0);
//! ```

#![allow(non_snake_case)]

pub mod abi;

use abi::{op, uGDSError_t, HandleObj};
use libc::{off_t, size_t, ssize_t, timespec};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;
use ugds::gpu::{GpuStream, StreamWait};
use ugds::{BatchIo, BatchOp, BatchStatus, BufferToken, Drain, Error, Handle, HandleOptions, StreamIo};
use ugds_emu::{EmuConfig, EmuPlatform, NamespaceConfig};

struct Registered {
    handle: Arc<Handle>,
    fd: c_int,
}

struct State {
    driver: ugds::Driver,
    /// Live handles by the address of their `HandleObj`.
    handles: HashMap<usize, Registered>,
    /// Batch contexts by id (an opaque `void *` to the caller), with the
    /// key of the handle they belong to.
    batches: HashMap<usize, (usize, Arc<ugds::Batch>)>,
    next_batch: usize,
    /// Streams by their runtime handle.
    streams: HashMap<usize, Arc<GpuStream>>,
    /// Bases registered with `enable_export`.
    exportable: HashSet<usize>,
}

const _: () = assert!(abi::MAX_BATCH_IO as usize == ugds::Batch::MAX_CAPACITY);

/// Read-locked by every I/O call (to find its handle), write-locked only to
/// add or remove objects; never held across device work.
static STATE: RwLock<Option<State>> = RwLock::new(None);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn state() -> RwLockReadGuard<'static, Option<State>> {
    STATE.read().unwrap_or_else(|p| p.into_inner())
}

fn state_mut() -> RwLockWriteGuard<'static, Option<State>> {
    STATE.write().unwrap_or_else(|p| p.into_inner())
}

fn ok() -> uGDSError_t {
    uGDSError_t { err: op::SUCCESS, cu_err: 0 }
}

fn fail(err: c_int, msg: impl Into<String>) -> uGDSError_t {
    remember(msg.into());
    uGDSError_t { err, cu_err: 0 }
}

fn remember(msg: String) {
    tracing::debug!("ugds C API: {msg}");
    LAST_ERROR.with(|l| *l.borrow_mut() = CString::new(msg.replace('\0', " ")).unwrap_or_default());
}

/// The uGDSOpError for a library error (and the GPU driver's code).
/// The uGDS code (and CUDA code) of an error: one per kind.
fn code(e: &Error) -> (c_int, c_int) {
    use ugds::ErrorKind as K;
    let err = match e.kind() {
        K::InvalidArgument => op::INVALID_VALUE,
        K::NotRegistered => op::MEMORY_NOT_REGISTERED,
        K::AlreadyRegistered => op::MEMORY_ALREADY_REGISTERED,
        K::Busy => op::BUSY,
        K::CapacityExceeded => op::BATCH_CAPACITY_EXCEEDED,
        K::Closed => op::HANDLE_NOT_REGISTERED,
        K::GpuUnavailable => op::PLATFORM_NOT_SUPPORTED,
        K::GpuDriver => op::CUDA_DRIVER_ERROR,
        K::GpuPointerInvalid => op::CUDA_POINTER_INVALID,
        K::GpuMemoryType => op::CUDA_MEMORY_TYPE_INVALID,
        K::GpuPointerRange => op::CUDA_POINTER_RANGE_ERROR,
        K::GpuContextMismatch => op::CUDA_CONTEXT_MISMATCH,
        K::Unsupported => op::IO_NOT_SUPPORTED,
        K::Wedged | K::Timeout => op::IO_DISABLED,
        K::PermissionDenied => op::PERMISSION_DENIED,
        K::NotFound => op::DEVICE_NOT_FOUND,
        K::OutOfMemory => op::OUT_OF_MEMORY,
        K::QueueFull | K::Canceled | K::Device | K::Platform => op::INTERNAL_ERROR,
    };
    let cu_err = match e {
        Error::GpuDriver { code, .. } => *code,
        _ => 0,
    };
    (err, cu_err)
}

fn from_error(e: Error) -> uGDSError_t {
    let (err, cu_err) = code(&e);
    remember(e.to_string());
    uGDSError_t { err, cu_err }
}

/// Runs an entry point's body; a panic becomes `on_panic`.
fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            remember(format!("internal error (panic): {msg}"));
            on_panic
        }
    }
}

fn internal() -> uGDSError_t {
    uGDSError_t { err: op::INTERNAL_ERROR, cu_err: 0 }
}

/// The message of the calling thread's last error (an extension).
#[no_mangle]
pub extern "C" fn ugds_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// Opens the library state (no device work). A second open: `UGDS_DRIVER_ALREADY_OPEN`.
#[no_mangle]
pub extern "C" fn uGDSDriverOpen() -> uGDSError_t {
    guard(internal(), || {
        // The library's messages go to standard error at UGDS_LOG's level
        // (unless the process installed a tracing subscriber of its own).
        ugds::log::install_from_env(ugds::log::Level::WARN);
        let mut s = state_mut();
        if s.is_some() {
            return fail(op::DRIVER_ALREADY_OPEN, "the driver is open already");
        }
        *s = Some(State {
            driver: ugds::Driver::open(),
            handles: HashMap::new(),
            batches: HashMap::new(),
            next_batch: 0x1000,
            streams: HashMap::new(),
            exportable: HashSet::new(),
        });
        ok()
    })
}

/// Closes batches and handles, waiting for their I/O. A handle that cannot
/// be closed (wedged) is named in the error, with what stays pinned.
#[no_mangle]
pub extern "C" fn uGDSDriverClose() -> uGDSError_t {
    guard(internal(), || {
        let Some(st) = state_mut().take() else {
            return fail(op::DRIVER_NOT_INITIALIZED, "the driver is not open");
        };
        // Streams are the caller's: forgetting them touches nothing. Then
        // batches (each cancels and waits for its requests), then handles.
        drop(st.streams);
        drop(st.batches);
        let mut stuck = Vec::new();
        for (_, r) in st.handles {
            if let Err(e) = r.handle.close(Drain::Forever) {
                stuck.push(format!(
                    "the handle on fd {} ({e}): its queues, DMA memory and the buffers its stuck commands \
                     target stay pinned, because the device may still write them; only \
                     uGDSHandleDeregisterEx(fh, -2) before closing releases them (it resets the controller)",
                    r.fd
                ));
            }
        }
        let (held, busy) = st.driver.private_registrations();
        if held > 0 {
            stuck.push(format!(
                "{held} just-in-time registrations ({busy} with I/O the device may still complete) stay \
                 pinned: their requests timed out"
            ));
        }
        if !stuck.is_empty() {
            return fail(op::IO_DISABLED, format!("closed, leaving behind {}", stuck.join("; ")));
        }
        ok()
    })
}

macro_rules! with_state {
    ($s:ident, $on_closed:expr) => {
        let mut guard_ = state_mut();
        let Some($s) = guard_.as_mut() else {
            return $on_closed;
        };
    };
}

/// The file behind `fd`, by path (for the emulated controller).
fn fd_path(fd: c_int) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
}

/// A descriptor of our own for the caller's open `fd` (close-on-exec).
fn dup(fd: c_int) -> Result<OwnedFd, uGDSError_t> {
    // SAFETY: the caller checked `fd` is open (fstat); it is only borrowed
    // for the duplication.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    borrowed.try_clone_to_owned().map_err(|e| fail(op::GETNEWFD_FAILED, format!("dup of fd {fd}: {e}")))
}

/// Opens the platform for `fd`: a ugds_drv character device, or (with
/// UGDS_EMULATE=1) an emulated controller over a regular file.
fn platform_for(fd: c_int) -> Result<Arc<dyn ugds::platform::Platform>, uGDSError_t> {
    // SAFETY: fstat writes one struct; an invalid fd is an error.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(fail(op::INVALID_VALUE, format!("fd {fd} is not an open file")));
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFCHR => {
            let (maj, min) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
            let subsystem = std::fs::read_link(format!("/sys/dev/char/{maj}:{min}/subsystem")).ok();
            if subsystem.as_ref().and_then(|p| p.file_name()).is_none_or(|n| n != "ugds_drv") {
                return Err(fail(op::INVALID_FILE_TYPE, format!("fd {fd} is a character device not of ugds_drv")));
            }
            let owned = dup(fd)?;
            let name = fd_path(fd).map(|p| p.display().to_string()).unwrap_or_else(|| format!("fd {fd}"));
            ugds::platform::ugds_drv::UgdsDrvPlatform::from_fd(owned, &name)
                .map(|p| Arc::new(p) as Arc<dyn ugds::platform::Platform>)
                .map_err(from_error)
        }
        libc::S_IFREG if std::env::var("UGDS_EMULATE").is_ok_and(|v| v == "1") => {
            let block: u32 = std::env::var("UGDS_EMULATE_BLOCK_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
            let size = st.st_size as u64 / block as u64 * block as u64;
            if size == 0 {
                return Err(fail(op::INVALID_VALUE, "the file is smaller than one block"));
            }
            // The caller's file itself, through a duplicate of its
            // descriptor: never reopened by name (the name may be gone).
            let owned = dup(fd)?;
            EmuPlatform::new(EmuConfig::default().namespaces(vec![NamespaceConfig::descriptor(owned, size, block)]))
                .map(|p| Arc::new(p) as Arc<dyn ugds::platform::Platform>)
                .map_err(from_error)
        }
        libc::S_IFREG => Err(fail(
            op::INVALID_FILE_TYPE,
            "a regular file needs UGDS_EMULATE=1 (an emulated controller over the file)",
        )),
        _ => Err(fail(op::INVALID_FILE_TYPE, format!("fd {fd} is neither /dev/ugds_drvN nor a regular file"))),
    }
}

/// Brings up the controller behind `descr`'s fd: `/dev/ugds_drvN`, or a regular file with `UGDS_EMULATE=1`.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleRegister(fh: *mut *mut c_void, descr: *mut abi::uGDSDescr_t) -> uGDSError_t {
    guard(internal(), || {
        if fh.is_null() || descr.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        if state().is_none() {
            return fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first");
        }
        // SAFETY: non-null; the caller passes a valid descriptor.
        let d = unsafe { &*descr };
        if d.type_ != abi::HANDLE_TYPE_OPAQUE_FD {
            return fail(op::INVALID_FILE_TYPE, format!("handle type {} (only OPAQUE_FD)", d.type_));
        }
        // SAFETY: OPAQUE_FD: the union holds an fd.
        let fd = unsafe { d.handle.fd };
        if state().as_ref().is_some_and(|s| s.handles.values().any(|r| r.fd == fd)) {
            return fail(op::HANDLE_ALREADY_REGISTERED, format!("fd {fd} is registered already"));
        }
        // Device work (bring-up) without the table's lock.
        let platform = match platform_for(fd) {
            Ok(p) => p,
            Err(e) => return e,
        };
        let driver = match state().as_ref() {
            Some(s) => s.driver.clone(),
            None => return fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed"),
        };
        let handle = match driver.open_handle(platform, HandleOptions::from_env()) {
            Ok(h) => Arc::new(h),
            Err(e) => return from_error(e),
        };
        let mut g = state_mut();
        let Some(s) = g.as_mut() else {
            drop(g);
            let _ = handle.close(Drain::Forever);
            return fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed");
        };
        // Checked again under the write lock: another thread may have
        // registered the same fd meanwhile.
        if s.handles.values().any(|r| r.fd == fd) {
            drop(g);
            let _ = handle.close(Drain::Forever);
            return fail(op::HANDLE_ALREADY_REGISTERED, format!("fd {fd} is registered already"));
        }
        let obj = Box::into_raw(Box::new(HandleObj { fd }));
        s.handles.insert(obj as usize, Registered { handle, fd });
        // SAFETY: non-null, checked above.
        unsafe { *fh = obj.cast() };
        ok()
    })
}

fn handle_of(s: &State, fh: *mut c_void) -> Option<Arc<Handle>> {
    s.handles.get(&(fh as usize)).map(|r| r.handle.clone())
}

fn lookup(fh: *mut c_void) -> Result<(Arc<Handle>, ugds::Driver), c_int> {
    let g = state();
    let s = g.as_ref().ok_or(op::DRIVER_NOT_INITIALIZED)?;
    if fh.is_null() {
        return Err(op::INVALID_VALUE);
    }
    let h = handle_of(s, fh).ok_or(op::HANDLE_NOT_REGISTERED)?;
    Ok((h, s.driver.clone()))
}

/// The namespace's capacity in bytes.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSGetDeviceCapacity(fh: *mut c_void, bytes: *mut u64) -> uGDSError_t {
    guard(internal(), || {
        if bytes.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        match lookup(fh) {
            Ok((h, _)) => {
                // SAFETY: non-null, checked above.
                unsafe { *bytes = h.capacity() };
                ok()
            }
            Err(c) => fail(c, "no such handle"),
        }
    })
}

/// Closes a handle, waiting for its I/O; a null handle is ignored.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleDeregister(fh: *mut c_void) {
    guard((), || {
        if !fh.is_null() {
            // SAFETY: the caller's handle, passed on under the same contract.
            let _ = unsafe { uGDSHandleDeregisterEx(fh, -1) };
        }
    })
}

/// Closes a handle and destroys its batch contexts: 0 refuses with
/// `UGDS_BUSY` while I/O is in flight, > 0 waits that many seconds, -1
/// waits, < -1 tears a wedged handle down after a controller reset.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleDeregisterEx(fh: *mut c_void, timeout_sec: c_int) -> uGDSError_t {
    guard(internal(), || {
        let h = match lookup(fh) {
            Ok((h, _)) => h,
            Err(c) => return fail(c, "no such handle"),
        };
        let drain = match timeout_sec {
            0 => Drain::NoWait,
            -1 => Drain::Forever,
            t if t < -1 => Drain::ForceAfterReset,
            t => Drain::Timeout(Duration::from_secs(t as u64)),
        };
        // The handle's batch contexts go with it (each holds the handle
        // open): unless asked not to wait while they have requests out.
        let batches: Vec<(usize, Arc<ugds::Batch>)> = {
            with_state!(s, fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed"));
            let mine: Vec<usize> = s.batches.iter().filter(|(_, (o, _))| *o == fh as usize).map(|(k, _)| *k).collect();
            if drain == Drain::NoWait {
                let out: usize = mine.iter().map(|k| s.batches[k].1.outstanding()).sum();
                if out > 0 {
                    return fail(op::BUSY, format!("{out} batch requests of this handle are outstanding"));
                }
            }
            mine.into_iter().filter_map(|k| s.batches.remove(&k).map(|(_, b)| (k, b))).collect()
        };
        // Dropped outside the lock: each cancels and waits for its requests.
        drop(batches);
        if let Err(e) = h.close(drain) {
            return from_error(e);
        }
        with_state!(s, ok());
        s.handles.remove(&(fh as usize));
        ok()
    })
}

/// The driver and the registration at `base`.
fn registered(base: *const c_void) -> Result<(ugds::Driver, BufferToken), uGDSError_t> {
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
fn register(base: *const c_void, len: size_t, backend: c_int, export: bool) -> uGDSError_t {
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
                s.exportable.insert(t.base);
            } else {
                s.exportable.remove(&t.base);
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
                    s.exportable.remove(&t.base);
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
        if !state().as_ref().is_some_and(|s| s.exportable.contains(&t.base)) {
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

/// The registration to use for `base + buf_offset .. + size`: the one
/// holding `base`, or a just-in-time one of this call alone (private: no
/// other call can find, use or deregister it), deregistered after the I/O.
enum Target {
    Registered(BufferToken, usize),
    JustInTime(BufferToken),
}

fn neg(c: c_int) -> ssize_t {
    -(c as ssize_t)
}

fn sync_io(
    fh: *mut c_void,
    base: *const c_void,
    size: size_t,
    file_offset: off_t,
    buf_offset: off_t,
    write: bool,
) -> ssize_t {
    if base.is_null() || size == 0 || file_offset < 0 || buf_offset < 0 {
        remember("null buffer, zero size or negative offset".into());
        return neg(libc::EINVAL);
    }
    let (h, driver) = match lookup(fh) {
        Ok(x) => x,
        Err(c) => {
            remember("no such handle".into());
            return neg(c);
        }
    };
    let bs = h.namespace().block_size as i64;
    if file_offset % bs != 0 || size as i64 % bs != 0 {
        remember(format!("offset {file_offset} or size {size} is not a multiple of the {bs}-byte block"));
        return neg(libc::EINVAL);
    }
    let Some(start) = (base as usize).checked_add(buf_offset as usize).filter(|s| s.checked_add(size).is_some()) else {
        remember("buffer offset and size wrap the address space".into());
        return neg(libc::EINVAL);
    };
    let target = match driver.token_containing(base.cast()) {
        Some(t) => Target::Registered(t, base as usize - t.base + buf_offset as usize),
        None => {
            // SAFETY: the C contract: the caller's buffer is valid for the
            // call; it is deregistered before this returns (or kept pinned
            // if the device may still write it).
            let r = unsafe {
                match ugds::gpu::cuda::Cuda::get().and_then(|c| c.classify(start as u64, size)) {
                    Ok(ugds::gpu::cuda::Memory::Device(_)) if start % (64 << 10) != 0 => {
                        remember("an unregistered GPU buffer must start 64 KiB aligned".into());
                        return neg(libc::EINVAL);
                    }
                    Ok(ugds::gpu::cuda::Memory::Device(_)) => driver.register_cuda_private(start as u64, size),
                    Err(Error::GpuPointerRange { .. } | Error::GpuMemoryType { .. }) => {
                        remember("the GPU range cannot be used".into());
                        return neg(libc::EINVAL);
                    }
                    _ => driver.register_private(start as *mut u8, size),
                }
            };
            match r {
                Ok(t) => Target::JustInTime(t),
                Err(e) => {
                    let n = neg(e.errno());
                    remember(e.to_string());
                    return n;
                }
            }
        }
    };
    let (token, off) = match &target {
        Target::Registered(t, off) => (*t, *off),
        Target::JustInTime(t) => (*t, 0),
    };
    let r = if write {
        h.write(&token, size, file_offset as u64, off)
    } else {
        h.read(&token, size, file_offset as u64, off)
    };
    let mut kept = None;
    if let Target::JustInTime(t) = target {
        // Refused only while a command that timed out still holds the
        // buffer: the device may write it, so its pages stay pinned.
        if let Err(e) = driver.deregister(&t) {
            tracing::warn!("just-in-time registration of {start:#x}+{size:#x} kept: {e}");
            kept = Some(e);
        }
    }
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            let n = match e {
                Error::Closed => neg(op::HANDLE_NOT_REGISTERED),
                ref other => neg(other.errno()),
            };
            match kept {
                Some(_) => remember(format!(
                    "{e}; the device may still {} the buffer at {start:#x}+{size:#x}: its pages stay pinned \
                     until the handle is torn down (uGDSHandleDeregisterEx(fh, -2)); do not free it before",
                    if write { "read" } else { "write" }
                )),
                None => remember(e.to_string()),
            }
            n
        }
    }
}

/// Synchronous read: bytes read, or a negative errno / uGDSOpError.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
/// `devPtr_base` + `devPtr_offset` must be valid for writes of `size` bytes, and stay so until the call returns.
#[no_mangle]
pub unsafe extern "C" fn uGDSRead(
    fh: *mut c_void,
    base: *mut c_void,
    size: size_t,
    file_offset: off_t,
    buf_offset: off_t,
) -> ssize_t {
    guard(neg(op::INTERNAL_ERROR), || sync_io(fh, base, size, file_offset, buf_offset, false))
}

/// Synchronous write: bytes written, or a negative errno / uGDSOpError.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
/// `devPtr_base` + `devPtr_offset` must be valid for reads of `size` bytes, and stay so until the call returns.
#[no_mangle]
pub unsafe extern "C" fn uGDSWrite(
    fh: *mut c_void,
    base: *const c_void,
    size: size_t,
    file_offset: off_t,
    buf_offset: off_t,
) -> ssize_t {
    guard(neg(op::INTERNAL_ERROR), || sync_io(fh, base, size, file_offset, buf_offset, true))
}

/// A batch context for up to `nr` requests on the handle's deep queue.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOSetUp(batch: *mut *mut c_void, fh: *mut c_void, nr: c_uint) -> uGDSError_t {
    guard(internal(), || {
        if batch.is_null() || nr == 0 {
            return fail(op::INVALID_VALUE, "null batch pointer or nr 0");
        }
        if nr as usize > ugds::Batch::MAX_CAPACITY {
            return fail(op::INVALID_VALUE, format!("nr {nr} is more than UGDS_MAX_BATCH_IO ({})", abi::MAX_BATCH_IO));
        }
        let h = match lookup(fh) {
            Ok((h, _)) => h,
            Err(c) => return fail(c, "no such handle"),
        };
        let b = match h.batch(nr as usize) {
            Ok(b) => Arc::new(b),
            Err(e) => return from_error(e),
        };
        with_state!(s, fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed"));
        let id = s.next_batch;
        s.next_batch += 16;
        s.batches.insert(id, (fh as usize, b));
        // SAFETY: non-null, checked above.
        unsafe { *batch = id as *mut c_void };
        ok()
    })
}

fn batch_of(batch: *mut c_void) -> Result<(Arc<ugds::Batch>, ugds::Driver), uGDSError_t> {
    let g = state();
    let s = g.as_ref().ok_or_else(|| fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first"))?;
    if batch.is_null() {
        return Err(fail(op::INVALID_VALUE, "null batch"));
    }
    let (_, b) = s.batches.get(&(batch as usize)).ok_or_else(|| fail(op::INVALID_VALUE, "no such batch"))?;
    Ok((b.clone(), s.driver.clone()))
}

/// Submits `nr` requests (all checked first; bad input submits none).
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
/// `params` must point to `nr` readable entries, and every buffer they name must stay valid until its event is collected.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOSubmit(
    batch: *mut c_void,
    nr: c_uint,
    params: *mut abi::uGDSIOParams_t,
    _flags: c_uint,
) -> uGDSError_t {
    guard(internal(), || {
        if params.is_null() || nr == 0 {
            return fail(op::INVALID_VALUE, "null params or nr 0");
        }
        let (b, driver) = match batch_of(batch) {
            Ok(x) => x,
            Err(e) => return e,
        };
        if nr as usize > b.capacity() {
            return fail(op::BATCH_CAPACITY_EXCEEDED, format!("{nr} requests, capacity {}", b.capacity()));
        }
        // SAFETY: the caller passes `nr` parameter blocks.
        let ps = unsafe { std::slice::from_raw_parts(params, nr as usize) };
        let mut ios = Vec::with_capacity(ps.len());
        for p in ps {
            if p.devPtr_base.is_null() || p.file_offset < 0 || p.devPtr_offset < 0 {
                return fail(op::INVALID_VALUE, "null buffer or negative offset");
            }
            let op_ = match p.opcode {
                abi::READ => BatchOp::Read,
                abi::WRITE => BatchOp::Write,
                o => return fail(op::INVALID_VALUE, format!("opcode {o}")),
            };
            let Some(t) = driver.token_containing(p.devPtr_base.cast()) else {
                return fail(op::MEMORY_NOT_REGISTERED, "batch I/O needs registered buffers");
            };
            ios.push(BatchIo {
                op: op_,
                buf: t,
                size: p.size,
                file_offset: p.file_offset as u64,
                buf_offset: p.devPtr_base as usize - t.base + p.devPtr_offset as usize,
                cookie: p.cookie as u64,
            });
        }
        match b.submit(&ios) {
            Ok(_) => ok(),
            Err(e) => from_error(e),
        }
    })
}

/// Collects finished requests: at least `min_nr` unless `timeout` passes; `*nr` is the room in, the count out.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOGetStatus(
    batch: *mut c_void,
    min_nr: c_uint,
    nr: *mut c_uint,
    events: *mut abi::uGDSIOEvents_t,
    timeout: *mut timespec,
) -> uGDSError_t {
    guard(internal(), || {
        if nr.is_null() || events.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        let (b, _) = match batch_of(batch) {
            Ok(x) => x,
            Err(e) => return e,
        };
        // SAFETY: non-null, checked above.
        let asked = unsafe { *nr } as usize;
        // 0: up to the capacity (the existing uGDS reads it so); never more
        // than the capacity, which is all there can be.
        let room = if asked == 0 { b.capacity() } else { asked.min(b.capacity()) };
        if (min_nr as usize) > room {
            return fail(op::INVALID_VALUE, format!("min_nr {min_nr} is more than the {room} events' room"));
        }
        let to = if timeout.is_null() {
            None
        } else {
            // SAFETY: non-null; the caller's timespec.
            let t = unsafe { *timeout };
            Some(Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32))
        };
        let mut ev = Vec::with_capacity(room);
        if let Err(e) = b.get_status(min_nr as usize, room, to, &mut ev) {
            return from_error(e);
        }
        for (i, e) in ev.iter().enumerate() {
            let (status, ret) = match (&e.status, &e.result) {
                (BatchStatus::Complete, Ok(n)) => (abi::BATCH_COMPLETE, *n as ssize_t),
                (BatchStatus::Canceled, _) => (abi::BATCH_CANCELED, neg(libc::ECANCELED)),
                (BatchStatus::Timeout, _) => (abi::BATCH_TIMEOUT, neg(libc::ETIMEDOUT)),
                (_, Err(x)) => (abi::BATCH_FAILED, neg(x.errno())),
                (_, Ok(n)) => (abi::BATCH_FAILED, *n as ssize_t),
            };
            // SAFETY: i < room, the caller's array holds `room` events.
            unsafe { *events.add(i) = abi::uGDSIOEvents_t { cookie: e.cookie as *mut c_void, status, ret } };
        }
        // SAFETY: non-null, checked above.
        unsafe { *nr = ev.len() as c_uint };
        ok()
    })
}

/// Cancels a batch context's requests (cuFile's `cuFileBatchIOCancel`).
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOCancel(batch: *mut c_void) -> uGDSError_t {
    guard(internal(), || match batch_of(batch) {
        Ok((b, _)) => match b.cancel() {
            Ok(()) => ok(),
            Err(e) => from_error(e),
        },
        Err(e) => e,
    })
}

/// Destroys a batch context after the device is done with it; null is ignored.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIODestroy(batch: *mut c_void) {
    guard((), || {
        if batch.is_null() {
            return;
        }
        let b = state_mut().as_mut().and_then(|s| s.batches.remove(&(batch as usize)));
        let b = b.map(|(_, b)| b);
        // Dropped outside the lock: a context with commands in flight waits
        // for them (or wedges the handle) before it goes.
        drop(b);
    })
}

fn stream_for(stream: *mut c_void, backend: c_int) -> Result<Arc<GpuStream>, uGDSError_t> {
    if let Some(s) = state().as_ref().and_then(|s| s.streams.get(&(stream as usize)).cloned()) {
        return Ok(s);
    }
    // SAFETY: the C contract: `stream` is a live stream of the current
    // context that outlives its registration.
    let s = unsafe {
        match backend {
            abi::BACKEND_HIP => ugds::gpu::hip::Hip::get().and_then(|h| h.stream(stream, StreamWait::DeviceSide)),
            _ => ugds::gpu::cuda::Cuda::get().and_then(|c| c.stream(stream, StreamWait::DeviceSide)),
        }
    }
    .map_err(from_error)?;
    let s = Arc::new(s);
    let mut g = state_mut();
    let st = g.as_mut().ok_or_else(|| fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first"))?;
    Ok(st.streams.entry(stream as usize).or_insert(s).clone())
}

#[allow(clippy::too_many_arguments)]
fn async_io(
    fh: *mut c_void,
    base: *const c_void,
    size_p: *mut size_t,
    file_offset_p: *mut off_t,
    buf_offset_p: *mut off_t,
    bytes_p: *mut ssize_t,
    stream: *mut c_void,
    write: bool,
) -> uGDSError_t {
    if base.is_null() || size_p.is_null() || file_offset_p.is_null() || buf_offset_p.is_null() || bytes_p.is_null() {
        return fail(op::INVALID_VALUE, "null argument");
    }
    let (h, driver) = match lookup(fh) {
        Ok(x) => x,
        Err(c) => return fail(c, "no such handle"),
    };
    let Some(t) = driver.token_at(base.cast()) else {
        return fail(op::MEMORY_NOT_REGISTERED, "stream-ordered I/O needs a registered buffer (by its base)");
    };
    let s = match stream_for(stream, abi::BACKEND_DEFAULT) {
        Ok(s) => s,
        Err(e) => return e,
    };
    // SAFETY: the C contract: the four pointers stay valid until the
    // stream has passed the operation.
    let io = unsafe { StreamIo::from_raw(size_p, file_offset_p, buf_offset_p, bytes_p) };
    let r = if write { h.write_async(&t, io, &*s) } else { h.read_async(&t, io, &*s) };
    match r {
        Ok(()) => ok(),
        Err(e) => from_error(e),
    }
}

/// Stream-ordered read: the values behind the pointers are read when the stream reaches it.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
/// Every pointer must stay valid until the stream has run the operation (the sizes and offsets are read then).
#[no_mangle]
pub unsafe extern "C" fn uGDSReadAsync(
    fh: *mut c_void,
    base: *mut c_void,
    size_p: *mut size_t,
    file_offset_p: *mut off_t,
    buf_offset_p: *mut off_t,
    bytes_p: *mut ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    guard(internal(), || async_io(fh, base, size_p, file_offset_p, buf_offset_p, bytes_p, stream, false))
}

/// Stream-ordered write; see `uGDSReadAsync`.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
/// Every pointer must stay valid until the stream has run the operation (the sizes and offsets are read then).
#[no_mangle]
pub unsafe extern "C" fn uGDSWriteAsync(
    fh: *mut c_void,
    base: *mut c_void,
    size_p: *mut size_t,
    file_offset_p: *mut off_t,
    buf_offset_p: *mut off_t,
    bytes_p: *mut ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    guard(internal(), || async_io(fh, base, size_p, file_offset_p, buf_offset_p, bytes_p, stream, true))
}

/// Prepares a CUDA stream for stream-ordered I/O.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSStreamRegister(stream: *mut c_void) -> uGDSError_t {
    // SAFETY: the caller's stream, passed on under the same contract.
    unsafe { uGDSStreamRegisterEx(stream, abi::BACKEND_DEFAULT) }
}

/// Prepares a CUDA or HIP stream for stream-ordered I/O.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSStreamRegisterEx(stream: *mut c_void, backend: c_int) -> uGDSError_t {
    guard(internal(), || {
        if state().is_none() {
            return fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first");
        }
        if !matches!(backend, abi::BACKEND_DEFAULT | abi::BACKEND_CUDA | abi::BACKEND_HIP) {
            return fail(op::INVALID_VALUE, format!("unknown backend {backend}"));
        }
        match stream_for(stream, backend) {
            Ok(_) => ok(),
            Err(e) => e,
        }
    })
}

/// Forgets a stream; does not wait for it or touch it (it stays the caller's).
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSStreamDeregister(stream: *mut c_void) -> uGDSError_t {
    guard(internal(), || {
        let s = {
            let mut g = state_mut();
            let Some(st) = g.as_mut() else {
                return fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first");
            };
            st.streams.remove(&(stream as usize))
        };
        match s {
            Some(s) => {
                drop(s);
                ok()
            }
            None => fail(op::INVALID_VALUE, "the stream is not registered"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;
    use ugds_emu::{Fault, FaultAction, FaultTarget};

    fn last_error() -> String {
        // SAFETY: the library's own NUL-terminated message.
        unsafe { CStr::from_ptr(ugds_last_error()) }.to_string_lossy().into_owned()
    }

    /// A handle whose command never completes: the just-in-time read that
    /// issued it says the device may still write the buffer (whose pages
    /// stay pinned), and `uGDSDriverClose` names the wedged handle and the
    /// pinned registration instead of reporting success.
    #[test]
    fn what_cannot_be_released_is_reported() {
        assert_eq!(uGDSDriverOpen().err, op::SUCCESS);
        let driver = state().as_ref().unwrap().driver.clone();
        let opts = HandleOptions { timeout: Duration::from_millis(300), ..HandleOptions::default() };
        let p = EmuPlatform::new(EmuConfig::default()).unwrap();
        let emu = p.control();
        let handle = driver.open_handle(Arc::new(p), opts).unwrap();
        let fd = 4242;
        let obj = Box::into_raw(Box::new(HandleObj { fd }));
        state_mut().as_mut().unwrap().handles.insert(obj as usize, Registered { handle: Arc::new(handle), fd });
        // The buffer is leaked on purpose: the device may still write it.
        let buf: &'static mut [u8] = Box::leak(vec![0u8; 8192].into_boxed_slice());
        emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::LoseCompletion));
        // SAFETY: a registered handle object and a live (leaked) buffer.
        let n = unsafe { uGDSRead(obj.cast(), buf.as_mut_ptr().cast(), 4096, 0, 0) };
        assert!(n < 0, "{n}");
        let msg = last_error();
        assert!(msg.contains("may still write") && msg.contains("stay pinned"), "{msg}");
        assert_eq!(driver.private_registrations().0, 1);
        let e = uGDSDriverClose();
        assert_eq!(e.err, op::IO_DISABLED);
        let msg = last_error();
        assert!(msg.contains("fd 4242") && msg.contains("just-in-time"), "{msg}");
        assert_eq!(uGDSDriverClose().err, op::DRIVER_NOT_INITIALIZED);
    }
}
