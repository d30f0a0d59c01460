//! An NVMe/RDMA I/O queue with many commands in flight: the queue pair a
//! `Handle` uses on an RDMA controller.
//!
//! Each command's capsule names its data in a Keyed SGL Data Block, and
//! the target moves the data itself (RDMA READ of a write's, RDMA WRITE of
//! a read's) before it sends the response. When the caller's buffer is
//! registered with the device (the platform's memory regions, in the
//! protection domain this queue's connection shares), the block names the
//! buffer itself: no copy. Otherwise each command identifier's table slot
//! owns a data area of [`STAGING`] bytes in the queue's registered memory
//! (beside its 64-byte capsule): a write's data is copied there when it is
//! staged, and a read's copied out when its response is consumed.
//!
//! A queue that ends (a failed work request, a broken response, a
//! disconnection) moves its queue pair to the error state and waits, for
//! at most [`DRAIN_WAIT`], until a receive completes flushed (one is
//! posted just before, so that there is one): the device flushes receives
//! once it serves the target no more, so from then on the target cannot
//! reach the caller's memory through it, and only then are the queue's
//! commands reported failed.
//! If that wait does not end, they are never reported, and the engine's
//! timeout keeps their memory (its quarantine).
//!
//! Capsules are sent at [`ring_sq_doorbell`](RdmaIoQueue::ring_sq_doorbell),
//! one SEND each, chained up to 16 to a post (signaled; the send queue
//! holds two per entry). A slot is used
//! again only after its command's response is consumed, which the target
//! sends after it has read the capsule and moved the data. Any failed work
//! request or malformed response ends the queue: every command on it then
//! completes with a transport error, and later ones are refused at once.
//!
//! Waiting: a polled queue is always worth a look. With an interrupt
//! vector the completion queue reports to a completion channel that the
//! platform watches (`ugds_platform::rdma`): each look takes the channel's
//! events, arms the completion queue for the next completion and only then
//! polls it (so a completion is either found by that poll or reported on
//! the channel), and watches the channel again when done; a look cut short
//! by its caller's limit, or a refusal or failure to report, keeps the
//! queue worth a look without a signal. A target that disconnects sends
//! nothing, so a look woken by no event (the engine's capped wait) asks
//! the connection manager whether the peer has gone.

mod stop;

use super::super::fabrics;
use super::super::qpair::{CqView, Full, Owner};
use super::super::stats::{QueueCounters, Staged};
use super::super::tracker::Tracker;
use super::{post_receive, response_sge, RdmaQueue, CQE_AT, DRAIN_ID, STAGING};
use crate::engine::transport::Transport;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds_nvme::status::generic;
use ugds_nvme::{Cid, Cqe, Qid, Sqe, Status};
use ugds_platform::rdma::{RdmaPlatform, Reach, ReachCache};
use ugds_platform::sys::verbs::{self, Sge, WorkCompletion};
use ugds_platform::Result;

/// SENDs that may be posted and not yet completed on a queue of `entries`:
/// every command in flight and as many whose responses came before their
/// SENDs' completions.
pub(super) fn sends_for(entries: u16) -> usize {
    2 * entries as usize
}

/// Where a queue of `entries` keeps its capsules (after the response
/// slots, one per entry) and its slots' data areas (after the capsules,
/// page aligned).
fn layout(entries: u16) -> (usize, usize) {
    let capsules = (CQE_AT + entries as usize * 16).next_multiple_of(64);
    (capsules, (capsules + entries as usize * 64).next_multiple_of(4096))
}

/// Set in a SEND's `wr_id` (the slot below it); receives use their
/// response slot's index.
const SEND_BIT: u64 = 1 << 63;

/// Empty polls with commands out between two looks at the connection
/// manager's events (a system call): a target that disconnects (its port
/// removed, say) flushes nothing on this side, so only that says so.
const EVENT_CHECK_POLLS: u32 = 1024;

/// The longest an ended queue waits for its queue pair to stop serving the
/// target (see the module docs).
pub const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Where an ended queue stands with its queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drain {
    /// Not ended, or ended and not yet drained.
    NotYet,
    /// In the error state and flushed: the target reaches nothing through it.
    Done,
    /// Not confirmed: its commands are never reported.
    Failed,
}

/// Which way a command's data goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Dir {
    #[default]
    None,
    /// Target to host: copied out when the response comes.
    In,
    /// Host to target: copied in when staged.
    Out,
}

