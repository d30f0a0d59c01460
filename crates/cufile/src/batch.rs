//! The batch API: a context of up to `nr` requests, each naming its own
//! file (a ugds batch per file, made at its first request).

use crate::abi::{op, CUfileError_t, CUfileIOEvents_t, CUfileIOParams_t, BATCH, READ, WRITE};
use crate::abi::{STATUS_CANCELED, STATUS_COMPLETE, STATUS_FAILED, STATUS_TIMEOUT};
use crate::errors::{fail, from_error, guard, internal, ok};
use crate::io::{file_in, File, Memory};
use crate::{config, driver, state, state_mut, stats, Snapshot};
use libc::timespec;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ugds::platform::Recover;
use ugds::{BatchIo, BatchOp, BatchStatus};

/// A batch context.
pub(crate) struct BatchObj {
    nr: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    /// A ugds batch per file, by the file's handle.
    per_file: Vec<(usize, Arc<File>, ugds::Batch)>,
    /// Requests submitted and not collected, by slot (the ugds cookie):
    /// the caller's cookie and the registration made for it, if any.
    slots: Vec<Option<(usize, Option<Memory>, bool)>>,
    /// Events of requests done when submitted (offsets or sizes off the
    /// file's block: moved as `cuFileRead`/`cuFileWrite` move them), not
    /// yet collected.
    /// Each as (the caller's cookie, status, return).
    ready: Vec<(usize, c_int, isize)>,
}

impl Inner {
    fn outstanding(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count() + self.ready.len()
    }
}

impl Drop for BatchObj {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().recover();
        // The ugds batches wait for their requests as they go; then the
        // registrations made for them are released.
        inner.per_file.clear();
        if let Some(d) = state().as_ref().map(|s| s.driver.clone()) {
            for (_, m, _) in inner.slots.drain(..).flatten() {
                if let Some(m) = m {
                    m.release(&d);
                }
            }
        }
    }
}

/// Sets up a batch context for up to `nr` requests outstanding at once
/// (at most the `io_batchsize` parameter).
///
/// # Safety
/// `batch_idp` is null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSetUp(batch_idp: *mut *mut c_void, nr: c_uint) -> CUfileError_t {
    guard(internal(), || {
        let most = config::batch_size();
        if batch_idp.is_null() || nr == 0 || nr as usize > most {
            stats::count("batch_setup_ops", false);
            return fail(op::INVALID_VALUE, format!("null batch pointer, or nr {nr} not within 1 to {most}"));
        }
        if let Err(e) = driver() {
            return e;
        }
        let b = Arc::new(BatchObj {
            nr: nr as usize,
            inner: Mutex::new(Inner { per_file: Vec::new(), slots: Vec::new(), ready: Vec::new() }),
        });
        let mut g = state_mut();
        let Some(s) = g.as_mut() else { return fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed") };
        let id = s.next_batch;
        s.next_batch += 16;
        s.batches.insert(id, b);
        // SAFETY: non-null, checked above.
        unsafe { *batch_idp = id as *mut c_void };
        stats::count("batch_setup_ops", true);
        ok()
    })
}

/// The batch `id` names in the snapshot `s`, borrowed from it; `code` is
/// the error for a null or unknown one (each call answers as NVIDIA's
/// library does: bench/cufile/probe_reference.c).
fn batch_in(s: &Snapshot, id: *mut c_void, code: c_int) -> Result<&Arc<BatchObj>, CUfileError_t> {
    if id.is_null() {
        return Err(fail(code, "null batch"));
    }
    s.as_ref()
        .and_then(|s| s.batches.get(&(id as usize)))
        .ok_or_else(|| fail(code, "no such batch (never set up, or destroyed)"))
}

/// Submits `nr` requests, each checked first: a bad one submits none.
/// Buffers registered or not. A request whose size or file offset is off
/// the file's block is moved here, before this returns (as `cuFileRead`
/// moves it: partial blocks through the page cache), its event ready at
/// once; the others go to the device and this returns without waiting.
///
/// # Safety
/// `iocbp` is null (refused) or valid for reads of `nr` entries; every
/// buffer stays valid until its event is collected.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSubmit(
    batch_idp: *mut c_void,
    nr: c_uint,
    iocbp: *mut CUfileIOParams_t,
    _flags: c_uint,
) -> CUfileError_t {
    guard(internal(), || {
        let r = submit(batch_idp, nr, iocbp);
        stats::count("batch_submit_ops", r.err == op::SUCCESS);
        stats::count("batch_total_submit_ops", r.err == op::SUCCESS);
        r
    })
}

