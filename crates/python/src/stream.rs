//! `Stream` and `StreamResult`: stream-ordered I/O from Python.

use super::*;

enum StreamKind {
    Host(HostStream),
    Gpu(ugds::gpu::GpuStream),
}

/// A stream to order I/O on: `Stream.cuda(handle)` for a CUDA stream (e.g.
/// `torch.cuda.current_stream().cuda_stream`), `Stream.host()` for a
/// host-side stream (no GPU needed).
#[pyclass(module = "ugds._ugds", frozen)]
pub(crate) struct Stream {
    inner: StreamKind,
}

impl Drop for Stream {
    fn drop(&mut self) {
        // A host stream's thread may be running a Python callable, which
        // needs the GIL: let it finish without holding it. A GPU stream is
        // the caller's and is not touched (see ugds::gpu::GpuStream).
        if let StreamKind::Host(s) = &self.inner {
            Python::with_gil(|py| py.allow_threads(|| s.synchronize()));
        }
    }
}

impl Stream {
    pub(crate) fn get(&self) -> &dyn ugds::Stream {
        match &self.inner {
            StreamKind::Host(s) => s,
            StreamKind::Gpu(s) => s,
        }
    }
}

#[pymethods]
impl Stream {
    /// A stream run by a host thread, in order.
    #[staticmethod]
    fn host() -> Stream {
        Stream { inner: StreamKind::Host(HostStream::new()) }
    }

    /// The CUDA stream `handle` (a `CUstream` as an int; 0 is the legacy
    /// default stream) of the current context (or of `device`'s primary
    /// context if none is current). `blocking=True` makes the host callback
    /// wait for each I/O instead of the GPU (the fallback mode).
    #[staticmethod]
    #[pyo3(signature = (handle, device=0, blocking=false))]
    fn cuda(handle: u64, device: usize, blocking: bool) -> PyResult<Stream> {
        let cuda = ugds::gpu::cuda::Cuda::get().map_err(err)?;
        let wait = if blocking { StreamWait::BlockingCallback } else { StreamWait::DeviceSide };
        // SAFETY: the caller passes a live stream handle that outlives this
        // object (the Python layer documents it).
        let s = match unsafe { cuda.stream(handle as *mut std::ffi::c_void, wait) } {
            Ok(s) => s,
            Err(ugds::Error::InvalidArgument(_)) => {
                cuda.use_device(device).map_err(err)?;
                // SAFETY: as above.
                unsafe { cuda.stream(handle as *mut std::ffi::c_void, wait) }.map_err(err)?
            }
            Err(e) => return Err(err(e)),
        };
        Ok(Stream { inner: StreamKind::Gpu(s) })
    }

    /// Runs the Python callable `f` in stream order (host streams only);
    /// its exceptions are printed and otherwise ignored.
    fn enqueue(&self, f: PyObject) -> PyResult<()> {
        match &self.inner {
            StreamKind::Host(s) => {
                s.enqueue(move || {
                    Python::with_gil(|py| {
                        if let Err(e) = f.call0(py) {
                            e.print(py);
                        }
                    })
                });
                Ok(())
            }
            StreamKind::Gpu(_) => Err(UnsupportedError::new_err(
                "enqueue Python work on a CUDA stream with torch (torch.cuda.stream) instead",
            )),
        }
    }

    /// Waits until all work on the stream is done.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| match &self.inner {
            StreamKind::Host(s) => {
                s.synchronize();
                Ok(())
            }
            StreamKind::Gpu(s) => s.synchronize(),
        })
        .map_err(err)
    }

    /// Whether the GPU waits for I/O on the device ("device") or the host
    /// callback does ("blocking"); "host" for a host stream.
    #[getter]
    fn wait_mode(&self) -> &'static str {
        match &self.inner {
            StreamKind::Host(_) => "host",
            StreamKind::Gpu(s) if s.wait_mode() == StreamWait::DeviceSide => "device",
            StreamKind::Gpu(_) => "blocking",
        }
    }

    /// How the handles' stream engines serve this stream's operations from
    /// now on: `priority` "critical", "normal" or "background", `mode` a
    /// built-in mode's name or None (see the Rust StreamService).
    #[pyo3(signature = (priority="normal", mode=None))]
    fn set_service(&self, priority: &str, mode: Option<&str>) -> PyResult<()> {
        let p = crate::priority(priority)?;
        let m = mode.map(ugds::mode::mode_by_name).transpose().map_err(crate::err)?;
        let service = ugds::StreamService::new(p, m);
        match &self.inner {
            StreamKind::Host(s) => s.set_service(service),
            StreamKind::Gpu(s) => s.set_service(service),
        }
        Ok(())
    }

    /// What the stream-ordered requests placed on this stream have done,
    /// on every handle: a dict as Batch.stats() gives (canceled is 0).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let s = match &self.inner {
            StreamKind::Host(s) => s.stats(),
            StreamKind::Gpu(s) => s.stats(),
        };
        crate::batch::request_stats(py, s)
    }
}

/// The outcome of a stream-ordered operation.
#[pyclass(module = "ugds._ugds", frozen)]
pub(crate) struct StreamResult {
    pub(crate) inner: Arc<ugds::StreamResult>,
}

#[pymethods]
impl StreamResult {
    /// Bytes moved, or a negative errno; valid once `done`.
    #[getter]
    fn bytes(&self) -> i64 {
        self.inner.bytes()
    }
    /// Whether the operation has run.
    #[getter]
    fn done(&self) -> bool {
        self.inner.is_done()
    }
    /// The error's message, if it failed (taken once).
    fn error(&self) -> Option<String> {
        self.inner.take_error().map(|e| e.to_string())
    }
}