/// What the queue keeps of each command besides the tracker's entry.
#[derive(Clone, Copy, Debug, Default)]
pub struct Transfer {
    dir: Dir,
    /// The caller's memory (its virtual address: the platform maps host
    /// memory one to one) and its length.
    addr: usize,
    len: u32,
    /// Named in the command itself (registered): nothing to copy.
    direct: bool,
    /// The status a refused command completes with at the next look.
    refused: Option<u16>,
}

/// An I/O queue of an NVMe/RDMA controller; see the module docs.
pub struct RdmaIoQueue {
    q: RdmaQueue,
    tracker: Tracker<Transfer>,
    entries: u16,
    /// (nsid, block size) of each namespace.
    blocks: Vec<(u32, u32)>,
    /// Where the capsules and the data areas are in the queue's memory.
    capsules_at: usize,
    data_base: usize,
    /// Slots whose capsules are staged, sent at the doorbell.
    staged: Vec<u16>,
    /// The SENDs of one doorbell (kept: no allocation per doorbell).
    sends_out: Vec<(u64, Sge)>,
    /// SENDs posted and not yet completed, and how many may be.
    sends: usize,
    send_room: usize,
    /// Commands refused at submission, completed at the next look.
    refused: Vec<Cid>,
    /// Why the queue ended, once it has.
    failure: Option<String>,
    /// Empty polls since the last look at the connection's events.
    quiet: u32,
    protocol_errors: u64,
    counts: Staged,
    counters: Arc<QueueCounters>,
    /// With a vector: non-zero while a look would find work no signal
    /// announces (see [`CqView`]); a polled queue is always worth a look.
    busy: Arc<AtomicU32>,
    /// The vector the platform signals when the completion channel has an
    /// event (interrupt completion); none: polled.
    irq: Option<u16>,
    /// The controller's platform: its memory regions and vectors.
    platform: Arc<RdmaPlatform>,
    /// Whether the connection is in the platform's protection domain (its
    /// memory regions may be named in commands).
    direct: bool,
    /// The mapping the last command's data was found in.
    last_region: ReachCache,
    /// Whether a receive completed flushed (the queue pair is in the error
    /// state and serves the target no more).
    flushed: bool,
    drain: Drain,
}

impl std::fmt::Debug for RdmaIoQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaIoQueue")
            .field("qid", &self.q.qid)
            .field("addr", &self.q.addr)
            .field("outstanding", &self.tracker.outstanding())
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

/// Registered memory a queue of `entries` needs.
pub(super) fn memory_for(entries: u16) -> usize {
    layout(entries).1 + (entries as usize - 1) * STAGING
}

impl RdmaIoQueue {
    /// The queue on a connection whose Fabrics Connect is done (`q` made
    /// with [`memory_for`]`(entries)` bytes, a receive per entry and room
    /// for [`sends_for`]`(entries)`; with a completion channel when `irq`
    /// names the vector to signal).
    pub(super) fn new(
        q: RdmaQueue,
        entries: u16,
        blocks: Vec<(u32, u32)>,
        platform: Arc<RdmaPlatform>,
        irq: Option<u16>,
    ) -> Result<RdmaIoQueue> {
        debug_assert!(q.mem.len() >= memory_for(entries) && q.receives == entries as usize);
        if let Some(v) = &irq {
            let channel = q.conn.cq().channel().ok_or_else(|| {
                ugds_platform::Error::InvalidArgument(
                    "an NVMe/RDMA queue with a vector needs a completion channel".into(),
                )
            })?;
            q.conn.cq().arm()?;
            platform.watch(channel.fd(), *v)?;
        }
        let (capsules_at, data_base) = layout(entries);
        let direct = q.conn.shares(platform.device());
        if !direct {
            tracing::warn!(
                qid = q.qid,
                "NVMe/RDMA: queue on another device than the admin queue's: its data is copied"
            );
        }
        Ok(RdmaIoQueue {
            q,
            // SQSIZE entries; one kept free as on a controller's ring.
            tracker: Tracker::new(entries - 1),
            entries,
            blocks,
            capsules_at,
            data_base,
            staged: Vec::with_capacity(entries as usize),
            sends_out: Vec::with_capacity(entries as usize),
            sends: 0,
            send_room: sends_for(entries),
            refused: Vec::new(),
            failure: None,
            quiet: 0,
            protocol_errors: 0,
            counts: Staged::default(),
            counters: Arc::default(),
            busy: Arc::default(),
            irq,
            direct,
            last_region: ReachCache::default(),
            flushed: false,
            platform,
            drain: Drain::NotYet,
        })
    }

