//! The `Handle` calls that place operations on a stream: their requests
//! before their values are bound, staging, pieces, and the binding that
//! makes them a [`Job`] for the stream engine.

use super::job::{Bound, HandleRef, Job, JobService, Progress};
use crate::batch::BatchOp;
use crate::engine::batch::Prepared;
use crate::engine::hold::Hold;
use crate::engine::Completion;
use crate::gpu::{GpuStream, StageLease, StageMark, MAX_PIECES};
use crate::handle::{Handle, HandleInner, Segment};
use crate::mode::ModeRequest;
use crate::registry::{BufGuard, BufferToken, Recent};
use crate::stream::io::{Sink, Src, SumSink};
use crate::stream::{Stream, StreamCounters, StreamIo, StreamService, StreamSignal};
use std::sync::{Arc, Mutex};
use ugds_nvme::NvmOpcode;
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// What `service` decides for an operation of `pending` requests.
fn job_service(service: StreamService, pending: &[Pending]) -> JobService {
    let Some(mode) = service.mode else {
        return JobService { class: service.priority, ..JobService::default() };
    };
    let bytes = pending
        .iter()
        .map(|p| match (&p.io.size, p.segments.is_empty()) {
            (_, false) => p.segments.iter().map(|s| s.2).sum(),
            (Src::Value(n), true) => *n as usize,
            _ => 0,
        })
        .sum();
    let req =
        ModeRequest { bytes, write: pending.iter().any(|p| p.op == NvmOpcode::Write), priority: service.priority };
    let plan = mode.plan(&req);
    JobService {
        class: plan.priority,
        naps: plan.completion == Completion::Interrupt,
        observe: if plan.measure { Some(Box::new((mode, req, plan))) } else { None },
    }
}

/// One request of a stream operation, before its values are bound.
struct Pending {
    op: NvmOpcode,
    buf: BufferToken,
    io: StreamIo,
    /// Taken at enqueue: the buffer cannot be deregistered meanwhile.
    _hold: BufGuard,
    /// A vectored request's pieces (buffer, offset, length) in the order of
    /// the range, `buf` the first's (empty: one piece, `buf` at `io`'s
    /// buffer offset); their holds after the first's.
    segments: Vec<(BufferToken, usize, usize)>,
    _holds: Vec<BufGuard>,
    /// A vectored request's staging blocks, one per segment (`None`: the
    /// controller reaches it); with any, each segment is a request of its own.
    seg_stages: Vec<Option<(StageLease, BufferToken)>>,
    /// Where the data passes through when the controller cannot reach the
    /// buffer (device memory behind the emulated controller): the staging
    /// block and its registration for this handle.
    stage: Option<(StageLease, BufferToken)>,
    /// A staged read's pieces: the stream copies each out as soon as its
    /// I/O is done, while the later pieces' I/O goes on (1: all at once).
    pieces: usize,
}

/// The least a staged read's piece holds, before its I/O is split: the
/// stream copies each piece out after a wait of its own.
const PIECE_MIN: usize = 1 << 20;
/// A piece's length is a multiple of this (so pieces keep the read's
/// alignment in the file and in the staging block).
const PIECE_ALIGN: usize = 64 << 10;

/// The pieces a staged read of `size` bytes is copied out in.
fn pieces_for(size: usize) -> usize {
    (size / PIECE_MIN).clamp(1, MAX_PIECES)
}

impl Handle {
    /// Reads in stream order: when `stream` reaches this point, `io`'s size
    /// and offsets are read and `size` bytes at `file_offset` go into the
    /// registered buffer at `buf_offset`; the bytes moved (or `-errno`) are
    /// written before later work on the stream runs. The buffer must be
    /// registered now; the ranges are checked when the values are read.
    pub fn read_async(&self, buf: &BufferToken, io: StreamIo, stream: &dyn Stream) -> Result<()> {
        self.stream_op(vec![(BatchOp::Read, *buf, io)], stream)
    }

    /// Writes in stream order; see [`read_async`](Self::read_async).
    pub fn write_async(&self, buf: &BufferToken, io: StreamIo, stream: &dyn Stream) -> Result<()> {
        self.stream_op(vec![(BatchOp::Write, *buf, io)], stream)
    }

