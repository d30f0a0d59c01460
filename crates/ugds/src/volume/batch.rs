//! Batch I/O on a volume: as [`Batch`] on a handle (submit many, collect
//! events by cookie in any order), each request split into its members'
//! parts, which go to a batch context per member; a request's event comes
//! when its last part has ended, carrying the bytes of the whole request
//! or the first member's failure ([`Error::Member`]).

use super::{Inner, Part, Volume};
use crate::batch::{batch_context, Batch, BatchContext, BatchIo, BatchIov, BatchOp, LOOK_EVERY};
use crate::engine::batch::RequestStats;
use crate::engine::requests::RequestTable;
use crate::engine::{BatchEvent, BatchStatus};
use crate::handle::Segment;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// Parts one member's context may hold per volume request of capacity (a
/// request of many small stripes can have more parts on a member than one
/// vectored request takes).
const PARTS_PER_REQUEST: usize = 4;

/// One request of a submission: direction, segments, volume offset, cookie.
type Request<'a, 's> = (BatchOp, &'a [Segment<'s>], u64, u64);

/// A batch context on a volume; see the module docs.
pub struct VolumeBatch {
    volume: Arc<Inner>,
    members: Vec<Batch>,
    capacity: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for VolumeBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeBatch").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    /// Requests by slot; a free slot's value is `None`.
    reqs: RequestTable<Option<Req>>,
    /// Parts on each member's context.
    parts_out: Vec<usize>,
    /// Requests ended, their events not yet collected.
    done: Vec<BatchEvent>,
    /// What the requests have done (in flight derived).
    stats: RequestStats,
    events: Vec<BatchEvent>,
    /// Kept from call to call: where each request of a submission lies,
    /// when each lies on one member in one piece, and each member's list.
    single: Vec<(usize, u64)>,
    lists: Vec<Vec<BatchIo>>,
}

impl State {
    /// Requests submitted whose events have not been collected.
    fn outstanding(&self) -> usize {
        self.reqs.in_use() + self.done.len()
    }

    /// Puts `req` in a free slot; its slot.
    fn start(&mut self, req: Req) -> usize {
        self.reqs.insert(Some(req)) as usize
    }
}

struct Req {
    cookie: u64,
    op: BatchOp,
    len: usize,
    /// Parts not yet ended.
    pending: usize,
    moved: usize,
    /// The first failure by member order, with its status.
    failure: Option<(usize, BatchStatus, Error)>,
}

impl Req {
    fn fail(&mut self, member: usize, status: BatchStatus, e: Error) {
        if self.failure.as_ref().is_none_or(|(m, _, _)| member < *m) {
            self.failure = Some((member, status, e));
        }
    }
}

impl Volume {
    /// A batch context for up to `capacity` outstanding requests on the
    /// volume (each member's context holds four parts per request).
    pub fn batch(&self, capacity: usize) -> Result<VolumeBatch> {
        let v = &self.inner;
        if capacity == 0 || capacity * PARTS_PER_REQUEST > Batch::MAX_CAPACITY {
            return Err(Error::InvalidArgument(format!(
                "a volume batch context's capacity is 1 to {}, not {capacity}",
                Batch::MAX_CAPACITY / PARTS_PER_REQUEST
            )));
        }
        let members = (0..v.members.len())
            .map(|m| v.members[m].batch(capacity * PARTS_PER_REQUEST).map_err(|e| v.member_error(m, e)))
            .collect::<Result<Vec<_>>>()?;
        let state = State { parts_out: vec![0; members.len()], ..State::default() };
        Ok(VolumeBatch { volume: v.clone(), members, capacity, state: Mutex::new(state) })
    }
}

impl VolumeBatch {
    /// The most requests this context may have outstanding.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Requests submitted whose events have not been collected.
    pub fn outstanding(&self) -> usize {
        let s = self.state.lock().recover();
        s.outstanding()
    }