    /// Whether a look would find work no signal announces: refusals to
    /// report, or commands of an ended queue to end.
    fn look_pending(&self) -> bool {
        !self.refused.is_empty()
            || (self.failure.is_some() && self.tracker.outstanding() > 0 && self.drain != Drain::Failed)
    }

    /// With a vector: publishes whether a look is due without a signal.
    fn publish_pending(&self, more: bool) {
        if self.irq.is_some() {
            self.busy.store((more || self.look_pending()) as u32, Ordering::Release);
        }
    }

    /// The transfer of `sqe` with its data at `addr` (PRP1), or the status
    /// it is refused with.
    fn transfer(&self, sqe: &Sqe, addr: Option<u64>) -> std::result::Result<Transfer, Status> {
        let Some((out, len)) = fabrics::command_data(sqe, &self.blocks) else {
            return Ok(Transfer::default());
        };
        let dir = if out { Dir::Out } else { Dir::In };
        // The engine splits requests at the controller's maximum transfer
        // (at most a slot): a longer command is a caller's error.
        match (addr, u32::try_from(len)) {
            (Some(addr), Ok(len32)) if len as usize <= STAGING => {
                Ok(Transfer { dir, addr: addr as usize, len: len32, direct: false, refused: None })
            }
            _ => Err(Status::generic(generic::INVALID_FIELD)),
        }
    }

    /// Where slot `slot`'s data area is in the queue's memory.
    fn data_at(&self, slot: usize) -> usize {
        self.data_base + slot * STAGING
    }

    /// Stages a command (its data at `addr`, PRP1 of its plan): a write's
    /// data is copied into the command's slot now, its capsule written
    /// there, and sent at [`ring_sq_doorbell`](Self::ring_sq_doorbell).
    pub fn submit(&mut self, mut sqe: Sqe, addr: Option<u64>, owner: Owner) -> std::result::Result<Cid, Full> {
        if self.tracker.is_full() {
            return Err(Full::Cid);
        }
        if self.sends + self.staged.len() >= self.send_room {
            return Err(Full::Sq);
        }
        let mut t = match self.transfer(&sqe, addr) {
            Ok(t) => t,
            Err(s) => Transfer { refused: Some(s.to_field(false)), ..Default::default() },
        };
        // The caller's buffer registered in this connection's domain: the
        // command names it. Copied only from host memory mapped as such;
        // anything else is refused, never touched.
        let mut rkey = None;
        if t.len > 0 && t.refused.is_none() {
            match (self.platform.reach(&mut self.last_region, t.addr as u64, t.len), self.direct) {
                (Reach::Direct(k) | Reach::Device(k), true) => rkey = Some(k),
                (Reach::Direct(_) | Reach::Copy, _) => {}
                (reach, _) => {
                    tracing::error!(
                        qid = self.q.qid,
                        "NVMe/RDMA: {} bytes at {:#x} refused: {}",
                        t.len,
                        t.addr,
                        match reach {
                            Reach::Device(_) =>
                                "device memory, and this queue is outside the domain it is registered in",
                            _ => "in no buffer mapped for this controller",
                        }
                    );
                    t.refused = Some(Status::generic(generic::INVALID_FIELD).to_field(false));
                }
            }
        }
        t.direct = rkey.is_some();
        let cid = self.tracker.begin_with(owner, None, t).expect("a CID is free");
        self.counts.add(sqe.opcode(), sqe.nlb());
        self.tracker.staged(cid, &sqe);
        if t.refused.is_some() || self.failure.is_some() {
            self.refused.push(cid);
            self.publish_pending(false);
            return Ok(cid);
        }
        let slot = self.tracker.slot(cid);
        let at = self.data_at(slot);
        if t.dir == Dir::Out && !t.direct {
            assert!(at + t.len as usize <= self.q.mem.len(), "a slot's data lies in the queue's memory");
            // SAFETY: the source is the command's memory (the caller's
            // registered buffer, held by its request until this command
            // completes; `len` bytes checked by the engine against the
            // registration); the destination is this slot's area of the
            // queue's memory (checked above), which no command in flight
            // uses: the slot is this command's until its response.
            unsafe { std::ptr::copy_nonoverlapping(t.addr as *const u8, self.q.mem.vaddr().add(at), t.len as usize) };
        }
        sqe.set_cid(cid);
        // Every command names its data with a Keyed SGL Data Block, one of
        // length 0 when it has none (nvmet-rdma refuses other descriptors).
        sqe = match rkey {
            Some(rkey) => sqe.with_keyed_data(t.addr as u64, t.len, rkey),
            None if t.len > 0 => {
                self.counters.copied.add(1);
                sqe.with_keyed_data(self.q.mr.addr() + at as u64, t.len, self.q.mr.rkey())
            }
            None => sqe.with_keyed_data(0, 0, 0),
        };
        self.q.mem.write_sqe(self.capsules_at + slot * 64, &sqe);
        self.staged.push(slot as u16);
        Ok(cid)
    }