fn submit(batch_idp: *mut c_void, nr: c_uint, iocbp: *mut CUfileIOParams_t) -> CUfileError_t {
    // Every refusal of a submission is CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR,
    // the code NVIDIA's library gives for each of these (seen: 1.15.1; it
    // accepts an unknown opcode and a size of 0, which are refused here).
    const REFUSED: c_int = op::INTERNAL_BATCH_SUBMIT_ERROR;
    let snap = state();
    let b = match batch_in(&snap, batch_idp, REFUSED) {
        Ok(b) => b,
        Err(e) => return e,
    };
    if iocbp.is_null() || nr == 0 || nr as usize > b.nr {
        return fail(REFUSED, format!("null params, or nr {nr} not within 1 to the batch's {}", b.nr));
    }
    // SAFETY: the caller's `nr` entries (non-null, checked).
    let ps = unsafe { std::slice::from_raw_parts(iocbp, nr as usize) };
    let Some(driver) = snap.as_ref().map(|s| &s.driver) else {
        return fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed");
    };
    // Checked, all of them, before anything is submitted. Requests off the
    // file's block go apart: done here, after the others are on their way.
    let mut checked = Vec::with_capacity(ps.len());
    let mut unaligned = Vec::new();
    for (i, p) in ps.iter().enumerate() {
        let write = match p.opcode {
            READ => false,
            WRITE => true,
            o => return fail(REFUSED, format!("request {i}: opcode {o}")),
        };
        let io = &p.batch;
        if p.mode != BATCH || io.devPtr_base.is_null() || io.file_offset < 0 || io.devPtr_offset < 0 || io.size == 0 {
            return fail(REFUSED, format!("request {i}: mode, null buffer, negative offset or size 0"));
        }
        let f = match file_in(&snap, p.fh) {
            Ok(f) => f,
            Err(_) => return fail(REFUSED, format!("request {i}: no such file handle")),
        };
        if (io.devPtr_base as usize).checked_add(io.devPtr_offset as usize + io.size).is_none() {
            return fail(REFUSED, format!("request {i}: buffer offset and size wrap the address space"));
        }
        let bs = f.handle.namespace().block_size as u64;
        if io.file_offset as u64 % bs != 0 || io.size as u64 % bs != 0 {
            unaligned.push((p.fh, io.devPtr_base, io.size, io.file_offset, io.devPtr_offset, write, p.cookie));
            continue;
        }
        checked.push((
            p.fh as usize,
            f,
            write,
            io.devPtr_base as usize + io.devPtr_offset as usize,
            io.size,
            io.file_offset as u64,
            p.cookie as usize,
        ));
    }
    let mut inner = b.inner.lock().recover();
    let more = checked.len() + unaligned.len();
    if inner.outstanding() + more > b.nr {
        return fail(
            op::BATCH_FULL,
            format!("{} outstanding and {more} more: the batch holds {}", inner.outstanding(), b.nr),
        );
    }
    let mut groups: Vec<(usize, &Arc<File>, Vec<BatchIo>)> = Vec::new();
    let mut made = Vec::new();
    for (fh, f, write, start, size, pos, cookie) in checked {
        // Files grow to take writes past their ends; reads past the end of
        // a file are cut to it (a short read).
        let cap = f.handle.capacity();
        let mut size = size;
        if write && pos + size as u64 > cap {
            if let Err(e) = f.handle.grow(pos + size as u64) {
                release(driver, made);
                return from_error(e);
            }
        } else if !write && pos + size as u64 > cap {
            let cap = f.handle.grow(0).unwrap_or(cap);
            size = cap.saturating_sub(pos).min(size as u64) as usize;
        }
        let mem = match Memory::find(driver, start, size.max(1)) {
            Ok(m) => m,
            Err(e) => {
                release(driver, made);
                return from_error(e);
            }
        };
        let slot = inner.slots.iter().position(|s| s.is_none()).unwrap_or_else(|| {
            inner.slots.push(None);
            inner.slots.len() - 1
        });
        let io = BatchIo {
            op: if write { BatchOp::Write } else { BatchOp::Read },
            buf: mem.token,
            size,
            file_offset: pos,
            buf_offset: mem.offset,
            cookie: slot as u64,
        };
        inner.slots[slot] = Some((cookie, None, write));
        made.push((slot, mem));
        match groups.iter_mut().find(|g| g.0 == fh) {
            Some(g) => g.2.push(io),
            None => groups.push((fh, f, vec![io])),
        }
    }
    let mut sent: Vec<usize> = Vec::new();
    for (fh, f, ios) in groups {
        let r = match inner.per_file.iter().position(|x| x.0 == fh) {
            Some(i) => Ok(i),
            None => f.handle.batch(b.nr).map(|ub| {
                inner.per_file.push((fh, f.clone(), ub));
                inner.per_file.len() - 1
            }),
        };
        let r = r.and_then(|i| inner.per_file[i].2.submit(&ios));
        if let Err(e) = r {
            // The groups before this one are on the device; this one's and
            // the later ones' requests are not.
            let (kept, dropped): (Vec<_>, Vec<_>) = made.into_iter().partition(|(s, _)| sent.contains(s));
            forget_slots(&mut inner, &dropped);
            release(driver, dropped);
            keep(&mut inner, kept);
            return fail(op::BATCH_SUBMIT_FAILED, e.to_string());
        }
        for io in &ios {
            sent.push(io.cookie as usize);
            stats::batch_bytes(io.op == BatchOp::Write, io.size as u64);
        }
    }
    keep(&mut inner, made);
    // The partial blocks go through the page cache, which ugds's batches
    // do not reach: these requests are moved now, as a synchronous call
    // moves them, and their events are ready at once.
    for (fh, base, size, pos, off, write, cookie) in unaligned {
        let ret = crate::io::sync(fh, base, size, pos, off, write);
        let (status, ret) = match ret {
            // SAFETY: this thread's errno, which the call set.
            -1 => (STATUS_FAILED, -(unsafe { *libc::__errno_location() }) as isize),
            r if r < 0 => (STATUS_FAILED, r),
            r => {
                stats::batch_bytes(write, r as u64);
                (STATUS_COMPLETE, r)
            }
        };
        inner.ready.push((cookie as usize, status, ret));
    }
    ok()
}

