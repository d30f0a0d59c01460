//! The end of an NVMe/RDMA queue pair: moved to the error state so that
//! the target can no longer reach the memory of its commands, and the wait
//! for the flush that says so.

use super::*;

impl RdmaIoQueue {
    /// Stops the queue pair serving the target (once): posts one more
    /// receive (so that one is there to flush), moves the queue pair to the
    /// error state and waits, for up to [`DRAIN_WAIT`], for a receive to
    /// complete flushed, unless one has. Whether it did: if not, the target
    /// may still reach the memory of the commands on the queue.
    pub(super) fn stop(&mut self) -> bool {
        if self.drain != Drain::NotYet {
            return self.drain == Drain::Done;
        }
        let qid = self.q.qid;
        let sge = response_sge(&self.q.mr, 0);
        // A queue pair already in the error state may not flush a receive
        // posted now; it has flushed one already.
        let r = match self.flushed {
            true => self.q.poster.to_error(),
            false => self.q.poster.recv(DRAIN_ID, sge).and_then(|()| self.q.poster.to_error()),
        };
        self.drain = match r {
            Ok(()) if self.flushed => Drain::Done,
            Ok(()) => self.wait_drained(),
            Err(e) => {
                tracing::error!(qid, "NVMe/RDMA: the queue pair to {} not stopped: {e}", self.q.addr);
                Drain::Failed
            }
        };
        if self.drain == Drain::Failed {
            tracing::error!(
                qid,
                outstanding = self.tracker.outstanding(),
                "NVMe/RDMA: the target may still reach the memory of this queue's commands; they are left to time out"
            );
        }
        self.drain == Drain::Done
    }

    /// Polls for a receive flushed (what else completes is dropped: the
    /// queue has ended).
    pub(super) fn wait_drained(&mut self) -> Drain {
        let started = Instant::now();
        let mut wcs = [WorkCompletion::default(); 16];
        loop {
            match self.q.conn.cq().poll(&mut wcs) {
                Ok(k) if wcs[..k].iter().any(|wc| wc.wr_id & SEND_BIT == 0 && wc.status == verbs::WC_WR_FLUSH_ERR) => {
                    return Drain::Done
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(qid = self.q.qid, "NVMe/RDMA: polling for the drain: {e}");
                    return Drain::Failed;
                }
            }
            if started.elapsed() > DRAIN_WAIT {
                return Drain::Failed;
            }
            std::thread::yield_now();
        }
    }
}
