//! Volumes: one handle over several namespaces, on one controller or many,
//! of any platforms (PCIe controllers, the ugds_drv module, files through
//! the kernel, emulated ones), striped (RAID 0) or concatenated.
//!
//! A request is split at the members' boundaries ([`layout`]); each member
//! gets one vectored request per run of its pieces that is contiguous on
//! it (a striped range gives one run per member), and the runs of
//! different members are on their devices at once: submitted through a
//! batch context per member, then waited for together. A request that
//! touches one member goes to it directly, as a synchronous call on its
//! handle. Everything is checked before anything is submitted (the range,
//! the alignment, every buffer's registration), so bad input changes
//! nothing on any member; a member that fails its part fails the whole
//! request with [`Error::Member`] naming it, after every other part
//! submitted has ended (its buffers are never given back while a device
//! may still use them). Bytes moved are only ever reported for a request
//! every member completed.
//!
//! [`VolumeBatch`] submits many requests per call from any thread;
//! [`VolumeQueue`] is the one-thread asynchronous form, on a queue lent by
//! each member (as [`IoQueue`](crate::IoQueue) on a handle).
//!
//! All members come from the same [`Driver`](crate::Driver), so one
//! registration serves them all, and have the same block size.

mod batch;
pub mod layout;
mod queue;
mod stream;
pub mod topology;

pub use batch::VolumeBatch;
pub use layout::{Geometry, Piece, Run, VolumeLayout, MIN_STRIPE};
pub use queue::VolumeQueue;

use crate::batch::{Batch, BatchIov, BatchOp};
use crate::engine::BatchEvent;
use crate::handle::{Handle, Segment, MAX_SEGMENTS};
use crate::registry::BufGuard;
use std::sync::{Arc, Mutex};
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// Requests one member's batch context of a lane holds at once.
const LANE_DEPTH: usize = 64;

/// A volume over several handles; see the module docs. Shareable between
/// threads; cloning it gives another reference to the same volume.
#[derive(Clone)]
pub struct Volume {
    inner: Arc<Inner>,
}

struct Inner {
    members: Vec<Arc<Handle>>,
    names: Vec<String>,
    geometry: Geometry,
    block: usize,
    /// Idle lanes: a batch context per member (made when first needed),
    /// one lane per synchronous request that spans members at once.
    lanes: Mutex<Vec<Lane>>,
    /// Runs stream-ordered operations (made at the first).
    stream: stream::StreamThread,
}

/// One request's batch contexts, a slot per member.
struct Lane(Vec<Option<Batch>>);

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = &self.inner;
        f.debug_struct("Volume")
            .field("layout", &v.geometry.layout())
            .field("members", &v.names)
            .field("capacity", &v.geometry.capacity())
            .finish_non_exhaustive()
    }
}

/// A part of a request on one member: a range there and the buffer
/// pieces it moves.
struct Part<'a> {
    member: usize,
    member_offset: u64,
    segments: Vec<Segment<'a>>,
}

impl Volume {
    /// A volume of `members` (in order: stripe `i` goes to member `i % n`;
    /// concatenation puts them one after another) laid out as `layout`.
    /// Refused: no members, members of different drivers or block sizes, a
    /// stripe that is not a power of two of at least 4 KiB, a member that
    /// holds no whole stripe.
    pub fn new(members: Vec<Handle>, layout: VolumeLayout) -> Result<Volume> {
        Volume::with_shared(members.into_iter().map(Arc::new).collect(), layout)
    }

    /// As [`new`](Self::new), on handles shared with others (the C
    /// library's registered handles stay usable on their own).
    pub fn with_shared(members: Vec<Arc<Handle>>, layout: VolumeLayout) -> Result<Volume> {
        let Some(first) = members.first() else {
            return Err(Error::InvalidArgument("a volume needs at least one member".into()));
        };
        let block = first.inner.block_size();
        for (i, m) in members.iter().enumerate() {
            if !m.inner.same_driver(&first.inner) {
                return Err(Error::InvalidArgument(format!(
                    "member {i} was opened by another Driver: a volume's members share their buffer registrations"
                )));
            }
            if m.inner.block_size() != block {
                return Err(Error::InvalidArgument(format!(
                    "member {i} has {}-byte blocks, member 0 {block}-byte ones: a volume's members have one block size",
                    m.inner.block_size()
                )));
            }
        }
        let caps: Vec<u64> = members.iter().map(|m| m.capacity()).collect();
        let geometry = Geometry::new(layout, &caps, block as u64)?;
        let names =
            members.iter().map(|m| format!("{} namespace {}", m.controller().platform, m.namespace().nsid)).collect();
        let inner =
            Inner { members, names, geometry, block, lanes: Mutex::new(Vec::new()), stream: Default::default() };
        Ok(Volume { inner: Arc::new(inner) })
    }

