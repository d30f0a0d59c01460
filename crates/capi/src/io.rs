//! Synchronous reads and writes.

use super::*;

/// The registration to use for `base + buf_offset .. + size`: the one
/// holding `base`, or a just-in-time one of this call alone (private: no
/// other call can find, use or deregister it), deregistered after the I/O.
pub(crate) enum Target {
    Registered(BufferToken, usize),
    JustInTime(BufferToken),
}

pub(crate) fn neg(c: c_int) -> ssize_t {
    -(c as ssize_t)
}

pub(crate) fn sync_io(
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
    let snap = state();
    let (h, driver) = match io_dev(&snap, fh) {
        Ok(x) => x,
        Err(n) => return n,
    };
    let bs = h.block_size() as i64;
    if file_offset % bs != 0 || size as i64 % bs != 0 {
        remember(format!("offset {file_offset} or size {size} is not a multiple of the {bs}-byte block"));
        return neg(libc::EINVAL);
    }
    let Some(start) = (base as usize).checked_add(buf_offset as usize).filter(|s| s.checked_add(size).is_some()) else {
        remember("buffer offset and size wrap the address space".into());
        return neg(libc::EINVAL);
    };
    let target = match driver.token_containing(base.cast()) {
        Some(t) => Target::Registered(t, base as usize - t.base() + buf_offset as usize),
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
            let n = neg_of(&e);
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

/// A vectored read or write: the segments, checked and found in their
/// registrations, as one request.
pub(crate) fn vectored_io(
    fh: *mut c_void,
    segs: *const abi::ugds_segment_t,
    count: c_int,
    file_offset: off_t,
    write: bool,
) -> ssize_t {
    if segs.is_null() || count <= 0 || count > abi::MAX_SEGMENTS || file_offset < 0 {
        remember(format!(
            "a vectored call takes 1 to {} segments (not {count}, or a null list) and a non-negative offset",
            abi::MAX_SEGMENTS
        ));
        return neg(libc::EINVAL);
    }
    let snap = state();
    let (h, driver) = match io_dev(&snap, fh) {
        Ok(x) => x,
        Err(n) => return n,
    };
    // SAFETY: the caller's array of `count` segments (checked non-null and
    // counted above), valid for the call.
    let found = match unsafe { segments_of(driver, segs, count) } {
        Ok(f) => f,
        Err(msg) => {
            remember(msg);
            return neg(libc::EINVAL);
        }
    };
    let segments: Vec<ugds::Segment> = found.iter().map(|(t, off, len)| ugds::Segment::new(t, *off, *len)).collect();
    let r = if write { h.writev(&segments, file_offset as u64) } else { h.readv(&segments, file_offset as u64) };
    r.map_or_else(
        |e| {
            remember(e.to_string());
            neg_of(&e)
        },
        |n| n as ssize_t,
    )
}

/// Each segment's registration, offset into it and size; why not, for a
/// segment that is in no registered buffer.
///
/// # Safety
/// `segs` is valid for reads of `count` (> 0) segments.
pub(crate) unsafe fn segments_of(
    driver: &ugds::Driver,
    segs: *const abi::ugds_segment_t,
    count: c_int,
) -> Result<Vec<(BufferToken, usize, usize)>, String> {
    // SAFETY: the caller's contract.
    let list = unsafe { std::slice::from_raw_parts(segs, count as usize) };
    let mut found = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        if s.base.is_null() || s.buf_offset < 0 {
            return Err(format!("segment {i}: null base or negative offset"));
        }
        let Some(t) = driver.token_containing(s.base.cast()) else {
            return Err(format!("segment {i}: {:p} is not in a registered buffer (uGDSBufRegister it first)", s.base));
        };
        let Some(off) = (s.base as usize - t.base()).checked_add(s.buf_offset as usize) else {
            return Err(format!("segment {i}: offset wraps the address space"));
        };
        found.push((t, off, s.size));
    }
    Ok(found)
}

/// The handle or volume (and driver) for an I/O call, or the negative
/// code it returns.
fn io_dev(s: &Snapshot, fh: *mut c_void) -> Result<(&Dev, &ugds::Driver), ssize_t> {
    crate::handle::dev_in(s, fh).map_err(|c| {
        remember(no_handle(c).into());
        neg(c)
    })
}

/// The synchronous calls, on a handle or a volume alike.
impl Dev {
    fn block_size(&self) -> usize {
        match self {
            Dev::One(h) => h.namespace().block_size as usize,
            Dev::Volume(v, _) => v.block_size(),
        }
    }

    fn read(&self, buf: &BufferToken, size: usize, file_offset: u64, buf_offset: usize) -> ugds::Result<usize> {
        match self {
            Dev::One(h) => h.read(buf, size, file_offset, buf_offset),
            Dev::Volume(v, _) => v.read(buf, size, file_offset, buf_offset),
        }
    }

    fn write(&self, buf: &BufferToken, size: usize, file_offset: u64, buf_offset: usize) -> ugds::Result<usize> {
        match self {
            Dev::One(h) => h.write(buf, size, file_offset, buf_offset),
            Dev::Volume(v, _) => v.write(buf, size, file_offset, buf_offset),
        }
    }

    fn readv(&self, segments: &[ugds::Segment<'_>], file_offset: u64) -> ugds::Result<usize> {
        match self {
            Dev::One(h) => h.readv(segments, file_offset),
            Dev::Volume(v, _) => v.readv(segments, file_offset),
        }
    }

    fn writev(&self, segments: &[ugds::Segment<'_>], file_offset: u64) -> ugds::Result<usize> {
        match self {
            Dev::One(h) => h.writev(segments, file_offset),
            Dev::Volume(v, _) => v.writev(segments, file_offset),
        }
    }
}

/// What an I/O call returns for a library error.
fn neg_of(e: &Error) -> ssize_t {
    match e {
        Error::Closed => neg(op::HANDLE_NOT_REGISTERED),
        other => neg(other.errno()),
    }
}

/// Vectored read (an extension): bytes read, or a negative errno.
///
/// # Safety
/// `segs` is null (refused) or valid for reads of `count` segments; each
/// segment's memory is valid for writes of its size, and stays so until
/// the call returns.
#[no_mangle]
pub unsafe extern "C" fn uGDSReadv(
    fh: *mut c_void,
    segs: *const abi::ugds_segment_t,
    count: c_int,
    file_offset: off_t,
) -> ssize_t {
    guard(neg(op::INTERNAL_ERROR), || vectored_io(fh, segs, count, file_offset, false))
}

/// Vectored write (an extension): bytes written, or a negative errno.
///
/// # Safety
/// As [`uGDSReadv`], each segment's memory valid for reads.
#[no_mangle]
pub unsafe extern "C" fn uGDSWritev(
    fh: *mut c_void,
    segs: *const abi::ugds_segment_t,
    count: c_int,
    file_offset: off_t,
) -> ssize_t {
    guard(neg(op::INTERNAL_ERROR), || vectored_io(fh, segs, count, file_offset, true))
}
