//! The public face of a handle: I/O, queues, close.

use super::*;

/// One controller and one of its namespaces, ready for I/O. Shareable
/// between threads (`&Handle` is enough to do I/O).
pub struct Handle {
    pub(crate) inner: Arc<HandleInner>,
}

impl Handle {
    /// The controller's PCI address, where it is a PCI function (not an
    /// emulated controller or a file).
    pub fn pci_address(&self) -> Option<String> {
        self.inner.platform().pci_address()
    }

    /// What bring-up learned about the controller.
    pub fn controller(&self) -> &ControllerInfo {
        self.inner.queues().ctrl.info()
    }

    /// The namespace this handle uses.
    pub fn namespace(&self) -> NamespaceInfo {
        self.inner.ns
    }

    /// Bytes usable on the namespace (the end of this process's share,
    /// when attached to a split namespace).
    pub fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    /// The byte range of the namespace this handle may read and write:
    /// `0..capacity()`, or this process's part when it is attached to a
    /// controller whose namespaces are split between processes
    /// (`ugds serve --split`); anything outside is refused.
    pub fn share(&self) -> std::ops::Range<u64> {
        self.inner.floor()..self.inner.capacity()
    }

    /// A regular file on the kernel path: extends it to `at_least` bytes
    /// where it is shorter (a hole; files opened read-only are not
    /// changed), then takes its size now as the capacity, which only
    /// grows; returns the capacity. cuFile's writes past a file's end grow
    /// it so. Other targets keep their capacity: `Unsupported`.
    pub fn grow(&self, at_least: u64) -> Result<u64> {
        self.inner.grow(at_least)
    }

    /// Where the handle stands.
    pub fn state(&self) -> HandleState {
        self.inner.life.handle_state()
    }

    /// Operations in flight (and lent I/O queues).
    pub fn inflight(&self) -> usize {
        self.inner.life.inflight.total()
    }

    /// Queue pairs shared by synchronous calls, and lendable as [`IoQueue`](crate::IoQueue)s.
    pub fn queue_counts(&self) -> (usize, usize) {
        (self.inner.queues().sync.len(), self.inner.queues().lendable)
    }

    /// Whether vectored requests that fit one command go as one command
    /// with a Scatter Gather List (the controller takes SGLs and
    /// [`HandleOptions::sgl`](crate::HandleOptions::sgl) allows it).
    pub fn sgl(&self) -> bool {
        self.inner.sgl
    }

    /// Whether the I/O queues use shadow doorbells.
    pub fn shadow_doorbells(&self) -> bool {
        self.inner.queues().ctrl.shadow_doorbells()
    }

    /// Entries and PRP-list pages of each batch queue, if there is one.
    pub fn batch_geometry(&self) -> Option<(usize, usize)> {
        self.inner.batch_queue().ok().map(|b| b.geometry())
    }

    /// Queue pairs batch contexts are spread over (see
    /// [`HandleOptions::batch_queues`](crate::HandleOptions::batch_queues)):
    /// 0 when there is no batch queue.
    pub fn batch_queues(&self) -> usize {
        self.inner.queues().batch_queues()
    }

    /// Every I/O queue pair of the handle, what it is for and how it
    /// learns of completions (a vector of its own, a shared one, or
    /// polling).
    pub fn queues(&self) -> &[QueueInfo] {
        &self.inner.queues().info
    }

    /// What each I/O queue pair has done since the handle opened: commands
    /// submitted and completed, bytes, errors, timeouts, doorbell writes
    /// and interrupts, in the order of [`queues`](Self::queues). The
    /// counters cost the request path no shared atomic operation (each is
    /// written by the thread that holds its queue pair); reading them takes
    /// no lock. [`QueueStats::total`] sums them.
    pub fn queue_stats(&self) -> Vec<QueueStats> {
        self.inner.queue_stats()
    }

    /// Each I/O queue pair's command latencies, from staging to the
    /// consumption of the completion, when the handle traces
    /// ([`HandleOptions::trace`]); empty otherwise. The lendable queues'
    /// include what they did while lent.
    pub fn queue_latency(&self) -> Vec<QueueLatency> {
        self.inner.queues().latency()
    }

