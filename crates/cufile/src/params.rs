//! Driver properties, parameters and statistics: the entry points (the
//! values are in `config` and `stats`).

use crate::abi::{op, CUfileDrvProps_t, CUfileError_t, L1_WORDS, L2_WORDS, L3_BYTES};
use crate::errors::{fail, guard, internal, ok};
use crate::{config, stats};
use libc::size_t;
use std::ffi::{c_char, c_int, CStr};

/// The driver's properties (those staged before it opens, or current).
///
/// # Safety
/// `props` is null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cuFileDriverGetProperties(props: *mut CUfileDrvProps_t) -> CUfileError_t {
    guard(internal(), || {
        if props.is_null() {
            return fail(op::INVALID_VALUE, "null props");
        }
        let opened = crate::open_implicitly();
        if opened.err != op::SUCCESS {
            return opened;
        }
        // SAFETY: non-null; the caller's struct.
        unsafe { props.write(config::properties()) };
        ok()
    })
}

/// Polled completion (`poll`) or interrupts for handles registered from
/// now on; the threshold (KB) is kept (ugds polls every size). A no-op
/// once the driver is open, as cuFile's.
#[no_mangle]
pub extern "C" fn cuFileDriverSetPollMode(poll: bool, poll_threshold_size: size_t) -> CUfileError_t {
    guard(internal(), || {
        if crate::is_open() {
            return ok();
        }
        let e = config::set_bool(config::USE_POLL_MODE as c_int, poll);
        if e.err != op::SUCCESS || poll_threshold_size == 0 {
            return e;
        }
        config::set_size(config::POLL_THRESHOLD_KB as c_int, poll_threshold_size)
    })
}

/// The largest request (KB) synchronous calls are cut into. A no-op once
/// the driver is open.
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxDirectIOSize(max_direct_io_size: size_t) -> CUfileError_t {
    guard(internal(), || {
        if crate::is_open() {
            return ok();
        }
        if max_direct_io_size == 0 {
            return fail(op::INVALID_VALUE, "a largest direct I/O of 0 KB");
        }
        config::set_size(config::MAX_DIRECT_IO_KB as c_int, max_direct_io_size)
    })
}

/// GPU memory for internal buffering: ugds keeps none (its bounce buffers
/// are pinned host memory); reported, a change refused.
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxCacheSize(max_cache_size: size_t) -> CUfileError_t {
    guard(internal(), || unchanged(6, max_cache_size))
}

/// Pinned memory for registrations: ugds pins what is registered, with no
/// pool; reported, a change refused.
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxPinnedMemSize(max_pinned_size: size_t) -> CUfileError_t {
    guard(internal(), || unchanged(8, max_pinned_size))
}

fn unchanged(param: c_int, v: size_t) -> CUfileError_t {
    if crate::is_open() {
        return ok();
    }
    match config::get_size(param) {
        Some(now) if now == v => ok(),
        _ if v == 0 => fail(op::INVALID_VALUE, "0 KB"),
        _ => fail(op::DRIVER_UNSUPPORTED_LIMIT, "this limit has no effect in ugds: it keeps its value"),
    }
}

/// A size_t parameter's value.
///
/// # Safety
/// `value` is null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterSizeT(param: c_int, value: *mut size_t) -> CUfileError_t {
    match (config::get_size(param), value.is_null()) {
        (Some(v), false) => {
            // SAFETY: non-null; the caller's size_t.
            unsafe { *value = v };
            ok()
        }
        _ => fail(op::INVALID_VALUE, format!("size_t parameter {param}, or a null value")),
    }
}

/// A bool parameter's value.
///
/// # Safety
/// `value` is null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterBool(param: c_int, value: *mut bool) -> CUfileError_t {
    match (config::get_bool(param), value.is_null()) {
        (Some(v), false) => {
            // SAFETY: non-null; the caller's bool.
            unsafe { *value = v };
            ok()
        }
        _ => fail(op::INVALID_VALUE, format!("bool parameter {param}, or a null value")),
    }
}

/// A string parameter's value, NUL-terminated, into `desc_str` of `len`
/// bytes (`CU_FILE_INVALID_VALUE` when it does not fit).
///
/// # Safety
/// `desc_str` is null (refused) or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterString(param: c_int, desc_str: *mut c_char, len: c_int) -> CUfileError_t {
    let Some(v) = config::get_string(param) else {
        return fail(op::INVALID_VALUE, format!("string parameter {param}"));
    };
    if desc_str.is_null() || len <= 0 || v.len() >= len as usize {
        return fail(op::INVALID_VALUE, "a null or short string buffer");
    }
    // SAFETY: the caller's buffer of `len` bytes; v.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(v.as_ptr(), desc_str as *mut u8, v.len());
        *desc_str.add(v.len()) = 0;
    }
    ok()
}

