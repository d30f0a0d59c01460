//! `Server`: this process owns a controller and serves it to others
//! (`ugds serve` from Python: the primary of several processes).

use super::*;

/// A controller owned by this process and served at a unix socket; other
/// processes of this user attach with `Driver.open_attached(socket)`.
/// Stops (every attached process cut off, its queues deleted before its
/// memory is unmapped) on `stop()` or when collected.
#[pyclass(module = "ugds._ugds")]
pub(crate) struct Server {
    inner: Option<ugds::serve::Server>,
}

fn options(parts: u32, queues_per_process: u16) -> ugds::serve::ServeOptions {
    ugds::serve::ServeOptions { parts, queues_per_process }
}

#[pymethods]
impl Server {
    /// Serves an emulated controller with a memory namespace of `size`
    /// bytes; `parts` > 1 splits it into that many ranges, one per process;
    /// `queues_per_process` 0: a quarter of the controller's queue pairs.
    #[staticmethod]
    #[pyo3(signature = (socket, size=1<<30, block_size=512, parts=1, queues_per_process=0))]
    fn emulated(
        py: Python<'_>,
        socket: std::path::PathBuf,
        size: u64,
        block_size: u32,
        parts: u32,
        queues_per_process: u16,
    ) -> PyResult<Server> {
        let cfg = EmuConfig::default().namespaces(vec![NamespaceConfig::memory(size, block_size)]);
        py.allow_threads(|| {
            let p = Arc::new(EmuPlatform::new(cfg)?);
            ugds::serve::Server::start(p, &socket, options(parts, queues_per_process))
        })
        .map(|s| Server { inner: Some(s) })
        .map_err(err)
    }

    /// Serves the controller behind ugds_drv's `/dev/ugds_drvN`.
    #[staticmethod]
    #[pyo3(signature = (socket, path, parts=1, queues_per_process=0))]
    fn drv(
        py: Python<'_>,
        socket: std::path::PathBuf,
        path: &str,
        parts: u32,
        queues_per_process: u16,
    ) -> PyResult<Server> {
        py.allow_threads(|| {
            let p = Arc::new(ugds::platform::ugds_drv::UgdsDrvPlatform::open(path)?);
            ugds::serve::Server::start(p, &socket, options(parts, queues_per_process))
        })
        .map(|s| Server { inner: Some(s) })
        .map_err(err)
    }

    /// What it has done: attached, sessions, refused, bad_requests,
    /// queues_in_use, mappings, leaked.
    #[getter]
    fn stats(&self) -> PyResult<std::collections::HashMap<&'static str, u64>> {
        let s = self.inner.as_ref().ok_or_else(|| ClosedError::new_err("the server was stopped"))?.stats();
        Ok([
            ("attached", s.attached),
            ("sessions", s.sessions),
            ("refused", s.refused),
            ("bad_requests", s.bad_requests),
            ("queues_in_use", s.queues_in_use),
            ("mappings", s.mappings),
            ("leaked", s.leaked),
        ]
        .into())
    }

    /// Stops serving and shuts the controller down.
    fn stop(&mut self, py: Python<'_>) -> PyResult<()> {
        match self.inner.take() {
            Some(s) => py.allow_threads(|| s.stop()).map_err(err),
            None => Ok(()),
        }
    }
}
