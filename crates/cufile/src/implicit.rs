//! Registrations this library makes for unregistered device buffers of
//! stream-ordered calls: one per CUDA allocation, checked against the
//! allocation at every use.

use crate::abi::{op, CUfileError_t};
use crate::errors::{fail, from_error};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use ugds::platform::Recover;

/// The bases of the registrations this library made for unregistered
/// device buffers (see `registration`).
static IMPLICIT: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// How many there are: read first by every synchronous call, so that a
/// process with none takes no lock per I/O.
static COUNT: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn made(base: usize) -> bool {
    COUNT.load(Ordering::Acquire) > 0 && IMPLICIT.lock().recover().contains(&base)
}

/// Keeps `COUNT` with the list (under its lock).
fn counted(list: &[usize]) {
    COUNT.store(list.len(), Ordering::Release);
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
    let mut made = IMPLICIT.lock().recover();
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
        counted(&made);
    }
    // SAFETY: the caller's device allocation, as CUDA reports it now; the
    // caller frees it only after its I/O (cuFile's contract), and a later
    // use checks it again.
    let t = unsafe { driver.register_cuda(alloc, len) }.map_err(from_error)?;
    made.push(alloc as usize);
    counted(&made);
    Ok(t)
}

/// Forgets every implicit registration (the driver closed: they went with it).
pub(crate) fn clear() {
    let mut made = IMPLICIT.lock().recover();
    made.clear();
    counted(&made);
}

/// Forgets an implicit registration deregistered by the caller.
pub(crate) fn forget(base: usize) {
    let mut made = IMPLICIT.lock().recover();
    made.retain(|&b| b != base);
    counted(&made);
}
