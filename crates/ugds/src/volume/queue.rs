//! Asynchronous I/O on a volume from one thread: [`IoQueue`]'s calls,
//! with a queue lent by every member.
//!
//! A request within one stripe (or one concatenated member) goes whole to
//! its member's queue, as a request on that handle would; a longer one is
//! cut at the members' boundaries into pieces, one request on a member's
//! queue each, and is staged only when every member has room for all its
//! pieces, so it is staged on every member or on none. A request is
//! reported once its last piece has ended: with its bytes when every piece
//! moved all of its own, otherwise with the failure of the first member in
//! member order ([`Error::Member`]), never as a partial success. Each
//! member's queue keeps its own claims on the buffer and its own timeouts,
//! so a member whose controller stops answering reports its pieces as
//! failed and wedges its handle, as an [`IoQueue`] does.

use super::{Inner, Piece, Volume};
use crate::batch::BatchOp;
use crate::engine::requests::RequestTable;
use crate::handle::Segment;
use crate::io_queue::IoQueue;
use crate::registry::BufferToken;
use std::time::Duration;
use ugds_platform::sys::EventFd;
use ugds_platform::sys::PAGE_SIZE;
use ugds_platform::{Error, Result};

/// A volume request on the members' queues.
struct Req {
    tag: u64,
    len: usize,
    /// Pieces on the members' queues not yet ended.
    pending: u32,
    /// Bytes the ended pieces moved.
    moved: usize,
    /// The failure of the first member, in member order, that failed.
    failure: Option<(usize, Error)>,
}

/// Asynchronous I/O on a volume for one thread; see the module docs.
/// Holds a queue of every member (and so an in-flight reference on each
/// member's handle) while it exists.
pub struct VolumeQueue<'v> {
    volume: &'v Inner,
    members: Vec<IoQueue<'v>>,
    /// Requests staged and not yet reported, by the tag their pieces carry.
    reqs: RequestTable<Req>,
    /// One request's pieces (no allocation per request once grown).
    pieces: Vec<Piece>,
}

impl std::fmt::Debug for VolumeQueue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeQueue")
            .field("members", &self.members.len())
            .field("outstanding", &self.reqs.in_use())
            .finish_non_exhaustive()
    }
}

impl Volume {
    /// Queues for asynchronous I/O from one thread: a queue lent by every
    /// member ([`Handle::io_queue`](crate::Handle::io_queue)). Refused as
    /// the first member that cannot lend one refuses, naming it.
    pub fn io_queue(&self) -> Result<VolumeQueue<'_>> {
        let v = &*self.inner;
        let members = v
            .members
            .iter()
            .enumerate()
            .map(|(m, h)| h.io_queue().map_err(|e| v.member_error(m, e)))
            .collect::<Result<Vec<_>>>()?;
        Ok(VolumeQueue { volume: v, members, reqs: RequestTable::default(), pieces: Vec::new() })
    }
}

