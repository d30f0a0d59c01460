//! The layout probes scripts/cufile-check compares with NVIDIA's
//! `cufile.h` (`ugds_cufile_abi_*`, exported beside cuFile's API): sizes,
//! field offsets and constant values as this library has them.

#![allow(missing_docs)]

use crate::abi::*;
use std::ffi::{c_char, c_int, c_long, CStr};

fn name(p: *const c_char) -> Option<&'static str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null; the check program passes string literals.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// Size of a cuFile type as this library lays it out (-1: unknown).
///
/// # Safety
/// `type_name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ugds_cufile_abi_sizeof(type_name: *const c_char) -> c_long {
    use std::mem::size_of;
    (match name(type_name) {
        Some("CUfileError_t") => size_of::<CUfileError_t>(),
        Some("CUfileDescr_t") => size_of::<CUfileDescr_t>(),
        Some("CUfileDrvProps_t") => size_of::<CUfileDrvProps_t>(),
        Some("CUfileIOParams_t") => size_of::<CUfileIOParams_t>(),
        Some("CUfileIOEvents_t") => size_of::<CUfileIOEvents_t>(),
        Some("CUfileIOVec_t") => size_of::<CUfileIOVec_t>(),
        Some("CUfileStatsLevel1_t") => L1_WORDS * 8,
        Some("CUfileStatsLevel2_t") => L2_WORDS * 8,
        Some("CUfilePerGpuStats_t") => PER_GPU_BYTES,
        Some("CUfileStatsLevel3_t") => L3_BYTES,
        _ => return -1,
    }) as c_long
}

/// Offset of a field of a cuFile type (dotted for nested members; -1:
/// unknown).
///
/// # Safety
/// Both arguments are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn ugds_cufile_abi_offsetof(type_name: *const c_char, field: *const c_char) -> c_long {
    use std::mem::offset_of;
    (match (name(type_name), name(field)) {
        (Some("CUfileError_t"), Some("err")) => offset_of!(CUfileError_t, err),
        (Some("CUfileError_t"), Some("cu_err")) => offset_of!(CUfileError_t, cu_err),
        (Some("CUfileDescr_t"), Some("type")) => offset_of!(CUfileDescr_t, type_),
        (Some("CUfileDescr_t"), Some("handle.fd")) => offset_of!(CUfileDescr_t, handle),
        (Some("CUfileDescr_t"), Some("fs_ops")) => offset_of!(CUfileDescr_t, fs_ops),
        (Some("CUfileDrvProps_t"), Some("nvfs.major_version")) => offset_of!(CUfileDrvProps_t, nvfs.major_version),
        (Some("CUfileDrvProps_t"), Some("nvfs.minor_version")) => offset_of!(CUfileDrvProps_t, nvfs.minor_version),
        (Some("CUfileDrvProps_t"), Some("nvfs.poll_thresh_size")) => {
            offset_of!(CUfileDrvProps_t, nvfs.poll_thresh_size)
        }
        (Some("CUfileDrvProps_t"), Some("nvfs.max_direct_io_size")) => {
            offset_of!(CUfileDrvProps_t, nvfs.max_direct_io_size)
        }
        (Some("CUfileDrvProps_t"), Some("nvfs.dstatusflags")) => offset_of!(CUfileDrvProps_t, nvfs.dstatusflags),
        (Some("CUfileDrvProps_t"), Some("nvfs.dcontrolflags")) => offset_of!(CUfileDrvProps_t, nvfs.dcontrolflags),
        (Some("CUfileDrvProps_t"), Some("fflags")) => offset_of!(CUfileDrvProps_t, fflags),
        (Some("CUfileDrvProps_t"), Some("max_device_cache_size")) => {
            offset_of!(CUfileDrvProps_t, max_device_cache_size)
        }
        (Some("CUfileDrvProps_t"), Some("per_buffer_cache_size")) => {
            offset_of!(CUfileDrvProps_t, per_buffer_cache_size)
        }
        (Some("CUfileDrvProps_t"), Some("max_device_pinned_mem_size")) => {
            offset_of!(CUfileDrvProps_t, max_device_pinned_mem_size)
        }
        (Some("CUfileDrvProps_t"), Some("max_batch_io_size")) => offset_of!(CUfileDrvProps_t, max_batch_io_size),
        (Some("CUfileDrvProps_t"), Some("max_batch_io_timeout_msecs")) => {
            offset_of!(CUfileDrvProps_t, max_batch_io_timeout_msecs)
        }
        (Some("CUfileIOParams_t"), Some("mode")) => offset_of!(CUfileIOParams_t, mode),
        (Some("CUfileIOParams_t"), Some("u.batch.devPtr_base")) => offset_of!(CUfileIOParams_t, batch.devPtr_base),
        (Some("CUfileIOParams_t"), Some("u.batch.file_offset")) => offset_of!(CUfileIOParams_t, batch.file_offset),
        (Some("CUfileIOParams_t"), Some("u.batch.devPtr_offset")) => offset_of!(CUfileIOParams_t, batch.devPtr_offset),
        (Some("CUfileIOParams_t"), Some("u.batch.size")) => offset_of!(CUfileIOParams_t, batch.size),
        (Some("CUfileIOParams_t"), Some("fh")) => offset_of!(CUfileIOParams_t, fh),
        (Some("CUfileIOParams_t"), Some("opcode")) => offset_of!(CUfileIOParams_t, opcode),
        (Some("CUfileIOParams_t"), Some("cookie")) => offset_of!(CUfileIOParams_t, cookie),
        (Some("CUfileIOEvents_t"), Some("cookie")) => offset_of!(CUfileIOEvents_t, cookie),
        (Some("CUfileIOEvents_t"), Some("status")) => offset_of!(CUfileIOEvents_t, status),
        (Some("CUfileIOEvents_t"), Some("ret")) => offset_of!(CUfileIOEvents_t, ret),
        (Some("CUfileIOVec_t"), Some("base")) => offset_of!(CUfileIOVec_t, base),
        (Some("CUfileIOVec_t"), Some("len")) => offset_of!(CUfileIOVec_t, len),
        (Some("CUfileStatsLevel3_t"), Some("num_gpus")) => L3_NUM_GPUS,
        (Some("CUfileStatsLevel3_t"), Some("per_gpu_stats")) => L3_NUM_GPUS + 8,
        (Some("CUfileStatsLevel2_t"), Some("read_size_kb_hist")) => L1_WORDS * 8,
        (Some("CUfileStatsLevel2_t"), Some("write_size_kb_hist")) => (L1_WORDS + 32) * 8,
        (Some("CUfileStatsLevel1_t"), Some(f)) => match crate::stats::l1_index(f) {
            Some(i) => i * 8,
            None => return -1,
        },
        _ => return -1,
    }) as c_long
}

