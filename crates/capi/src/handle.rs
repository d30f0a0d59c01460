//! Handles: a controller behind an fd (`/dev/ugds_drvN`, or a regular file
//! with `UGDS_EMULATE=1`), registered and deregistered.

use super::*;
use std::ffi::CStr;
use ugds_emu::descriptor::{Refused, Served};

/// What serves `fd` (see `ugds_emu::descriptor`), as a uGDS error.
pub(crate) fn target_for(fd: c_int) -> Result<Served, uGDSError_t> {
    // SAFETY: borrowed for the call only; an fd that is not open is
    // reported by fstat.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    ugds_emu::descriptor::serve(borrowed).map_err(|r| match r {
        Refused::NotOpen => fail(op::INVALID_VALUE, format!("fd {fd} is not an open file")),
        Refused::FileType(why) => fail(op::INVALID_FILE_TYPE, why),
        Refused::Dup(e) => fail(op::GETNEWFD_FAILED, format!("dup of fd {fd}: {e}")),
        Refused::Platform(e) => from_error(e),
        Refused::TooSmall => fail(op::INVALID_VALUE, "the file is smaller than one block"),
        Refused::Setting(why) => fail(op::INVALID_VALUE, why),
    })
}

/// Opens a handle on `descr`'s fd: the controller behind `/dev/ugds_drvN`;
/// a regular file or block device through the kernel path (io_uring); or,
/// with `UGDS_EMULATE=1`, a regular file through an emulated controller.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleRegister(fh: *mut *mut c_void, descr: *mut abi::uGDSDescr_t) -> uGDSError_t {
    guard(internal(), || {
        if fh.is_null() || descr.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        if state().is_none() {
            return fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first");
        }
        // SAFETY: non-null; the caller passes a valid descriptor.
        let d = unsafe { &*descr };
        if d.type_ != abi::HANDLE_TYPE_OPAQUE_FD {
            return fail(op::INVALID_FILE_TYPE, format!("handle type {} (only OPAQUE_FD)", d.type_));
        }
        // SAFETY: OPAQUE_FD: the union holds an fd.
        let fd = unsafe { d.handle.fd };
        if state().as_ref().is_some_and(|s| s.handles.values().any(|r| r.fd == fd)) {
            return fail(op::HANDLE_ALREADY_REGISTERED, format!("fd {fd} is registered already"));
        }
        // Device work (bring-up) without the table's lock.
        let target = match target_for(fd) {
            Ok(t) => t,
            Err(e) => return e,
        };
        let driver = match state().as_ref() {
            Some(s) => s.driver.clone(),
            None => return fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed"),
        };
        let opened = match target {
            Served::Controller(platform) => driver.open_handle(platform, HandleOptions::from_env()),
            Served::Kernel => {
                // SAFETY: fstat found `fd` open; it is borrowed for the call
                // (the handle keeps a duplicate).
                let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                driver.open_fd(borrowed, HandleOptions::from_env())
            }
        };
        let handle = match opened {
            Ok(h) => Arc::new(h),
            Err(e) => return from_error(e),
        };
        let mut g = state_mut();
        let Some(s) = g.as_mut() else {
            drop(g);
            let _ = handle.close(Drain::Forever);
            return fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed");
        };
        // Checked again under the write lock: another thread may have
        // registered the same fd meanwhile.
        if s.handles.values().any(|r| r.fd == fd) {
            drop(g);
            let _ = handle.close(Drain::Forever);
            return fail(op::HANDLE_ALREADY_REGISTERED, format!("fd {fd} is registered already"));
        }
        let obj = Box::into_raw(Box::new(HandleObj { fd }));
        s.handles.insert(obj as usize, Registered { dev: Dev::One(handle), fd });
        // SAFETY: non-null, checked above.
        unsafe { *fh = obj.cast() };
        ok()
    })
}

/// A controller's handle for a call that takes no volume: a volume's
/// handle is refused with `UGDS_IO_NOT_SUPPORTED` (see [`no_handle`]).
pub(crate) fn lookup(fh: *mut c_void) -> Result<(Arc<Handle>, ugds::Driver), c_int> {
    match lookup_dev(fh)? {
        (Dev::One(h), d) => Ok((h, d)),
        (Dev::Volume(..), _) => Err(op::IO_NOT_SUPPORTED),
    }
}

/// What `fh` is: a controller's handle or a volume.
pub(crate) fn lookup_dev(fh: *mut c_void) -> Result<(Dev, ugds::Driver), c_int> {
    dev_in(&state(), fh).map(|(d, driver)| (d.clone(), driver.clone()))
}