impl VolumeQueue<'_> {
    /// Requests submitted and not yet reported by [`poll`](Self::poll).
    pub fn outstanding(&self) -> usize {
        self.reqs.in_use()
    }

    /// Whether any member's queue is a context on its handle's shared
    /// batch queue ([`IoQueue::is_shared`]).
    pub fn is_shared(&self) -> bool {
        self.members.iter().any(IoQueue::is_shared)
    }

    /// Stages a read of `size` bytes at `file_offset` of the volume into
    /// `buf` at `buf_offset`; `tag` comes back with its completion. Bad
    /// input, or a member without room for its pieces
    /// ([`Error::QueueFull`]), stages nothing. A request some of whose
    /// pieces were staged when a member refused the next (its handle
    /// wedged meanwhile) is accepted and reported failed once the staged
    /// pieces end.
    pub fn submit_read(
        &mut self,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        tag: u64,
    ) -> Result<()> {
        self.submit(BatchOp::Read, buf, size, file_offset, buf_offset, tag)
    }

    /// Stages a write; see [`submit_read`](Self::submit_read).
    pub fn submit_write(
        &mut self,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        tag: u64,
    ) -> Result<()> {
        self.submit(BatchOp::Write, buf, size, file_offset, buf_offset, tag)
    }

    fn submit(
        &mut self,
        op: BatchOp,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        tag: u64,
    ) -> Result<()> {
        let v = self.volume;
        // Within one stripe: the member's queue checks the request as it
        // would its own (the same block size; the range lies on the
        // member), and a refusal is looked at again on the volume below.
        if let Some((m, at)) = v.single_piece(file_offset, size as u64) {
            let slot = self.start(tag, size, 1);
            return match stage(&mut self.members[m], op, buf, size, at, buf_offset, slot) {
                Ok(()) => Ok(()),
                Err(e) => {
                    self.reqs.release(slot);
                    Err(refusal(v, m, e, op, buf, size, file_offset, buf_offset))
                }
            };
        }
        // The range, the alignment and the buffer's registration, on the
        // volume: what the caller gave wrong is refused as such, not as a
        // member's failure.
        v.check_one(op, &Segment::new(buf, buf_offset, size), file_offset)?;
        self.submit_pieces(op, buf, size, file_offset, buf_offset, tag)
    }

    /// A request cut into pieces on several members (or several pieces on
    /// one): admitted on every member first, then staged.
    #[cold]
    fn submit_pieces(
        &mut self,
        op: BatchOp,
        buf: &BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        tag: u64,
    ) -> Result<()> {
        let v = self.volume;
        let mut pieces = std::mem::take(&mut self.pieces);
        pieces.clear();
        v.geometry.split(file_offset, size as u64, |p| pieces.push(p));
        let first_page = buf.base % PAGE_SIZE + buf_offset;
        let admitted = (0..self.members.len()).try_for_each(|m| {
            let mine = pieces.iter().filter(|p| p.member == m);
            let reqs = mine.map(|p| (p.len as usize, p.member_offset, first_page + p.at as usize));
            match self.members[m].admits(reqs) {
                Ok(true) => Ok(()),
                Ok(false) => Err(Error::QueueFull),
                Err(e) => Err(v.member_error(m, e)),
            }
        });
        if let Err(e) = admitted {
            self.pieces = pieces;
            return Err(e);
        }
        let slot = self.start(tag, size, pieces.len() as u32);
        let mut staged = 0;
        let mut refused = None;
        for p in &pieces {
            let (m, len) = (p.member, p.len as usize);
            match stage(&mut self.members[m], op, buf, len, p.member_offset, buf_offset + p.at as usize, slot) {
                Ok(()) => staged += 1,
                Err(e) => {
                    let r = &mut self.reqs[slot];
                    r.pending -= 1;
                    fail(r, m, e.clone());
                    refused.get_or_insert((m, e));
                }
            }
        }
        self.pieces = pieces;
        if staged == 0 {
            // Nothing reached a member: refused as a whole.
            self.reqs.release(slot);
            let (m, e) = refused.expect("a request has pieces");
            return Err(member_error(v, m, e));
        }
        Ok(())
    }

    /// Takes a free entry for a request of `pieces` pieces.
    fn start(&mut self, tag: u64, len: usize, pieces: u32) -> u32 {
        self.reqs.insert(Req { tag, len, pending: pieces, moved: 0, failure: None })
    }

    /// Tells every member's controller about what is staged on it.
    pub fn ring(&mut self) {
        self.members.iter_mut().for_each(IoQueue::ring);
    }

    /// Rings for anything staged, then reports every request whose last
    /// piece has ended as `f(tag, bytes or error)`. Returns how many were
    /// reported. (`max` is there for [`IoQueue::poll`]'s shape: every
    /// completion found is reported.)
    pub fn poll(&mut self, max: usize, mut f: impl FnMut(u64, Result<usize>)) -> usize {
        let _ = max;
        let VolumeQueue { volume, members, reqs, .. } = self;
        let mut done = 0;
        for (m, q) in members.iter_mut().enumerate() {
            if q.outstanding() == 0 {
                continue;
            }
            q.poll(usize::MAX, |slot, res| {
                let r = &mut reqs[slot as u32];
                match res {
                    Ok(n) => r.moved += n,
                    Err(e) => fail(r, m, e),
                }
                r.pending -= 1;
                if r.pending == 0 {
                    f(r.tag, ended(volume, r));
                    reqs.release(slot as u32);
                    done += 1;
                }
            });
        }
        done
    }

    /// Blocks until a member's completion may be waiting (interrupt mode:
    /// the members' interrupts waited on together) or returns at once
    /// (polling mode, or a completion is there): call
    /// [`poll`](Self::poll) after it.
    pub fn wait(&mut self, timeout: Duration) {
        let (mut members, mut fds): (Vec<usize>, Vec<&EventFd>) = (Vec::new(), Vec::new());
        for (m, q) in self.members.iter_mut().enumerate() {
            if q.outstanding() == 0 {
                continue;
            }
            match q.interrupt() {
                Some(efd) => {
                    members.push(m);
                    fds.push(efd);
                }
                None => return,
            }
        }
        if fds.is_empty() {
            return;
        }
        let woken = EventFd::wait_any(&fds, timeout);
        if woken.is_empty() {
            // Nothing came: each member looks for late requests next.
            for &m in &members {
                self.members[m].waited_in_vain();
            }
        }
        for i in woken {
            fds[i].drain();
            self.members[members[i]].count_interrupt();
        }
    }

    /// Polls until every request has been reported (each member's queue
    /// ends its own late pieces, as [`IoQueue::drain`] says).
    /// [`Error::Wedged`] when a member's queue was given up on.
    pub fn drain(&mut self, mut f: impl FnMut(u64, Result<usize>)) -> Result<()> {
        while self.reqs.in_use() > 0 {
            if self.poll(usize::MAX, &mut f) == 0 {
                // A queue given up on has reported all it had; with nothing
                // left on a live one, nothing more will come.
                if self.members.iter().all(|q| q.is_dead() || q.outstanding() == 0) {
                    return Err(Error::Wedged);
                }
                self.wait(Duration::from_millis(10));
                std::hint::spin_loop();
            }
        }
        if self.members.iter().any(IoQueue::is_dead) {
            Err(Error::Wedged)
        } else {
            Ok(())
        }
    }
}