    /// An ordered batch: the requests run after earlier work on `stream` and
    /// before later work, all at once and in no order among themselves.
    pub fn batch_async(&self, ios: Vec<(BatchOp, BufferToken, StreamIo)>, stream: &dyn Stream) -> Result<()> {
        if ios.is_empty() {
            return Err(Error::InvalidArgument("empty batch".into()));
        }
        self.stream_op(ios, stream)
    }

    /// A vectored read in stream order: when `stream` reaches this point,
    /// the range at `io`'s namespace offset goes into `segments` in order,
    /// as one request; the bytes moved (or `-errno`) are written before
    /// later work on the stream runs. The list is checked now (as
    /// [`readv`](Self::readv) checks it) and each buffer claimed until the
    /// I/O is done; `io`'s size, when read, must be the segments' total and
    /// its buffer offset 0 ([`StreamIo::new`]`(total, offset, 0)`). Where
    /// the controller reaches device memory only through a GPU stream's
    /// copies (an emulated controller, the kernel path), each segment goes
    /// through a staging block as a request of its own, and the result is
    /// their sum (or the first error).
    pub fn readv_async(&self, segments: &[Segment<'_>], io: StreamIo, stream: &dyn Stream) -> Result<()> {
        self.stream_vectored(BatchOp::Read, segments, io, stream)
    }

    /// A vectored write in stream order; see [`readv_async`](Self::readv_async).
    pub fn writev_async(&self, segments: &[Segment<'_>], io: StreamIo, stream: &dyn Stream) -> Result<()> {
        self.stream_vectored(BatchOp::Write, segments, io, stream)
    }

    fn stream_vectored(&self, op: BatchOp, segments: &[Segment<'_>], io: StreamIo, stream: &dyn Stream) -> Result<()> {
        let h = &self.inner;
        let _in = h.enter()?;
        crate::handle::check_segments(segments, h.block_size(), op == BatchOp::Read)?;
        let gpu =
            stream.as_any().and_then(|s| s.downcast_ref::<GpuStream>()).filter(|_| h.platform().copies_device_memory());
        let mark = gpu.map(|_| StageMark::default());
        let mut holds = Vec::with_capacity(segments.len());
        let mut seg_stages = Vec::with_capacity(segments.len());
        for s in segments {
            holds.push(h.registry().acquire(s.buf, s.offset as u64, s.len as u64)?);
            seg_stages.push(match (gpu, &mark) {
                (Some(g), Some(m)) => stage_block(h, g, s.buf, s.len, m)?,
                _ => None,
            });
        }
        let pieces = segments.iter().map(|s| (*s.buf, s.offset, s.len)).collect();
        let first = holds.remove(0);
        let p = Pending {
            op: if op == BatchOp::Read { NvmOpcode::Read } else { NvmOpcode::Write },
            buf: *segments[0].buf,
            io,
            _hold: first,
            stage: None,
            segments: pieces,
            _holds: holds,
            seg_stages,
            pieces: 1,
        };
        self.stream_launch(vec![p], stream, gpu, mark)
    }

    fn stream_op(&self, ios: Vec<(BatchOp, BufferToken, StreamIo)>, stream: &dyn Stream) -> Result<()> {
        let h = &self.inner;
        let _in = h.enter()?;
        let gpu =
            stream.as_any().and_then(|s| s.downcast_ref::<GpuStream>()).filter(|_| h.platform().copies_device_memory());
        // What will free this operation's staging blocks (an allocation:
        // only where staging may happen).
        let mark = gpu.map(|_| StageMark::default());
        let one = ios.len() == 1;
        let mut pending = Vec::with_capacity(ios.len());
        for (op, buf, io) in ios {
            let hold = h.registry().acquire(&buf, 0, 0)?;
            let op = if op == BatchOp::Read { NvmOpcode::Read } else { NvmOpcode::Write };
            let stage = match gpu {
                Some(g) => stage_for(h, g, &buf, &io, mark.as_ref().expect("made with gpu"))?,
                None => None,
            };
            // A large staged read alone in its operation, of a size known
            // now, is copied out piece by piece as its I/O completes.
            let pieces = match (&stage, &io.size) {
                (Some(_), Src::Value(n)) if one && op == NvmOpcode::Read => pieces_for(*n as usize),
                _ => 1,
            };
            pending.push(Pending {
                op,
                buf,
                io,
                _hold: hold,
                stage,
                segments: Vec::new(),
                _holds: Vec::new(),
                seg_stages: Vec::new(),
                pieces,
            });
        }
        self.stream_launch(pending, stream, gpu, mark)
    }

    /// Puts an operation of `pending` requests on `stream` (the caller has
    /// entered the handle): bound and sent to the engine when the stream
    /// reaches it, after the copies into staging blocks where there are any.
    fn stream_launch(
        &self,
        pending: Vec<Pending>,
        stream: &dyn Stream,
        gpu: Option<&GpuStream>,
        mark: Option<StageMark>,
    ) -> Result<()> {
        let h = &self.inner;
        if h.service().is_none() {
            return Err(Error::Unsupported("stream-ordered I/O needs the batch queue, which this handle lacks".into()));
        }
        let staged = |p: &Pending| p.stage.is_some() || p.seg_stages.iter().any(Option::is_some);
        let counters = stream.counters();
        let service = job_service(stream.service(), &pending);
        let Some(g) = gpu.filter(|_| pending.iter().any(staged)) else {
            let href = HandleRef::new(h);
            return stream.launch(Box::new(move |signal| {
                let mut bound = bind(&href.0, pending, counters);
                bound.service = service;
                send(href, bound, signal)
            }));
        };
        // Staged: the binding (which sets the copies' parameters) runs
        // before the copies into staging blocks; the operation after them.
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for p in &pending {
            for (lease, _) in p.stage.iter().chain(p.seg_stages.iter().flatten()) {
                let headers = (0..p.pieces).map(|i| lease.header_dev(i));
                if p.op == NvmOpcode::Write { &mut before } else { &mut after }.extend(headers);
            }
        }
        let piecewise = pending.len() == 1 && pending[0].pieces > 1;
        let cell: Arc<Mutex<Option<Bound>>> = Arc::default();
        let c = cell.clone();
        let href = HandleRef::new(h);
        let h2 = h.clone();
        let bind_fn = Box::new(move || *c.lock().recover() = Some(bind(&h2, pending, counters)));
        let op = Box::new(move |signal| {
            let mut bound = cell.lock().recover().take().unwrap_or_default();
            bound.service = service;
            send(href, bound, signal)
        });
        g.launch_staged(bind_fn, op, before, &after, piecewise, mark.as_ref().expect("made with gpu"))
    }
}

/// A staging block for a request on `buf` through GPU stream `g`, when the
/// buffer is device memory of the stream's context that the controller
/// reaches only by copies; registered for this handle.
fn stage_for(
    h: &Arc<HandleInner>,
    g: &GpuStream,
    buf: &BufferToken,
    io: &StreamIo,
    mark: &StageMark,
) -> Result<Option<(StageLease, BufferToken)>> {
    // The most this request can move, as far as is known now.
    let bound = match (&io.size, &io.buf_offset) {
        (Src::Value(n), _) => *n as usize,
        (_, Src::Value(off)) => buf.len.saturating_sub(*off as usize),
        _ => buf.len,
    };
    stage_block(h, g, buf, bound, mark)
}

/// As [`stage_for`], for a request of at most `bound` bytes.
fn stage_block(
    h: &Arc<HandleInner>,
    g: &GpuStream,
    buf: &BufferToken,
    bound: usize,
    mark: &StageMark,
) -> Result<Option<(StageLease, BufferToken)>> {
    let Some(dev) = h.registry().device_memory(buf)? else { return Ok(None) };
    if dev.runtime.context() == 0 || dev.runtime.context() != g.context() {
        return Ok(None);
    }
    let lease = match g.stage(bound.max(1), mark) {
        Ok(l) => l,
        Err(Error::Unsupported(why)) => {
            tracing::debug!("stream-ordered I/O not staged: {why}");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let (ptr, cap) = lease.data();
    let token = h.staging_token(ptr, cap)?;
    Ok(Some((lease, token)))
}

/// Binds each request's late values and validates them; a request that
/// fails has its result written now and is left out.
fn bind(h: &Arc<HandleInner>, pending: Vec<Pending>, counters: Option<Arc<StreamCounters>>) -> Bound {
    let mut b =
        Bound { reqs: Vec::with_capacity(pending.len()), sinks: Vec::with_capacity(pending.len()), ..Bound::default() };
    // A request refused here ends at once; one bound is counted as submitted.
    let refused = |write: bool, sink: Sink, e: Error| {
        if let Some(c) = &counters {
            c.submitted(1);
            c.ended(write, &Err(e.clone()));
        }
        sink.write(Err(e));
    };
    let mut recent = None;
    for mut p in pending {
        let write = p.op == NvmOpcode::Write;
        let values = (|| -> Result<(usize, u64, usize)> {
            let size = usize::try_from(p.io.size.get()?).map_err(|_| Error::InvalidArgument("size".into()))?;
            let file_offset = p.io.file_offset.get()?;
            let buf_offset =
                usize::try_from(p.io.buf_offset.get()?).map_err(|_| Error::InvalidArgument("offset".into()))?;
            if h.is_wedged() {
                return Err(Error::Wedged);
            }
            Ok((size, file_offset, buf_offset))
        })();
        let (size, file_offset, buf_offset) = match values {
            Ok(v) => v,
            Err(e) => {
                refused(write, p.io.result, e);
                b.stages.extend(p.stage.take());
                b.stages.extend(p.seg_stages.drain(..).flatten());
                continue;
            }
        };
        let pieces = p.stage.as_ref().map_or(1, |_| piece_count(size, p.pieces));
        if p.segments.is_empty() && pieces > 1 {
            let (lease, token) = p.stage.as_ref().expect("pieces are staged");
            match prepare_pieces(h, &mut recent, &p.buf, (size, file_offset, buf_offset), lease, token, pieces) {
                Ok((reqs, hold)) => {
                    let sum = Arc::new(SumSink::new(reqs.len(), p.io.result));
                    for (i, r) in reqs.into_iter().enumerate() {
                        b.cuts.push(Some((b.stages.len(), i, r.len)));
                        b.reqs.push(r);
                        b.sinks.push(Some(Sink::Sum(sum.clone())));
                        b.writes.push(false);
                    }
                    b.progress = Some(Progress::new(b.reqs.len()));
                    b.holds.push(hold);
                }
                Err(e) => refused(write, p.io.result, e),
            }
            b.stages.extend(p.stage.take());
        } else if p.segments.is_empty() {
            match prepare(h, &mut recent, p.op, &p.buf, size, file_offset, buf_offset, &p.stage) {
                Ok((r, hold)) => {
                    let staged_read = p.stage.is_some() && !write;
                    b.cuts.push(staged_read.then_some((b.stages.len(), 0, r.len)));
                    b.reqs.push(r);
                    b.sinks.push(Some(p.io.result));
                    b.writes.push(write);
                    b.holds.extend(hold);
                }
                Err(e) => refused(write, p.io.result, e),
            }
            b.stages.extend(p.stage.take());
        } else if p.seg_stages.iter().all(Option::is_none) {
            match bind_vectored(h, p.op, &p.segments, size, file_offset, buf_offset) {
                Ok(r) => {
                    b.cuts.push(None);
                    b.reqs.push(r);
                    b.sinks.push(Some(p.io.result));
                    b.writes.push(write);
                }
                Err(e) => refused(write, p.io.result, e),
            }
        } else {
            // Staged pieces: a request per segment, each through its own
            // staging block, their results summed into the one result.
            let total: usize = p.segments.iter().map(|s| s.2).sum();
            let checked =
                check_total(total, size, buf_offset).and_then(|()| h.check_range(total, file_offset).map(drop));
            let sum = Arc::new(SumSink::new(p.segments.len(), p.io.result));
            let mut at = file_offset;
            for ((buf, off, len), stage) in p.segments.iter().zip(p.seg_stages.drain(..)) {
                let r = checked.clone().and_then(|()| prepare(h, &mut recent, p.op, buf, *len, at, *off, &stage));
                match r {
                    Ok((r, hold)) => {
                        let staged_read = stage.is_some() && !write;
                        b.cuts.push(staged_read.then_some((b.stages.len(), 0, r.len)));
                        b.reqs.push(r);
                        b.sinks.push(Some(Sink::Sum(sum.clone())));
                        b.writes.push(write);
                        b.holds.extend(hold);
                    }
                    Err(e) => refused(write, Sink::Sum(sum.clone()), e),
                }
                b.stages.extend(stage);
                at += *len as u64;
            }
        }
    }
    b.counters = counters;
    b
}

/// One request of `size` bytes at `file_offset` to or from `buf` at
/// `buf_offset`, through the staging block when there is one (then also
/// the hold on the caller's buffer, kept until the copies are done).
#[allow(clippy::too_many_arguments)]
fn prepare(
    h: &Arc<HandleInner>,
    recent: &mut Option<Recent>,
    op: NvmOpcode,
    buf: &BufferToken,
    size: usize,
    file_offset: u64,
    buf_offset: usize,
    stage: &Option<(StageLease, BufferToken)>,
) -> Result<(Prepared, Option<BufGuard>)> {
    let (guard, data_off) = h.prepare_recent(recent, buf, size, file_offset, buf_offset)?;
    let Some((lease, token)) = stage else {
        let chunks = h.chunker(file_offset, data_off, size);
        let pages = recent.as_ref().expect("filled by prepare_recent").shared_pages();
        return Ok((
            Prepared { op, cookie: 0, len: size, chunks, pages, more: Vec::new(), hold: guard.into(), sgl: false },
            None,
        ));
    };
    // Checked exactly as the caller's buffer would be; then the I/O goes to
    // the staging block and the stream copies.
    if size > lease.data().1 {
        return Err(Error::InvalidArgument(format!(
            "{size} bytes is more than this staged stream operation can move ({} bytes: the emulated controller \
             reaches device memory through a staging block)",
            lease.data().1
        )));
    }
    let (sguard, sdata_off) = h.prepare_recent(recent, token, size, file_offset, 0)?;
    lease.set_copy(op == NvmOpcode::Read, (buf.base + buf_offset) as u64, size);
    let chunks = h.chunker(file_offset, sdata_off, size);
    let pages = recent.as_ref().expect("filled by prepare_recent").shared_pages();
    Ok((
        Prepared { op, cookie: 0, len: size, chunks, pages, more: Vec::new(), hold: sguard.into(), sgl: false },
        Some(guard),
    ))
}

/// How many pieces a staged read of `size` bytes is split in, at most
/// `most`: pieces of equal length, a multiple of [`PIECE_ALIGN`], the last
/// shorter.
fn piece_count(size: usize, most: usize) -> usize {
    if most <= 1 {
        return 1;
    }
    size.div_ceil(piece_len(size, most)).max(1)
}

fn piece_len(size: usize, most: usize) -> usize {
    size.div_ceil(most.max(1)).next_multiple_of(PIECE_ALIGN).max(PIECE_ALIGN)
}

/// A staged read of `size` bytes at `file_offset` into `buf` at
/// `buf_offset` (the values bound), as requests of one piece each into
/// `lease`'s block, each piece's copy set; checked as one read first.
/// Also the hold on the caller's buffer, kept until the copies are done.
fn prepare_pieces(
    h: &Arc<HandleInner>,
    recent: &mut Option<Recent>,
    buf: &BufferToken,
    (size, file_offset, buf_offset): (usize, u64, usize),
    lease: &StageLease,
    token: &BufferToken,
    most: usize,
) -> Result<(Vec<Prepared>, BufGuard)> {
    let (guard, _) = h.prepare_recent(recent, buf, size, file_offset, buf_offset)?;
    if size > lease.data().1 {
        return Err(Error::InvalidArgument(format!(
            "{size} bytes is more than this staged stream operation can move ({} bytes)",
            lease.data().1
        )));
    }
    let piece = piece_len(size, most);
    let mut reqs = Vec::with_capacity(most);
    for at in (0..size).step_by(piece) {
        let len = piece.min(size - at);
        let off = file_offset + at as u64;
        let (sguard, sdata_off) = h.prepare_recent(recent, token, len, off, at)?;
        let pages = recent.as_ref().expect("filled by prepare_recent").shared_pages();
        let chunks = h.chunker(off, sdata_off, len);
        let op = NvmOpcode::Read;
        reqs.push(Prepared { op, cookie: 0, len, chunks, pages, more: Vec::new(), hold: sguard.into(), sgl: false });
    }
    // Every piece is valid: now the copies are set.
    for (i, r) in reqs.iter().enumerate() {
        lease.set_piece(i, true, i * piece, (buf.base + buf_offset + i * piece) as u64, r.len);
    }
    Ok((reqs, guard))
}

/// A vectored operation moves its segments' total from buffer offset 0.
fn check_total(total: usize, size: usize, buf_offset: usize) -> Result<()> {
    if size != total || buf_offset != 0 {
        return Err(Error::InvalidArgument(format!(
            "a vectored stream operation moves its segments' {total} bytes from buffer offset 0, not {size} bytes \
             from {buf_offset}"
        )));
    }
    Ok(())
}

/// Binds a vectored request: the segments' pieces as one request of
/// `size` bytes (their total) at `file_offset`, each piece claimed again
/// for the I/O.
fn bind_vectored(
    h: &Arc<HandleInner>,
    op: NvmOpcode,
    segments: &[(BufferToken, usize, usize)],
    size: usize,
    file_offset: u64,
    buf_offset: usize,
) -> Result<Prepared> {
    let total: usize = segments.iter().map(|s| s.2).sum();
    check_total(total, size, buf_offset)?;
    h.check_range(total, file_offset)?;
    let (mut holds, mut pieces) = (Vec::with_capacity(segments.len()), Vec::with_capacity(segments.len()));
    let mut at = file_offset;
    for (buf, off, len) in segments {
        let mut recent = None;
        let (guard, data_off) = h.prepare_recent(&mut recent, buf, *len, at, *off)?;
        holds.push(guard.into());
        let pages = recent.as_ref().expect("filled by prepare_recent").shared_pages();
        pieces.push((h.chunker(at, data_off, *len), pages));
        at += *len as u64;
    }
    let sgl = h.one_sgl(total, &crate::engine::batch::pieces(pieces.iter().map(|(c, p)| (c, &p[..]))));
    let mut pieces = pieces.into_iter();
    let (chunks, pages) = pieces.next().expect("at least one segment");
    Ok(Prepared { op, cookie: 0, len: total, chunks, pages, more: pieces.collect(), hold: Hold::many(holds), sgl })
}

/// Hands bound requests to the handle's engine; with none left, lets the
/// stream go on at once.
fn send(handle: HandleRef, bound: Bound, signal: StreamSignal) {
    let h = handle.0.clone();
    if let Some(c) = &bound.counters {
        c.submitted(bound.reqs.len() as u64);
    }
    let mut job = Job { bound, signal, handle, timed_out: false, failed: false, issued: None };
    if job.bound.reqs.is_empty() {
        job.release_stages();
        let Job { signal, handle, .. } = job;
        drop(handle);
        signal.set();
        return;
    }
    let sent = super::engine::send(&h, job);
    if let Err(e) = sent {
        // The engine is gone (the handle is being torn down): the job, and
        // with it the signal, is dropped, which sets the signal.
        tracing::error!("stream engine unavailable: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_aligned_and_at_most_the_count_asked() {
        let mib = 1usize << 20;
        assert_eq!((pieces_for(16 * mib), piece_len(16 * mib, 16), piece_count(16 * mib, 16)), (16, mib, 16));
        assert_eq!(pieces_for(mib + 4096), 1);
        assert_eq!(pieces_for(1 << 30), MAX_PIECES);
        // 5 MiB and 4 KiB in at most 5: 1088 KiB each, the last shorter.
        let odd = 5 * mib + 4096;
        assert_eq!((piece_len(odd, 5), piece_count(odd, 5)), (1088 << 10, 5));
        // Smaller than a piece's alignment: one piece.
        assert_eq!(piece_count(4096, 16), 1);
        for size in [4096, 65536, 3 * mib + 8192, 16 * mib - 4096, 256 * mib] {
            for most in 1..=MAX_PIECES {
                let (len, n) = (piece_len(size, most), piece_count(size, most));
                assert!(n <= most && len % PIECE_ALIGN == 0 && (n - 1) * len < size && n * len >= size);
            }
        }
    }

    #[test]
    fn progress_counts_the_first_requests_done() {
        let mut p = Progress::new(4);
        assert_eq!(p.complete(2), None);
        assert_eq!(p.complete(1), None);
        assert_eq!(p.complete(0), Some(3));
        assert_eq!(p.complete(0), None, "again: no news");
        assert_eq!(p.complete(9), None, "not a request of the job");
        assert_eq!(p.complete(3), Some(4));
    }
}
