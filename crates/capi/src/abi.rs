//! The types and constants of include/ugds.h, laid out as C lays them out,
//! and the layout self-report the C tests compare the header against.
#![allow(non_camel_case_types, non_snake_case, missing_docs)]

use libc::{off_t, size_t, ssize_t};
use std::ffi::{c_char, c_int, c_long, c_void, CStr};
use std::mem::{offset_of, size_of};

pub const UGDSOP_BASE_ERR: c_int = 5000;

/// uGDSOpError values (a C enum: int-sized).
pub mod op {
    use std::ffi::c_int;
    pub const SUCCESS: c_int = 0;
    pub const DRIVER_NOT_INITIALIZED: c_int = 5001;
    pub const DRIVER_INVALID_PROPS: c_int = 5002;
    pub const DRIVER_UNSUPPORTED_LIMIT: c_int = 5003;
    pub const DRIVER_VERSION_MISMATCH: c_int = 5004;
    pub const DRIVER_VERSION_READ_ERROR: c_int = 5005;
    pub const DRIVER_CLOSING: c_int = 5006;
    pub const PLATFORM_NOT_SUPPORTED: c_int = 5007;
    pub const IO_NOT_SUPPORTED: c_int = 5008;
    pub const DEVICE_NOT_SUPPORTED: c_int = 5009;
    pub const NVFS_DRIVER_ERROR: c_int = 5010;
    pub const CUDA_DRIVER_ERROR: c_int = 5011;
    pub const CUDA_POINTER_INVALID: c_int = 5012;
    pub const CUDA_MEMORY_TYPE_INVALID: c_int = 5013;
    pub const CUDA_POINTER_RANGE_ERROR: c_int = 5014;
    pub const CUDA_CONTEXT_MISMATCH: c_int = 5015;
    pub const INVALID_MAPPING_SIZE: c_int = 5016;
    pub const INVALID_MAPPING_RANGE: c_int = 5017;
    pub const INVALID_FILE_TYPE: c_int = 5018;
    pub const INVALID_FILE_OPEN_FLAG: c_int = 5019;
    pub const DIO_NOT_SET: c_int = 5020;
    pub const INVALID_VALUE: c_int = 5022;
    pub const MEMORY_ALREADY_REGISTERED: c_int = 5023;
    pub const MEMORY_NOT_REGISTERED: c_int = 5024;
    pub const PERMISSION_DENIED: c_int = 5025;
    pub const DRIVER_ALREADY_OPEN: c_int = 5026;
    pub const HANDLE_NOT_REGISTERED: c_int = 5027;
    pub const HANDLE_ALREADY_REGISTERED: c_int = 5028;
    pub const DEVICE_NOT_FOUND: c_int = 5029;
    pub const INTERNAL_ERROR: c_int = 5030;
    pub const GETNEWFD_FAILED: c_int = 5031;
    pub const NVFS_SETUP_ERROR: c_int = 5033;
    pub const IO_DISABLED: c_int = 5034;
    pub const GPU_MEMORY_PINNING_FAILED: c_int = 5036;
    pub const BATCH_CAPACITY_EXCEEDED: c_int = 5040;
    pub const RDMA_MR_STILL_ACTIVE: c_int = 5041;
    pub const BUSY: c_int = 5042;
    pub const OUT_OF_MEMORY: c_int = 5043;
}

pub const HANDLE_TYPE_OPAQUE_FD: c_int = 1;
/// The most members `uGDSVolumeOpen` takes (`UGDS_MAX_VOLUME_MEMBERS`).
pub const MAX_VOLUME_MEMBERS: c_int = 64;