/// The registrations of submitted requests stay with their slots until
/// their events are collected.
fn keep(inner: &mut Inner, made: Vec<(usize, Memory)>) {
    for (slot, mem) in made {
        if let Some(s) = inner.slots[slot].as_mut() {
            s.1 = Some(mem);
        }
    }
}

fn forget_slots(inner: &mut Inner, made: &[(usize, Memory)]) {
    for (slot, _) in made {
        inner.slots[*slot] = None;
    }
}

fn release(driver: &ugds::Driver, made: Vec<(usize, Memory)>) {
    for (_, m) in made {
        m.release(driver);
    }
}

/// Collects finished requests: at least `min_nr` (unless `timeout`
/// passes; null: no limit), at most `*nr` (the room in `iocbp`); `*nr` is
/// set to how many were written.
///
/// # Safety
/// `nr` is null (refused) or valid for a read and a write; `iocbp` for
/// writes of `*nr` events; `timeout` null or valid for a read.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOGetStatus(
    batch_idp: *mut c_void,
    min_nr: c_uint,
    nr: *mut c_uint,
    iocbp: *mut CUfileIOEvents_t,
    timeout: *mut timespec,
) -> CUfileError_t {
    guard(internal(), || {
        let snap = state();
        let b = match batch_in(&snap, batch_idp, op::INTERNAL_BATCH_GETSTATUS_ERROR) {
            Ok(b) => b,
            Err(e) => return e,
        };
        if nr.is_null() || iocbp.is_null() {
            return fail(op::INVALID_VALUE, "null nr or events");
        }
        // SAFETY: non-null; the caller's count.
        let room = unsafe { *nr } as usize;
        if min_nr as usize > room {
            return fail(op::INVALID_VALUE, format!("min_nr {min_nr} is more than the {room} events' room"));
        }
        let limit = if timeout.is_null() {
            None
        } else {
            // SAFETY: non-null; the caller's timespec.
            let t = unsafe { *timeout };
            Some(Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32))
        };
        let Some(driver) = state().as_ref().map(|s| s.driver.clone()) else {
            return fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed");
        };
        let start = Instant::now();
        let mut events = Vec::new();
        // Events of requests done at submit, first.
        let mut early = Vec::new();
        loop {
            let mut inner = b.inner.lock().recover();
            let take = inner.ready.len().min(room - early.len());
            early.extend(inner.ready.drain(..take));
            let single = inner.per_file.len() == 1;
            for (_, _, ub) in &inner.per_file {
                let have = early.len() + events.len();
                if have >= room {
                    break;
                }
                // One file: its own wait; several: a look at each.
                let (want, wait) = if single {
                    ((min_nr as usize).saturating_sub(have), limit.map(|l| l.saturating_sub(start.elapsed())))
                } else {
                    (0, Some(Duration::ZERO))
                };
                if let Err(e) = ub.get_status(want.min(room - have), room - have, wait, &mut events) {
                    return from_error(e);
                }
            }
            let done = early.len() + events.len() >= min_nr as usize
                || single
                || inner.per_file.is_empty()
                || limit.is_some_and(|l| start.elapsed() >= l);
            if done {
                for (i, &(cookie, status, ret)) in early.iter().enumerate() {
                    // SAFETY: i < room; the caller's array holds `room` events.
                    unsafe {
                        *iocbp.add(i) = CUfileIOEvents_t { cookie: cookie as *mut c_void, status, ret: ret as usize }
                    };
                }
                let iocbp = iocbp.wrapping_add(early.len());
                for (i, e) in events.iter().enumerate() {
                    let slot = e.cookie as usize;
                    let (cookie, mem, write) =
                        inner.slots.get_mut(slot).and_then(|s| s.take()).unwrap_or((0, None, false));
                    if let Some(m) = mem {
                        m.release(&driver);
                    }
                    let (status, ret) = match (&e.status, &e.result) {
                        (BatchStatus::Complete, Ok(n)) => (STATUS_COMPLETE, *n as isize),
                        (BatchStatus::Canceled, _) => (STATUS_CANCELED, -(libc::ECANCELED as isize)),
                        (BatchStatus::Timeout, _) => (STATUS_TIMEOUT, -(libc::ETIMEDOUT as isize)),
                        (_, Err(x)) => (STATUS_FAILED, -(x.errno() as isize)),
                        (_, Ok(n)) => (STATUS_FAILED, *n as isize),
                    };
                    stats::count("batch_complete_ops", status == STATUS_COMPLETE);
                    let _ = write;
                    // SAFETY: i < room; the caller's array holds `room` events.
                    unsafe {
                        *iocbp.add(i) = CUfileIOEvents_t { cookie: cookie as *mut c_void, status, ret: ret as usize }
                    };
                }
                // SAFETY: non-null; the caller's count.
                unsafe { *nr = (early.len() + events.len()) as c_uint };
                return ok();
            }
            drop(inner);
            std::thread::yield_now();
        }
    })
}