    /// Ends the queue: what is outstanding completes with a transport
    /// error at the next look.
    fn fail(&mut self, why: String) {
        if self.failure.is_none() {
            tracing::error!(qid = self.q.qid, "{why}");
            self.failure = Some(why);
        }
    }

    /// A response or work completion that breaks the protocol ends the
    /// queue.
    fn violation(&mut self, why: String) {
        self.protocol_errors += 1;
        self.fail(format!("{} broke the NVMe/RDMA protocol: {why}", self.q.addr));
    }

    /// The status of commands on a queue that ended.
    fn transport_error() -> u16 {
        Status { dnr: true, ..Status::generic(generic::TRANSIENT_TRANSPORT_ERROR) }.to_field(false)
    }

    /// Takes the completion channel's events and arms the completion queue
    /// for the next completion; how many events there were. A failure
    /// leaves the queue to the engine's capped waits.
    fn arm(&mut self) -> u32 {
        let cq = self.q.conn.cq();
        let events = cq.take_events().unwrap_or_else(|e| {
            tracing::warn!(qid = self.q.qid, "NVMe/RDMA: completion channel: {e}; waits are capped");
            0
        });
        if let Err(e) = cq.arm() {
            tracing::warn!(qid = self.q.qid, "NVMe/RDMA: completion queue not armed ({e}); waits are capped");
        }
        events
    }
}

impl Drop for RdmaIoQueue {
    fn drop(&mut self) {
        if let (Some(_), Some(c)) = (self.irq, self.q.conn.cq().channel()) {
            self.platform.unwatch(c.fd());
        }
    }
}

impl Transport for RdmaIoQueue {
    type Extra = Transfer;

    /// Queue identifier.
    fn qid(&self) -> Qid {
        Qid(self.q.qid)
    }

    /// Entries (the connection's SQSIZE).
    fn entries(&self) -> u16 {
        self.entries
    }

    /// The interrupt vector the platform signals, if any (none: polled).
    fn vector(&self) -> Option<u16> {
        self.irq
    }

    /// Commands that may be submitted now.
    fn free_slots(&self) -> usize {
        (self.tracker.capacity() as usize - self.tracker.outstanding())
            .min(self.send_room - self.sends - self.staged.len())
    }

    /// Responses that broke the protocol (each ended the queue).
    fn protocol_errors(&self) -> u64 {
        self.protocol_errors
    }

    /// The commands in flight.
    fn tracker_mut(&mut self) -> &mut Tracker<Transfer> {
        &mut self.tracker
    }

    /// The tracker, read only.
    fn tracker(&self) -> &Tracker<Transfer> {
        &self.tracker
    }

    /// What this queue has done.
    fn counters(&self) -> &Arc<QueueCounters> {
        &self.counters
    }

    /// Polled: always worth a look (responses arrive on the completion
    /// queue, which only a poll finds). With a vector: worth a look when
    /// signalled, or while `busy`.
    fn cq_view(&self) -> CqView {
        CqView::kernel(self.irq.is_none(), self.busy.clone())
    }

    /// Whether a look may find something. Polled: always, while commands
    /// are out. With a vector: only while a look would find work no
    /// signal announces (else the vector says when), so that a waiter
    /// sleeps.
    fn completion_pending(&mut self) -> bool {
        match self.irq {
            Some(_) => self.busy.load(Ordering::Acquire) != 0 || self.look_pending(),
            None => self.tracker.outstanding() > 0,
        }
    }

