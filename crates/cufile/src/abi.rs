//! cuFile's C types and numbers, as NVIDIA's `cufile.h` declares them
//! (checked against that header by scripts/cufile-check through the
//! `ugds_cufile_abi_*` probes in `probes.rs`).

#![allow(non_camel_case_types, missing_docs)]

use libc::{off_t, size_t};
use std::ffi::{c_int, c_uint, c_void};

/// `CUfileOpError` values (`CU_FILE_*`).
pub mod op {
    use std::ffi::c_int;
    pub const SUCCESS: c_int = 0;
    pub const DRIVER_NOT_INITIALIZED: c_int = 5001;
    pub const DRIVER_INVALID_PROPS: c_int = 5002;
    pub const DRIVER_UNSUPPORTED_LIMIT: c_int = 5003;
    pub const DRIVER_CLOSING: c_int = 5006;
    pub const DRIVER_ALREADY_OPEN: c_int = 5026;
    pub const PLATFORM_NOT_SUPPORTED: c_int = 5007;
    pub const IO_NOT_SUPPORTED: c_int = 5008;
    pub const DEVICE_NOT_SUPPORTED: c_int = 5009;
    pub const CUDA_DRIVER_ERROR: c_int = 5011;
    pub const CUDA_POINTER_INVALID: c_int = 5012;
    pub const CUDA_MEMORY_TYPE_INVALID: c_int = 5013;
    pub const CUDA_POINTER_RANGE_ERROR: c_int = 5014;
    pub const CUDA_CONTEXT_MISMATCH: c_int = 5015;
    pub const INVALID_FILE_TYPE: c_int = 5018;
    pub const INVALID_VALUE: c_int = 5022;
    pub const MEMORY_ALREADY_REGISTERED: c_int = 5023;
    pub const MEMORY_NOT_REGISTERED: c_int = 5024;
    pub const PERMISSION_DENIED: c_int = 5025;
    pub const HANDLE_NOT_REGISTERED: c_int = 5027;
    pub const HANDLE_ALREADY_REGISTERED: c_int = 5028;
    pub const DEVICE_NOT_FOUND: c_int = 5029;
    pub const INTERNAL_ERROR: c_int = 5030;
    pub const GETNEWFD_FAILED: c_int = 5031;
    pub const IO_DISABLED: c_int = 5034;
    pub const BATCH_SUBMIT_FAILED: c_int = 5035;
    pub const BATCH_FULL: c_int = 5037;
    pub const INTERNAL_BATCH_SUBMIT_ERROR: c_int = 5040;
    pub const INTERNAL_BATCH_GETSTATUS_ERROR: c_int = 5041;
    pub const NOMEM_ERROR: c_int = 5043;
    pub const IO_ERROR: c_int = 5044;
    pub const INTERNAL_BUF_REGISTER_ERROR: c_int = 5045;
}

/// `CUfileFileHandleType`.
pub const HANDLE_TYPE_OPAQUE_FD: c_int = 1;
/// `CUfileOpcode_t`.
pub const READ: c_int = 0;
pub const WRITE: c_int = 1;
/// `CUfileBatchMode_t`.
pub const BATCH: c_int = 1;
/// `CUfileStatus_t`.
pub const STATUS_WAITING: c_int = 0x01;
pub const STATUS_PENDING: c_int = 0x02;
pub const STATUS_INVALID: c_int = 0x04;
pub const STATUS_CANCELED: c_int = 0x08;
pub const STATUS_COMPLETE: c_int = 0x10;
pub const STATUS_TIMEOUT: c_int = 0x20;
pub const STATUS_FAILED: c_int = 0x40;
/// `cuFileStreamRegister` flags.
pub const STREAM_FIXED_BUF_OFFSET: c_uint = 1;
pub const STREAM_FIXED_FILE_OFFSET: c_uint = 2;
pub const STREAM_FIXED_FILE_SIZE: c_uint = 4;
pub const STREAM_PAGE_ALIGNED_INPUTS: c_uint = 8;
/// `CUfileFeatureFlags` and `CUfileDriverControlFlags` bits used here.
pub const FEATURE_BATCH_IO: c_uint = 1;
pub const FEATURE_STREAMS: c_uint = 2;
pub const CONTROL_USE_POLL_MODE: c_uint = 0;
pub const CONTROL_ALLOW_COMPAT_MODE: c_uint = 1;
pub const STATUS_NVME_SUPPORTED: c_uint = 4;

/// `CUfileError_t`: returned by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUfileError_t {
    pub err: c_int,
    /// `CUresult`.
    pub cu_err: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_debug_implementations)]
pub union DescrHandle {
    pub fd: c_int,
    pub handle: *mut c_void,
}

/// `CUfileDescr_t`.
#[repr(C)]
#[allow(missing_debug_implementations)]
pub struct CUfileDescr_t {
    pub type_: c_int,
    pub handle: DescrHandle,
    /// `const CUfileFSOps_t *` (user-space file systems: not served).
    pub fs_ops: *const c_void,
}

/// The `nvfs` part of `CUfileDrvProps_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvfsProps {
    pub major_version: c_uint,
    pub minor_version: c_uint,
    pub poll_thresh_size: size_t,
    pub max_direct_io_size: size_t,
    pub dstatusflags: c_uint,
    pub dcontrolflags: c_uint,
}

/// `CUfileDrvProps_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUfileDrvProps_t {
    pub nvfs: NvfsProps,
    pub fflags: c_uint,
    pub max_device_cache_size: c_uint,
    pub per_buffer_cache_size: c_uint,
    pub max_device_pinned_mem_size: c_uint,
    pub max_batch_io_size: c_uint,
    pub max_batch_io_timeout_msecs: c_uint,
}

/// The `batch` member of `CUfileIOParams_t`'s union (its only one).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BatchParams {
    pub devPtr_base: *mut c_void,
    pub file_offset: off_t,
    pub devPtr_offset: off_t,
    pub size: size_t,
}

/// `CUfileIOParams_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfileIOParams_t {
    pub mode: c_int,
    pub batch: BatchParams,
    pub fh: *mut c_void,
    pub opcode: c_int,
    pub cookie: *mut c_void,
}

/// `CUfileIOEvents_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfileIOEvents_t {
    pub cookie: *mut c_void,
    pub status: c_int,
    /// `size_t` holding a byte count, or a negative error.
    pub ret: size_t,
}

/// `CUfileIOVec_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfileIOVec_t {
    pub base: *mut c_void,
    pub len: size_t,
}

/// `CUfileStatsLevel1_t`: 78 64-bit words (counters are `{ok, err}`
/// pairs); the words ugds fills are named in `stats::l1`.
pub const L1_WORDS: usize = 78;
/// `CUfileStatsLevel2_t`: level 1, then read and write size histograms of
/// 32 buckets each.
pub const L2_WORDS: usize = L1_WORDS + 64;
/// `CUfilePerGpuStats_t`: a 16-byte UUID and 29 64-bit words.
pub const PER_GPU_BYTES: usize = 16 + 29 * 8;
/// `CUfileStatsLevel3_t`: level 2, `num_gpus` (padded to 8 bytes), and 16
/// per-GPU records.
pub const L3_BYTES: usize = L2_WORDS * 8 + 8 + 16 * PER_GPU_BYTES;
/// Offset of `num_gpus` in `CUfileStatsLevel3_t`.
pub const L3_NUM_GPUS: usize = L2_WORDS * 8;
