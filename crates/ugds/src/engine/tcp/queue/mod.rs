//! An NVMe/TCP I/O queue: one connection standing where a controller's
//! queue pair stands, so that every API above (synchronous, lent queues,
//! batches, stream-ordered I/O, volumes) runs on it unchanged.
//!
//! The engine hands it the commands it hands a controller, with PRPs whose
//! first entry is the host address of the command's first byte (the TCP
//! platform maps host memory at its own address, so a command's data is
//! contiguous there). Staging a command appends its capsule to the
//! queue's send buffer: a write's data goes in the capsule when it fits
//! (the controller's IOCCSZ), else when the controller's R2T asks for it,
//! as H2CData PDUs of at most MAXH2CDATA bytes. Ringing sends what is
//! staged without blocking; what the socket does not take is sent at the
//! next look. A look reads what the socket has without blocking and
//! parses it as it comes: a C2HData's bytes go straight into the
//! command's buffer (checked first to start where the command's last
//! C2HData ended and to end within its length, so that a success means
//! every byte came once), a CapsuleResp completes the command, an R2T
//! queues the data asked for (once per byte, one R2T at a time).
//!
//! Anything the controller sends that breaks the protocol (a length, an
//! offset or a PDU type that does not fit, a digest that does not match,
//! data or a completion for no command in flight) ends the connection:
//! every command on it completes with Transient Transport Error, as do
//! the commands staged after it, and the reason is logged. A closed or reset connection is the same. A
//! controller that stops answering is the engine's timeouts' to find.
//!
//! Waiting: a polled queue is always worth a look. With an interrupt
//! vector the platform watches the socket (epoll, one shot, armed again
//! after each look) and signals the vector when data arrives; bytes
//! already received and not parsed, or staged and not yet sent, keep the
//! queue worth a look without a signal.
//!
//! Commands on GPU memory (a window above `DEVICE_IOVA_BASE`) borrow a
//! pinned host bounce buffer: a write's bytes are copied off the device
//! at submission (waited for: the capsule or H2CData needs them), a read's
//! onto it when its data is all in. That copy is started and not waited
//! for: the command stays outstanding (its CID, bounce buffer and request)
//! while the queue goes on receiving, and completes at the look that finds
//! its copy done, so that the network and the copies overlap. A failed
//! copy fails its command alone. A bounce buffer a copy may still read is
//! never given back.

mod receive;

use super::super::bounce::{self, Bounce};
use super::super::qpair::{CqView, Full, Owner};
use super::super::stats::{QueueCounters, Staged};
use super::super::tracker::Tracker;
use crate::engine::transport::Transport;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use ugds_nvme::status::generic;
use ugds_nvme::tcp::{self, CommonHeader, Framing, Head, PduError};
use ugds_nvme::{Cid, Cqe, Qid, Sqe, Status};
use ugds_platform::device::{CopyTicket, DeviceRuntime};
use ugds_platform::tcp::TcpPlatform;
use ugds_platform::window::DEVICE_IOVA_BASE;
use ugds_platform::{Error, Result};

/// Bytes of the receive buffer: headers and small data are read through
/// it; a large C2HData's bytes go straight to the command's buffer.
const RX_BUF: usize = 64 << 10;

/// Data left of a C2HData at or above which it is read straight into the
/// command's buffer rather than through the receive buffer.
const DIRECT_READ: usize = 4096;

/// Which way a command's data goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Dir {
    /// No data.
    #[default]
    None,
    /// Controller to host (C2HData).
    In,
    /// Host to controller (in the capsule, or H2CData after an R2T).
    Out,
}

/// What the queue keeps of each command besides the tracker's entry.
#[derive(Clone, Copy, Debug, Default)]
pub struct Transfer {
    pub(super) dir: Dir,
    /// Host address of the data (the bounce buffer's for GPU memory).
    pub(super) addr: usize,
    pub(super) len: u32,
    /// C2HData bytes received, in order: the offset the next C2HData must
    /// start at. A success with fewer than `len` fails the command.
    pub(super) got: u32,
    /// The end of the data R2Ts have asked for so far: a later R2T starts
    /// at or past it (no byte is asked for twice).
    pub(super) asked: u32,
    /// Where in the queue's send stream the answer to the command's last
    /// R2T ends: until the socket took it all, that R2T is outstanding,
    /// and another one exceeds the MAXR2T of 0 the host offered.
    pub(super) r2t_until: u64,
    /// The GPU window address of the data, or 0.
    pub(super) device: u64,
    pub(super) bounce: Option<Bounce>,
    /// Refused at submission with this status field (no capsule sent).
    pub(super) refused: Option<u16>,
    /// Its data is all in and being copied to GPU memory ([`Copying`]).
    pub(super) copying: bool,
}