    /// The last commands of each I/O queue pair, when the handle traces
    /// ([`HandleOptions::trace`]): the completed ones oldest first, then
    /// those still outstanding. Waits for the synchronous and batch queues'
    /// locks; a lendable queue lent out now is left out (its
    /// [`IoQueue::trace`](crate::IoQueue::trace) has it). Empty when not traced.
    pub fn trace(&self) -> Vec<QueueTrace> {
        self.inner.trace(true)
    }

    /// Whether batch contexts (and stream-ordered I/O) share the one
    /// synchronous queue pair (a controller that granted one) rather than
    /// a deep queue pair of their own.
    pub fn batch_queue_is_shared(&self) -> bool {
        self.inner.batch_queue().is_ok_and(|b| b.is_shared())
    }

    /// Completions the controller posted that broke the protocol and were
    /// ignored (a CID not in flight or of an earlier generation, an SQ head
    /// outside what was submitted), on the synchronous and batch queues.
    pub fn protocol_errors(&self) -> u64 {
        let batch: u64 = self.inner.queues().batch_queues_own().map(|b| b.lock().qp.protocol_errors()).sum();
        self.inner.queues().sync.iter().map(|q| q.with_qp(|qp| qp.protocol_errors())).sum::<u64>() + batch
    }

    /// Interrupt waits of synchronous requests that slept to their cap
    /// (100 ms) without a wake-up: a lost wake-up, or a device gone quiet.
    pub fn interrupt_waits_capped(&self) -> u64 {
        self.inner.queues().sync.iter().map(|q| q.capped_waits()).sum()
    }

    /// Of [`Handle::interrupt_waits_capped`], the waits after which the
    /// waiter found its work ready (its request done, a completion posted, a
    /// slot or submission-queue room free): a wake-up the library lost, or
    /// an interrupt the device did not send. A disk or GPU copy that is slow
    /// for 100 ms caps waits without losing any.
    pub fn interrupt_wakeups_lost(&self) -> u64 {
        self.inner.queues().sync.iter().map(|q| q.lost_wakeups()).sum()
    }

    /// Reads `size` bytes at `file_offset` of the namespace into the
    /// registered buffer, `buf_offset` bytes in. Returns the bytes read once
    /// all of them are in the buffer: `size`, or fewer on the kernel path
    /// when the file ends first (the buffer past the bytes read may then
    /// be written: direct I/O moves whole blocks, with zeroes past the end).
    pub fn read(&self, buf: &BufferToken, size: usize, file_offset: u64, buf_offset: usize) -> Result<usize> {
        self.rw(NvmOpcode::Read, buf, size, file_offset, buf_offset, Priority::Normal)
    }

    /// As [`read`](Self::read), of class `priority`: a latency-critical
    /// read is never held back and large normal and background requests
    /// make room for it; a large background read makes room for every
    /// request that is not background (see [`HandleOptions::chunk_bytes`]).
    pub fn read_with_priority(
        &self,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        priority: Priority,
    ) -> Result<usize> {
        self.rw(NvmOpcode::Read, buf, size, file_offset, buf_offset, priority)
    }

    /// As [`write`](Self::write), of class `priority` (see
    /// [`read_with_priority`](Self::read_with_priority)).
    pub fn write_with_priority(
        &self,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        priority: Priority,
    ) -> Result<usize> {
        self.rw(NvmOpcode::Write, buf, size, file_offset, buf_offset, priority)
    }

    /// Writes `size` bytes from the registered buffer, `buf_offset` bytes
    /// in, to `file_offset` of the namespace. Returns once the controller has
    /// completed every command.
    pub fn write(&self, buf: &BufferToken, size: usize, file_offset: u64, buf_offset: usize) -> Result<usize> {
        self.rw(NvmOpcode::Write, buf, size, file_offset, buf_offset, Priority::Normal)
    }

