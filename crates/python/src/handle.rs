//! `Handle`: one controller and namespace, its synchronous, vectored,
//! batch and stream-ordered calls; the late-bound `Cell`.

use super::*;

/// One controller and namespace. read/write are synchronous and release
/// the GIL; any number of threads may use one handle.
#[pyclass(module = "ugds._ugds", frozen)]
pub(crate) struct Handle {
    /// Shared with the volumes made of it.
    pub(crate) inner: Arc<ugds::Handle>,
    /// The batch contexts on it, ended when it closes.
    pub(crate) batches: Arc<batch::Batches>,
}

impl Handle {
    /// One stream-ordered request (an ordered batch of one).
    pub(crate) fn one_async(
        &self,
        py: Python<'_>,
        op: BatchOp,
        buf: &Buffer,
        args: [Arg<'_>; 3],
        stream: &Stream,
    ) -> PyResult<StreamResult> {
        buf.check(py)?;
        let [size, file_offset, buf_offset] = args;
        let (io, r) = StreamIo::late(size.cell(), file_offset.cell(), buf_offset.cell());
        self.inner.batch_async(vec![(op, buf.token, io)], stream.get()).map_err(err)?;
        Ok(StreamResult { inner: r })
    }
}

impl Handle {
    pub(crate) fn vectored_async(
        &self,
        py: Python<'_>,
        segments: &[(PyRef<'_, Buffer>, usize, usize)],
        file_offset: Arg<'_>,
        stream: &Stream,
        write: bool,
    ) -> PyResult<StreamResult> {
        let tokens = checked_tokens(py, segments)?;
        let segs = as_segments(&tokens, segments);
        let total = segments.iter().map(|s| s.2 as u64).sum::<u64>();
        let (io, r) = StreamIo::late(Arc::new(AtomicU64::new(total)), file_offset.cell(), Arc::new(AtomicU64::new(0)));
        let h = &self.inner;
        if write { h.writev_async(&segs, io, stream.get()) } else { h.readv_async(&segs, io, stream.get()) }
            .map_err(err)?;
        Ok(StreamResult { inner: r })
    }
}

impl From<ugds::Handle> for Handle {
    fn from(inner: ugds::Handle) -> Self {
        Handle { inner: Arc::new(inner), batches: Arc::default() }
    }
}

impl Handle {
    /// A vectored read or write of (buffer, offset, length) segments, each
    /// buffer checked live.
    pub(crate) fn vectored(
        &self,
        py: Python<'_>,
        segments: &[(PyRef<'_, Buffer>, usize, usize)],
        file_offset: u64,
        write: bool,
    ) -> PyResult<usize> {
        let tokens = checked_tokens(py, segments)?;
        let segs = as_segments(&tokens, segments);
        let h = &self.inner;
        py.allow_threads(|| if write { h.writev(&segs, file_offset) } else { h.readv(&segs, file_offset) }).map_err(err)
    }
}

/// The registrations of (buffer, offset, length) segments, each buffer
/// checked live.
pub(crate) fn checked_tokens(
    py: Python<'_>,
    segments: &[(PyRef<'_, Buffer>, usize, usize)],
) -> PyResult<Vec<ugds::BufferToken>> {
    segments
        .iter()
        .map(|(b, _, _)| {
            b.check(py)?;
            Ok(b.token)
        })
        .collect()
}

/// The segments as the library takes them, on `tokens` (in order).
pub(crate) fn as_segments<'t>(
    tokens: &'t [ugds::BufferToken],
    segments: &[(PyRef<'_, Buffer>, usize, usize)],
) -> Vec<ugds::Segment<'t>> {
    tokens.iter().zip(segments).map(|(t, (_, off, len))| ugds::Segment::new(t, *off, *len)).collect()
}

/// A late-bound value for stream-ordered I/O: read when the stream reaches
/// the operation, so it may be set after the call that enqueues it.
#[pyclass(module = "ugds._ugds", frozen)]
pub(crate) struct Cell {
    pub(crate) v: Arc<AtomicU64>,
}

#[pymethods]
impl Cell {
    #[new]
    #[pyo3(signature = (value=0))]
    fn new(value: u64) -> Self {
        Cell { v: Arc::new(AtomicU64::new(value)) }
    }
    /// The value.
    #[getter]
    fn get_value(&self) -> u64 {
        self.v.load(Ordering::Acquire)
    }
    #[setter]
    fn set_value(&self, value: u64) {
        self.v.store(value, Ordering::Release)
    }
}

#[derive(FromPyObject)]
pub(crate) enum Arg<'py> {
    Cell(PyRef<'py, Cell>),
    Int(u64),
}

impl Arg<'_> {
    pub(crate) fn cell(&self) -> Arc<AtomicU64> {
        match self {
            Arg::Cell(c) => c.v.clone(),
            Arg::Int(v) => Arc::new(AtomicU64::new(*v)),
        }
    }
}

pub(crate) fn op(name: &str) -> PyResult<BatchOp> {
    match name {
        "read" => Ok(BatchOp::Read),
        "write" => Ok(BatchOp::Write),
        o => Err(InvalidArgument::new_err(format!("unknown operation {o:?} (read, write)"))),
    }
}

#[pymethods]
impl Handle {
    /// Reads `size` bytes at byte `file_offset` of the namespace into the
    /// buffer at `buf_offset`; returns the bytes read. `priority`: the
    /// request's class, "critical", "normal" or "background".
    #[pyo3(signature = (buf, size, file_offset, buf_offset=0, priority="normal"))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Buffer,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        priority: &str,
    ) -> PyResult<usize> {
        let p = self::priority(priority)?;
        buf.check(py)?;
        let t = buf.token;
        py.allow_threads(|| self.inner.read_with_priority(&t, size, file_offset, buf_offset, p)).map_err(err)
    }

    /// Writes `size` bytes from the buffer at `buf_offset` to byte
    /// `file_offset` of the namespace; returns the bytes written.
    /// `priority` as for read.
    #[pyo3(signature = (buf, size, file_offset, buf_offset=0, priority="normal"))]
    fn write(
        &self,
        py: Python<'_>,
        buf: &Buffer,
        size: usize,
        file_offset: u64,
        buf_offset: usize,
        priority: &str,
    ) -> PyResult<usize> {
        let p = self::priority(priority)?;
        buf.check(py)?;
        let t = buf.token;
        py.allow_threads(|| self.inner.write_with_priority(&t, size, file_offset, buf_offset, p)).map_err(err)
    }

    /// Reads the range at `file_offset` into `segments`, a list of
    /// (buffer, offset, length) filled in order, as one request; returns
    /// the bytes read. A bad list (empty, over 256 segments, a length not
    /// of whole blocks, overlapping segments) raises with nothing read.
    fn readv(
        &self,
        py: Python<'_>,
        segments: Vec<(PyRef<'_, Buffer>, usize, usize)>,
        file_offset: u64,
    ) -> PyResult<usize> {
        self.vectored(py, &segments, file_offset, false)
    }

    /// Writes `segments`, a list of (buffer, offset, length), in order to
    /// the range at `file_offset`, as one request; returns the bytes written.
    fn writev(
        &self,
        py: Python<'_>,
        segments: Vec<(PyRef<'_, Buffer>, usize, usize)>,
        file_offset: u64,
    ) -> PyResult<usize> {
        self.vectored(py, &segments, file_offset, true)
    }

    /// Flushes the device's volatile write cache.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.flush()).map_err(err)
    }

    /// Namespace capacity in bytes.
    #[getter]
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    /// Logical block size: offsets and sizes are multiples of it.
    #[getter]
    fn block_size(&self) -> u32 {
        self.inner.namespace().block_size
    }

    /// What each I/O queue pair has done since the handle opened: a list of
    /// dicts (qid, role "sync"/"batch"/"lendable", submitted, completed,
    /// in_flight, bytes_read, bytes_written, errors, timeouts,
    /// doorbell_writes, interrupts, copied, cache_hits, cache_misses), one per
    /// queue.
    fn queue_stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, pyo3::types::PyDict>>> {
        self.inner
            .queue_stats()
            .iter()
            .map(|s| {
                let d = pyo3::types::PyDict::new(py);
                d.set_item("qid", s.qid)?;
                d.set_item("role", role_name(s.role))?;
                for (k, v) in [
                    ("submitted", s.submitted),
                    ("completed", s.completed),
                    ("in_flight", s.in_flight),
                    ("bytes_read", s.bytes_read),
                    ("bytes_written", s.bytes_written),
                    ("errors", s.errors),
                    ("timeouts", s.timeouts),
                    ("doorbell_writes", s.doorbell_writes),
                    ("interrupts", s.interrupts),
                    ("copied", s.copied),
                    ("cache_hits", s.cache_hits),
                    ("cache_misses", s.cache_misses),
                ] {
                    d.set_item(k, v)?;
                }
                Ok(d)
            })
            .collect()
    }

    /// Each traced queue's command latencies (the handle traces when
    /// `UGDS_TRACE=N` was set as it opened): a list of dicts (qid, role,
    /// commands, and p50_us, p99_us, p999_us, max_us: upper bounds of
    /// buckets 25% wide). Empty when not traced.
    fn queue_latency<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, pyo3::types::PyDict>>> {
        self.inner
            .queue_latency()
            .iter()
            .map(|l| {
                let d = pyo3::types::PyDict::new(py);
                d.set_item("qid", l.qid)?;
                d.set_item("role", role_name(l.role))?;
                d.set_item("commands", l.latency.count())?;
                for (k, q) in [("p50_us", 0.5), ("p99_us", 0.99), ("p999_us", 0.999), ("max_us", 1.0)] {
                    d.set_item(k, l.latency.quantile(q).map(|t| t.as_secs_f64() * 1e6))?;
                }
                Ok(d)
            })
            .collect()
    }

    /// The traced queues' last commands (`UGDS_TRACE=N`): a list of dicts
    /// (qid, role, events), each event a dict (cid, opcode, slba, blocks,
    /// submitted_us and completed_us from the handle's opening, status: the
    /// NVMe status as (sct, sc), or None and None while outstanding),
    /// completed ones oldest first, then those outstanding.
    fn trace<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, pyo3::types::PyDict>>> {
        let traces = py.allow_threads(|| self.inner.trace());
        traces
            .iter()
            .map(|t| {
                let d = pyo3::types::PyDict::new(py);
                d.set_item("qid", t.qid)?;
                d.set_item("role", role_name(t.role))?;
                let events = t
                    .events
                    .iter()
                    .map(|e| {
                        let x = pyo3::types::PyDict::new(py);
                        x.set_item("cid", e.cid)?;
                        x.set_item("opcode", e.opcode)?;
                        x.set_item("slba", e.slba)?;
                        x.set_item("blocks", e.blocks)?;
                        x.set_item("submitted_us", e.submitted.as_secs_f64() * 1e6)?;
                        x.set_item("completed_us", e.completed.map(|c| c.as_secs_f64() * 1e6))?;
                        x.set_item("status", e.status.map(|s| (s.sct, s.sc)))?;
                        Ok(x)
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                d.set_item("events", events)?;
                Ok(d)
            })
            .collect()
    }

    /// A batch context for up to `capacity` requests in flight, ended
    /// when the handle closes.
    fn batch(&self, capacity: usize) -> PyResult<Batch> {
        self.inner.batch(capacity).map(|b| Batch::new(Box::new(b), &[&self.batches])).map_err(err)
    }

    /// Reads in stream order: `size`, `file_offset` and `buf_offset` (ints,
    /// or Cells read when the stream gets there) are bound when the stream
    /// reaches the operation. Returns a StreamResult, filled in before later
    /// work on the stream runs.
    #[pyo3(signature = (buf, size, file_offset, buf_offset, stream))]
    fn read_async(
        &self,
        py: Python<'_>,
        buf: &Buffer,
        size: Arg<'_>,
        file_offset: Arg<'_>,
        buf_offset: Arg<'_>,
        stream: &Stream,
    ) -> PyResult<StreamResult> {
        self.one_async(py, BatchOp::Read, buf, [size, file_offset, buf_offset], stream)
    }

    /// Writes in stream order; see read_async.
    #[pyo3(signature = (buf, size, file_offset, buf_offset, stream))]
    fn write_async(
        &self,
        py: Python<'_>,
        buf: &Buffer,
        size: Arg<'_>,
        file_offset: Arg<'_>,
        buf_offset: Arg<'_>,
        stream: &Stream,
    ) -> PyResult<StreamResult> {
        self.one_async(py, BatchOp::Write, buf, [size, file_offset, buf_offset], stream)
    }

    /// A vectored read in stream order: the range at `file_offset` (an int,
    /// or a Cell read when the stream gets there) into `segments`, a list
    /// of (buffer, offset, length) filled in order, as one request. The
    /// list is checked now. Returns a StreamResult.
    fn readv_async(
        &self,
        py: Python<'_>,
        segments: Vec<(PyRef<'_, Buffer>, usize, usize)>,
        file_offset: Arg<'_>,
        stream: &Stream,
    ) -> PyResult<StreamResult> {
        self.vectored_async(py, &segments, file_offset, stream, false)
    }

    /// A vectored write in stream order; see readv_async.
    fn writev_async(
        &self,
        py: Python<'_>,
        segments: Vec<(PyRef<'_, Buffer>, usize, usize)>,
        file_offset: Arg<'_>,
        stream: &Stream,
    ) -> PyResult<StreamResult> {
        self.vectored_async(py, &segments, file_offset, stream, true)
    }

    /// An ordered batch: `ios` is a list of `(op, buf, size, file_offset,
    /// buf_offset)` with op "read" or "write"; all run after earlier work on
    /// the stream and before later work, in no order among themselves.
    fn batch_async(
        &self,
        py: Python<'_>,
        ios: Vec<(String, PyRef<'_, Buffer>, Arg<'_>, Arg<'_>, Arg<'_>)>,
        stream: &Stream,
    ) -> PyResult<Vec<StreamResult>> {
        let mut reqs = Vec::with_capacity(ios.len());
        let mut results = Vec::with_capacity(ios.len());
        for (o, b, size, foff, boff) in &ios {
            b.check(py)?;
            let (io, r) = StreamIo::late(size.cell(), foff.cell(), boff.cell());
            reqs.push((op(o)?, b.token, io));
            results.push(StreamResult { inner: r });
        }
        self.inner.batch_async(reqs, stream.get()).map_err(err)?;
        Ok(results)
    }

    /// Closes the handle. `drain`: "wait" (for I/O in flight, up to
    /// `timeout` seconds, forever when None), "nowait" (BusyError if any,
    /// or a batch request not yet collected), or "force" (a wedged handle:
    /// reset the controller, then release). Its batch contexts (and those
    /// of volumes it is in) end with it, as in the C library: each first
    /// waits for its requests on the device; their uncollected events go,
    /// and their later calls raise ClosedError.
    #[pyo3(signature = (drain="wait", timeout=None))]
    fn close(&self, py: Python<'_>, drain: &str, timeout: Option<f64>) -> PyResult<()> {
        let d = match (drain, timeout) {
            ("wait", None) => Drain::Forever,
            ("wait", Some(t)) => Drain::Timeout(Duration::from_secs_f64(t)),
            ("nowait", _) => Drain::NoWait,
            ("force", _) => Drain::ForceAfterReset,
            (o, _) => return Err(InvalidArgument::new_err(format!("unknown drain {o:?} (wait, nowait, force)"))),
        };
        // A close that will be refused ends no batch context.
        match self.inner.state() {
            ugds::HandleState::Closed => return Err(err(ugds::Error::Closed)),
            ugds::HandleState::Wedged if d != Drain::ForceAfterReset => return Err(err(ugds::Error::Wedged)),
            _ => {}
        }
        if d == Drain::NoWait {
            // Each open context holds one in-flight reference: anything
            // beyond them, or a request of theirs not yet collected, is busy.
            let (open, outstanding) = self.batches.open();
            let inflight = self.inner.inflight();
            if outstanding > 0 || inflight > open {
                return Err(err(ugds::Error::Busy {
                    what: "handle",
                    inflight: inflight.saturating_sub(open) + outstanding,
                }));
            }
        }
        py.allow_threads(|| {
            self.batches.close_all();
            self.inner.close(d)
        })
        .map_err(err)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(&self, py: Python<'_>, _t: PyObject, _v: PyObject, _tb: PyObject) -> PyResult<()> {
        self.close(py, "wait", None)
    }
}