    /// Size in bytes.
    pub fn capacity(&self) -> u64 {
        self.inner.geometry.capacity()
    }

    /// The members' logical block size.
    pub fn block_size(&self) -> usize {
        self.inner.block
    }

    /// How the bytes are laid out.
    pub fn layout(&self) -> VolumeLayout {
        self.inner.geometry.layout()
    }

    /// Members.
    pub fn member_count(&self) -> usize {
        self.inner.members.len()
    }

    /// Member `i`'s handle.
    pub fn member(&self, i: usize) -> &Handle {
        &self.inner.members[i]
    }

    /// What member `i` is, as errors name it.
    pub fn member_name(&self, i: usize) -> &str {
        &self.inner.names[i]
    }

    /// The members nearest the GPU (or any PCI function) at `gpu` first,
    /// by where they sit in the PCIe hierarchy (see [`topology`]): the
    /// ones to give its requests where the data is on several, the order to
    /// pick members in when building a volume for it.
    pub fn members_near(&self, gpu: &str) -> Vec<(usize, topology::Affinity)> {
        let addrs: Vec<Option<String>> = self.inner.members.iter().map(|m| m.pci_address()).collect();
        topology::rank(std::path::Path::new("/sys"), gpu, &addrs)
    }

    /// Reads `size` bytes at `file_offset` of the volume into `buf` at
    /// `buf_offset`. Returns the bytes read (all of them: a member's
    /// failure fails the request).
    pub fn read(
        &self,
        buf: &crate::registry::BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
    ) -> Result<usize> {
        self.inner.rwv(BatchOp::Read, &[Segment::new(buf, buf_offset, size)], file_offset)
    }

    /// Writes `size` bytes of `buf` at `buf_offset` to `file_offset` of the
    /// volume.
    pub fn write(
        &self,
        buf: &crate::registry::BufferToken,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
    ) -> Result<usize> {
        self.inner.rwv(BatchOp::Write, &[Segment::new(buf, buf_offset, size)], file_offset)
    }

