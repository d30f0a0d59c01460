//! Batch I/O: contexts, submission, status, cancel.

use super::*;

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
        let b = match lookup_dev(fh) {
            Ok((Dev::One(h), _)) => h.batch(nr as usize).map(|b| Arc::new(b) as CBatch),
            Ok((Dev::Volume(v, _), _)) => v.batch(nr as usize).map(|b| Arc::new(b) as CBatch),
            Err(c) => return fail(c, no_handle(c)),
        };
        let b = match b {
            Ok(b) => b,
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

/// The batch context `batch` names in the snapshot `s`, and the driver,
/// borrowed from it.
pub(crate) fn batch_in(s: &Snapshot, batch: *mut c_void) -> Result<(&CBatch, &ugds::Driver), uGDSError_t> {
    let s = s.as_ref().ok_or_else(|| fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first"))?;
    if batch.is_null() {
        return Err(fail(op::INVALID_VALUE, "null batch"));
    }
    let (_, b) = s.batches.get(&(batch as usize)).ok_or_else(|| fail(op::INVALID_VALUE, "no such batch"))?;
    Ok((b, &s.driver))
}

/// The batch of a submission, the driver, and its `nr` parameter blocks;
/// the error to return for a null list, `nr` 0 or more than the batch holds.
///
/// # Safety
/// `params` is null or valid for reads of `nr` blocks for the call.
unsafe fn submission<T>(
    s: &Snapshot,
    batch: *mut c_void,
    nr: c_uint,
    params: *const T,
) -> Result<(&CBatch, &ugds::Driver, &[T]), uGDSError_t> {
    if params.is_null() || nr == 0 {
        return Err(fail(op::INVALID_VALUE, "null params or nr 0"));
    }
    let (b, driver) = batch_in(s, batch)?;
    if nr as usize > b.capacity() {
        return Err(fail(op::BATCH_CAPACITY_EXCEEDED, format!("{nr} requests, capacity {}", b.capacity())));
    }
    // SAFETY: non-null, and `nr` blocks by the caller's contract.
    Ok((b, driver, unsafe { std::slice::from_raw_parts(params, nr as usize) }))
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
        let snap = state();
        // SAFETY: the caller passes `nr` parameter blocks (or null, refused).
        let (b, driver, ps) = match unsafe { submission(&snap, batch, nr, params) } {
            Ok(x) => x,
            Err(e) => return e,
        };
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
                buf_offset: p.devPtr_base as usize - t.base() + p.devPtr_offset as usize,
                cookie: p.cookie as u64,
            });
        }
        match b.submit(&ios) {
            Ok(_) => ok(),
            Err(e) => from_error(e),
        }
    })
}

/// Submits `nr` vectored requests (an extension): each one range of the
/// namespace to or from several registered buffer segments, completed as
/// one event. A bad request refuses the whole submission.
///
/// # Safety
/// `params` is null (refused) or valid for reads of `nr` blocks, each with
/// `segs` valid for reads of `count` segments; the segments' memory stays
/// valid until the request's event is collected.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOSubmitv(
    batch: *mut c_void,
    nr: c_uint,
    params: *const abi::ugds_iov_params_t,
    _flags: c_uint,
) -> uGDSError_t {
    guard(internal(), || {
        let snap = state();
        // SAFETY: the caller passes `nr` parameter blocks (or null, refused).
        let (b, driver, ps) = match unsafe { submission(&snap, batch, nr, params) } {
            Ok(x) => x,
            Err(e) => return e,
        };
        let mut found = Vec::with_capacity(ps.len());
        for (r, p) in ps.iter().enumerate() {
            if p.segs.is_null() || p.count <= 0 || p.count > abi::MAX_SEGMENTS || p.file_offset < 0 {
                return fail(
                    op::INVALID_VALUE,
                    format!(
                        "request {r}: 1 to {} segments, not {} (or a null list), and a non-negative offset",
                        abi::MAX_SEGMENTS,
                        p.count
                    ),
                );
            }
            let op_ = match p.opcode {
                abi::READ => BatchOp::Read,
                abi::WRITE => BatchOp::Write,
                o => return fail(op::INVALID_VALUE, format!("request {r}: opcode {o}")),
            };
            // SAFETY: `segs` holds `count` segments (the caller's contract, checked non-null).
            match unsafe { crate::io::segments_of(driver, p.segs, p.count) } {
                Ok(f) => found.push((op_, f, p.file_offset as u64, p.cookie as u64)),
                Err(msg) => return fail(op::INVALID_VALUE, format!("request {r}: {msg}")),
            }
        }
        let segs: Vec<Vec<ugds::Segment>> = found
            .iter()
            .map(|(_, f, _, _)| f.iter().map(|(t, off, len)| ugds::Segment::new(t, *off, *len)).collect())
            .collect();
        let ios: Vec<ugds::BatchIov> = found
            .iter()
            .zip(&segs)
            .map(|((op_, _, off, cookie), s)| ugds::BatchIov {
                op: *op_,
                segments: s,
                file_offset: *off,
                cookie: *cookie,
            })
            .collect();
        match b.submit_vectored(&ios) {
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
        let snap = state();
        let (b, _) = match batch_in(&snap, batch) {
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

/// What a batch context's requests have done (an extension).
///
/// # Safety
/// `out` is null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOGetStats(batch: *mut c_void, out: *mut abi::ugds_request_stats_t) -> uGDSError_t {
    guard(internal(), || {
        if out.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        match batch_in(&state(), batch) {
            Ok((b, _)) => {
                // SAFETY: non-null, checked above; valid for a write (caller).
                unsafe { out.write(b.stats().into()) };
                ok()
            }
            Err(e) => e,
        }
    })
}

/// Cancels a batch context's requests (cuFile's `cuFileBatchIOCancel`).
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSBatchIOCancel(batch: *mut c_void) -> uGDSError_t {
    guard(internal(), || match batch_in(&state(), batch) {
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
