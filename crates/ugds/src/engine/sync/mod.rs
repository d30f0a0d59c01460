//! Synchronous requests on shared queue pairs.
//!
//! Several threads may have requests outstanding on one queue pair. The
//! queue pair's lock is held only to stage commands and to consume
//! completions, never while waiting for the device: a waiting thread takes
//! the lock when it can, consumes whatever completed (its own commands or
//! anyone's), and lets go. Each request owns a slot of atomics, preallocated
//! with the queue, where completions are counted; a thread whose request was
//! completed by another sees it there.
//!
//! In interrupt mode threads sleep for a completion, a free request slot or
//! room in the submission queue. One of them at a time (the leader) sleeps
//! on the eventfd of the queue's vector (and on the queue's own kick
//! eventfd), and only it drains them; the others sleep on a condition
//! variable. Each wake-up-worthy event (an interrupt, completions consumed,
//! a slot freed) bumps an epoch under the sleepers' mutex and wakes them all
//! (the leader through the kick eventfd), and a thread about to sleep that
//! sees the epoch moved since it last looked looks again: no wake-up is
//! lost. A vector may be shared by several queues (fewer vectors than
//! queues, as Linux shares them): whoever drains it wakes the other queues
//! on it, which then look at their own completion queues. The eventfds are
//! only hints: the phase tag decides.

mod wait;

use super::contexts::BatchTable;
use super::qpair::CqView;
use super::queue::QueuePair;
use super::requests::RequestTable;
use super::stats::QueueCounters;
use super::tracker::Owner;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};
use ugds_nvme::prp::PrpPlan;
use ugds_nvme::{regs, Sqe, Status};
use ugds_platform::sys::EventFd;
use ugds_platform::Platform;
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// How completions are waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Completion {
    /// Spin on the completion queue's phase tag (the default).
    #[default]
    Poll,
    /// Sleep on the queue's interrupt eventfd between checks.
    Interrupt,
}

/// One command of a request: the entry (CID and PRPs filled in at submit)
/// and its data.
pub struct Cmd<'a> {
    /// The entry.
    pub sqe: Sqe,
    /// Its PRPs, for commands that move data.
    pub prp: Option<PrpPlan<'a>>,
    /// Or its data as an SGL of these pieces (the controller takes SGLs).
    pub sgl: Option<&'a [ugds_nvme::sgl::Piece<'a>]>,
    /// The bytes it moves (what it adds to the queue's load).
    pub bytes: u32,
}

/// What the scheduler asks of a request (see `handle::scheduler`): whether
/// its bytes count as background load, and how many of its commands may be
/// on the device at once while other work waits.
#[derive(Clone, Copy)]
pub struct Pacing<'a> {
    /// Its bytes count in the queue's background load too.
    pub background: bool,
    /// Its bytes count in the queue's urgent load too (what large normal
    /// requests make room for).
    pub urgent: bool,
    /// At most this many commands on the device while the function says
    /// other work waits (asked before each command beyond them).
    pub window: Option<(u32, &'a dyn Fn() -> bool)>,
}

impl std::fmt::Debug for Pacing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pacing")
            .field("background", &self.background)
            .field("urgent", &self.urgent)
            .field("window", &self.window.map(|(n, _)| n))
            .finish()
    }
}

impl Pacing<'_> {
    /// A request of normal class, never held back.
    pub const NONE: Pacing<'static> = Pacing { background: false, urgent: false, window: None };

    /// Whether the request in `slot` must wait before staging another
    /// command.
    #[inline]
    fn full(&self, slot: &Slot) -> bool {
        self.window.is_some_and(|(n, yield_now)| slot.pending.load(Ordering::Relaxed) >= n && yield_now())
    }
}

