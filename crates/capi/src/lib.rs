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
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;
use ugds::gpu::{GpuStream, StreamWait};
use ugds::shared_state::{AddrMap, Change, SharedState};
use ugds::{BatchIo, BatchOp, BatchStatus, BufferToken, Drain, Error, Handle, HandleOptions, StreamIo};

#[derive(Clone)]
struct Registered {
    dev: Dev,
    fd: c_int,
}

/// What a `uGDSBatchHandle_t` is: a context on a handle, or on a volume.
pub(crate) type CBatch = Arc<dyn ugds::BatchContext>;

/// What a registered `uGDSHandle_t` is.
#[derive(Clone)]
pub(crate) enum Dev {
    /// A controller's namespace (or a file through the kernel).
    One(Arc<Handle>),
    /// A volume over registered handles (`uGDSVolumeOpen`), with their keys.
    Volume(ugds::Volume, Vec<usize>),
}

#[derive(Clone)]
struct State {
    driver: ugds::Driver,
    /// Live handles by the address of their `HandleObj`.
    handles: AddrMap<Registered>,
    /// Batch contexts by id (an opaque `void *` to the caller), with the
    /// key of the handle they belong to.
    batches: AddrMap<(usize, CBatch)>,
    next_batch: usize,
    /// Streams by their runtime handle.
    streams: AddrMap<Arc<GpuStream>>,
    /// Bases registered with `enable_export`.
    exportable: HashSet<usize>,
}

const _: () = assert!(abi::MAX_BATCH_IO as usize == ugds::Batch::MAX_CAPACITY);

/// The library's objects: every call reads a snapshot with no lock and
/// no shared count and borrows what it names from it; registration and
/// deregistration publish a changed copy (see `ugds::shared_state`).
static STATE: SharedState<State> = SharedState::new();

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The state a call works on.
pub(crate) type Snapshot = ugds::shared_state::Snapshot<State>;

fn state() -> Snapshot {
    STATE.load()
}

fn state_mut() -> Change<'static, State> {
    STATE.change()
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
            handles: AddrMap::default(),
            batches: AddrMap::default(),
            next_batch: 0x1000,
            streams: AddrMap::default(),
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
        // Volumes first: they hold their members' handles.
        let (volumes, handles): (Vec<_>, Vec<_>) =
            st.handles.into_values().partition(|r| matches!(r.dev, Dev::Volume(..)));
        drop(volumes);
        for r in handles {
            let Dev::One(h) = r.dev else { continue };
            if let Err(e) = h.close(Drain::Forever) {
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

mod batch;
mod buffer;
mod handle;
mod io;
mod stream;

pub use batch::*;
pub use buffer::*;
pub use handle::*;
pub use io::*;
pub use stream::*;

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;
    use ugds_emu::{EmuConfig, EmuPlatform, Fault, FaultAction, FaultTarget};

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
        let opts = HandleOptions::default().timeout(Duration::from_millis(300));
        let p = EmuPlatform::new(EmuConfig::default()).unwrap();
        let emu = p.control();
        let handle = driver.open_handle(Arc::new(p), opts).unwrap();
        let fd = 4242;
        let obj = Box::into_raw(Box::new(HandleObj { fd }));
        state_mut().as_mut().unwrap().handles.insert(obj as usize, Registered { dev: Dev::One(Arc::new(handle)), fd });
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
