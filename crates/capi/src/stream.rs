//! Stream-ordered I/O on CUDA (or HIP) streams.

use super::*;

pub(crate) fn stream_for(stream: *mut c_void, backend: c_int) -> Result<Arc<GpuStream>, uGDSError_t> {
    if let Some(s) = stream_in(&state(), stream) {
        return Ok(s.clone());
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

/// The registered stream `stream` in the snapshot `s`, borrowed from it.
fn stream_in(s: &Snapshot, stream: *mut c_void) -> Option<&Arc<GpuStream>> {
    s.as_ref().and_then(|s| s.streams.get(&(stream as usize)))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn async_io(
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
    // A controller's handle or a volume's.
    let snap = state();
    let (dev, driver) = match crate::handle::dev_in(&snap, fh) {
        Ok(x) => x,
        Err(c) => return fail(c, no_handle(c)),
    };
    // The registration at `base` (found as the one holding it: the
    // thread's last find answers without the registry's lock).
    let Some(t) = driver.token_containing(base.cast()).filter(|t| t.base() == base as usize) else {
        return fail(op::MEMORY_NOT_REGISTERED, "stream-ordered I/O needs a registered buffer (by its base)");
    };
    // SAFETY: the C contract: the four pointers stay valid until the
    // stream has passed the operation.
    let io = unsafe { StreamIo::from_raw(size_p, file_offset_p, buf_offset_p, bytes_p) };
    let registered = stream_in(&snap, stream);
    let made;
    let s = match registered {
        Some(s) => s,
        None => match stream_for(stream, abi::BACKEND_DEFAULT) {
            Ok(s) => {
                made = s;
                &made
            }
            Err(e) => return e,
        },
    };
    enqueue_async(dev, &t, io, s, write)
}

/// Puts `io` on `s` for `dev` and the registered buffer `t`.
pub(crate) fn enqueue_async(dev: &Dev, t: &BufferToken, io: StreamIo, s: &GpuStream, write: bool) -> uGDSError_t {
    let r = match (dev, write) {
        (Dev::One(h), true) => h.write_async(t, io, s),
        (Dev::One(h), false) => h.read_async(t, io, s),
        (Dev::Volume(v, _), true) => v.write_async(t, io, s),
        (Dev::Volume(v, _), false) => v.read_async(t, io, s),
    };
    match r {
        Ok(()) => ok(),
        Err(e) => from_error(e),
    }
}

/// A vectored stream-ordered read or write: the list is read and checked
/// now, the namespace offset when the stream reaches the operation.
fn vectored_async(
    fh: *mut c_void,
    segs: *const abi::ugds_segment_t,
    count: c_int,
    file_offset_p: *mut off_t,
    bytes_p: *mut ssize_t,
    stream: *mut c_void,
    write: bool,
) -> uGDSError_t {
    if segs.is_null() || count <= 0 || count > abi::MAX_SEGMENTS || file_offset_p.is_null() || bytes_p.is_null() {
        return fail(
            op::INVALID_VALUE,
            format!("1 to {} segments (not {count}), a file offset and a result, none null", abi::MAX_SEGMENTS),
        );
    }
    let (h, driver) = match lookup(fh) {
        Ok(x) => x,
        Err(c) => return fail(c, no_handle(c)),
    };
    // SAFETY: the caller's array of `count` segments (checked non-null and
    // counted above), valid for the call.
    let found = match unsafe { crate::io::segments_of(&driver, segs, count) } {
        Ok(f) => f,
        Err(msg) => return fail(op::INVALID_VALUE, msg),
    };
    let Some(total) = found.iter().try_fold(0usize, |t, s| t.checked_add(s.2)) else {
        return fail(op::INVALID_VALUE, "the segments' sizes overflow");
    };
    let s = match stream_for(stream, abi::BACKEND_DEFAULT) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let segments: Vec<ugds::Segment> = found.iter().map(|(t, off, len)| ugds::Segment::new(t, *off, *len)).collect();
    // SAFETY: the C contract: both pointers stay valid until the stream has
    // passed the operation.
    let io = unsafe { StreamIo::from_raw_vectored(total, file_offset_p, bytes_p) };
    let r = if write { h.writev_async(&segments, io, &*s) } else { h.readv_async(&segments, io, &*s) };
    match r {
        Ok(()) => ok(),
        Err(e) => from_error(e),
    }
}

/// Vectored stream-ordered read (an extension): the range at
/// `*file_offset_p` (read when the stream reaches it) into `segs` in order.
///
/// # Safety
/// `segs` is null (refused) or valid for reads of `count` segments for the
/// call; `file_offset_p` and `bytes_p` stay valid until the stream has run
/// the operation.
#[no_mangle]
pub unsafe extern "C" fn uGDSReadvAsync(
    fh: *mut c_void,
    segs: *const abi::ugds_segment_t,
    count: c_int,
    file_offset_p: *mut off_t,
    bytes_p: *mut ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    guard(internal(), || vectored_async(fh, segs, count, file_offset_p, bytes_p, stream, false))
}

/// Vectored stream-ordered write (an extension); see `uGDSReadvAsync`.
///
/// # Safety
/// As [`uGDSReadvAsync`].
#[no_mangle]
pub unsafe extern "C" fn uGDSWritevAsync(
    fh: *mut c_void,
    segs: *const abi::ugds_segment_t,
    count: c_int,
    file_offset_p: *mut off_t,
    bytes_p: *mut ssize_t,
    stream: *mut c_void,
) -> uGDSError_t {
    guard(internal(), || vectored_async(fh, segs, count, file_offset_p, bytes_p, stream, true))
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

/// What the stream-ordered requests placed on a stream the library knows
/// have done (an extension).
///
/// # Safety
/// `out` is null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn uGDSStreamGetStats(stream: *mut c_void, out: *mut abi::ugds_request_stats_t) -> uGDSError_t {
    guard(internal(), || {
        if out.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        let g = state();
        let Some(st) = g.as_ref() else {
            return fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first");
        };
        match st.streams.get(&(stream as usize)) {
            Some(s) => {
                // SAFETY: non-null, checked above; valid for a write (caller).
                unsafe { out.write(s.stats().into()) };
                ok()
            }
            None => fail(op::INVALID_VALUE, "a stream the library does not know (uGDSStreamRegister it)"),
        }
    })
}

/// How the library serves a stream's operations (an extension).
///
/// # Safety
/// `stream` is a live stream of the current context (as for
/// `uGDSStreamRegister`); `mode` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn uGDSStreamSetService(
    stream: *mut c_void,
    priority: c_int,
    mode: *const c_char,
) -> uGDSError_t {
    guard(internal(), || {
        let p = match priority {
            abi::UGDS_PRIORITY_CRITICAL => ugds::Priority::Critical,
            abi::UGDS_PRIORITY_NORMAL => ugds::Priority::Normal,
            abi::UGDS_PRIORITY_BACKGROUND => ugds::Priority::Background,
            _ => return fail(op::INVALID_VALUE, format!("unknown priority {priority}")),
        };
        let m = if mode.is_null() {
            None
        } else {
            // SAFETY: the caller's NUL-terminated string, valid for the call.
            let name = unsafe { std::ffi::CStr::from_ptr(mode) }.to_string_lossy();
            match ugds::mode::mode_by_name(&name) {
                Ok(m) => Some(m),
                Err(e) => return fail(op::INVALID_VALUE, e.to_string()),
            }
        };
        match stream_for(stream, abi::BACKEND_DEFAULT) {
            Ok(s) => {
                s.set_service(ugds::StreamService::new(p, m));
                ok()
            }
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
