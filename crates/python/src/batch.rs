//! `Batch`: cuFile's batch API from Python.

use super::*;
use std::sync::{RwLock, Weak};

/// A batch context, shared with the handles it is on: closing one of them
/// empties it (the context goes, waiting for what the device holds), as
/// the C library's `uGDSHandleDeregister` destroys a handle's batches, so
/// that a batch object still referenced (a variable, a `with` block) does
/// not hold its handle open for good.
type Slot = RwLock<Option<Box<dyn ugds::BatchContext>>>;

/// The batch contexts on one handle (its own, and volumes' that it is a
/// member of).
#[derive(Default)]
pub(crate) struct Batches(Mutex<Vec<Weak<Slot>>>);

impl Batches {
    fn add(&self, slot: &Arc<Slot>) {
        let mut v = self.0.lock().recover();
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(slot));
    }

    fn live(&self) -> Vec<Arc<Slot>> {
        self.0.lock().recover().iter().filter_map(Weak::upgrade).collect()
    }

    /// Contexts still open, and their requests submitted and not collected.
    pub(crate) fn open(&self) -> (usize, usize) {
        let live = self.live();
        let open: Vec<usize> =
            live.iter().filter_map(|s| s.read().recover().as_ref().map(|b| b.outstanding())).collect();
        (open.len(), open.iter().sum())
    }

    /// Ends every context: each waits for its requests on the device (up
    /// to the handle's timeout) as a dropped batch does; their uncollected
    /// events go with them.
    pub(crate) fn close_all(&self) {
        for slot in self.live() {
            // Taken under the lock, ended (a wait for its requests on the
            // device) after the lock is released.
            let b = slot.write().recover().take();
            drop(b);
        }
    }
}

/// A batch context (cuFile's batch API): submit many, collect by cookie.
/// On a handle or on a volume (each request then split across members,
/// still one event). Closing its handle ends it: its calls then raise
/// ClosedError.
#[pyclass(module = "ugds._ugds", frozen)]
pub(crate) struct Batch {
    slot: Arc<Slot>,
}

impl Batch {
    /// `inner`, on the handles whose registries are `on`.
    pub(crate) fn new(inner: Box<dyn ugds::BatchContext>, on: &[&Batches]) -> Batch {
        let slot = Arc::new(RwLock::new(Some(inner)));
        for b in on {
            b.add(&slot);
        }
        Batch { slot }
    }

    /// Runs `f` on the context, or says it was closed with its handle.
    fn with<T>(&self, f: impl FnOnce(&dyn ugds::BatchContext) -> ugds::Result<T>) -> PyResult<T> {
        let g = self.slot.read().recover();
        match g.as_deref() {
            Some(b) => f(b).map_err(err),
            None => Err(ClosedError::new_err("this batch context was closed with its handle")),
        }
    }
}

#[pymethods]
impl Batch {
    /// Submits `ios`, a list of `(op, buf, size, file_offset, buf_offset,
    /// cookie)`; all are checked first, and bad input submits none. Returns
    /// the number of doorbell writes it took (1 unless the queue filled).
    fn submit(&self, py: Python<'_>, ios: Vec<(String, PyRef<'_, Buffer>, usize, u64, usize, u64)>) -> PyResult<usize> {
        for (_, b, ..) in &ios {
            b.check(py)?;
        }
        let reqs = ios
            .iter()
            .map(|(o, b, size, file_offset, buf_offset, cookie)| {
                Ok(BatchIo {
                    op: op(o)?,
                    buf: b.token,
                    size: *size,
                    file_offset: *file_offset,
                    buf_offset: *buf_offset,
                    cookie: *cookie,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        py.allow_threads(|| self.with(|b| b.submit(&reqs)))
    }

    /// Submits vectored requests, a list of `(op, segments, file_offset,
    /// cookie)` with `segments` a list of `(buf, offset, length)` (as
    /// `Handle.readv`); each completes as one event. All are checked first.
    #[allow(clippy::type_complexity)]
    fn submitv(
        &self,
        py: Python<'_>,
        ios: Vec<(String, Vec<(PyRef<'_, Buffer>, usize, usize)>, u64, u64)>,
    ) -> PyResult<usize> {
        for (_, segs, ..) in &ios {
            for (b, ..) in segs {
                b.check(py)?;
            }
        }
        let tokens: Vec<Vec<(ugds::BufferToken, usize, usize)>> =
            ios.iter().map(|(_, segs, ..)| segs.iter().map(|(b, off, len)| (b.token, *off, *len)).collect()).collect();
        let segments: Vec<Vec<ugds::Segment>> = tokens
            .iter()
            .map(|t| t.iter().map(|(tok, off, len)| ugds::Segment::new(tok, *off, *len)).collect())
            .collect();
        let reqs = ios
            .iter()
            .zip(&segments)
            .map(|((o, _, file_offset, cookie), segs)| {
                Ok(ugds::BatchIov { op: op(o)?, segments: segs, file_offset: *file_offset, cookie: *cookie })
            })
            .collect::<PyResult<Vec<_>>>()?;
        py.allow_threads(|| self.with(|b| b.submit_vectored(&reqs)))
    }

    /// Waits for at least `min_nr` finished requests (or `timeout`
    /// seconds) and returns up to `max_nr` as `(cookie, status, result)`:
    /// status "complete", "failed", "canceled" or "timeout"; result the
    /// bytes moved, or a negative errno.
    #[pyo3(signature = (min_nr=1, max_nr=None, timeout=None))]
    fn get_status(
        &self,
        py: Python<'_>,
        min_nr: usize,
        max_nr: Option<usize>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<(u64, &'static str, i64)>> {
        let mut ev = Vec::new();
        py.allow_threads(|| {
            self.with(|b| {
                let max = max_nr.unwrap_or(b.capacity());
                b.get_status(min_nr, max, timeout.map(Duration::from_secs_f64), &mut ev)
            })
        })?;
        Ok(ev
            .into_iter()
            .map(|e| {
                let status = e.status.name();
                let r = match &e.result {
                    Ok(n) => *n as i64,
                    Err(x) => -(x.errno() as i64),
                };
                (e.cookie, status, r)
            })
            .collect())
    }

    /// Cancels: no more submissions; waits for what the device holds.
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.with(|b| b.cancel()))
    }

    /// Requests submitted and not yet collected (0 once closed).
    #[getter]
    fn outstanding(&self) -> usize {
        self.slot.read().recover().as_ref().map_or(0, |b| b.outstanding())
    }

    /// What this context's requests have done: a dict (submitted, ended,
    /// in_flight, bytes_read, bytes_written, errors, canceled, timeouts).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let stats = self.with(|b| Ok(b.stats()))?;
        request_stats(py, stats)
    }
}

/// Request totals (a batch context's, a stream's) as a dict.
pub(crate) fn request_stats(py: Python<'_>, s: ugds::RequestStats) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let d = pyo3::types::PyDict::new(py);
    for (k, v) in [
        ("submitted", s.submitted),
        ("ended", s.ended),
        ("in_flight", s.in_flight),
        ("bytes_read", s.bytes_read),
        ("bytes_written", s.bytes_written),
        ("errors", s.errors),
        ("canceled", s.canceled),
        ("timeouts", s.timeouts),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}