/// `uGDSTcpOpen`'s flag for header and data digests (`UGDS_TCP_DIGESTS`).
pub const TCP_DIGESTS: u32 = 1;
/// `uGDSRdmaOpen`'s flag to register no buffer with the RDMA device and
/// copy every command's data through the queues' memory (`UGDS_RDMA_COPY`).
pub const RDMA_COPY: u32 = 1;
pub const HANDLE_TYPE_OPAQUE_WIN32: c_int = 2;
pub const HANDLE_TYPE_USERSPACE_FS: c_int = 3;
pub const BACKEND_DEFAULT: c_int = 0;
pub const BACKEND_CUDA: c_int = 1;
pub const BACKEND_HIP: c_int = 2;
pub const READ: c_int = 0;
pub const WRITE: c_int = 1;
pub const BATCH_WAITING: c_int = 0x01;
pub const BATCH_PENDING: c_int = 0x02;
pub const BATCH_INVALID: c_int = 0x04;
pub const BATCH_CANCELED: c_int = 0x08;
pub const BATCH_COMPLETE: c_int = 0x10;
pub const BATCH_TIMEOUT: c_int = 0x20;
pub const BATCH_FAILED: c_int = 0x40;
pub const MAX_BATCH_IO: c_int = 65536;
pub const NVM_MAP_DMABUF: c_int = 0x1;
pub const NVM_MAP_RDMA: c_int = 0x2;
pub const NVM_MAP_FORCE_CUDA: c_int = 0x4;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct uGDSError_t {
    pub err: c_int,
    pub cu_err: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrHandle {
    pub fd: c_int,
    pub handle: *mut c_void,
}

impl std::fmt::Debug for DescrHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Which member is live is the descriptor's `type_` (and a member
        // set through `fd` leaves the rest uninitialized): not read here.
        f.write_str("DescrHandle { .. }")
    }
}

#[repr(C)]
#[derive(Debug)]
pub struct uGDSDescr_t {
    pub type_: c_int,
    pub handle: DescrHandle,
}

#[repr(C)]
#[derive(Debug)]
pub struct uGDSBufConfig_t {
    pub backend: c_int,
    pub enable_export: bool,
}

#[repr(C)]
#[derive(Debug)]
pub struct uGDSDmabufExport_t {
    pub fd: c_int,
    pub offset: u64,
    pub length: size_t,
}

#[repr(C)]
#[derive(Debug)]
pub struct uGDSRDMARegion_t {
    pub mr: *mut c_void,
    pub iova: u64,
    pub lkey: u32,
    pub rkey: u32,
    pub token: u64,
}

#[repr(C)]
#[derive(Debug)]
pub struct uGDSIOParams_t {
    pub devPtr_base: *mut c_void,
    pub file_offset: off_t,
    pub devPtr_offset: off_t,
    pub size: size_t,
    pub opcode: c_int,
    pub cookie: *mut c_void,
}

#[repr(C)]
#[derive(Debug)]
pub struct uGDSIOEvents_t {
    pub cookie: *mut c_void,
    pub status: c_int,
    pub ret: ssize_t,
}

/// `ugds_queue_stats_t`: what one I/O queue pair of a handle has done (an
/// extension; see `ugds::QueueStats`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct ugds_queue_stats_t {
    pub qid: u16,
    pub role: u16,
    pub reserved: u32,
    pub submitted: u64,
    pub completed: u64,
    pub in_flight: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub doorbell_writes: u64,
    pub interrupts: u64,
}

/// `ugds_segment_t`: a piece of a registered buffer for `uGDSReadv` and
/// `uGDSWritev` (an extension).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ugds_segment_t {
    pub base: *mut c_void,
    pub buf_offset: off_t,
    pub size: size_t,
}

/// `ugds_iov_params_t`: one vectored request of `uGDSBatchIOSubmitv` (an
/// extension).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ugds_iov_params_t {
    pub segs: *const ugds_segment_t,
    pub count: c_int,
    pub opcode: c_int,
    pub file_offset: off_t,
    pub cookie: *mut c_void,
}

/// `ugds_request_stats_t`: what a batch context's or a stream's requests
/// have done (`uGDSBatchIOGetStats`, `uGDSStreamGetStats`; an extension).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ugds_request_stats_t {
    pub submitted: u64,
    pub ended: u64,
    pub in_flight: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
    pub canceled: u64,
    pub timeouts: u64,
}

