//! cuFile's error numbers, and ugds's errors as cuFile reports them.

use crate::abi::{op, CUfileError_t};
use libc::ssize_t;
use std::cell::RefCell;
use std::ffi::c_int;
use ugds::Error;

/// Every `CUfileOpError`, by name.
const ALL: &[(&str, c_int)] = &[
    ("CU_FILE_SUCCESS", 0),
    ("CU_FILE_DRIVER_NOT_INITIALIZED", 5001),
    ("CU_FILE_DRIVER_INVALID_PROPS", 5002),
    ("CU_FILE_DRIVER_UNSUPPORTED_LIMIT", 5003),
    ("CU_FILE_DRIVER_VERSION_MISMATCH", 5004),
    ("CU_FILE_DRIVER_VERSION_READ_ERROR", 5005),
    ("CU_FILE_DRIVER_CLOSING", 5006),
    ("CU_FILE_PLATFORM_NOT_SUPPORTED", 5007),
    ("CU_FILE_IO_NOT_SUPPORTED", 5008),
    ("CU_FILE_DEVICE_NOT_SUPPORTED", 5009),
    ("CU_FILE_NVFS_DRIVER_ERROR", 5010),
    ("CU_FILE_CUDA_DRIVER_ERROR", 5011),
    ("CU_FILE_CUDA_POINTER_INVALID", 5012),
    ("CU_FILE_CUDA_MEMORY_TYPE_INVALID", 5013),
    ("CU_FILE_CUDA_POINTER_RANGE_ERROR", 5014),
    ("CU_FILE_CUDA_CONTEXT_MISMATCH", 5015),
    ("CU_FILE_INVALID_MAPPING_SIZE", 5016),
    ("CU_FILE_INVALID_MAPPING_RANGE", 5017),
    ("CU_FILE_INVALID_FILE_TYPE", 5018),
    ("CU_FILE_INVALID_FILE_OPEN_FLAG", 5019),
    ("CU_FILE_DIO_NOT_SET", 5020),
    ("CU_FILE_INVALID_VALUE", 5022),
    ("CU_FILE_MEMORY_ALREADY_REGISTERED", 5023),
    ("CU_FILE_MEMORY_NOT_REGISTERED", 5024),
    ("CU_FILE_PERMISSION_DENIED", 5025),
    ("CU_FILE_DRIVER_ALREADY_OPEN", 5026),
    ("CU_FILE_HANDLE_NOT_REGISTERED", 5027),
    ("CU_FILE_HANDLE_ALREADY_REGISTERED", 5028),
    ("CU_FILE_DEVICE_NOT_FOUND", 5029),
    ("CU_FILE_INTERNAL_ERROR", 5030),
    ("CU_FILE_GETNEWFD_FAILED", 5031),
    ("CU_FILE_NVFS_SETUP_ERROR", 5033),
    ("CU_FILE_IO_DISABLED", 5034),
    ("CU_FILE_BATCH_SUBMIT_FAILED", 5035),
    ("CU_FILE_GPU_MEMORY_PINNING_FAILED", 5036),
    ("CU_FILE_BATCH_FULL", 5037),
    ("CU_FILE_ASYNC_NOT_SUPPORTED", 5038),
    ("CU_FILE_INTERNAL_BATCH_SETUP_ERROR", 5039),
    ("CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR", 5040),
    ("CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR", 5041),
    ("CU_FILE_INTERNAL_BATCH_CANCEL_ERROR", 5042),
    ("CU_FILE_NOMEM_ERROR", 5043),
    ("CU_FILE_IO_ERROR", 5044),
    ("CU_FILE_INTERNAL_BUF_REGISTER_ERROR", 5045),
    ("CU_FILE_HASH_OPR_ERROR", 5046),
    ("CU_FILE_INVALID_CONTEXT_ERROR", 5047),
    ("CU_FILE_NVFS_INTERNAL_DRIVER_ERROR", 5048),
    ("CU_FILE_BATCH_NOCOMPAT_ERROR", 5049),
    ("CU_FILE_IO_MAX_ERROR", 5050),
];

/// The value of the `CUfileOpError` called `name`.
pub(crate) fn by_name(name: &str) -> Option<c_int> {
    ALL.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

thread_local! {
    static LAST: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Keeps `msg` as the calling thread's last error (logged at debug level).
pub(crate) fn remember(msg: impl Into<String>) {
    let msg = msg.into();
    tracing::debug!("cuFile: {msg}");
    LAST.with(|l| *l.borrow_mut() = msg);
}

/// The calling thread's last error message.
pub(crate) fn last() -> String {
    LAST.with(|l| l.borrow().clone())
}

pub(crate) fn ok() -> CUfileError_t {
    CUfileError_t { err: op::SUCCESS, cu_err: 0 }
}

/// `err`, with `msg` kept as the reason.
pub(crate) fn fail(err: c_int, msg: impl Into<String>) -> CUfileError_t {
    remember(msg);
    CUfileError_t { err, cu_err: 0 }
}

/// cuFile's code for a library error, and the CUDA driver's where it has one.
pub(crate) fn code(e: &Error) -> (c_int, c_int) {
    use ugds::ErrorKind as K;
    let err = match e.kind() {
        K::InvalidArgument | K::CapacityExceeded => op::INVALID_VALUE,
        K::NotRegistered => op::MEMORY_NOT_REGISTERED,
        K::AlreadyRegistered => op::MEMORY_ALREADY_REGISTERED,
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
        K::OutOfMemory => op::NOMEM_ERROR,
        K::Device => op::IO_ERROR,
        K::Busy | K::QueueFull | K::Canceled | K::Platform => op::INTERNAL_ERROR,
    };
    let cu_err = match e {
        Error::GpuDriver { code, .. } => *code,
        _ => 0,
    };
    (err, cu_err)
}

/// A library error as a `CUfileError_t`, its message kept.
pub(crate) fn from_error(e: Error) -> CUfileError_t {
    let (err, cu_err) = code(&e);
    remember(e.to_string());
    CUfileError_t { err, cu_err }
}

/// A system error as cuFile's I/O calls return it: -1, with `errno` set.
pub(crate) fn posix(errno: c_int, msg: impl Into<String>) -> ssize_t {
    remember(msg);
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = errno };
    -1
}

/// A cuFile error as the I/O calls return it: its negated value.
pub(crate) fn negative(err: c_int, msg: impl Into<String>) -> ssize_t {
    remember(msg);
    -(err as ssize_t)
}

/// A library error from an I/O call: errors of the data's path (the file,
/// the device) as -1 with `errno`; the rest as a negated cuFile error.
pub(crate) fn io_error(e: Error) -> ssize_t {
    use ugds::ErrorKind as K;
    match e.kind() {
        K::Device | K::Platform | K::InvalidArgument | K::PermissionDenied | K::OutOfMemory => {
            let errno = e.errno();
            posix(errno, e.to_string())
        }
        _ => {
            let (c, _) = code(&e);
            negative(c, e.to_string())
        }
    }
}

/// Runs an entry point's body; a panic becomes `on_panic` (nothing unwinds
/// into C).
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
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

pub(crate) fn internal() -> CUfileError_t {
    CUfileError_t { err: op::INTERNAL_ERROR, cu_err: 0 }
}