impl Drop for VolumeQueue<'_> {
    fn drop(&mut self) {
        // Each member's queue drains (or keeps what it cannot) on its own
        // drop; reporting here only settles the volume's requests first.
        let _ = self.drain(|_, _| {});
    }
}

/// One piece, or a whole request, on a member's queue, tagged with the
/// volume request's entry.
#[inline(always)]
fn stage(
    q: &mut IoQueue<'_>,
    op: BatchOp,
    buf: &BufferToken,
    size: usize,
    member_offset: u64,
    buf_offset: usize,
    slot: u32,
) -> Result<()> {
    match op {
        BatchOp::Read => q.submit_read(buf, size, member_offset, buf_offset, slot as u64),
        _ => q.submit_write(buf, size, member_offset, buf_offset, slot as u64),
    }
}

/// A member's refusal as the caller sees it: a full queue as such (poll,
/// then submit again), anything else naming the member.
fn member_error(v: &Inner, m: usize, e: Error) -> Error {
    match e {
        Error::QueueFull => Error::QueueFull,
        e => v.member_error(m, e),
    }
}

/// A member's refusal of a whole request: the volume's own checks' error
/// when the input is what is wrong (a buffer range, an alignment), as for
/// a longer request; the member's otherwise.
#[cold]
#[allow(clippy::too_many_arguments)]
fn refusal(
    v: &Inner,
    m: usize,
    e: Error,
    op: BatchOp,
    buf: &BufferToken,
    size: usize,
    file_offset: u64,
    buf_offset: usize,
) -> Error {
    match v.check_one(op, &Segment::new(buf, buf_offset, size), file_offset) {
        Err(input) if !matches!(e, Error::QueueFull) => input,
        _ => member_error(v, m, e),
    }
}

/// Keeps the failure of the first member in member order.
fn fail(r: &mut Req, m: usize, e: Error) {
    if r.failure.as_ref().is_none_or(|(f, _)| m < *f) {
        r.failure = Some((m, e));
    }
}

/// What an ended request reports: its bytes when every piece moved all of
/// its own, the first member's failure otherwise.
fn ended(v: &Inner, r: &mut Req) -> Result<usize> {
    match r.failure.take() {
        Some((m, e)) => Err(v.member_error(m, e)),
        None if r.moved == r.len => Ok(r.len),
        None => Err(Error::Platform(format!("volume request moved {} of {} bytes", r.moved, r.len))),
    }
}