impl From<ugds::RequestStats> for ugds_request_stats_t {
    fn from(s: ugds::RequestStats) -> Self {
        ugds_request_stats_t {
            submitted: s.submitted,
            ended: s.ended,
            in_flight: s.in_flight,
            bytes_read: s.bytes_read,
            bytes_written: s.bytes_written,
            errors: s.errors,
            canceled: s.canceled,
            timeouts: s.timeouts,
        }
    }
}

/// The most segments one vectored call takes (`UGDS_MAX_SEGMENTS`).
pub const MAX_SEGMENTS: c_int = 256;

/// `role` values of `ugds_queue_stats_t`.
pub const UGDS_QUEUE_SYNC: u16 = 0;
pub const UGDS_QUEUE_BATCH: u16 = 1;
pub const UGDS_QUEUE_LENDABLE: u16 = 2;

/// Stream priorities of `uGDSStreamSetService`.
pub const UGDS_PRIORITY_CRITICAL: c_int = 0;
pub const UGDS_PRIORITY_NORMAL: c_int = 1;
pub const UGDS_PRIORITY_BACKGROUND: c_int = 2;

impl From<&ugds::QueueStats> for ugds_queue_stats_t {
    fn from(s: &ugds::QueueStats) -> Self {
        ugds_queue_stats_t {
            qid: s.qid,
            role: match s.role {
                ugds::QueueRole::Sync => UGDS_QUEUE_SYNC,
                ugds::QueueRole::Batch => UGDS_QUEUE_BATCH,
                _ => UGDS_QUEUE_LENDABLE,
            },
            reserved: 0,
            submitted: s.submitted,
            completed: s.completed,
            in_flight: s.in_flight,
            bytes_read: s.bytes_read,
            bytes_written: s.bytes_written,
            errors: s.errors,
            timeouts: s.timeouts,
            doorbell_writes: s.doorbell_writes,
            interrupts: s.interrupts,
        }
    }
}

/// What a `uGDSHandle_t` points to: existing programs read the fd as
/// `*(int *)handle`.
#[repr(C)]
#[derive(Debug)]
pub struct HandleObj {
    pub fd: c_int,
}

fn name(p: *const c_char) -> Option<&'static str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string (tests pass literals).
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

macro_rules! layouts {
    ($($ty:ident { $($field:ident => $cname:literal),* })*) => {
        fn size_of_type(t: &str) -> Option<usize> {
            match t { $(stringify!($ty) => Some(size_of::<$ty>()),)* "uGDSOpError" | "uGDSHandleType" | "uGDSBackend_t"
                | "uGDSOpcode_t" | "uGDSBatchStatus_t" => Some(size_of::<c_int>()),
                "uGDSHandle_t" | "uGDSBatchHandle_t" => Some(size_of::<*mut c_void>()), _ => None }
        }
        fn offset_of_field(t: &str, f: &str) -> Option<usize> {
            match (t, f) { $($((stringify!($ty), $cname) => Some(offset_of!($ty, $field)),)*)* _ => None }
        }
    };
}

layouts! {
    uGDSError_t { err => "err", cu_err => "cu_err" }
    uGDSDescr_t { type_ => "type", handle => "handle" }
    uGDSBufConfig_t { backend => "backend", enable_export => "enable_export" }
    uGDSDmabufExport_t { fd => "fd", offset => "offset", length => "length" }
    uGDSRDMARegion_t { mr => "mr", iova => "iova", lkey => "lkey", rkey => "rkey", token => "token" }
    uGDSIOParams_t { devPtr_base => "devPtr_base", file_offset => "file_offset", devPtr_offset => "devPtr_offset",
        size => "size", opcode => "opcode", cookie => "cookie" }
    uGDSIOEvents_t { cookie => "cookie", status => "status", ret => "ret" }
    ugds_queue_stats_t { qid => "qid", role => "role", submitted => "submitted", completed => "completed",
        in_flight => "in_flight", bytes_read => "bytes_read", bytes_written => "bytes_written", errors => "errors",
        timeouts => "timeouts", doorbell_writes => "doorbell_writes", interrupts => "interrupts" }
    ugds_segment_t { base => "base", buf_offset => "buf_offset", size => "size" }
    ugds_iov_params_t { segs => "segs", count => "count", opcode => "opcode", file_offset => "file_offset",
        cookie => "cookie" }
    ugds_request_stats_t { submitted => "submitted", ended => "ended", in_flight => "in_flight",
        bytes_read => "bytes_read", bytes_written => "bytes_written", errors => "errors", canceled => "canceled",
        timeouts => "timeouts" }
}

