//! `Volume`: several handles as one, striped or concatenated.

use super::*;

/// Several handles as one: striped (RAID 0) or concatenated. read, write,
/// readv and writev as on a Handle; a request spanning members runs on them
/// at once and completes whole, or raises naming the member that failed.
/// The members stay usable on their own.
#[pyclass(module = "ugds._ugds", frozen)]
pub(crate) struct Volume {
    pub(crate) inner: ugds::Volume,
    /// The members' batch registries: a volume batch context is on each.
    pub(crate) batches: Vec<Arc<batch::Batches>>,
}

#[pymethods]
impl Volume {
    /// A volume over `handles` (in order; one driver, one block size):
    /// striped with `stripe`-byte stripes (a power of two of at least
    /// 4096), or concatenated when `stripe` is 0.
    #[new]
    #[pyo3(signature = (handles, stripe=0))]
    fn new(handles: Vec<PyRef<'_, Handle>>, stripe: u64) -> PyResult<Volume> {
        let members = handles.iter().map(|h| h.inner.clone()).collect();
        let batches = handles.iter().map(|h| h.batches.clone()).collect();
        let layout = match stripe {
            0 => ugds::VolumeLayout::Concat,
            s => ugds::VolumeLayout::Striped { stripe: s },
        };
        ugds::Volume::with_shared(members, layout).map(|inner| Volume { inner, batches }).map_err(err)
    }

    /// Reads `size` bytes at byte `file_offset` of the volume into the
    /// buffer at `buf_offset`; returns the bytes read.
    #[pyo3(signature = (buf, size, file_offset, buf_offset=0))]
    fn read(&self, py: Python<'_>, buf: &Buffer, size: usize, file_offset: u64, buf_offset: usize) -> PyResult<usize> {
        buf.check(py)?;
        let t = buf.token;
        py.allow_threads(|| self.inner.read(&t, size, file_offset, buf_offset)).map_err(err)
    }

    /// Writes `size` bytes from the buffer at `buf_offset` to byte
    /// `file_offset` of the volume; returns the bytes written.
    #[pyo3(signature = (buf, size, file_offset, buf_offset=0))]
    fn write(&self, py: Python<'_>, buf: &Buffer, size: usize, file_offset: u64, buf_offset: usize) -> PyResult<usize> {
        buf.check(py)?;
        let t = buf.token;
        py.allow_threads(|| self.inner.write(&t, size, file_offset, buf_offset)).map_err(err)
    }

    /// As Handle.readv, on the volume.
    fn readv(
        &self,
        py: Python<'_>,
        segments: Vec<(PyRef<'_, Buffer>, usize, usize)>,
        file_offset: u64,
    ) -> PyResult<usize> {
        self.vectored(py, &segments, file_offset, false)
    }

    /// As Handle.writev, on the volume.
    fn writev(
        &self,
        py: Python<'_>,
        segments: Vec<(PyRef<'_, Buffer>, usize, usize)>,
        file_offset: u64,
    ) -> PyResult<usize> {
        self.vectored(py, &segments, file_offset, true)
    }

    /// Flushes every member's volatile write cache.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.flush()).map_err(err)
    }

    /// As Handle.read_async, on the volume: the values are read when the
    /// stream reaches the operation, which then runs on every member it
    /// spans before later work on the stream.
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

    /// A batch context for up to `capacity` volume requests in flight
    /// (as Handle.batch; each request completes as one event). Closing a
    /// member handle ends it.
    fn batch(&self, capacity: usize) -> PyResult<Batch> {
        let on: Vec<&batch::Batches> = self.batches.iter().map(|b| &**b).collect();
        self.inner.batch(capacity).map(|b| Batch::new(Box::new(b), &on)).map_err(err)
    }

    /// Size in bytes.
    #[getter]
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    /// The members' logical block size.
    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    /// Stripe size in bytes, 0 when concatenated.
    #[getter]
    fn stripe(&self) -> u64 {
        match self.inner.layout() {
            ugds::VolumeLayout::Striped { stripe } => stripe,
            _ => 0,
        }
    }

    /// What each member is, in order.
    #[getter]
    fn members(&self) -> Vec<String> {
        (0..self.inner.member_count()).map(|i| self.inner.member_name(i).to_string()).collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "<ugds.Volume {} members, {} bytes, stripe {}>",
            self.inner.member_count(),
            self.capacity(),
            self.stripe()
        )
    }
}

impl Volume {
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
        match op {
            BatchOp::Read => self.inner.read_async(&buf.token, io, stream.get()),
            _ => self.inner.write_async(&buf.token, io, stream.get()),
        }
        .map_err(err)?;
        Ok(StreamResult { inner: r })
    }

    pub(crate) fn vectored(
        &self,
        py: Python<'_>,
        segments: &[(PyRef<'_, Buffer>, usize, usize)],
        file_offset: u64,
        write: bool,
    ) -> PyResult<usize> {
        let tokens = checked_tokens(py, segments)?;
        let segs = as_segments(&tokens, segments);
        let v = &self.inner;
        py.allow_threads(|| if write { v.writev(&segs, file_offset) } else { v.readv(&segs, file_offset) }).map_err(err)
    }
}
