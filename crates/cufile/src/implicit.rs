//! Registrations this library makes for unregistered device buffers of
//! stream-ordered calls: one per CUDA allocation, checked against the
//! allocation at every use.

use crate::abi::{op, CUfileError_t};
use crate::errors::{fail, from_error};
use std::sync::atomic::{AtomicBool, Ordering};
use ugds::shared_state::SharedState;

/// The bases of the registrations this library made for unregistered
/// device buffers (see `registration`): read by every synchronous call
/// without a lock (a snapshot), changed one at a time.
static IMPLICIT: SharedState<Vec<usize>> = SharedState::new();
/// Whether any was ever made: a process that never made one reads only
/// this flag per I/O.
static ANY: AtomicBool = AtomicBool::new(false);

pub(crate) fn made(base: usize) -> bool {
    ANY.load(Ordering::Acquire) && IMPLICIT.load().as_ref().is_some_and(|l| l.contains(&base))
}

/// The registration of the CUDA allocation holding `ptr`, for
/// stream-ordered I/O on an unregistered buffer (host memory must be
/// registered first): made at the first such use, kept until
/// `cuFileBufDeregister` of its base or the driver's close, and checked at
/// every use against the allocation there now. A registration that no
/// longer matches it (the memory was freed and allocated again) is
/// replaced, so that no I/O reaches past what the caller holds.
pub(crate) fn registration(driver: &ugds::Driver, ptr: u64) -> Result<ugds::BufferToken, CUfileError_t> {
    let cuda = ugds::gpu::cuda::Cuda::get().map_err(from_error)?;
    let (alloc, len) = match cuda.allocation(ptr) {
        Ok(a) => a,
        Err(_) => {
            return Err(fail(
                op::MEMORY_NOT_REGISTERED,
                "stream-ordered I/O on host memory needs it registered (cuFileBufRegister)",
            ))
        }
    };
    let mut change = IMPLICIT.change();
    let made = change.get_or_insert_with(Vec::new);
    if let Some(t) = driver.token_containing(ptr as *const u8) {
        if t.base() == alloc as usize && t.len() == len {
            return Ok(t);
        }
        if !made.contains(&t.base()) {
            // The caller's own registration, covering only part of the
            // allocation: used as it is.
            return Ok(t);
        }
        // Stale: refused while I/O still holds it (the device may reach
        // it), else dropped.
        driver.deregister(&t).map_err(from_error)?;
        made.retain(|&b| b != t.base());
    }
    // SAFETY: the caller's device allocation, as CUDA reports it now; the
    // caller frees it only after its I/O (cuFile's contract), and a later
    // use checks it again.
    let t = unsafe { driver.register_cuda(alloc, len) }.map_err(from_error)?;
    made.push(alloc as usize);
    // Before the change is published (when `change` drops): a reader that
    // finds the base in the list has found the flag set.
    ANY.store(true, Ordering::Release);
    Ok(t)
}

/// Forgets every implicit registration (the driver closed: they went with it).
pub(crate) fn clear() {
    IMPLICIT.change().take();
}

/// Forgets an implicit registration deregistered by the caller.
pub(crate) fn forget(base: usize) {
    if let Some(made) = IMPLICIT.change().as_mut() {
        made.retain(|&b| b != base);
    }
}