/// A read into GPU memory whose data is in and whose copy from the bounce
/// buffer to the device is running: its command stays outstanding until
/// the copy is answered.
struct Copying {
    cid: Cid,
    /// The command's status as received (a success).
    status: Status,
    runtime: Arc<dyn DeviceRuntime>,
    ticket: CopyTicket,
}

/// Where the receive side is in the byte stream.
#[derive(Clone, Copy, Debug)]
enum Rx {
    /// At the start of a PDU.
    Head,
    /// Inside a C2HData's data: `left` bytes of command `cid` still to
    /// come, to its buffer at `at`; `crc`, the data digest so far.
    Data { cid: Cid, at: usize, left: usize, crc: u32, last: bool, success: bool },
    /// The data digest of a C2HData, then its end.
    Digest { cid: Cid, crc: u32, last: bool, success: bool },
}

/// One I/O queue on its own connection; see the module docs.
pub struct TcpQueue {
    stream: TcpStream,
    addr: String,
    framing: Framing,
    maxh2cdata: u32,
    /// Bytes of write data that go in the capsule.
    in_capsule: usize,
    tracker: Tracker<Transfer>,
    platform: Arc<TcpPlatform>,
    qid: Qid,
    entries: u16,
    /// (nsid, block size) of each namespace.
    blocks: Vec<(u32, u32)>,
    /// Staged PDUs, and how many of their bytes the socket has taken.
    out: Vec<u8>,
    sent: usize,
    /// Bytes the socket has taken since the connection began.
    flushed: u64,
    /// Received bytes not yet parsed: `rx[start..end]`.
    rx: Box<[u8]>,
    start: usize,
    end: usize,
    state: Rx,
    /// Why the connection ended, once it has.
    failure: Option<String>,
    /// Commands refused at submission, completed at the next look.
    refused: Vec<Cid>,
    /// Reads whose copy to GPU memory runs.
    copying: Vec<Copying>,
    protocol_errors: u64,
    staged: Staged,
    counters: Arc<QueueCounters>,
    /// Non-zero while a look would find work no signal announces: bytes
    /// received and not yet parsed, bytes staged and not yet sent.
    busy: Arc<AtomicU32>,
    /// Signalled by the platform when the socket has data (interrupt
    /// completion); none: waiters poll.
    vector: Option<u16>,
}

impl std::fmt::Debug for TcpQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpQueue")
            .field("qid", &self.qid.0)
            .field("addr", &self.addr)
            .field("outstanding", &self.tracker.outstanding())
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

/// What a connected queue needs to know of its connection and controller.
pub(super) struct QueueSetup {
    pub stream: TcpStream,
    pub addr: String,
    pub framing: Framing,
    pub maxh2cdata: u32,
    pub in_capsule: usize,
    pub qid: u16,
    pub entries: u16,
    pub blocks: Vec<(u32, u32)>,
    /// The interrupt vector to signal when the socket has data, if any.
    pub vector: Option<u16>,
}