/// Cancels the batch's outstanding requests (their events then say
/// canceled, or complete if they finished first).
#[no_mangle]
pub extern "C" fn cuFileBatchIOCancel(batch_idp: *mut c_void) -> CUfileError_t {
    guard(internal(), || {
        let snap = state();
        let b = match batch_in(&snap, batch_idp, op::INVALID_VALUE) {
            Ok(b) => b,
            // A destroyed batch has nothing left to cancel: success, as
            // NVIDIA's library answers (seen: 1.15.1).
            Err(_) if !batch_idp.is_null() => return ok(),
            Err(e) => return e,
        };
        let inner = b.inner.lock().recover();
        for (_, _, ub) in &inner.per_file {
            if let Err(e) = ub.cancel() {
                stats::count("batch_cancel_ops", false);
                return from_error(e);
            }
        }
        stats::count("batch_cancel_ops", true);
        ok()
    })
}

/// Destroys a batch context once the device is done with its requests; a
/// null or unknown one is ignored.
#[no_mangle]
pub extern "C" fn cuFileBatchIODestroy(batch_idp: *mut c_void) {
    guard((), || {
        let b = state_mut().as_mut().and_then(|s| s.batches.remove(&(batch_idp as usize)));
        stats::count("batch_destroy_ops", b.is_some());
        drop(b);
    })
}