impl std::fmt::Debug for Cmd<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cmd").field("sqe", &self.sqe).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Slot {
    /// Commands submitted and not completed.
    pending: AtomicU32,
    /// First error status (the CQE status field with bit 31 set), or 0.
    status: AtomicU32,
    /// Bytes the request's commands did not move (a read that met the end
    /// of a kernel-path file).
    short: AtomicU64,
    /// Bytes of the request's commands staged (its share of the load).
    bytes: AtomicU64,
    /// Whether they count as background load.
    background: AtomicBool,
    /// Whether they count as urgent load.
    urgent: AtomicBool,
}

const STATUS_SET: u32 = 1 << 31;

/// What the queue pair's lock guards.
pub(crate) struct State {
    pub qp: QueuePair,
    /// Which request slots are free: the queue's request table, whose
    /// entries' bodies are the atomics in [`SyncQueue`]'s `slots` (a caller
    /// waits on its own without the lock).
    requests: RequestTable<()>,
    /// Batch contexts using this queue pair (see [`super::batch`]).
    pub batch: BatchTable,
}

/// A queue pair shared by synchronous callers.
pub struct SyncQueue {
    state: Mutex<State>,
    slots: Box<[Slot]>,
    /// The completion ring, for waiting without the lock; and where the
    /// next completion appears (head << 1 | phase), published after each
    /// reap.
    cq: CqView,
    cursor: AtomicU32,
    platform: Arc<dyn Platform>,
    vector: Option<u16>,
    qid: u16,
    /// Interrupt-mode sleepers (see the module's comment).
    sleep: Mutex<Sleepers>,
    woken: Condvar,
    /// Wakes this queue's leader (interrupt mode with a vector).
    kick: Option<EventFd>,
    /// The other queues on this queue's vector, when it is shared.
    siblings: OnceLock<Box<[Weak<SyncQueue>]>>,
    /// Interrupt waits that lasted to their cap without a wake-up (a lost
    /// wake-up, or a device that went quiet).
    capped_waits: AtomicU64,
    /// Those of them whose waiter then found its work ready: a wake-up that
    /// should have come and did not.
    lost_wakeups: AtomicU64,
    /// Set when the vector's eventfd fired, cleared by the next reap: a
    /// completion may be waiting even where the ring cannot be looked at
    /// without the lock (the kernel path's).
    irq_hint: AtomicBool,
    /// The queue pair's counters, for the interrupts its waiters see.
    counters: Arc<QueueCounters>,
    /// Bytes of the requests on this queue (staged and not finished): what
    /// the scheduler places by. Written under the queue's lock only.
    load: super::stats::Counter,
    /// Of `load`, the background requests' bytes.
    background_load: super::stats::Counter,
    /// Of `load`, the urgent requests' bytes (see [`Pacing::urgent`]).
    urgent_load: super::stats::Counter,
    /// Whether completions report bytes not moved in DW0 (the kernel
    /// path's; a controller's DW0 of a Read or Write says nothing).
    reports_short: bool,
}

impl std::fmt::Debug for SyncQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncQueue").field("qid", &self.qid).field("vector", &self.vector).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Sleepers {
    /// Bumped by each wake-up-worthy event.
    epoch: u32,
    /// A thread sleeps on the eventfd.
    leader: bool,
}

/// The longest one interrupt wait sleeps before looking again.
const WAIT_CAP: Duration = Duration::from_millis(100);

/// A request's deadline, read from the clock only when first needed (a
/// wait that lasts, or an interrupt wait): most requests complete sooner
/// and never read the clock. The timeout thus counts from a few hundred
/// polls after submission.
struct Deadline {
    timeout: Duration,
    at: Option<Instant>,
}

impl Deadline {
    fn new(timeout: Duration) -> Deadline {
        Deadline { timeout, at: None }
    }

    fn at(&mut self) -> Instant {
        let timeout = self.timeout;
        *self.at.get_or_insert_with(|| Instant::now() + timeout)
    }

    fn passed(&mut self) -> bool {
        let at = self.at();
        Instant::now() > at
    }
}