fn constant(n: &str) -> Option<c_long> {
    use op::*;
    let v = match n {
        "UGDSOP_BASE_ERR" => UGDSOP_BASE_ERR,
        "UGDS_SUCCESS" => SUCCESS,
        "UGDS_QUEUE_SYNC" => UGDS_QUEUE_SYNC as c_int,
        "UGDS_QUEUE_BATCH" => UGDS_QUEUE_BATCH as c_int,
        "UGDS_QUEUE_LENDABLE" => UGDS_QUEUE_LENDABLE as c_int,
        "UGDS_DRIVER_NOT_INITIALIZED" => DRIVER_NOT_INITIALIZED,
        "UGDS_DRIVER_INVALID_PROPS" => DRIVER_INVALID_PROPS,
        "UGDS_DRIVER_UNSUPPORTED_LIMIT" => DRIVER_UNSUPPORTED_LIMIT,
        "UGDS_DRIVER_VERSION_MISMATCH" => DRIVER_VERSION_MISMATCH,
        "UGDS_DRIVER_VERSION_READ_ERROR" => DRIVER_VERSION_READ_ERROR,
        "UGDS_DRIVER_CLOSING" => DRIVER_CLOSING,
        "UGDS_PLATFORM_NOT_SUPPORTED" => PLATFORM_NOT_SUPPORTED,
        "UGDS_IO_NOT_SUPPORTED" => IO_NOT_SUPPORTED,
        "UGDS_DEVICE_NOT_SUPPORTED" => DEVICE_NOT_SUPPORTED,
        "UGDS_NVFS_DRIVER_ERROR" => NVFS_DRIVER_ERROR,
        "UGDS_CUDA_DRIVER_ERROR" => CUDA_DRIVER_ERROR,
        "UGDS_CUDA_POINTER_INVALID" => CUDA_POINTER_INVALID,
        "UGDS_CUDA_MEMORY_TYPE_INVALID" => CUDA_MEMORY_TYPE_INVALID,
        "UGDS_CUDA_POINTER_RANGE_ERROR" => CUDA_POINTER_RANGE_ERROR,
        "UGDS_CUDA_CONTEXT_MISMATCH" => CUDA_CONTEXT_MISMATCH,
        "UGDS_INVALID_MAPPING_SIZE" => INVALID_MAPPING_SIZE,
        "UGDS_INVALID_MAPPING_RANGE" => INVALID_MAPPING_RANGE,
        "UGDS_INVALID_FILE_TYPE" => INVALID_FILE_TYPE,
        "UGDS_INVALID_FILE_OPEN_FLAG" => INVALID_FILE_OPEN_FLAG,
        "UGDS_DIO_NOT_SET" => DIO_NOT_SET,
        "UGDS_INVALID_VALUE" => INVALID_VALUE,
        "UGDS_MEMORY_ALREADY_REGISTERED" => MEMORY_ALREADY_REGISTERED,
        "UGDS_MEMORY_NOT_REGISTERED" => MEMORY_NOT_REGISTERED,
        "UGDS_PERMISSION_DENIED" => PERMISSION_DENIED,
        "UGDS_DRIVER_ALREADY_OPEN" => DRIVER_ALREADY_OPEN,
        "UGDS_HANDLE_NOT_REGISTERED" => HANDLE_NOT_REGISTERED,
        "UGDS_HANDLE_ALREADY_REGISTERED" => HANDLE_ALREADY_REGISTERED,
        "UGDS_DEVICE_NOT_FOUND" => DEVICE_NOT_FOUND,
        "UGDS_INTERNAL_ERROR" => INTERNAL_ERROR,
        "UGDS_GETNEWFD_FAILED" => GETNEWFD_FAILED,
        "UGDS_NVFS_SETUP_ERROR" => NVFS_SETUP_ERROR,
        "UGDS_IO_DISABLED" => IO_DISABLED,
        "UGDS_GPU_MEMORY_PINNING_FAILED" => GPU_MEMORY_PINNING_FAILED,
        "UGDS_BATCH_CAPACITY_EXCEEDED" => BATCH_CAPACITY_EXCEEDED,
        "UGDS_RDMA_MR_STILL_ACTIVE" => RDMA_MR_STILL_ACTIVE,
        "UGDS_BUSY" => BUSY,
        "UGDS_OUT_OF_MEMORY" => OUT_OF_MEMORY,
        "UGDS_HANDLE_TYPE_OPAQUE_FD" => HANDLE_TYPE_OPAQUE_FD,
        "UGDS_HANDLE_TYPE_OPAQUE_WIN32" => HANDLE_TYPE_OPAQUE_WIN32,
        "UGDS_HANDLE_TYPE_USERSPACE_FS" => HANDLE_TYPE_USERSPACE_FS,
        "UGDS_BACKEND_DEFAULT" => BACKEND_DEFAULT,
        "UGDS_BACKEND_CUDA" => BACKEND_CUDA,
        "UGDS_BACKEND_HIP" => BACKEND_HIP,
        "UGDS_READ" => READ,
        "UGDS_WRITE" => WRITE,
        "UGDS_BATCH_WAITING" => BATCH_WAITING,
        "UGDS_BATCH_PENDING" => BATCH_PENDING,
        "UGDS_BATCH_INVALID" => BATCH_INVALID,
        "UGDS_BATCH_CANCELED" => BATCH_CANCELED,
        "UGDS_BATCH_COMPLETE" => BATCH_COMPLETE,
        "UGDS_BATCH_TIMEOUT" => BATCH_TIMEOUT,
        "UGDS_BATCH_FAILED" => BATCH_FAILED,
        "UGDS_MAX_BATCH_IO" => MAX_BATCH_IO,
        "UGDS_MAX_SEGMENTS" => MAX_SEGMENTS,
        "UGDS_MAX_VOLUME_MEMBERS" => MAX_VOLUME_MEMBERS,
        "UGDS_TCP_DIGESTS" => TCP_DIGESTS as _,
        "UGDS_RDMA_COPY" => RDMA_COPY as _,
        "UGDS_PRIORITY_CRITICAL" => UGDS_PRIORITY_CRITICAL,
        "UGDS_PRIORITY_NORMAL" => UGDS_PRIORITY_NORMAL,
        "UGDS_PRIORITY_BACKGROUND" => UGDS_PRIORITY_BACKGROUND,
        "NVM_MAP_DMABUF" | "UGDS_REGISTER_DMABUF" => NVM_MAP_DMABUF,
        "NVM_MAP_RDMA" => NVM_MAP_RDMA,
        "NVM_MAP_FORCE_CUDA" => NVM_MAP_FORCE_CUDA,
        _ => return None,
    };
    Some(v as c_long)
}

/// The size of the named type as this library lays it out, or -1.
///
/// # Safety
/// `type_name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ugds_abi_sizeof(type_name: *const c_char) -> c_long {
    name(type_name).and_then(size_of_type).map_or(-1, |v| v as c_long)
}

/// The offset of `field` in the named struct as this library lays it out, or -1.
///
/// # Safety
/// Both are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn ugds_abi_offsetof(type_name: *const c_char, field: *const c_char) -> c_long {
    match (name(type_name), name(field)) {
        (Some(t), Some(f)) => offset_of_field(t, f).map_or(-1, |v| v as c_long),
        _ => -1,
    }
}

/// The value of the named constant in this library, or -1.
///
/// # Safety
/// `n` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ugds_abi_constant(n: *const c_char) -> c_long {
    name(n).and_then(constant).unwrap_or(-1)
}