impl TcpQueue {
    /// The queue on a connection whose handshake and Connect are done.
    pub(super) fn new(s: QueueSetup, platform: Arc<TcpPlatform>) -> Result<TcpQueue> {
        s.stream.set_nonblocking(true).map_err(|e| super::os("O_NONBLOCK", e))?;
        if let Some(v) = s.vector {
            platform.watch(std::os::fd::AsFd::as_fd(&s.stream), v)?;
        }
        Ok(TcpQueue {
            stream: s.stream,
            addr: s.addr,
            framing: s.framing,
            maxh2cdata: s.maxh2cdata,
            in_capsule: s.in_capsule,
            // SQSIZE entries; one kept free as on a controller's ring.
            tracker: Tracker::new(s.entries - 1),
            platform,
            qid: Qid(s.qid),
            entries: s.entries,
            blocks: s.blocks,
            out: Vec::new(),
            sent: 0,
            flushed: 0,
            rx: vec![0u8; RX_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            state: Rx::Head,
            failure: None,
            refused: Vec::new(),
            copying: Vec::new(),
            protocol_errors: 0,
            staged: Staged::default(),
            counters: Arc::default(),
            busy: Arc::default(),
            vector: s.vector,
        })
    }

    /// Publishes whether a look would find work no signal announces, and
    /// watches the socket again (interrupt completion).
    fn settle(&mut self) {
        let pending = self.look_pending();
        self.busy.store(pending as u32, std::sync::atomic::Ordering::Release);
        if let (Some(v), None) = (self.vector, &self.failure) {
            if let Err(e) = self.platform.rearm(std::os::fd::AsFd::as_fd(&self.stream), v) {
                tracing::warn!(qid = self.qid.0, "NVMe/TCP: socket not watched again ({e}); waits are capped");
            }
        }
    }

    /// Whether a look would find work no signal announces: bytes received
    /// and not parsed, staged and not sent, refusals to report, copies to
    /// GPU memory to ask about.
    fn look_pending(&self) -> bool {
        self.end > self.start || self.sent < self.out.len() || !self.refused.is_empty() || !self.copying.is_empty()
    }

    /// The transfer of `sqe` with its data at `addr` (PRP1), or the status
    /// it is refused with.
    fn transfer(&self, sqe: &Sqe, addr: Option<u64>) -> std::result::Result<Transfer, Status> {
        // A namespace this queue does not know moves nothing: the controller
        // answers with Invalid Namespace.
        let Some((out, len)) = super::super::fabrics::command_data(sqe, &self.blocks) else {
            return Ok(Transfer::default());
        };
        let dir = if out { Dir::Out } else { Dir::In };
        let (Some(addr), Ok(len32)) = (addr, u32::try_from(len)) else {
            return Err(Status::generic(generic::INVALID_FIELD));
        };
        if addr < DEVICE_IOVA_BASE {
            return Ok(Transfer { dir, addr: addr as usize, len: len32, ..Default::default() });
        }
        let Some((_, runtime)) = self.platform.device_at(addr, len as usize) else {
            return Err(Status::generic(generic::DATA_TRANSFER_ERROR));
        };
        let b = bounce::take(len as usize, &*runtime).map_err(|e| {
            tracing::error!("no bounce buffer for a GPU transfer: {e}");
            Status::generic(generic::INTERNAL_ERROR)
        })?;
        let t = Transfer { dir, addr: b.addr, len: len32, device: addr, bounce: Some(b), ..Default::default() };
        if dir == Dir::Out {
            match self.copy_out(&t) {
                Ok(true) => {}
                Ok(false) => {
                    // Not answered: it may still write the bounce buffer, kept.
                    tracing::error!("copy from GPU memory for a write not answered in {COPY_WAIT:?}");
                    return Err(Status::generic(generic::DATA_TRANSFER_ERROR));
                }
                Err(e) => {
                    tracing::error!("copy from GPU memory for a write failed: {e}");
                    bounce::give(b);
                    return Err(Status::generic(generic::DATA_TRANSFER_ERROR));
                }
            }
        }
        Ok(t)
    }

    /// Copies a GPU write's bytes from the device into its bounce buffer,
    /// and waits for the copy (see [`wait_copy`]).
    fn copy_out(&self, t: &Transfer) -> Result<bool> {
        let (runtime, ticket) = self.start_copy(t, false)?;
        wait_copy(&*runtime, ticket, std::time::Instant::now() + COPY_WAIT)
    }

    /// Starts the copy between a command's bounce buffer and its GPU
    /// memory; the ticket must be asked about until answered, and the
    /// bounce buffer kept until then.
    fn start_copy(&self, t: &Transfer, to_device: bool) -> Result<(Arc<dyn DeviceRuntime>, CopyTicket)> {
        let (dev, runtime) = self
            .platform
            .device_at(t.device, t.len as usize)
            .ok_or_else(|| Error::Platform("GPU memory no longer mapped".into()))?;
        // SAFETY: the bounce buffer is this command's alone (`len` bytes; its
        // size class holds at least that) and the socket is not reading into
        // it now (a read's data is all in; a write's is not yet sent); the
        // device range lies in registered GPU memory the request holds.
        let ticket = unsafe {
            if to_device {
                runtime.copy_to_device_start(dev, t.addr as *const u8, t.len as usize)
            } else {
                runtime.copy_from_device_start(t.addr as *mut u8, dev, t.len as usize)
            }
        }?;
        Ok((runtime, ticket))
    }

    /// Stages a command (its data at `addr`, PRP1 of its plan): its capsule
    /// goes to the send buffer, sent at [`ring_sq_doorbell`](Self::ring_sq_doorbell).
    pub fn submit(&mut self, mut sqe: Sqe, addr: Option<u64>, owner: Owner) -> std::result::Result<Cid, Full> {
        if self.tracker.is_full() {
            return Err(Full::Cid);
        }
        let t = match self.transfer(&sqe, addr) {
            Ok(t) => t,
            Err(s) => Transfer { refused: Some(s.to_field(false)), ..Default::default() },
        };
        let cid = self.tracker.begin_with(owner, None, t).expect("a CID is free");
        self.staged.add(sqe.opcode(), sqe.nlb());
        self.tracker.staged(cid, &sqe);
        if t.refused.is_some() || self.failure.is_some() {
            self.refused.push(cid);
            self.busy.store(1, std::sync::atomic::Ordering::Release);
            return Ok(cid);
        }
        sqe.set_cid(cid);
        let data: &[u8] = match t.dir {
            Dir::None => {
                sqe = sqe.with_transport_data(0);
                &[]
            }
            Dir::In => {
                sqe = sqe.with_transport_data(t.len);
                &[]
            }
            Dir::Out if (t.len as usize) <= self.in_capsule => {
                sqe = sqe.with_in_capsule_data(t.len);
                // SAFETY: the command's memory (the caller's registered
                // buffer, held by its request until this command completes,
                // or its bounce buffer), `len` bytes checked by the engine
                // against the registration.
                unsafe { std::slice::from_raw_parts(t.addr as *const u8, t.len as usize) }
            }
            Dir::Out => {
                sqe = sqe.with_transport_data(t.len);
                &[]
            }
        };
        tcp::capsule_cmd(&mut self.out, &sqe, data, self.framing);
        Ok(cid)
    }

    /// Writes the send buffer without blocking; a failed send ends the
    /// connection.
    fn send(&mut self) {
        while self.sent < self.out.len() && self.failure.is_none() {
            match self.stream.write(&self.out[self.sent..]) {
                Ok(0) => self.fail(format!("{} took no more bytes (connection closed)", self.addr)),
                Ok(n) => {
                    self.sent += n;
                    self.flushed += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => self.fail(format!("sending to {}: {e}", self.addr)),
            }
        }
        if self.sent == self.out.len() || self.failure.is_some() {
            self.out.clear();
            self.sent = 0;
        }
    }

    /// Ends the connection for `why`: its commands complete with an error at
    /// the next look.
    fn fail(&mut self, why: String) {
        if self.failure.is_none() {
            tracing::error!(qid = self.qid.0, "NVMe/TCP: {why}; the connection is closed");
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
            self.failure = Some(why);
        }
    }

    /// Ends the connection for a PDU that breaks the protocol.
    fn violation(&mut self, e: PduError) {
        self.protocol_errors += 1;
        self.fail(format!("{} broke the NVMe/TCP protocol: {e}", self.addr));
    }

    /// Transient Transport Error, Do Not Retry (the connection is gone).
    fn transport_error(&self) -> u16 {
        Status { dnr: true, ..Status::generic(generic::TRANSIENT_TRANSPORT_ERROR) }.to_field(false)
    }

    /// A read that completed successfully must have had all its data.
    fn check_received(&mut self, cid: Cid, t: &Transfer, status: Status) -> Status {
        if status.is_success() && t.dir == Dir::In && t.got != t.len {
            self.violation(PduError::Field(format!(
                "command {:#06x} completed with {} of its {} bytes of data",
                cid.0, t.got, t.len
            )));
            return Status::generic(generic::DATA_TRANSFER_ERROR);
        }
        status
    }

    /// A received completion of a read into GPU memory starts the copy of
    /// its data to the device and leaves the command outstanding (`None`);
    /// any other completion's status is returned, to be reported now (a
    /// copy that could not start fails its read).
    fn copy_in(&mut self, cid: Cid, t: &Transfer, status: Status) -> Option<Status> {
        if t.device == 0 || t.dir != Dir::In || !status.is_success() {
            return Some(status);
        }
        match self.start_copy(t, true) {
            Ok((runtime, ticket)) => {
                self.tracker.get_mut(cid).expect("outstanding").extra.copying = true;
                self.copying.push(Copying { cid, status, runtime, ticket });
                None
            }
            Err(e) => {
                tracing::error!("copy of a read to GPU memory failed to start: {e}");
                Some(Status::generic(generic::DATA_TRANSFER_ERROR))
            }
        }
    }

    /// Completes the reads whose copies to GPU memory are done (up to
    /// `max` reported in all, counted in `n`); a failed copy fails its
    /// read.
    fn reap_copies(&mut self, max: usize, n: &std::cell::Cell<usize>, f: &mut impl FnMut(Owner, &Cqe)) {
        let mut i = 0;
        while i < self.copying.len() && n.get() < max {
            let c = &self.copying[i];
            let status = match c.runtime.copy_finished(c.ticket) {
                Ok(false) => {
                    i += 1;
                    continue;
                }
                Ok(true) => c.status,
                Err(e) => {
                    tracing::error!("copy of a read to GPU memory failed: {e}");
                    Status::generic(generic::DATA_TRANSFER_ERROR)
                }
            };
            let cid = self.copying.swap_remove(i).cid;
            let e = self.tracker.end(cid, status.to_field(false)).expect("a copying read is outstanding");
            self.finish(cid, e.owner, e.extra, status, f);
        }
    }

    /// Reports a finished command and gives its bounce buffer back (any
    /// copy of it answered by now).
    fn finish(&self, cid: Cid, owner: Owner, t: Transfer, status: Status, f: &mut impl FnMut(Owner, &Cqe)) {
        if let Some(b) = t.bounce {
            bounce::give(b);
        }
        let cqe = Cqe { dw0: 0, dw1: 0, sqhd: 0, sqid: self.qid.0, cid: cid.0, status: status.to_field(false) };
        f(owner, &cqe);
    }
}

/// Why parsing stopped.
enum Stop {
    /// Nothing more to read now (or the connection ended: see `failure`).
    Idle,
    /// The controller broke the protocol.
    Broken(PduError),
}

/// How long a copy to or from GPU memory is waited for where one is.
const COPY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits for a copy to or from GPU memory until `deadline`: `Ok(true)`
/// once done, the copy's error once it failed (both answer the ticket),
/// `Ok(false)` when not answered by then (the copy may still run).
fn wait_copy(runtime: &dyn DeviceRuntime, ticket: CopyTicket, deadline: std::time::Instant) -> Result<bool> {
    while !runtime.copy_finished(ticket)? {
        if std::time::Instant::now() > deadline {
            return Ok(false);
        }
        std::thread::yield_now();
    }
    Ok(true)
}

impl Drop for TcpQueue {
    fn drop(&mut self) {
        if self.vector.is_some() {
            self.platform.unwatch(std::os::fd::AsFd::as_fd(&self.stream));
        }
    }
}

impl Transport for TcpQueue {
    type Extra = Transfer;

    /// Queue identifier.
    fn qid(&self) -> Qid {
        self.qid
    }

    /// Entries (the connection's SQSIZE).
    fn entries(&self) -> u16 {
        self.entries
    }

    /// The interrupt vector the platform signals, if any.
    fn vector(&self) -> Option<u16> {
        self.vector
    }

    /// Commands that may be submitted now.
    fn free_slots(&self) -> usize {
        self.tracker.capacity() as usize - self.tracker.outstanding()
    }

    /// PDUs from the controller that broke the protocol.
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

    /// Polled: always worth a look (completions arrive on the socket, which
    /// only a read finds). With a vector: worth a look when signalled, or
    /// while `busy`.
    fn cq_view(&self) -> CqView {
        CqView::kernel(self.vector.is_none(), self.busy.clone())
    }

    /// Whether a look may find something. Polled: always, while commands
    /// are out. With a vector: only while a look would find work no
    /// signal announces (else the vector says when), so that a waiter
    /// sleeps.
    fn completion_pending(&mut self) -> bool {
        match self.vector {
            Some(_) => self.look_pending(),
            None => self.tracker.outstanding() > 0,
        }
    }

    /// Consumes up to `max` completions, calling `f(owner, cqe)` for each
    /// command that finished. Returns how many.
    fn process_completions(&mut self, max: usize, mut f: impl FnMut(Owner, &Cqe)) -> usize {
        let (n, failed) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0u64));
        let mut report = |owner: Owner, cqe: &Cqe| {
            n.set(n.get() + 1);
            failed.set(failed.get() + !cqe.status().is_success() as u64);
            f(owner, cqe)
        };
        for cid in std::mem::take(&mut self.refused) {
            let e = self.tracker.end(cid, 0).expect("outstanding");
            let status = e.extra.refused.unwrap_or(self.transport_error());
            self.finish(cid, e.owner, e.extra, Status::from_field(status), &mut report);
        }
        self.reap_copies(max, &n, &mut report);
        self.send();
        while n.get() < max && self.failure.is_none() && self.tracker.outstanding() > self.copying.len() {
            match self.step() {
                Ok(Some((cid, status))) => match self.tracker.get_mut(cid).map(|e| e.extra) {
                    Some(t) if !t.copying => {
                        let status = self.check_received(cid, &t, status);
                        if let Some(status) = self.copy_in(cid, &t, status) {
                            let e = self.tracker.end(cid, status.to_field(false)).expect("looked up above");
                            self.finish(cid, e.owner, e.extra, status, &mut report);
                        }
                    }
                    _ => self.violation(PduError::Field(format!(
                        "a completion for command {:#06x}, which is not in flight",
                        cid.0
                    ))),
                },
                Ok(None) => {}
                Err(Stop::Idle) => break,
                Err(Stop::Broken(e)) => self.violation(e),
            }
            self.send();
        }
        // Copies that finished while the socket was read (or at once).
        self.reap_copies(max, &n, &mut report);
        if self.failure.is_some() {
            // Everything on the connection is lost with it, but for reads
            // whose data is all in and whose copies run: they end with
            // their copies.
            let status = self.transport_error();
            let cids: Vec<Cid> =
                self.tracker.outstanding_commands().filter(|(_, t)| !t.extra.copying).map(|(c, _)| c).collect();
            for cid in cids {
                let e = self.tracker.end(cid, status).expect("outstanding");
                self.finish(cid, e.owner, e.extra, Status::from_field(status), &mut report);
            }
        }
        self.counters.completed.add(n.get() as u64);
        self.counters.errors.add(failed.get());
        if self.vector.is_some() {
            self.settle();
        }
        n.get()
    }