/// Why a request did not finish normally: the detail the handle needs to
/// decide whether to wedge.
#[derive(Debug)]
pub enum Failure {
    /// Finished with an error; nothing is left in flight.
    Error(Error),
    /// Commands are still outstanding and will stay so: the slot is
    /// quarantined and whatever the request holds must be kept.
    Stuck(Error),
    /// The deadline passed with commands outstanding on a controller that
    /// still answers: the caller may try Abort, then [`SyncQueue::settle`].
    Late {
        /// The timeout, for the caller to report if nothing helps.
        error: Error,
        /// The request's slot (still taken).
        slot: u32,
    },
}

impl SyncQueue {
    /// Wraps a created queue pair.
    pub fn new(qp: QueuePair, platform: Arc<dyn Platform>) -> Result<SyncQueue> {
        let n = qp.free_slots() as u32;
        let (vector, qid) = (qp.vector(), qp.qid().0);
        let reports_short = qp.reports_short();
        let counters = qp.counters().clone();
        let cq = qp.cq_view();
        let (head, phase) = qp.cq_cursor();
        let kick = match vector {
            Some(_) => Some(EventFd::new()?),
            None => None,
        };
        Ok(SyncQueue {
            state: Mutex::new(State { qp, requests: RequestTable::filled(n, || ()), batch: BatchTable::default() }),
            slots: (0..n).map(|_| Slot::default()).collect(),
            cq,
            cursor: AtomicU32::new(head << 1 | phase as u32),
            platform,
            vector,
            qid,
            sleep: Mutex::default(),
            woken: Condvar::new(),
            kick,
            siblings: OnceLock::new(),
            capped_waits: AtomicU64::new(0),
            lost_wakeups: AtomicU64::new(0),
            irq_hint: AtomicBool::new(false),
            counters,
            load: Default::default(),
            background_load: Default::default(),
            urgent_load: Default::default(),
            reports_short,
        })
    }

    /// Tells the queue which other queues share its interrupt vector (set
    /// once, at open).
    pub(crate) fn set_siblings(&self, siblings: Box<[Weak<SyncQueue>]>) {
        let _ = self.siblings.set(siblings);
    }

    /// The interrupt vector, if the queue has one.
    pub fn vector(&self) -> Option<u16> {
        self.vector
    }

    /// Bytes of the requests on this queue now (staged, not finished).
    #[inline]
    pub fn load(&self) -> u64 {
        self.load.get()
    }

    /// Of [`load`](Self::load), the bytes of background requests.
    pub fn background_load(&self) -> u64 {
        self.background_load.get()
    }

    /// Of [`load`](Self::load), the bytes of urgent requests.
    pub fn urgent_load(&self) -> u64 {
        self.urgent_load.get()
    }

    /// Interrupt waits that lasted to their cap (see [`WAIT_CAP`]).
    pub fn capped_waits(&self) -> u64 {
        self.capped_waits.load(Ordering::Relaxed)
    }

    /// Capped waits whose waiter then found its work ready (its request
    /// done, a completion posted, a slot or SQ room free): a lost wake-up or
    /// a missed interrupt. A slow device or copy leaves nothing ready (on
    /// the H200, waits capped while the queue's other threads polled it some
    /// 300000 times with GPU copies still running).
    pub fn lost_wakeups(&self) -> u64 {
        self.lost_wakeups.load(Ordering::Relaxed)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().recover()
    }

    /// The queue pair, for teardown (locks it).
    pub fn with_qp<R>(&self, f: impl FnOnce(&mut QueuePair) -> R) -> R {
        f(&mut self.lock().qp)
    }