/// The value of a cuFile constant as this library uses it (`i64::MIN`:
/// unknown).
///
/// # Safety
/// `n` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ugds_cufile_abi_constant(n: *const c_char) -> i64 {
    let Some(n) = name(n) else { return i64::MIN };
    if let Some(v) = crate::errors::by_name(n) {
        return v as i64;
    }
    (match n {
        "CU_FILE_HANDLE_TYPE_OPAQUE_FD" => HANDLE_TYPE_OPAQUE_FD,
        "CUFILE_READ" => READ,
        "CUFILE_WRITE" => WRITE,
        "CUFILE_BATCH" => BATCH,
        "CUFILE_WAITING" => STATUS_WAITING,
        "CUFILE_PENDING" => STATUS_PENDING,
        "CUFILE_INVALID" => STATUS_INVALID,
        "CUFILE_CANCELED" => STATUS_CANCELED,
        "CUFILE_COMPLETE" => STATUS_COMPLETE,
        "CUFILE_TIMEOUT" => STATUS_TIMEOUT,
        "CUFILE_FAILED" => STATUS_FAILED,
        "CU_FILE_STREAM_FIXED_BUF_OFFSET" => STREAM_FIXED_BUF_OFFSET as c_int,
        "CU_FILE_STREAM_FIXED_FILE_OFFSET" => STREAM_FIXED_FILE_OFFSET as c_int,
        "CU_FILE_STREAM_FIXED_FILE_SIZE" => STREAM_FIXED_FILE_SIZE as c_int,
        "CU_FILE_STREAM_PAGE_ALIGNED_INPUTS" => STREAM_PAGE_ALIGNED_INPUTS as c_int,
        "CU_FILE_BATCH_IO_SUPPORTED" => FEATURE_BATCH_IO as c_int,
        "CU_FILE_STREAMS_SUPPORTED" => FEATURE_STREAMS as c_int,
        "CU_FILE_USE_POLL_MODE" => CONTROL_USE_POLL_MODE as c_int,
        "CU_FILE_ALLOW_COMPAT_MODE" => CONTROL_ALLOW_COMPAT_MODE as c_int,
        "CU_FILE_NVME_SUPPORTED" => STATUS_NVME_SUPPORTED as c_int,
        _ => match crate::config::param_index(n) {
            Some(i) => i as c_int,
            None => return i64::MIN,
        },
    }) as i64
}