    /// Submits `ios`: all are checked first (bad input submits none, on any
    /// member), then each member's parts go to its context at once.
    /// Returns the doorbell writes it took on all the members.
    pub fn submit(&self, ios: &[BatchIo]) -> Result<usize> {
        if let Some(r) = self.submit_single_pieces(ios) {
            return r;
        }
        let segs: Vec<[Segment<'_>; 1]> =
            ios.iter().map(|io| [Segment::new(&io.buf, io.buf_offset, io.size)]).collect();
        let reqs: Vec<Request<'_, '_>> =
            ios.iter().zip(&segs).map(|(io, s)| (io.op, &s[..], io.file_offset, io.cookie)).collect();
        self.submit_requests(&reqs)
    }

    /// Submits vectored requests (each one range of the volume to or from
    /// several buffer segments, as [`Volume::readv`]) as [`submit`](Self::submit)
    /// does requests; each completes as one event.
    pub fn submit_vectored(&self, ios: &[BatchIov<'_>]) -> Result<usize> {
        let reqs: Vec<Request<'_, '_>> = ios.iter().map(|io| (io.op, io.segments, io.file_offset, io.cookie)).collect();
        self.submit_requests(&reqs)
    }

    /// What this context's requests have done since it opened.
    pub fn stats(&self) -> RequestStats {
        let st = self.state.lock().recover();
        RequestStats { in_flight: st.stats.submitted - st.stats.ended, ..st.stats }
    }

    fn submit_requests(&self, ios: &[Request<'_, '_>]) -> Result<usize> {
        if ios.is_empty() {
            return Err(Error::InvalidArgument("empty batch".into()));
        }
        let v = &*self.volume;
        let mut st = self.state.lock().recover();
        let outstanding = st.outstanding();
        if outstanding + ios.len() > self.capacity {
            return Err(Error::CapacityExceeded { capacity: self.capacity, requested: ios.len(), outstanding });
        }
        let mut all: Vec<(usize, Vec<Part<'_>>)> = Vec::with_capacity(ios.len());
        let mut claims = Vec::new();
        let mut need = vec![0usize; v.members.len()];
        for &(op, segs, file_offset, _) in ios {
            let (total, c) = v.check(op, segs, file_offset)?;
            claims.extend(c);
            let parts = v.parts(segs, file_offset, total);
            for p in &parts {
                need[p.member] += 1;
            }
            all.push((total, parts));
        }
        for (m, n) in need.iter().enumerate() {
            let room = self.members[m].capacity() - st.parts_out[m];
            if *n > room {
                // A part is a request on the member's context.
                return Err(v.member_error(
                    m,
                    Error::CapacityExceeded {
                        capacity: self.members[m].capacity(),
                        requested: *n,
                        outstanding: st.parts_out[m],
                    },
                ));
            }
        }
        // Slots and member cookies: (slot << 32) | part index.
        let mut by_member: Vec<Vec<(u64, BatchOp, &Part<'_>)>> = (0..v.members.len()).map(|_| Vec::new()).collect();
        let mut slots = Vec::with_capacity(ios.len());
        st.stats.submitted += ios.len() as u64;
        for (&(op, _, _, cookie), (total, parts)) in ios.iter().zip(&all) {
            let req = Req { cookie, op, len: *total, pending: parts.len(), moved: 0, failure: None };
            let slot = st.start(req);
            slots.push(slot);
            for (k, p) in parts.iter().enumerate() {
                by_member[p.member].push(((slot as u64) << 32 | k as u64, op, p));
            }
        }
        let mut doorbells = 0;
        for (m, list) in by_member.iter().enumerate() {
            // A part of one buffer piece goes as a plain request (the
            // member's cheaper path), the others as vectored ones.
            let (plain, vectored): (Vec<_>, Vec<_>) = list.iter().partition(|(_, _, p)| p.segments.len() == 1);
            if !plain.is_empty() {
                let ios: Vec<BatchIo> = plain
                    .iter()
                    .map(|&&(cookie, op, p)| {
                        let s = &p.segments[0];
                        BatchIo {
                            op,
                            buf: *s.buf,
                            size: s.len,
                            file_offset: p.member_offset,
                            buf_offset: s.offset,
                            cookie,
                        }
                    })
                    .collect();
                let r = self.members[m].submit(&ios).map(|n| doorbells += n);
                Self::submitted(&mut st, m, plain.iter().map(|x| x.0), r);
            }
            if !vectored.is_empty() {
                let iovs: Vec<BatchIov<'_>> = vectored
                    .iter()
                    .map(|&&(cookie, op, p)| BatchIov {
                        op,
                        segments: &p.segments,
                        file_offset: p.member_offset,
                        cookie,
                    })
                    .collect();
                let r = self.members[m].submit_vectored(&iovs).map(|n| doorbells += n);
                Self::submitted(&mut st, m, vectored.iter().map(|x| x.0), r);
            }
        }
        for &slot in &slots {
            Self::finish_if_done(&mut st, v, slot);
        }
        Ok(doorbells)
    }

    /// [`submit`](Self::submit) of requests that each lie on one member in
    /// one piece (a small request within a stripe): no parts to cut, each
    /// request goes whole to its member's context, through lists kept from
    /// call to call. `None` (nothing done) when any request does not.
    fn submit_single_pieces(&self, ios: &[BatchIo]) -> Option<Result<usize>> {
        let v = &*self.volume;
        let mut st = self.state.lock().recover();
        let mut on = std::mem::take(&mut st.single);
        on.clear();
        for io in ios {
            match v.single_piece(io.file_offset, io.size as u64) {
                Some(p) => on.push(p),
                _ => {
                    st.single = on;
                    return None;
                }
            }
        }
        let r = self.submit_on(&mut st, ios, &on);
        st.single = on;
        Some(r)
    }

    /// Submits `ios`, request `i` whole to member `on[i].0` at `on[i].1`.
    fn submit_on(&self, st: &mut State, ios: &[BatchIo], on: &[(usize, u64)]) -> Result<usize> {
        let v = &*self.volume;
        if ios.is_empty() {
            return Err(Error::InvalidArgument("empty batch".into()));
        }
        let outstanding = st.outstanding();
        if outstanding + ios.len() > self.capacity {
            return Err(Error::CapacityExceeded { capacity: self.capacity, requested: ios.len(), outstanding });
        }
        // Checked whole first: bad input submits nothing on any member.
        for io in ios {
            v.check_one(io.op, &Segment::new(&io.buf, io.buf_offset, io.size), io.file_offset)?;
        }
        let mut lists = std::mem::take(&mut st.lists);
        lists.resize_with(v.members.len(), Vec::new);
        lists.iter_mut().for_each(Vec::clear);
        for (io, &(m, member_offset)) in ios.iter().zip(on) {
            lists[m].push(BatchIo { file_offset: member_offset, ..*io });
        }
        let full = (0..lists.len()).find(|&m| lists[m].len() > self.members[m].capacity() - st.parts_out[m]);
        if let Some(m) = full {
            let e = Error::CapacityExceeded {
                capacity: self.members[m].capacity(),
                requested: lists[m].len(),
                outstanding: st.parts_out[m],
            };
            st.lists = lists;
            return Err(v.member_error(m, e));
        }
        st.stats.submitted += ios.len() as u64;
        for list in lists.iter_mut() {
            for io in list.iter_mut() {
                let req = Req { cookie: io.cookie, op: io.op, len: io.size, pending: 1, moved: 0, failure: None };
                let slot = st.start(req);
                // The member's cookie: (slot << 32) | part 0.
                io.cookie = (slot as u64) << 32;
            }
        }
        let mut doorbells = 0;
        for (m, list) in lists.iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            let r = self.members[m].submit(list).map(|n| doorbells += n);
            Self::submitted(st, m, list.iter().map(|io| io.cookie), r);
            for io in list {
                Self::finish_if_done(st, v, (io.cookie >> 32) as usize);
            }
        }
        st.lists = lists;
        Ok(doorbells)
    }

    /// Books parts (by cookie) handed to member `m`: on the member's context,
    /// or, refused (`r`), ended now as failed; the requests' other parts
    /// still complete.
    fn submitted(st: &mut State, m: usize, cookies: impl ExactSizeIterator<Item = u64>, r: Result<()>) {
        match r {
            Ok(()) => st.parts_out[m] += cookies.len(),
            Err(e) => {
                for cookie in cookies {
                    let r = st.reqs[(cookie >> 32) as u32].as_mut().expect("just started");
                    r.fail(m, BatchStatus::Failed, e.clone());
                    r.pending -= 1;
                }
            }
        }
    }

    /// Moves request `slot` to the collectable events once its last part
    /// has ended.
    fn finish_if_done(st: &mut State, v: &Inner, slot: usize) {
        if st.reqs[slot as u32].as_ref().is_none_or(|r| r.pending > 0) {
            return;
        }
        let r = st.reqs[slot as u32].take().expect("checked");
        st.reqs.release(slot as u32);
        let ev = match r.failure {
            Some((m, status, e)) => BatchEvent { cookie: r.cookie, status, result: Err(v.member_error(m, e)) },
            None if r.moved == r.len => {
                BatchEvent { cookie: r.cookie, status: BatchStatus::Complete, result: Ok(r.len) }
            }
            None => BatchEvent {
                cookie: r.cookie,
                status: BatchStatus::Failed,
                result: Err(Error::Platform(format!("volume request moved {} of {} bytes", r.moved, r.len))),
            },
        };
        let s = &mut st.stats;
        s.ended += 1;
        match (ev.status, r.op) {
            (BatchStatus::Complete, BatchOp::Read) => s.bytes_read += r.len as u64,
            (BatchStatus::Complete, _) => s.bytes_written += r.len as u64,
            (BatchStatus::Canceled, _) => s.canceled += 1,
            (BatchStatus::Timeout, _) => s.timeouts += 1,
            _ => s.errors += 1,
        }
        st.done.push(ev);
    }

    /// Collects ended requests into `out`: waits until at least `min_nr`
    /// are available or `timeout` passes (`None`: no limit; the members'
    /// own timeouts still end every request), takes at most `max`.
    pub fn get_status(
        &self,
        min_nr: usize,
        max: usize,
        timeout: Option<Duration>,
        out: &mut Vec<BatchEvent>,
    ) -> Result<usize> {
        if min_nr > max {
            return Err(Error::InvalidArgument(format!("min_nr {min_nr} is more than max {max}")));
        }
        let start = Instant::now();
        let mut got = 0;
        let mut spins = 0u32;
        loop {
            let mut st = self.state.lock().recover();
            let mut busy = false;
            // Now and then, as a handle's batch does: parts late on their
            // member end as timed out, so that no wait is without end.
            let late = spins % 1024 == 1023;
            for (m, b) in self.members.iter().enumerate() {
                if st.parts_out[m] == 0 {
                    continue;
                }
                busy = true;
                if late {
                    b.expire_late();
                }
                if !late && spins % LOOK_EVERY != 0 && !b.completion_waiting() {
                    continue;
                }
                let mut evs = std::mem::take(&mut st.events);
                b.look(usize::MAX, &mut evs);
                for ev in evs.drain(..) {
                    st.parts_out[m] -= 1;
                    let slot = (ev.cookie >> 32) as usize;
                    let Some(r) = st.reqs[slot as u32].as_mut() else { continue };
                    r.pending -= 1;
                    match ev.result {
                        Ok(n) => r.moved += n,
                        Err(e) => r.fail(m, ev.status, e),
                    }
                    Self::finish_if_done(&mut st, &self.volume, slot);
                }
                st.events = evs;
            }
            let take = st.done.len().min(max - got);
            out.extend(st.done.drain(..take));
            got += take;
            let waiting = st.reqs.in_use() > 0;
            drop(st);
            if got >= min_nr || got == max || (!waiting && !busy) {
                return Ok(got);
            }
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                return Ok(got);
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Cancels every member's context (see [`Batch::cancel`]); the
    /// requests' events stay collectable.
    pub fn cancel(&self) -> Result<()> {
        let mut first = None;
        for (m, b) in self.members.iter().enumerate() {
            if let Err(e) = b.cancel() {
                first.get_or_insert(self.volume.member_error(m, e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

batch_context!(VolumeBatch);