    /// As [`with_qp`](Self::with_qp) when the lock is free now; `None` when
    /// it is held (by a caller up the stack, perhaps).
    pub fn try_with_qp<R>(&self, f: impl FnOnce(&mut QueuePair) -> R) -> Option<R> {
        use std::sync::TryLockError;
        match self.state.try_lock() {
            Ok(mut g) => Some(f(&mut g.qp)),
            Err(TryLockError::Poisoned(p)) => Some(f(&mut p.into_inner().qp)),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Consumes completions, crediting each to its request's slot (or
    /// batch request). Returns how many were consumed and whether any
    /// belonged to another request.
    fn reap(&self, st: &mut State, mine: u32) -> (usize, bool) {
        let mut others = false;
        if self.irq_hint.load(Ordering::Relaxed) {
            // Cleared before the ring is read (see `note_interrupt`).
            self.irq_hint.swap(false, Ordering::SeqCst);
        }
        let slots = &self.slots;
        let reports_short = self.reports_short;
        let State { qp, batch, .. } = st;
        let n = qp.process_completions(usize::MAX, |owner, cqe| {
            let short = if reports_short { cqe.dw0 } else { 0 };
            let slot = match owner {
                Owner::Sync(slot) => slot,
                Owner::Batch { ctx, req } => {
                    batch.credit(ctx, req, cqe, short);
                    others = true;
                    return;
                }
                Owner::Own(_) => unreachable!("a shared queue pair's commands are synchronous or batch"),
            };
            let s = &slots[slot as usize];
            if short != 0 {
                s.short.fetch_add(short as u64, Ordering::Relaxed);
            }
            let status = cqe.status();
            if !status.is_success() {
                let _ =
                    s.status.compare_exchange(0, STATUS_SET | cqe.status as u32, Ordering::Relaxed, Ordering::Relaxed);
            }
            s.pending.fetch_sub(1, Ordering::Release);
            others |= slot != mine;
        });
        if n > 0 {
            let (head, phase) = st.qp.cq_cursor();
            self.cursor.store(head << 1 | phase as u32, Ordering::Release);
        }
        (n, others)
    }

    /// Consumes every completion for a caller that is not a synchronous
    /// request (batch contexts): synchronous waiters asleep on this queue
    /// are woken when any was consumed.
    pub(crate) fn reap_all(&self, st: &mut State) -> usize {
        let copies = self.cq.busy();
        let (n, _) = self.reap(st, u32::MAX);
        // Copies started here (the kernel path's GPU commands) finish only
        // by looking: a synchronous waiter asleep on the eventfd must look.
        if (n > 0 || self.cq.busy() > copies) && self.vector.is_some() {
            self.wake_sleepers(Completion::Interrupt);
        }
        n
    }

    /// Whether a completion is waiting to be consumed (no lock taken).
    #[inline]
    pub(crate) fn completion_waiting(&self) -> bool {
        let c = self.cursor.load(Ordering::Acquire);
        self.cq.is_new(c >> 1, c & 1 != 0) || self.irq_hint.load(Ordering::Acquire)
    }

    /// Stages as many of `cmds` as fit (and as `pacing` allows); true when
    /// any was staged.
    fn stage<'a>(
        &self,
        st: &mut State,
        slot: u32,
        cmds: &mut std::iter::Peekable<impl Iterator<Item = Cmd<'a>>>,
        pacing: Pacing<'_>,
    ) -> bool {
        let mut any = false;
        let s = &self.slots[slot as usize];
        while let Some(c) = cmds.peek() {
            if s.status.load(Ordering::Relaxed) != 0 {
                // An earlier command of this request failed: send no more.
                cmds.by_ref().for_each(drop);
                break;
            }
            if pacing.full(s) {
                break;
            }
            // Counted as load (and urgent or background load) before the
            // command is staged, and taken back if it does not go: another
            // queue's large request that looks after this command's
            // submission stamp then sees it.
            let bytes = c.bytes as u64;
            self.load.add(bytes);
            if pacing.urgent {
                self.urgent_load.add(bytes);
            }
            if pacing.background {
                self.background_load.add(bytes);
            }
            let staged = match c.sgl {
                Some(pieces) => st.qp.submit_sgl(c.sqe, pieces, Owner::Sync(slot)),
                None => st.qp.submit(c.sqe, c.prp, Owner::Sync(slot)),
            };
            match staged {
                Ok(_) => {
                    s.pending.fetch_add(1, Ordering::Relaxed);
                    s.bytes.store(s.bytes.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
                    cmds.next();
                    any = true;
                }
                Err(_) => {
                    // Full: wait for completions to free room.
                    self.load.set(self.load.get() - bytes);
                    if pacing.urgent {
                        self.urgent_load.set(self.urgent_load.get() - bytes);
                    }
                    if pacing.background {
                        self.background_load.set(self.background_load.get() - bytes);
                    }
                    break;
                }
            }
        }
        if any {
            st.qp.ring_sq_doorbell();
        }
        any
    }

    /// Runs `cmds` as one request and waits for all of them; the first
    /// error status (if any) is the result, else the bytes the commands did
    /// not move (0 but for a read that met the end of a kernel-path file).
    /// `timeout` bounds the wait for the device; when it passes, the
    /// request is stuck and its slot is kept. `pacing` holds its commands
    /// back while other work waits, as far as it says.
    pub fn execute<'a>(
        &self,
        cmds: impl Iterator<Item = Cmd<'a>>,
        op: &'static str,
        mode: Completion,
        timeout: Duration,
        pacing: Pacing<'_>,
    ) -> Result<u64, Failure> {
        let mut cmds = cmds.peekable();
        let mut deadline = Deadline::new(timeout);
        let mut spins = 0u32;
        let mut seen = match mode {
            Completion::Interrupt => self.sleep.lock().recover().epoch,
            Completion::Poll => 0,
        };
        // Whether the last wait slept to its cap.
        let mut capped = false;
        // Take a slot; when every slot is in use, help the others finish.
        let slot = loop {
            let after_cap = std::mem::take(&mut capped);
            let mut st = self.lock();
            if let Some(s) = st.requests.take() {
                self.note_look(after_cap, true);
                self.slots[s as usize].pending.store(0, Ordering::Relaxed);
                self.slots[s as usize].status.store(0, Ordering::Relaxed);
                self.slots[s as usize].short.store(0, Ordering::Relaxed);
                self.slots[s as usize].bytes.store(0, Ordering::Relaxed);
                self.slots[s as usize].background.store(pacing.background, Ordering::Relaxed);
                self.slots[s as usize].urgent.store(pacing.urgent, Ordering::Relaxed);
                self.stage(&mut st, s, &mut cmds, pacing);
                break s;
            }
            let (n, _) = self.reap(&mut st, u32::MAX);
            drop(st);
            self.note_look(after_cap, n > 0);
            if n > 0 {
                self.wake_sleepers(mode);
            }
            if deadline.passed() {
                return Err(Failure::Error(Error::QueueFull));
            }
            capped = self.wait(mode, &mut spins, &mut deadline, &mut seen);
        };
        let s = &self.slots[slot as usize];
        loop {
            let mut progressed = false;
            let mut after_cap = std::mem::take(&mut capped);
            let done = cmds.peek().is_none() && s.pending.load(Ordering::Acquire) == 0;
            if after_cap && (done || self.completion_posted()) {
                self.note_look(true, true);
                after_cap = false;
            }
            // Commands to stage, and room for them.
            let staging = cmds.peek().is_some() && !pacing.full(s);
            // Take the lock only when there is something to do under it:
            // a completion to consume, commands to stage, or our slot to free.
            let work = done || staging || self.completion_waiting();
            if !work {
                if spins % 256 == 255 && (deadline.passed() || self.platform.gone()) {
                    return Err(self.timed_out(slot, op, timeout));
                }
                capped = self.wait(mode, &mut spins, &mut deadline, &mut seen);
                continue;
            }
            // Our own work (the slot to free, commands to stage) takes the
            // lock whatever it costs: whoever holds it may have nothing to
            // wake us with. Someone else's completion is left to the holder
            // when the lock is busy (it reaps, and wakes us if it consumed any).
            let own = done || staging;
            let st = if own { Some(self.lock()) } else { self.state.try_lock().ok() };
            if let Some(mut st) = st {
                let (n, _) = self.reap(&mut st, slot);
                progressed = n > 0;
                if staging {
                    progressed |= self.stage(&mut st, slot, &mut cmds, pacing);
                }
                self.note_look(after_cap, progressed);
                if cmds.peek().is_none() && s.pending.load(Ordering::Acquire) == 0 {
                    let r = self.release_slot(&mut st, slot, op).map_err(Failure::Error);
                    drop(st);
                    // A slot and perhaps SQ room are free: anyone asleep
                    // for them (or for completions consumed here) looks.
                    self.wake_sleepers(mode);
                    return r;
                }
                drop(st);
                if n > 0 {
                    self.wake_sleepers(mode);
                }
            }
            if !progressed {
                if spins % 256 == 255 && (deadline.passed() || self.platform.gone()) {
                    return Err(self.timed_out(slot, op, timeout));
                }
                capped = self.wait(mode, &mut spins, &mut deadline, &mut seen);
            }
        }
    }

    /// The escalation once a request's deadline passed: look at the
    /// controller, check the queue one last time (a missed interrupt), and
    /// otherwise give the request up as stuck. Its slot stays taken.
    fn timed_out(&self, slot: u32, op: &'static str, timeout: Duration) -> Failure {
        let mut st = self.lock();
        self.reap(&mut st, slot);
        let s = &self.slots[slot as usize];
        if s.pending.load(Ordering::Acquire) == 0 {
            // It completed in that last look: a late success is still late.
            let r = self.release_slot(&mut st, slot, op);
            return Failure::Error(r.err().unwrap_or(Error::Timeout { qid: self.qid, cid: None, after: timeout }));
        }
        let csts = regs::Csts(self.platform.read32(regs::CSTS));
        if csts.is_gone() {
            return Failure::Stuck(Error::DeviceGone);
        }
        if csts.cfs() {
            return Failure::Stuck(Error::ControllerFatal);
        }
        let cid = st.qp.outstanding_cid_of(Owner::Sync(slot));
        tracing::error!(qid = self.qid, ?cid, ?timeout, "{op} timed out");
        Failure::Late { error: Error::Timeout { qid: self.qid, cid, after: timeout }, slot }
    }

    /// Frees a finished request's slot; its first error status, if any, is
    /// the result, else the bytes not moved.
    fn release_slot(&self, st: &mut State, slot: u32, op: &'static str) -> Result<u64> {
        st.requests.release(slot);
        let s = &self.slots[slot as usize];
        let bytes = s.bytes.load(Ordering::Relaxed);
        self.load.set(self.load.get().saturating_sub(bytes));
        if s.urgent.load(Ordering::Relaxed) {
            self.urgent_load.set(self.urgent_load.get().saturating_sub(bytes));
        }
        if s.background.load(Ordering::Relaxed) {
            self.background_load.set(self.background_load.get().saturating_sub(bytes));
        }
        match self.slots[slot as usize].status.load(Ordering::Relaxed) {
            0 => Ok(self.slots[slot as usize].short.load(Ordering::Relaxed)),
            status => Err(Error::Nvme { op, status: Status::from_field(status as u16) }),
        }
    }

    /// Queue id.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The commands of `slot` still on the device.
    pub fn outstanding_cids(&self, slot: u32) -> Vec<ugds_nvme::Cid> {
        self.lock().qp.outstanding_cids_of(Owner::Sync(slot))
    }

    /// One look for the late request in `slot` (after an Abort):
    /// `Some(result)` frees the slot once it is back; `None` leaves it taken.
    pub fn settle_once(&self, slot: u32, op: &'static str) -> Option<Result<u64>> {
        let mut st = self.lock();
        self.reap(&mut st, slot);
        if self.slots[slot as usize].pending.load(Ordering::Acquire) == 0 {
            return Some(self.release_slot(&mut st, slot, op));
        }
        None
    }
}

#[cfg(test)]
mod tests;