/// The bounds a size_t parameter may be set within.
///
/// # Safety
/// Both pointers are null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterMinMaxValue(
    param: c_int,
    min_value: *mut size_t,
    max_value: *mut size_t,
) -> CUfileError_t {
    match (config::min_max(param), min_value.is_null() || max_value.is_null()) {
        (Some((lo, hi)), false) => {
            // SAFETY: non-null; the caller's size_t's.
            unsafe {
                *min_value = lo;
                *max_value = hi;
            }
            ok()
        }
        _ => fail(op::INVALID_VALUE, format!("size_t parameter {param}, or a null value")),
    }
}

/// Sets a size_t parameter (before the driver opens).
#[no_mangle]
pub extern "C" fn cuFileSetParameterSizeT(param: c_int, value: size_t) -> CUfileError_t {
    guard(internal(), || config::set_size(param, value))
}

/// Sets a bool parameter (before the driver opens).
#[no_mangle]
pub extern "C" fn cuFileSetParameterBool(param: c_int, value: bool) -> CUfileError_t {
    guard(internal(), || config::set_bool(param, value))
}

/// Sets a string parameter (before the driver opens).
///
/// # Safety
/// `desc_str` is null (refused) or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cuFileSetParameterString(param: c_int, desc_str: *const c_char) -> CUfileError_t {
    if desc_str.is_null() {
        return fail(op::INVALID_VALUE, "null string");
    }
    // SAFETY: non-null, NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(desc_str) }.to_string_lossy();
    guard(internal(), || config::set_string(param, &s))
}

/// Sets the statistics level (0 to 3).
#[no_mangle]
pub extern "C" fn cuFileSetStatsLevel(level: c_int) -> CUfileError_t {
    if !(0..=3).contains(&level) {
        return fail(op::INVALID_VALUE, format!("stats level {level} (0 to 3)"));
    }
    stats::set_level(level);
    ok()
}

/// The statistics level.
///
/// # Safety
/// `level` is null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetStatsLevel(level: *mut c_int) -> CUfileError_t {
    if level.is_null() {
        return fail(op::INVALID_VALUE, "null level");
    }
    // SAFETY: non-null; the caller's int.
    unsafe { *level = stats::level() };
    ok()
}

/// Starts counting (at the level set).
#[no_mangle]
pub extern "C" fn cuFileStatsStart() -> CUfileError_t {
    stats::start();
    ok()
}

/// Stops counting; the figures stay.
#[no_mangle]
pub extern "C" fn cuFileStatsStop() -> CUfileError_t {
    stats::stop();
    ok()
}

/// Zeroes the figures.
#[no_mangle]
pub extern "C" fn cuFileStatsReset() -> CUfileError_t {
    stats::reset();
    ok()
}

fn get_stats(out: *mut u8, bytes: usize, level: c_int) -> CUfileError_t {
    if out.is_null() {
        return fail(op::INVALID_VALUE, "null stats");
    }
    if stats::level() < level {
        return fail(op::INVALID_VALUE, format!("the stats level is {} (level {level} asked)", stats::level()));
    }
    // SAFETY: the caller's struct of `bytes` bytes (its type's size).
    stats::snapshot(unsafe { std::slice::from_raw_parts_mut(out, bytes) });
    ok()
}

/// Level-1 statistics.
///
/// # Safety
/// `stats` is null (refused) or valid for writes of a `CUfileStatsLevel1_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetStatsL1(stats: *mut u8) -> CUfileError_t {
    get_stats(stats, L1_WORDS * 8, 1)
}

/// Level-2 statistics.
///
/// # Safety
/// `stats` is null (refused) or valid for writes of a `CUfileStatsLevel2_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetStatsL2(stats: *mut u8) -> CUfileError_t {
    get_stats(stats, L2_WORDS * 8, 2)
}

/// Level-3 statistics (no per-GPU records: `num_gpus` is 0).
///
/// # Safety
/// `stats` is null (refused) or valid for writes of a `CUfileStatsLevel3_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetStatsL3(stats: *mut u8) -> CUfileError_t {
    get_stats(stats, L3_BYTES, 3)
}