    /// Sends what is staged, as far as the socket takes it now.
    fn ring_sq_doorbell(&mut self) {
        self.staged.publish(&self.counters);
        if self.sent < self.out.len() {
            self.counters.doorbell_writes.add(1);
            self.send();
        }
        if self.vector.is_some() {
            let pending = self.look_pending();
            self.busy.store(pending as u32, std::sync::atomic::Ordering::Release);
        }
    }

    /// Forgets every command: only when none can complete any more (the
    /// queue is being dropped). Closes the connection first, so that
    /// nothing more lands in the commands' memory.
    fn forget_outstanding(&mut self) -> usize {
        if self.vector.is_some() {
            self.platform.unwatch(std::os::fd::AsFd::as_fd(&self.stream));
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        let n = self.tracker.outstanding();
        // A copy still reading a bounce buffer keeps it: all are waited
        // for until one deadline, and one not answered by then is never
        // given back.
        let deadline = std::time::Instant::now() + COPY_WAIT;
        let stuck: Vec<Cid> = std::mem::take(&mut self.copying)
            .into_iter()
            .filter(|c| matches!(wait_copy(&*c.runtime, c.ticket, deadline), Ok(false)))
            .map(|c| c.cid)
            .collect();
        for (cid, t) in self.tracker.outstanding_commands() {
            if let Some(b) = t.extra.bounce {
                if stuck.contains(&cid) {
                    tracing::error!(cid = cid.0, "a copy to GPU memory still reads this bounce buffer: kept");
                } else {
                    bounce::give(b);
                }
            }
        }
        self.tracker.forget_all();
        self.refused.clear();
        n
    }
}
