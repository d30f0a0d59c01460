//! Stream-ordered I/O on CUDA streams (`cuFileReadAsync`,
//! `cuFileWriteAsync`), through ugds's `GpuStream`: the I/O starts when
//! the stream reaches it and later work on the stream waits for it; the
//! caller is never blocked for the I/O.

use crate::abi::{op, CUfileError_t, STREAM_FIXED_BUF_OFFSET, STREAM_FIXED_FILE_OFFSET, STREAM_FIXED_FILE_SIZE};
use crate::errors::{fail, from_error, guard, internal, ok};
use crate::io::file_in;
use crate::{driver, state, state_mut};
use libc::{off_t, size_t, ssize_t};
use std::ffi::{c_uint, c_void};
use std::sync::Arc;
use ugds::gpu::{GpuStream, StreamWait};
use ugds::StreamIo;

/// A stream known to the library, with the flags it was registered with.
#[derive(Clone)]
pub(crate) struct StreamObj {
    stream: Arc<GpuStream>,
    flags: c_uint,
}

const ALL_FIXED: c_uint = STREAM_FIXED_BUF_OFFSET | STREAM_FIXED_FILE_OFFSET | STREAM_FIXED_FILE_SIZE;

fn stream_for(stream: *mut c_void, flags: Option<c_uint>) -> Result<StreamObj, CUfileError_t> {
    driver()?;
    if flags.is_none() {
        if let Some(s) = state().as_ref().and_then(|s| s.streams.get(&(stream as usize)).cloned()) {
            return Ok(s);
        }
    }
    // SAFETY: the C contract: a live stream of the current context, kept
    // until it is deregistered (cuFile asks that before cuStreamDestroy).
    let g = unsafe { ugds::gpu::cuda::Cuda::get().and_then(|c| c.stream(stream, StreamWait::DeviceSide)) };
    let g = g.map_err(from_error)?;
    let obj = StreamObj { stream: Arc::new(g), flags: flags.unwrap_or(0) };
    let mut st = state_mut();
    let s = st.as_mut().ok_or_else(|| fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed"))?;
    match flags {
        Some(_) => {
            s.streams.insert(stream as usize, obj.clone());
            Ok(obj)
        }
        None => Ok(s.streams.entry(stream as usize).or_insert(obj).clone()),
    }
}

/// Registers a CUDA stream for stream-ordered I/O with `flags`
/// (`CU_FILE_STREAM_*`): with all three of FIXED_BUF_OFFSET,
/// FIXED_FILE_OFFSET and FIXED_FILE_SIZE, the values behind an
/// operation's pointers are read when it is enqueued instead of when the
/// stream reaches it. A stream used unregistered is registered with flags 0.
///
/// # Safety
/// `stream` is a live CUDA stream (or null, the default stream) of the
/// current context, deregistered before it is destroyed.
#[no_mangle]
pub unsafe extern "C" fn cuFileStreamRegister(stream: *mut c_void, flags: c_uint) -> CUfileError_t {
    guard(internal(), || {
        if flags & !(ALL_FIXED | crate::abi::STREAM_PAGE_ALIGNED_INPUTS) != 0 {
            return fail(op::INVALID_VALUE, format!("stream flags {flags:#x}"));
        }
        match stream_for(stream, Some(flags)) {
            Ok(_) => ok(),
            Err(e) => e,
        }
    })
}

/// Forgets a stream (its operations already enqueued run as they are).
///
/// # Safety
/// `stream` is any pointer (an unknown one is refused).
#[no_mangle]
pub unsafe extern "C" fn cuFileStreamDeregister(stream: *mut c_void) -> CUfileError_t {
    guard(internal(), || match state_mut().as_mut().and_then(|s| s.streams.remove(&(stream as usize))) {
        Some(_) => ok(),
        None => fail(op::INVALID_VALUE, "the stream is not registered"),
    })
}

#[allow(clippy::too_many_arguments)]
fn enqueue(
    fh: *mut c_void,
    base: *mut c_void,
    size_p: *mut size_t,
    file_offset_p: *mut off_t,
    buf_offset_p: *mut off_t,
    bytes_p: *mut ssize_t,
    stream: *mut c_void,
    write: bool,
) -> CUfileError_t {
    if base.is_null() || size_p.is_null() || file_offset_p.is_null() || buf_offset_p.is_null() || bytes_p.is_null() {
        return fail(op::INVALID_VALUE, "null argument");
    }
    // Borrowed from one snapshot: no count of the file's, the stream's or
    // the driver's is touched.
    let snap = state();
    let f = match file_in(&snap, fh) {
        Ok(f) => f,
        Err(c) => return fail(c, "no such file handle"),
    };
    let made;
    let s = match snap.as_ref().and_then(|st| st.streams.get(&(stream as usize))) {
        Some(s) => s,
        None => match stream_for(stream, None) {
            Ok(s) => {
                made = s;
                &made
            }
            Err(e) => return e,
        },
    };
    let Some(driver) = snap.as_ref().map(|s| &s.driver) else {
        return fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed");
    };
    // SAFETY: non-null; the caller's values as they are now: fixed ones,
    // or (cuFile's rule) the largest size and the offsets to expect.
    let (size, pos, off) = unsafe { (*size_p, *file_offset_p, *buf_offset_p) };
    // The registration holding the buffer, or one made for the device
    // allocation holding it (kept until the buffer is deregistered or the
    // driver closes).
    let t = match driver.token_containing(base as *const u8) {
        // One this library made is checked against the allocation there
        // now: the caller may have freed it and allocated again.
        Some(t) if !crate::implicit::made(t.base()) => t,
        _ => match crate::implicit::registration(driver, base as u64) {
            Ok(t) => t,
            Err(e) => return e,
        },
    };
    let bias = base as usize - t.base();
    // Files grow to take writes past their ends, to the end the values
    // give now (cuFile's rule: `*size_p` is then the largest size to
    // expect); a read past the capacity known looks at the file's size
    // again.
    if pos >= 0 {
        let end = pos as u64 + size as u64;
        if end > f.handle.capacity() {
            let r = if write { f.handle.grow(end) } else { f.handle.grow(0) };
            if let Err(e) = r.or_else(|e| if matches!(e, ugds::Error::Unsupported(_)) { Ok(0) } else { Err(e) }) {
                return from_error(e);
            }
        }
    }
    let io = if s.flags & ALL_FIXED == ALL_FIXED {
        if pos < 0 || off < 0 {
            return fail(op::INVALID_VALUE, "negative offset");
        }
        // SAFETY: the caller keeps `bytes_p` valid until the stream has
        // run the operation.
        unsafe { StreamIo::fixed_raw(size, pos as u64, off as u64, bytes_p) }
    } else {
        // SAFETY: the caller keeps the four pointers valid until the
        // stream has run the operation (the values are read then).
        unsafe { StreamIo::from_raw(size_p, file_offset_p, buf_offset_p, bytes_p) }
    };
    let io = io.buffer_offset_from(bias as u64);
    let r = if write { f.handle.write_async(&t, io, &*s.stream) } else { f.handle.read_async(&t, io, &*s.stream) };
    match r {
        Ok(()) => ok(),
        Err(e) => from_error(e),
    }
}

/// Reads in stream order: when `stream` reaches the operation, `*size_p`
/// bytes at `*file_offset_p` go into `base + *buf_offset_p`, and the bytes
/// read (or a negative errno) into `*bytes_read_p`, before later work on
/// the stream runs. Sizes and offsets are multiples of the file's block.
///
/// # Safety
/// The pointers stay valid until the stream has run the operation; the
/// buffer stays allocated until then.
#[no_mangle]
pub unsafe extern "C" fn cuFileReadAsync(
    fh: *mut c_void,
    base: *mut c_void,
    size_p: *mut size_t,
    file_offset_p: *mut off_t,
    buf_offset_p: *mut off_t,
    bytes_read_p: *mut ssize_t,
    stream: *mut c_void,
) -> CUfileError_t {
    guard(internal(), || enqueue(fh, base, size_p, file_offset_p, buf_offset_p, bytes_read_p, stream, false))
}

/// Writes in stream order; see `cuFileReadAsync`.
///
/// # Safety
/// As for `cuFileReadAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuFileWriteAsync(
    fh: *mut c_void,
    base: *mut c_void,
    size_p: *mut size_t,
    file_offset_p: *mut off_t,
    buf_offset_p: *mut off_t,
    bytes_written_p: *mut ssize_t,
    stream: *mut c_void,
) -> CUfileError_t {
    guard(internal(), || enqueue(fh, base, size_p, file_offset_p, buf_offset_p, bytes_written_p, stream, true))
}