/// What `fh` is in the snapshot `s`, borrowed from it (the I/O calls:
/// no count of the handle's or the driver's is touched).
pub(crate) fn dev_in(s: &Snapshot, fh: *mut c_void) -> Result<(&Dev, &ugds::Driver), c_int> {
    let s = s.as_ref().ok_or(op::DRIVER_NOT_INITIALIZED)?;
    if fh.is_null() {
        return Err(op::INVALID_VALUE);
    }
    let r = s.handles.get(&(fh as usize)).ok_or(op::HANDLE_NOT_REGISTERED)?;
    Ok((&r.dev, &s.driver))
}

/// Why [`lookup`] refused a handle.
pub(crate) fn no_handle(c: c_int) -> &'static str {
    match c {
        op::IO_NOT_SUPPORTED => {
            "a volume's handle: this call takes a controller's handle (a volume takes uGDSRead, uGDSWrite, \
             uGDSReadv, uGDSWritev, uGDSReadAsync, uGDSWriteAsync, uGDSGetDeviceCapacity, the uGDSBatchIO* \
             calls and uGDSHandleDeregister)"
        }
        op::DRIVER_NOT_INITIALIZED => "uGDSDriverOpen first",
        op::INVALID_VALUE => "null handle",
        _ => "no such handle",
    }
}

/// The namespace's capacity in bytes.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSGetDeviceCapacity(fh: *mut c_void, bytes: *mut u64) -> uGDSError_t {
    guard(internal(), || {
        if bytes.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        let cap = match lookup_dev(fh) {
            Ok((Dev::One(h), _)) => h.capacity(),
            Ok((Dev::Volume(v, _), _)) => v.capacity(),
            Err(c) => return fail(c, no_handle(c)),
        };
        // SAFETY: non-null, checked above.
        unsafe { *bytes = cap };
        ok()
    })
}

/// What each I/O queue pair of a handle has done (an extension): fills up
/// to `max` entries of `out` and sets `*n` to the number of queues.
///
/// # Safety
/// `n` is null (refused) or valid for a write; `out` is valid for `max`
/// entries (or null with `max` 0, to ask for the count).
#[no_mangle]
pub unsafe extern "C" fn uGDSGetQueueStats(
    fh: *mut c_void,
    out: *mut abi::ugds_queue_stats_t,
    max: usize,
    n: *mut usize,
) -> uGDSError_t {
    guard(internal(), || {
        if n.is_null() || (out.is_null() && max > 0) {
            return fail(op::INVALID_VALUE, "null argument");
        }
        match lookup(fh) {
            Ok((h, _)) => {
                let stats = h.queue_stats();
                for (i, s) in stats.iter().take(max).enumerate() {
                    // SAFETY: `out` holds `max` entries (caller), i < max.
                    unsafe { out.add(i).write(s.into()) };
                }
                // SAFETY: non-null, checked above.
                unsafe { *n = stats.len() };
                ok()
            }
            Err(c) => fail(c, no_handle(c)),
        }
    })
}

/// Closes a handle, waiting for its I/O; a null handle is ignored.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleDeregister(fh: *mut c_void) {
    guard((), || {
        if !fh.is_null() {
            // SAFETY: the caller's handle, passed on under the same contract.
            let _ = unsafe { uGDSHandleDeregisterEx(fh, -1) };
        }
    })
}