    fn rw(
        &self,
        op: NvmOpcode,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        prio: Priority,
    ) -> Result<usize> {
        thread_local! {
            /// The buffer this thread's last request used.
            static RECENT: Cell<Option<Recent>> = const { Cell::new(None) };
        }
        let h = &*self.inner;
        let _in = h.enter()?;
        let mut recent = RECENT.take();
        let (guard, data_off) = match h.prepare_recent(&mut recent, buf, size, file_offset, buf_offset) {
            Ok(p) => p,
            Err(e) => {
                RECENT.set(recent);
                return Err(e);
            }
        };
        let pages = recent.as_ref().expect("filled by prepare_recent").pages();
        let nsid = Nsid(h.ns.nsid);
        let name = if op == NvmOpcode::Read { "Read" } else { "Write" };
        // A page or less is one command (MDTS is at least a page), planned
        // in place: no chunker, no splitting to iterate. Its PRPs as two
        // entries, the second 0 when unused (what One means on the wire).
        if size <= PAGE_SIZE {
            let (prp1, prp2) = match prp::plan(pages, PAGE_SIZE, data_off, size) {
                Ok(prp::PrpPlan::One { prp1 }) => (prp1, 0),
                Ok(prp::PrpPlan::Two { prp1, prp2 }) => (prp1, prp2),
                _ => unreachable!("a validated range of a page or less plans as one or two entries"),
            };
            let shift = h.ns.block_size.trailing_zeros();
            let cmd = Cmd {
                sqe: Sqe::rw(op, Cid(0), nsid, Lba(file_offset >> shift), (size >> shift) as u32, 0, 0),
                prp: Some(prp::PrpPlan::Two { prp1, prp2 }),
                sgl: None,
                bytes: size as u32,
            };
            let (q, r) = h.run_scheduled(std::iter::once(cmd), name, op == NvmOpcode::Write, prio, size);
            RECENT.set(recent);
            return match r {
                Ok(0) => Ok(size),
                r => h.finish(q, r, name, Some(guard)).map(|short| size.saturating_sub(short as usize)),
            };
        }
        let cmd = |c: Chunk| Cmd {
            sqe: Sqe::rw(op, Cid(0), nsid, Lba(c.slba), c.nlb, 0, 0),
            // Cannot fail: the range was checked against the registration
            // and the chunker keeps each command within one PRP-list page.
            prp: Some(prp::plan(pages, PAGE_SIZE, c.data_off, c.len).expect("validated range plans")),
            sgl: None,
            bytes: c.len as u32,
        };
        let chunks = h.chunker(file_offset, data_off, size);
        let (q, r) = h.run_scheduled(chunks.map(cmd), name, op == NvmOpcode::Write, prio, size);
        RECENT.set(recent);
        match r {
            Ok(0) => Ok(size),
            r => h.finish(q, r, name, Some(guard)).map(|short| size.saturating_sub(short as usize)),
        }
    }

    /// Flushes the namespace's volatile write cache (NVMe Flush).
    pub fn flush(&self) -> Result<()> {
        let h = &*self.inner;
        let _in = h.enter()?;
        let q = h.next_sync_queue();
        let cmd = Cmd { sqe: Sqe::flush(Cid(0), Nsid(h.ns.nsid)), prp: None, sgl: None, bytes: 0 };
        let r = q.execute(std::iter::once(cmd), "Flush", h.opts.completion, h.opts.timeout, Pacing::NONE);
        h.finish(q, r, "Flush", None).map(drop)
    }

    /// Zeroes `size` bytes at `file_offset` (NVMe Write Zeroes).
    pub fn write_zeroes(&self, size: usize, file_offset: u64) -> Result<()> {
        let h = &*self.inner;
        let _in = h.enter()?;
        let bs = h.check_range(size, file_offset)?;
        let q = h.next_sync_queue();
        let first = file_offset / bs as u64;
        let blocks = (size / bs) as u64;
        let cmds = (0..blocks).step_by(65536).map(|b| Cmd {
            sqe: Sqe::write_zeroes(Cid(0), Nsid(h.ns.nsid), Lba(first + b), (blocks - b).min(65536) as u32),
            prp: None,
            sgl: None,
            bytes: 0,
        });
        let r = q.execute(cmds, "Write Zeroes", h.opts.completion, h.opts.timeout, Pacing::NONE);
        h.finish(q, r, "Write Zeroes", None).map(drop)
    }

    /// Closes the handle: waits for I/O in flight as `drain` says, deletes
    /// the queues and shuts the controller down. A refused close (busy,
    /// wedged) changes nothing.
    pub fn close(&self, drain: Drain) -> Result<()> {
        self.inner.close(drain)
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("id", &self.inner.id)
            .field("namespace", &self.inner.ns)
            .field("state", &self.state())
            .finish()
    }
}