    /// Reads the range at `file_offset` into `segments`, in order (see
    /// [`Handle::readv`]).
    pub fn readv(&self, segments: &[Segment<'_>], file_offset: u64) -> Result<usize> {
        self.inner.rwv(BatchOp::Read, segments, file_offset)
    }

    /// Writes `segments`, in order, to the range at `file_offset`.
    pub fn writev(&self, segments: &[Segment<'_>], file_offset: u64) -> Result<usize> {
        self.inner.rwv(BatchOp::Write, segments, file_offset)
    }

    /// Flushes every member's volatile write cache; the first member to
    /// fail is named.
    pub fn flush(&self) -> Result<()> {
        let v = &self.inner;
        let mut first = None;
        for (i, m) in v.members.iter().enumerate() {
            if let Err(e) = m.flush() {
                first.get_or_insert(v.member_error(i, e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Inner {
    fn member_error(&self, member: usize, e: Error) -> Error {
        Error::Member { member, name: self.names[member].clone(), source: Box::new(e) }
    }

    /// Checks a request whole: the range on the volume, every segment
    /// (length, alignment, registration). Returns the total and the claims
    /// that keep the buffers registered until the request ends.
    fn check(&self, op: BatchOp, segments: &[Segment<'_>], file_offset: u64) -> Result<(usize, Vec<BufGuard>)> {
        let total = self.check_range(op, segments, file_offset)?;
        let inner = &self.members[0].inner;
        let claims = segments.iter().map(|s| Self::claim(inner, s)).collect::<Result<_>>()?;
        Ok((total, claims))
    }

    /// [`check`](Self::check) of a one-segment request that keeps no claim
    /// (its member takes its own): nothing allocated.
    fn check_one(&self, op: BatchOp, segment: &Segment<'_>, file_offset: u64) -> Result<()> {
        self.check_range(op, std::slice::from_ref(segment), file_offset)?;
        Self::claim(&self.members[0].inner, segment).map(drop)
    }

    /// A claim on a segment's buffer range, refused where PRPs cannot name
    /// its address.
    fn claim(inner: &crate::handle::HandleInner, s: &Segment<'_>) -> Result<BufGuard> {
        let g = inner.registry().acquire(s.buf, s.offset as u64, s.len as u64)?;
        inner.data_offset(g.entry().base, s.offset)?;
        Ok(g)
    }

    /// The segments and the volume range of a request; its total length.
    fn check_range(&self, op: BatchOp, segments: &[Segment<'_>], file_offset: u64) -> Result<usize> {
        let total = crate::handle::check_segments(segments, self.block, op == BatchOp::Read)?;
        let bs = self.block as u64;
        if file_offset % bs != 0 {
            return Err(Error::Misaligned { what: "file offset", value: file_offset, alignment: bs });
        }
        let cap = self.geometry.capacity();
        if file_offset.checked_add(total as u64).is_none_or(|e| e > cap) {
            return Err(Error::OutOfRange { offset: file_offset, len: total as u64, capacity: cap });
        }
        Ok(total)
    }

    /// Where `len` bytes at `file_offset` lie when they lie on one member
    /// in one piece (within a stripe, or within a concatenated member):
    /// (member, offset on it).
    fn single_piece(&self, file_offset: u64, len: u64) -> Option<(usize, u64)> {
        self.geometry.single_piece(file_offset, len)
    }

    /// The parts of a checked request: its runs on each member, cut where
    /// a run would need more than [`MAX_SEGMENTS`] buffer pieces.
    fn parts<'a>(&self, segments: &[Segment<'a>], file_offset: u64, total: usize) -> Vec<Part<'a>> {
        // Where each segment starts in the request.
        let mut starts = Vec::with_capacity(segments.len());
        let mut at = 0u64;
        for s in segments {
            starts.push(at);
            at += s.len as u64;
        }
        let mut parts = Vec::new();
        for run in self.geometry.runs(file_offset, total as u64) {
            let mut part = Part { member: run.member, member_offset: run.member_offset, segments: Vec::new() };
            let mut member_at = run.member_offset;
            for p in &run.pieces {
                // The segments under the piece's bytes of the request.
                let (mut pos, end) = (p.at, p.at + p.len);
                let mut i = starts.partition_point(|&s| s <= pos) - 1;
                while pos < end {
                    let s = &segments[i];
                    let within = (pos - starts[i]) as usize;
                    let n = (s.len - within).min((end - pos) as usize);
                    if part.segments.len() == MAX_SEGMENTS {
                        let next = Part { member: run.member, member_offset: member_at, segments: Vec::new() };
                        parts.push(std::mem::replace(&mut part, next));
                    }
                    part.segments.push(Segment::new(s.buf, s.offset + within, n));
                    member_at += n as u64;
                    pos += n as u64;
                    i += 1;
                }
            }
            parts.push(part);
        }
        parts
    }

    fn rwv(&self, op: BatchOp, segments: &[Segment<'_>], file_offset: u64) -> Result<usize> {
        let (total, _claims) = self.check(op, segments, file_offset)?;
        let parts = self.parts(segments, file_offset, total);
        if let [part] = &parts[..] {
            // One member: its own synchronous call.
            return self.run_alone(op, part);
        }
        let mut lane =
            self.lanes.lock().recover().pop().unwrap_or_else(|| Lane((0..self.members.len()).map(|_| None).collect()));
        let (moved, first_error, reusable) = self.run_together(op, &parts, &mut lane);
        if reusable {
            self.lanes.lock().recover().push(lane);
        }
        match first_error {
            Some(e) => Err(e),
            None if moved == total => Ok(total),
            None => Err(Error::Platform(format!("volume request moved {moved} of {total} bytes"))),
        }
    }

    /// A part as a synchronous call on its member.
    fn run_alone(&self, op: BatchOp, part: &Part<'_>) -> Result<usize> {
        let m = &self.members[part.member];
        let r = match (op, &part.segments[..]) {
            (BatchOp::Read, [s]) => m.read(s.buf, s.len, part.member_offset, s.offset),
            (BatchOp::Write, [s]) => m.write(s.buf, s.len, part.member_offset, s.offset),
            (BatchOp::Read, segs) => m.readv(segs, part.member_offset),
            (_, segs) => m.writev(segs, part.member_offset),
        };
        let want: usize = part.segments.iter().map(|s| s.len).sum();
        match r {
            Ok(n) if n == want => Ok(n),
            Ok(n) => Err(self.member_error(part.member, short(n, want))),
            Err(e) => Err(self.member_error(part.member, e)),
        }
    }

    /// Parts on several members at once: each member's parts go to its
    /// batch context in the lane (up to [`LANE_DEPTH`] at a time), then
    /// every submitted part is waited for, whatever failed. Returns the
    /// bytes moved, the first failure (by member order), and whether the
    /// lane may serve again (no context wedged or stuck).
    fn run_together(&self, op: BatchOp, parts: &[Part<'_>], lane: &mut Lane) -> (usize, Option<Error>, bool) {
        let mut failures: Vec<(usize, Error)> = Vec::new();
        let mut moved = 0usize;
        let mut reusable = true;
        let mut by_member: Vec<Vec<usize>> = vec![Vec::new(); self.members.len()];
        for (i, p) in parts.iter().enumerate() {
            by_member[p.member].push(i);
        }
        // Members without a batch context (a handle with no batch queue):
        // their parts run as synchronous calls after the others are
        // submitted.
        let mut alone = Vec::new();
        let mut next: Vec<usize> = vec![0; self.members.len()];
        let mut events: Vec<BatchEvent> = Vec::new();
        loop {
            // Submit what each member's context has room for.
            let mut waiting = Vec::new();
            for (m, idx) in by_member.iter().enumerate() {
                if next[m] == idx.len() {
                    continue;
                }
                let batch = match self.lane_batch(lane, m) {
                    Ok(b) => b,
                    Err(_) => {
                        alone.extend(idx[next[m]..].iter().copied());
                        next[m] = idx.len();
                        continue;
                    }
                };
                let take = (idx.len() - next[m]).min(LANE_DEPTH);
                let ios: Vec<BatchIov<'_>> = idx[next[m]..next[m] + take]
                    .iter()
                    .map(|&i| BatchIov {
                        op,
                        segments: &parts[i].segments,
                        file_offset: parts[i].member_offset,
                        cookie: i as u64,
                    })
                    .collect();
                match batch.submit_vectored(&ios) {
                    Ok(_) => {
                        next[m] += take;
                        waiting.push((m, take));
                    }
                    Err(e) => {
                        // Not submitted: the member's remaining parts fail.
                        failures.push((m, e));
                        next[m] = idx.len();
                    }
                }
            }
            if waiting.is_empty() {
                break;
            }
            for (m, n) in waiting {
                let batch = lane.0[m].as_ref().expect("submitted through it");
                events.clear();
                match batch.get_status(n, n, None, &mut events) {
                    Ok(_) => {}
                    Err(e) => {
                        failures.push((m, e));
                        reusable = false;
                    }
                }
                if events.len() < n {
                    // Not all came back (the handle wedged): the lane's
                    // context still holds them; it is not reused.
                    reusable = false;
                }
                for ev in events.drain(..) {
                    let i = ev.cookie as usize;
                    let want: usize = parts[i].segments.iter().map(|s| s.len).sum();
                    match ev.result {
                        Ok(got) if got == want => moved += got,
                        Ok(got) => failures.push((m, short(got, want))),
                        Err(e) => failures.push((m, e)),
                    }
                }
            }
        }
        for i in alone {
            match self.run_alone(op, &parts[i]) {
                Ok(n) => moved += n,
                Err(Error::Member { member, source, .. }) => failures.push((member, *source)),
                Err(e) => failures.push((parts[i].member, e)),
            }
        }
        failures.sort_by_key(|(m, _)| *m);
        let first = failures.into_iter().next().map(|(m, e)| self.member_error(m, e));
        (moved, first, reusable)
    }

    /// Member `m`'s batch context in `lane`, made at its first use.
    fn lane_batch<'l>(&self, lane: &'l mut Lane, m: usize) -> Result<&'l Batch> {
        if lane.0[m].is_none() {
            lane.0[m] = Some(self.members[m].batch(LANE_DEPTH)?);
        }
        Ok(lane.0[m].as_ref().expect("made above"))
    }
}

/// A member that moved fewer bytes than its part (a kernel-path file
/// that shrank under the handle).
fn short(got: usize, want: usize) -> Error {
    Error::Platform(format!("moved {got} of {want} bytes (the member's file is shorter than when it was opened?)"))
}
