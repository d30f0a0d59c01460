//! Registered memory: `Buffer`, and its release when collected.

use super::*;

/// A registered buffer. Keep it to do I/O. It holds the memory's owner (and
/// a buffer export, so a bytearray cannot be resized under it) until it is
/// deregistered; when it is collected it deregisters itself, or, if I/O
/// still holds it, keeps the owner alive until that I/O is done.
#[pyclass(module = "ugds._ugds", frozen)]
pub(crate) struct Buffer {
    pub(crate) token: BufferToken,
    pub(crate) device: bool,
    pub(crate) owner: Mutex<Option<PyObject>>,
    /// A torch tensor whose storage must still be at `token.base`.
    pub(crate) tensor: Option<PyObject>,
    pub(crate) driver: ugds::Driver,
    pub(crate) graveyard: Graveyard,
}

impl Buffer {
    /// Refuses I/O if a registered torch tensor's storage moved or shrank
    /// (`resize_`, `set_`): the registration would name memory the tensor
    /// no longer owns.
    pub(crate) fn check(&self, py: Python<'_>) -> PyResult<()> {
        let Some(t) = &self.tensor else { return Ok(()) };
        let t = t.bind(py);
        let ptr: u64 = t.call_method0("data_ptr")?.extract()?;
        let storage = t.call_method0("untyped_storage")?;
        let start: u64 = storage.call_method0("data_ptr")?.extract()?;
        let len: u64 = storage.call_method0("nbytes")?.extract()?;
        let (base, need) = (self.token.base() as u64, self.token.len() as u64);
        if ptr != base || base < start || base + need > start + len {
            return Err(InvalidArgument::new_err(format!(
                "the tensor's storage moved or shrank since it was registered at {base:#x} ({need} bytes; \
                 now {ptr:#x}, storage {start:#x}+{len}): deregister it and register it again"
            )));
        }
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let owner = self.owner.get_mut().recover().take();
        // Ok: deregistered now. NotRegistered or StaleToken: deregistered
        // before (this token, or this memory since). Busy: I/O holds it.
        match (self.driver.deregister(&self.token), owner) {
            (Err(ugds::Error::Busy { .. }), Some(o)) => self.graveyard.lock().recover().push((self.token, o)),
            // Dropped here, without any lock held (see `sweep`).
            (_, o) => drop(o),
        }
        sweep(&self.driver, &self.graveyard);
    }
}

#[pymethods]
impl Buffer {
    /// Base address.
    #[getter]
    fn ptr(&self) -> u64 {
        self.token.base() as u64
    }
    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.token.len()
    }
    /// Whether this is GPU memory.
    #[getter]
    fn is_device(&self) -> bool {
        self.device
    }
    fn __repr__(&self) -> String {
        let kind = if self.device { "GPU" } else { "host" };
        format!("<ugds.Buffer {kind} {:#x}+{:#x}>", self.token.base(), self.token.len())
    }
}