    /// Consumes up to `max` responses (all the work completions of a poll
    /// are consumed), calling `f(owner, cqe)` for each command that
    /// finished. Returns how many.
    fn process_completions(&mut self, max: usize, mut f: impl FnMut(Owner, &Cqe)) -> usize {
        let (n, failed) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0u64));
        let qid = self.q.qid;
        let mut report = |owner: Owner, cqe: &Cqe| {
            n.set(n.get() + 1);
            failed.set(failed.get() + !cqe.is_success() as u64);
            f(owner, cqe)
        };
        // Interrupts: the channel's events taken, the queue armed, then
        // polled (a completion after the arming is reported on the channel).
        let events = match self.irq {
            Some(_) => self.arm(),
            None => 0,
        };
        for cid in std::mem::take(&mut self.refused) {
            let e = self.tracker.end(cid, 0).expect("outstanding");
            let status = e.extra.refused.unwrap_or(Self::transport_error());
            report(e.owner, &Cqe { dw0: 0, dw1: 0, sqhd: 0, sqid: qid, cid: cid.0, status });
        }
        let mut wcs = [WorkCompletion::default(); 16];
        while n.get() < max && self.failure.is_none() && (self.tracker.outstanding() > 0 || self.sends > 0) {
            let k = match self.q.conn.cq().poll(&mut wcs) {
                Ok(0) => {
                    self.quiet += 1;
                    // Woken by no event and nothing found: the capped wait
                    // of a queue whose peer may have gone.
                    let woken_idle = self.irq.is_some() && events == 0 && n.get() == 0;
                    if self.quiet >= EVENT_CHECK_POLLS || woken_idle {
                        self.quiet = 0;
                        if self.q.conn.disconnected() {
                            self.fail(format!("NVMe/RDMA: {} disconnected queue {qid}", self.q.addr));
                        }
                    }
                    break;
                }
                Ok(k) => k,
                Err(e) => {
                    self.fail(format!("NVMe/RDMA: polling the completion queue of {}: {e}", self.q.addr));
                    break;
                }
            };
            self.quiet = 0;
            for wc in &wcs[..k] {
                match wc.wr_id & SEND_BIT {
                    0 => self.flushed |= wc.status == verbs::WC_WR_FLUSH_ERR,
                    _ if wc.status != 0 => self.sends = self.sends.saturating_sub(1),
                    _ => {}
                }
                if wc.status != 0 {
                    self.fail(format!(
                        "NVMe/RDMA: {} on queue {} to {}: {} (status {}, vendor error {:#x})",
                        if wc.wr_id & SEND_BIT != 0 { "a send" } else { "a receive" },
                        qid,
                        self.q.addr,
                        verbs::wc_status_str(wc.status),
                        wc.status,
                        wc.vendor_err
                    ));
                    continue;
                }
                if wc.wr_id & SEND_BIT != 0 {
                    self.sends = self.sends.saturating_sub(1);
                    continue;
                }
                let slot = wc.wr_id as usize;
                if wc.opcode != verbs::WC_RECV || slot >= self.q.receives || wc.byte_len != 16 {
                    self.violation(format!(
                        "a completion of {} bytes (opcode {}, request {}) where a 16-byte response was due",
                        wc.byte_len, wc.opcode, wc.wr_id
                    ));
                    continue;
                }
                let mut cqe = self.q.mem.read_cqe(CQE_AT + slot * 16);
                if let Err(e) = post_receive(&self.q.poster, &self.q.mr, slot) {
                    self.fail(format!("NVMe/RDMA: a receive on queue {qid} not posted again: {e}"));
                }
                let cid = Cid(cqe.cid);
                let Some(t) = self.tracker.get_mut(cid).map(|e| e.extra) else {
                    self.violation(format!("a response for command {:#06x}, which is not in flight", cid.0));
                    continue;
                };
                if t.refused.is_some() {
                    self.violation(format!("a response for command {:#06x}, which was never sent", cid.0));
                    continue;
                }
                if cqe.is_success() && t.dir == Dir::In && !t.direct {
                    let at = self.data_at(self.tracker.slot(cid));
                    assert!(at + t.len as usize <= self.q.mem.len(), "a slot's data lies in the queue's memory");
                    // SAFETY: the target wrote this slot's area before it
                    // sent the response (one reliable connection keeps
                    // them in order); the destination is the command's
                    // memory, held by its request until it is reported
                    // below, `len` bytes checked by the engine.
                    unsafe {
                        std::ptr::copy_nonoverlapping(self.q.mem.vaddr().add(at), t.addr as *mut u8, t.len as usize)
                    };
                }
                let e = self.tracker.end(cid, cqe.status).expect("looked up above");
                cqe.sqid = qid;
                report(e.owner, &cqe);
            }
        }
        if self.failure.is_some() && self.tracker.outstanding() > 0 && self.stop() {
            // Everything on the queue is lost with it; the target can no
            // longer reach the caller's memory through it (stopped).
            let status = Self::transport_error();
            let cids: Vec<Cid> = self.tracker.outstanding_commands().map(|(c, _)| c).collect();
            for cid in cids {
                let e = self.tracker.end(cid, status).expect("outstanding");
                report(e.owner, &Cqe { dw0: 0, dw1: 0, sqhd: 0, sqid: qid, cid: cid.0, status });
            }
            self.staged.clear();
        }
        self.counters.completed.add(n.get() as u64);
        self.counters.errors.add(failed.get());
        if let Some(v) = self.irq {
            // Cut short by `max`: completions may wait that no event
            // announces (they came before the arming).
            self.publish_pending(n.get() >= max);
            if self.failure.is_none() {
                if let Some(c) = self.q.conn.cq().channel() {
                    if let Err(e) = self.platform.rearm(c.fd(), v) {
                        tracing::warn!(qid, "NVMe/RDMA: completion channel not watched again ({e}); waits are capped");
                    }
                }
            }
        }
        n.get()
    }

    /// Sends the staged capsules, one SEND each, chained.
    fn ring_sq_doorbell(&mut self) {
        self.counts.publish(&self.counters);
        if self.staged.is_empty() {
            return;
        }
        // The capsules and data written above are in memory before the
        // device reads them: ibv_post_send's own barrier orders them (as
        // the doorbell's does on a controller).
        let (addr, lkey) = (self.q.mr.addr(), self.q.mr.lkey());
        self.sends_out.clear();
        self.sends_out.extend(self.staged.iter().map(|&slot| {
            let at = self.capsules_at + slot as usize * 64;
            (SEND_BIT | slot as u64, Sge { addr: addr + at as u64, length: 64, lkey })
        }));
        // Chained: one post per chain, not per capsule.
        let (posted, r) = self.q.poster.send_all(&self.sends_out);
        self.sends += posted;
        let failed = r.err();
        self.staged.clear();
        self.counters.doorbell_writes.add(1);
        if let Some(e) = failed {
            // A capsule not sent leaves its command without an answer: the
            // queue ends, and every command on it completes at the next look.
            self.fail(format!("NVMe/RDMA: a capsule to {} not sent: {e}", self.q.addr));
            self.publish_pending(false);
        }
    }

    /// Forgets every outstanding command: after the handle gave up on
    /// them (the queue pair is stopped first, so that the target cannot
    /// reach their memory once it is given back, as far as this side can
    /// tell); the queue is not used again.
    fn forget_outstanding(&mut self) -> usize {
        let n = self.tracker.outstanding();
        if n > 0 && !self.stop() {
            tracing::error!(qid = self.q.qid, "NVMe/RDMA: commands given up on a queue pair not confirmed stopped");
        }
        let _ = self.tracker.forget_all();
        self.refused.clear();
        self.staged.clear();
        self.fail(format!("NVMe/RDMA: queue {} to {}: its commands were given up", self.q.qid, self.q.addr));
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The response slots, the capsules and the data areas of a queue of
    /// any size it may be lie apart, in the queue's memory, with the data
    /// page aligned.
    #[test]
    fn a_queues_memory_holds_each_entrys_pieces_apart() {
        for entries in 2..=super::super::IO_ENTRIES {
            let (capsules, data) = layout(entries);
            let n = entries as usize;
            assert!(CQE_AT + n * 16 <= capsules, "{entries}: responses before the capsules");
            assert_eq!(capsules % 64, 0);
            assert!(capsules + n * 64 <= data, "{entries}: capsules before the data");
            assert_eq!(data % 4096, 0);
            // The tracker's slots are 0..entries - 1.
            assert_eq!(memory_for(entries), data + (n - 1) * STAGING);
            assert!(sends_for(entries) >= 2 * (n - 1), "a SEND per command in flight, and as many unacknowledged");
        }
        assert_eq!(layout(32), (576, 4096));
    }
}
