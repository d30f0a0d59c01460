//! The copy stage of the kernel path's GPU commands: copies between bounce
//! buffers and GPU memory are started under the queue's lock and finished
//! by a later look, never waited for (see the module docs).

use super::transfer::{refusal, Transfer};
use super::UringQueue;
use crate::engine::bounce;
use crate::engine::qpair::Owner;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use ugds_nvme::status::generic;
use ugds_nvme::{Cid, Cqe, Status};
use ugds_platform::device::{CopyTicket, DeviceRuntime};
use ugds_platform::kernel::KernelPlatform;
use ugds_platform::{Error, Result};

/// A command whose data is being copied between its bounce buffer and
/// GPU memory.
pub(super) struct Copying {
    pub cid: Cid,
    pub ticket: CopyTicket,
    pub runtime: Arc<dyn DeviceRuntime>,
    /// Bytes a read did not move (end of file), for its completion.
    pub short: u32,
}

impl UringQueue {
    /// Starts the copy of a GPU write's bytes into its bounce buffer.
    pub(super) fn start_copy_from_device(&self, t: &Transfer) -> Result<(CopyTicket, Arc<dyn DeviceRuntime>)> {
        let (dev, runtime) = self
            .platform
            .device_at(t.device, t.len as usize)
            .ok_or_else(|| Error::Platform("GPU memory no longer mapped".into()))?;
        // SAFETY: the bounce buffer is this command's alone (`len` bytes of
        // it; its size class holds at least that) and is not touched until the
        // ticket is answered (the command waits in `staging`); the device
        // range lies in registered GPU memory, held by the request.
        let ticket = unsafe { runtime.copy_from_device_start(t.addr as *mut u8, dev, t.len as usize) }?;
        Ok((ticket, runtime))
    }

    /// Starts the copy of a GPU read's bytes from its bounce buffer.
    pub(super) fn start_copy_to_device(
        platform: &KernelPlatform,
        t: &Transfer,
    ) -> Result<(CopyTicket, Arc<dyn DeviceRuntime>)> {
        let (dev, runtime) = platform
            .device_at(t.device, t.done as usize)
            .ok_or_else(|| Error::Platform("GPU memory no longer mapped".into()))?;
        // SAFETY: the kernel is done with the bounce buffer (its completion
        // is consumed) and nothing touches it until the ticket is answered
        // (the command waits in `landing`); the range lies in registered
        // GPU memory the request holds.
        let ticket = unsafe { runtime.copy_to_device_start(dev, t.addr as *const u8, t.done as usize) }?;
        Ok((ticket, runtime))
    }

    /// Finishes the copies that are done: a read completes (`f`), a write
    /// goes to the ring (with the next resubmissions). Returns how many
    /// commands completed.
    pub(super) fn advance_copies(&mut self, f: &mut impl FnMut(Owner, &Cqe)) -> usize {
        while let Some(c) = self.staging.front() {
            let failed = match c.runtime.copy_finished(c.ticket) {
                Ok(false) => break,
                Ok(true) => None,
                Err(e) => Some(e),
            };
            let c = self.staging.pop_front().expect("looked at");
            self.copies.fetch_sub(1, Ordering::Release);
            if let Some(e) = failed {
                // Completes through a no-op with the error.
                tracing::error!("copy from GPU memory for a write failed: {e}");
                self.tracker.get_mut(c.cid).expect("outstanding").extra.kind =
                    refusal(Status::generic(generic::DATA_TRANSFER_ERROR));
            }
            self.retry.push(c.cid);
        }
        let mut n = 0;
        while let Some(c) = self.landing.front() {
            let status = match c.runtime.copy_finished(c.ticket) {
                Ok(false) => break,
                Ok(true) => Status::SUCCESS,
                Err(e) => {
                    tracing::error!("copy of a read to GPU memory failed: {e}");
                    Status::generic(generic::DATA_TRANSFER_ERROR)
                }
            };
            let c = self.landing.pop_front().expect("looked at");
            self.copies.fetch_sub(1, Ordering::Release);
            let e = self.tracker.end(c.cid, status.to_field(false)).expect("outstanding");
            if let Some(b) = e.extra.bounce {
                bounce::give(b);
            }
            let cqe = self.cqe(c.cid, status, c.short);
            f(e.owner, &cqe);
            n += 1;
        }
        n
    }
}
