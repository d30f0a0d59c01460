//! `Batch`: cuFile's batch API from Python.

use super::*;

/// A batch context (cuFile's batch API): submit many, collect by cookie.
/// On a handle or on a volume (each request then split across members,
/// still one event).
#[pyclass(module = "ugds._ugds", frozen)]
pub(crate) struct Batch {
    pub(crate) inner: Box<dyn ugds::BatchContext>,
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
        py.allow_threads(|| self.inner.submit(&reqs)).map_err(err)
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
        py.allow_threads(|| self.inner.submit_vectored(&reqs)).map_err(err)
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
        let max = max_nr.unwrap_or(self.inner.capacity());
        let mut ev = Vec::new();
        py.allow_threads(|| self.inner.get_status(min_nr, max, timeout.map(Duration::from_secs_f64), &mut ev))
            .map_err(err)?;
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
        py.allow_threads(|| self.inner.cancel()).map_err(err)
    }

    /// Requests submitted and not yet collected.
    #[getter]
    fn outstanding(&self) -> usize {
        self.inner.outstanding()
    }

    /// What this context's requests have done: a dict (submitted, ended,
    /// in_flight, bytes_read, bytes_written, errors, canceled, timeouts).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        request_stats(py, self.inner.stats())
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