/// A GPU's BAR1 size in KiB, from sysfs (ugds maps no BAR1 itself; the
/// figure is the device's).
///
/// # Safety
/// `bar_size` is null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetBARSizeInKB(gpu_index: c_int, bar_size: *mut size_t) -> CUfileError_t {
    guard(internal(), || {
        if bar_size.is_null() || gpu_index < 0 {
            return fail(op::INVALID_VALUE, "null size or a negative GPU index");
        }
        if !crate::is_open() {
            return fail(op::DRIVER_NOT_INITIALIZED, "cuFileDriverOpen first");
        }
        let bdf = match ugds::gpu::cuda::Cuda::get().and_then(|c| c.pci_bus_id(gpu_index as usize)) {
            Ok(b) => b.to_ascii_lowercase(),
            Err(e) => return fail(op::INVALID_VALUE, format!("GPU {gpu_index}: {e}")),
        };
        let res = std::fs::read_to_string(format!("/sys/bus/pci/devices/{bdf}/resource")).unwrap_or_default();
        let bar1 = res.lines().nth(1).and_then(|l| {
            let v: Vec<u64> =
                l.split_whitespace().filter_map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok()).collect();
            (v.len() >= 2 && v[1] > v[0]).then(|| v[1] - v[0] + 1)
        });
        match bar1 {
            Some(bytes) => {
                // SAFETY: non-null; the caller's size_t.
                unsafe { *bar_size = (bytes / 1024) as size_t };
                ok()
            }
            None => fail(op::INVALID_VALUE, format!("no BAR1 in /sys/bus/pci/devices/{bdf}/resource")),
        }
    })
}

/// Pools ugds does not keep (POSIX and GPU bounce-buffer slabs): their
/// arrays are empty. `len` 0 reads them; any other length is refused.
fn no_slabs(len: c_int) -> CUfileError_t {
    if len == 0 {
        return ok();
    }
    fail(op::INVALID_VALUE, "ugds keeps no such slab pool: its arrays have length 0")
}

/// The POSIX pool's slabs: none (ugds's bounce buffers are its own, by size class).
///
/// # Safety
/// Arrays are unused (their length must be 0).
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterPosixPoolSlabArray(
    _size_values: *mut size_t,
    _count_values: *mut size_t,
    len: c_int,
) -> CUfileError_t {
    no_slabs(len)
}

/// Refused unless empty (see `cuFileGetParameterPosixPoolSlabArray`).
///
/// # Safety
/// Arrays are unused.
#[no_mangle]
pub unsafe extern "C" fn cuFileSetParameterPosixPoolSlabArray(
    _size_values: *const size_t,
    _count_values: *const size_t,
    len: c_int,
) -> CUfileError_t {
    if crate::is_open() {
        return fail(op::DRIVER_ALREADY_OPEN, "parameters are set before cuFileDriverOpen");
    }
    no_slabs(len)
}

/// The GPU bounce-buffer slabs: none (ugds bounces through pinned host memory).
///
/// # Safety
/// Arrays are unused (their length must be 0).
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterGpuBounceBufferSlabArray(
    _size_values: *mut size_t,
    _count_values: *mut size_t,
    len: c_int,
) -> CUfileError_t {
    no_slabs(len)
}

/// Refused unless empty (see `cuFileGetParameterGpuBounceBufferSlabArray`).
///
/// # Safety
/// Arrays are unused.
#[no_mangle]
pub unsafe extern "C" fn cuFileSetParameterGpuBounceBufferSlabArray(
    _size_values: *const size_t,
    _count_values: *const size_t,
    len: c_int,
) -> CUfileError_t {
    if crate::is_open() {
        return fail(op::DRIVER_ALREADY_OPEN, "parameters are set before cuFileDriverOpen");
    }
    no_slabs(len)
}

/// `CU_FILE_P2P_FLAG_DMABUF`: how ugds reaches GPU memory from an NVMe
/// device it owns.
const P2P_DMABUF: c_int = 1 << 2;

/// The peer-to-peer ways used for a kind of file system or device: NVMe
/// (a device ugds owns) by dma-buf; nothing else peer to peer.
///
/// # Safety
/// `p2p_flags` is null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cuFileDriverGetP2PFlags(status_flag: c_int, p2p_flags: *mut c_int) -> CUfileError_t {
    if p2p_flags.is_null() {
        return fail(op::INVALID_VALUE, "null flags");
    }
    if !crate::is_open() {
        return fail(op::DRIVER_NOT_INITIALIZED, "cuFileDriverOpen first");
    }
    // SAFETY: non-null; the caller's enum.
    unsafe { *p2p_flags = if status_flag == crate::abi::STATUS_NVME_SUPPORTED as c_int { P2P_DMABUF } else { 0 } };
    ok()
}

/// Refused unless it asks for what `cuFileDriverGetP2PFlags` reports.
#[no_mangle]
pub extern "C" fn cuFileDriverSetP2PFlags(status_flag: c_int, p2p_flags: c_int) -> CUfileError_t {
    let now = if status_flag == crate::abi::STATUS_NVME_SUPPORTED as c_int { P2P_DMABUF } else { 0 };
    if p2p_flags == now {
        return ok();
    }
    fail(op::INVALID_VALUE, "ugds reaches GPU memory from NVMe by dma-buf, and from nothing else peer to peer")
}