/// Closes a handle and destroys its batch contexts: 0 refuses with
/// `UGDS_BUSY` while I/O is in flight, > 0 waits that many seconds, -1
/// waits, < -1 tears a wedged handle down after a controller reset.
///
/// # Safety
/// Each pointer argument is null (refused with an error) or valid for the
/// reads and writes `ugds.h` documents for this call, for its duration.
#[no_mangle]
pub unsafe extern "C" fn uGDSHandleDeregisterEx(fh: *mut c_void, timeout_sec: c_int) -> uGDSError_t {
    guard(internal(), || {
        let h = match lookup_dev(fh) {
            Ok((Dev::One(h), _)) => h,
            Ok((Dev::Volume(..), _)) => {
                // A volume holds no queues of its own: its members' stay
                // open. Its batch contexts go with it (each waits for its
                // requests when dropped, outside the lock).
                let batches: Vec<CBatch> = {
                    with_state!(s, ok());
                    let mine: Vec<usize> =
                        s.batches.iter().filter(|(_, (o, _))| *o == fh as usize).map(|(k, _)| *k).collect();
                    let out: usize = mine.iter().map(|k| s.batches[k].1.outstanding()).sum();
                    if timeout_sec == 0 && out > 0 {
                        return fail(op::BUSY, format!("{out} batch requests of this volume are outstanding"));
                    }
                    s.handles.remove(&(fh as usize));
                    mine.into_iter().filter_map(|k| s.batches.remove(&k).map(|(_, b)| b)).collect()
                };
                drop(batches);
                return ok();
            }
            Err(c) => return fail(c, no_handle(c)),
        };
        {
            with_state!(s, fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed"));
            let n = s
                .handles
                .values()
                .filter(|r| matches!(&r.dev, Dev::Volume(_, m) if m.contains(&(fh as usize))))
                .count();
            if n > 0 {
                return fail(op::BUSY, format!("the handle is a member of {n} volume(s): deregister them first"));
            }
        }
        let drain = match timeout_sec {
            0 => Drain::NoWait,
            -1 => Drain::Forever,
            t if t < -1 => Drain::ForceAfterReset,
            t => Drain::Timeout(Duration::from_secs(t as u64)),
        };
        // The handle's batch contexts go with it (each holds the handle
        // open): unless asked not to wait while they have requests out.
        let batches: Vec<(usize, CBatch)> = {
            with_state!(s, fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed"));
            let mine: Vec<usize> = s.batches.iter().filter(|(_, (o, _))| *o == fh as usize).map(|(k, _)| *k).collect();
            if drain == Drain::NoWait {
                let out: usize = mine.iter().map(|k| s.batches[k].1.outstanding()).sum();
                if out > 0 {
                    return fail(op::BUSY, format!("{out} batch requests of this handle are outstanding"));
                }
            }
            mine.into_iter().filter_map(|k| s.batches.remove(&k).map(|(_, b)| (k, b))).collect()
        };
        // Dropped outside the lock: each cancels and waits for its requests.
        drop(batches);
        if let Err(e) = h.close(drain) {
            return from_error(e);
        }
        with_state!(s, ok());
        s.handles.remove(&(fh as usize));
        ok()
    })
}

/// Opens a handle (an extension) on namespace `nsid` (0: the first) of the
/// NVMe/TCP controller exporting `subnqn` at `addr` ("host:port"), through
/// ugds's own initiator; `flags`: `UGDS_TCP_DIGESTS` asks for header and
/// data digests. The handle takes every call a controller's takes (it has
/// no file descriptor: its handle object's fd is -1); the handle options
/// come from the environment as for uGDSHandleRegister.
///
/// # Safety
/// `fh` is null (refused) or valid for a write; `addr` and `subnqn` are
/// null (refused) or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn uGDSTcpOpen(
    fh: *mut *mut c_void,
    addr: *const c_char,
    subnqn: *const c_char,
    nsid: u32,
    flags: u32,
) -> uGDSError_t {
    guard(internal(), || {
        if flags & !abi::TCP_DIGESTS != 0 {
            return fail(op::INVALID_VALUE, format!("flags {flags:#x}: only UGDS_TCP_DIGESTS"));
        }
        // SAFETY: the caller's contract, passed on.
        unsafe {
            open_fabrics(fh, addr, subnqn, nsid, |driver, addr, subnqn, opts| {
                let mut t = ugds::fabrics::TcpTarget::new(addr, subnqn);
                let digests = flags & abi::TCP_DIGESTS != 0;
                t.digests = ugds::fabrics::Digests { header: digests, data: digests };
                driver.open_tcp(&t, opts)
            })
        }
    })
}

/// Opens a handle (an extension) on namespace `nsid` (0: the first) of the
/// NVMe/RDMA controller exporting `subnqn` at `addr` ("address:port" on an
/// RDMA device's network), through ugds's own initiator (rdma-core loaded
/// at run time). Registered host buffers are registered with the RDMA
/// device too, and the target moves their data; `flags`: `UGDS_RDMA_COPY`
/// registers none and copies every command's data through the queues' own
/// memory. GPU memory is registered from its dma-buf where the RDMA device
/// can (soft RoCE cannot: refused). `UGDS_INTERRUPT_MODE=1` sleeps on the
/// queues' completion channels. Otherwise as uGDSTcpOpen.
///
/// # Safety
/// As for [`uGDSTcpOpen`].
#[no_mangle]
pub unsafe extern "C" fn uGDSRdmaOpen(
    fh: *mut *mut c_void,
    addr: *const c_char,
    subnqn: *const c_char,
    nsid: u32,
    flags: u32,
) -> uGDSError_t {
    guard(internal(), || {
        if flags & !abi::RDMA_COPY != 0 {
            return fail(op::INVALID_VALUE, format!("flags {flags:#x}: only UGDS_RDMA_COPY"));
        }
        // SAFETY: the caller's contract, passed on.
        unsafe {
            open_fabrics(fh, addr, subnqn, nsid, |driver, addr, subnqn, opts| {
                let mut t = ugds::fabrics::RdmaTarget::new(addr, subnqn);
                t.register_memory = flags & abi::RDMA_COPY == 0;
                driver.open_rdma(&t, opts)
            })
        }
    })
}

/// The common part of the fabrics opens: checks the arguments, opens the
/// handle with `open` (the options from the environment, `nsid` 0 the
/// first) and enters it in the table.
///
/// # Safety
/// As for [`uGDSTcpOpen`].
unsafe fn open_fabrics(
    fh: *mut *mut c_void,
    addr: *const c_char,
    subnqn: *const c_char,
    nsid: u32,
    open: impl FnOnce(&ugds::Driver, &str, &str, HandleOptions) -> ugds::Result<ugds::Handle>,
) -> uGDSError_t {
    if fh.is_null() || addr.is_null() || subnqn.is_null() {
        return fail(op::INVALID_VALUE, "null argument");
    }
    // SAFETY: non-null NUL-terminated strings, by the caller's contract.
    let (addr, subnqn) = unsafe { (CStr::from_ptr(addr), CStr::from_ptr(subnqn)) };
    let (Ok(addr), Ok(subnqn)) = (addr.to_str(), subnqn.to_str()) else {
        return fail(op::INVALID_VALUE, "the address and the NQN are UTF-8");
    };
    let driver = match state().as_ref() {
        Some(s) => s.driver.clone(),
        None => return fail(op::DRIVER_NOT_INITIALIZED, "uGDSDriverOpen first"),
    };
    let opts = HandleOptions::from_env().nsid((nsid != 0).then_some(nsid));
    // Connection and bring-up without the table's lock.
    let handle = match open(&driver, addr, subnqn, opts) {
        Ok(h) => Arc::new(h),
        Err(e) => return from_error(e),
    };
    let mut g = state_mut();
    let Some(s) = g.as_mut() else {
        drop(g);
        let _ = handle.close(Drain::Forever);
        return fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed");
    };
    let obj = Box::into_raw(Box::new(HandleObj { fd: -1 }));
    s.handles.insert(obj as usize, Registered { dev: Dev::One(handle), fd: -1 });
    // SAFETY: non-null, checked above.
    unsafe { *fh = obj.cast() };
    ok()
}

/// Opens a volume (an extension) over `count` registered handles: striped
/// with `stripe_bytes` stripes (a power of two of at least 4096), or
/// concatenated in order when `stripe_bytes` is 0. The volume's handle
/// takes uGDSRead, uGDSWrite, uGDSReadv, uGDSWritev, uGDSGetDeviceCapacity,
/// the uGDSBatchIO* calls and uGDSHandleDeregister; a member's failure
/// fails the request whole
/// (the error names the member). Members stay usable on their own and
/// cannot be deregistered while a volume holds them.
///
/// # Safety
/// `vh` is null (refused) or valid for a write; `members` is null
/// (refused) or valid for reads of `count` handles.
#[no_mangle]
pub unsafe extern "C" fn uGDSVolumeOpen(
    vh: *mut *mut c_void,
    members: *const *mut c_void,
    count: c_int,
    stripe_bytes: u64,
) -> uGDSError_t {
    guard(internal(), || {
        if vh.is_null() || members.is_null() || count <= 0 || count > abi::MAX_VOLUME_MEMBERS {
            return fail(
                op::INVALID_VALUE,
                format!("null argument, or {count} members (1 to {})", abi::MAX_VOLUME_MEMBERS),
            );
        }
        // SAFETY: non-null and `count` entries, by the caller's contract.
        let list = unsafe { std::slice::from_raw_parts(members, count as usize) };
        let mut keys: Vec<usize> = Vec::with_capacity(list.len());
        let mut handles = Vec::with_capacity(list.len());
        for (i, &m) in list.iter().enumerate() {
            if keys.contains(&(m as usize)) {
                return fail(op::INVALID_VALUE, format!("member {i} is given twice"));
            }
            match lookup(m) {
                Ok((h, _)) => handles.push(h),
                Err(c) => return fail(c, format!("member {i}: {}", no_handle(c))),
            }
            keys.push(m as usize);
        }
        let layout = match stripe_bytes {
            0 => ugds::VolumeLayout::Concat,
            s => ugds::VolumeLayout::Striped { stripe: s },
        };
        let volume = match ugds::Volume::with_shared(handles, layout) {
            Ok(v) => v,
            Err(e) => return from_error(e),
        };
        with_state!(s, fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed"));
        // Checked again under the write lock: a member may have gone meanwhile.
        if let Some(i) = keys.iter().position(|k| !s.handles.contains_key(k)) {
            return fail(op::HANDLE_NOT_REGISTERED, format!("member {i} was deregistered meanwhile"));
        }
        let obj = Box::into_raw(Box::new(HandleObj { fd: -1 }));
        s.handles.insert(obj as usize, Registered { dev: Dev::Volume(volume, keys), fd: -1 });
        // SAFETY: non-null, checked above.
        unsafe { *vh = obj.cast() };
        ok()
    })
}
