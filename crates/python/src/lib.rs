//! The native module behind the `ugds` Python package (`ugds._ugds`).
//!
//! Thin: every call goes straight to the Rust library, with the GIL released
//! while the device works. Turning Python objects (torch tensors, arrays
//! with `__cuda_array_interface__`, DLPack) into an address and a length is
//! done by the pure-Python layer in `python/ugds/__init__.py`.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ugds::gpu::StreamWait;
use ugds::platform::Recover;
use ugds::{BatchIo, BatchOp, BufferToken, Completion, Drain, HandleOptions, HostStream, StreamIo};
use ugds_emu::{EmuConfig, EmuPlatform, NamespaceConfig};

mod batch;
mod stream;

use batch::Batch;
use stream::{Stream, StreamResult};

create_exception!(_ugds, Error, PyException, "Base of every ugds error; `errno` is its errno.");
create_exception!(_ugds, InvalidArgument, Error, "Bad input (alignment, range, size): nothing was done.");
create_exception!(_ugds, NotRegistered, Error, "The buffer is not (or no longer) registered.");
create_exception!(_ugds, AlreadyRegistered, Error, "The memory overlaps a registered buffer.");
create_exception!(_ugds, BusyError, Error, "I/O is in flight on it: nothing was released.");
create_exception!(_ugds, TimeoutError, Error, "A command did not complete in time; the handle is wedged.");
create_exception!(_ugds, WedgedError, Error, "The handle is wedged after a timeout; close it with drain='force'.");
create_exception!(_ugds, ClosedError, Error, "The handle is closed.");
create_exception!(_ugds, UnsupportedError, Error, "The platform or device cannot do this.");
create_exception!(_ugds, GpuError, Error, "A GPU runtime call failed, or the pointer is not usable GPU memory.");
create_exception!(_ugds, DeviceError, Error, "The controller failed the command or is gone.");

pub(crate) fn err(e: ugds::Error) -> PyErr {
    let msg = e.to_string();
    let errno = e.errno();
    use ugds::ErrorKind as K;
    let py_err = match e.kind() {
        K::InvalidArgument | K::CapacityExceeded => InvalidArgument::new_err(msg),
        K::NotRegistered => NotRegistered::new_err(msg),
        K::AlreadyRegistered => AlreadyRegistered::new_err(msg),
        K::Busy | K::QueueFull => BusyError::new_err(msg),
        K::Timeout => TimeoutError::new_err(msg),
        K::Wedged => WedgedError::new_err(msg),
        K::Closed | K::Canceled => ClosedError::new_err(msg),
        K::Unsupported => UnsupportedError::new_err(msg),
        K::GpuUnavailable
        | K::GpuDriver
        | K::GpuPointerInvalid
        | K::GpuMemoryType
        | K::GpuPointerRange
        | K::GpuContextMismatch => GpuError::new_err(msg),
        K::Device | K::PermissionDenied | K::NotFound | K::OutOfMemory | K::Platform => DeviceError::new_err(msg),
    };
    Python::with_gil(|py| {
        let _ = py_err.value(py).setattr("errno", errno);
    });
    py_err
}

/// Library state: registered buffers and open handles (`uGDSDriverOpen`).
#[pyclass(module = "ugds._ugds", frozen, subclass)]
struct Driver {
    inner: ugds::Driver,
    graveyard: Graveyard,
}

/// Registrations of collected Buffers that I/O still held: each keeps its
/// owner (the memory) alive until its deregistration succeeds, tried again
/// at later calls.
type Graveyard = Arc<Mutex<Vec<(BufferToken, PyObject)>>>;

/// Deregisters what the device no longer holds, releasing its owners.
/// Called with the GIL held (owners are dropped here).
fn sweep(driver: &ugds::Driver, graveyard: &Graveyard) {
    let released: Vec<(BufferToken, PyObject)> = {
        let mut g = graveyard.lock().recover();
        let (busy, done) = std::mem::take(&mut *g)
            .into_iter()
            .partition(|(t, _)| matches!(driver.deregister(t), Err(ugds::Error::Busy { .. })));
        *g = busy;
        done
    };
    // Dropped after the lock: an owner's __del__ may drop another Buffer,
    // which sweeps again.
    drop(released);
}

/// The handle's options: from the environment, then `interrupt` and
/// `mode` (a built-in mode's name) when given.
fn options(interrupt: bool, mode: Option<&str>) -> PyResult<HandleOptions> {
    let mut o = HandleOptions::from_env();
    if interrupt {
        o.completion = Completion::Interrupt;
    }
    if let Some(m) = mode {
        o.mode = Some(ugds::mode::mode_by_name(m).map_err(err)?);
    }
    Ok(o)
}

/// A request class by name.
pub(crate) fn priority(name: &str) -> PyResult<ugds::Priority> {
    match name {
        "critical" => Ok(ugds::Priority::Critical),
        "normal" => Ok(ugds::Priority::Normal),
        "background" => Ok(ugds::Priority::Background),
        p => Err(InvalidArgument::new_err(format!("unknown priority {p:?} (critical, normal, background)"))),
    }
}

impl Handle {
    /// A vectored read or write of (buffer, offset, length) segments, each
    /// buffer checked live.
    fn vectored(
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

/// A queue role's name in the dicts handed to Python.
fn role_name(role: ugds::QueueRole) -> &'static str {
    match role {
        ugds::QueueRole::Sync => "sync",
        ugds::QueueRole::Batch => "batch",
        _ => "lendable",
    }
}

impl Driver {
    /// Opens the platform `open` makes and a handle on it, without the GIL.
    fn open_on(
        &self,
        py: Python<'_>,
        interrupt: bool,
        mode: Option<&str>,
        open: impl FnOnce() -> ugds::Result<Arc<dyn ugds::platform::Platform>> + Send,
    ) -> PyResult<Handle> {
        let opts = options(interrupt, mode)?;
        py.allow_threads(|| self.inner.open_handle(open()?, opts)).map(Handle::from).map_err(err)
    }
}

#[pymethods]
impl Driver {
    #[new]
    fn new() -> Self {
        Driver { inner: ugds::Driver::open(), graveyard: Graveyard::default() }
    }

    /// Opens a handle on an emulated NVMe controller (runs anywhere). The
    /// namespace lives in memory, or in the file `path` (created if missing;
    /// `direct` reads and writes it with O_DIRECT).
    #[pyo3(signature = (path=None, size=1<<30, block_size=512, direct=false, interrupt=false, mode=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn open_emulated(
        &self,
        py: Python<'_>,
        path: Option<std::path::PathBuf>,
        size: u64,
        block_size: u32,
        direct: bool,
        interrupt: bool,
        mode: Option<&str>,
    ) -> PyResult<Handle> {
        let ns = match path {
            None => NamespaceConfig::memory(size, block_size),
            Some(p) if direct => NamespaceConfig::direct_file(p, size, block_size),
            Some(p) => NamespaceConfig::file(p, size, block_size),
        };
        let cfg = EmuConfig::default().namespaces(vec![ns]);
        self.open_on(py, interrupt, mode, || Ok(Arc::new(EmuPlatform::new(cfg)?)))
    }

    /// Opens a handle on a file (on any filesystem) or a block device
    /// through the kernel: io_uring, O_DIRECT where memory, offset and size
    /// are aligned for it, the page cache otherwise. Offsets and sizes are
    /// multiples of 512; the file's size is the handle's capacity; a read
    /// into its last, partial block returns the bytes there are. Host and
    /// GPU memory (through pinned bounce buffers). `ring`: "plain",
    /// "sqpoll" (a kernel thread takes submissions) or "iopoll"
    /// (completions polled from the device, where the file allows).
    #[pyo3(signature = (path, interrupt=false, ring="plain", mode=None))]
    fn open_file(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
        interrupt: bool,
        ring: &str,
        mode: Option<&str>,
    ) -> PyResult<Handle> {
        let ring = match ring {
            "plain" => ugds::KernelRing::Plain,
            "sqpoll" => ugds::KernelRing::SqPoll,
            "iopoll" => ugds::KernelRing::IoPoll,
            r => return Err(err(ugds::Error::InvalidArgument(format!("ring {r:?}: plain, sqpoll or iopoll")))),
        };
        let opts = options(interrupt, mode)?.kernel_ring(ring);
        py.allow_threads(|| self.inner.open_file(&path, opts)).map(Handle::from).map_err(err)
    }

    /// Opens a handle on a controller bound to the ugds_drv module
    /// (`/dev/ugds_drvN`).
    #[pyo3(signature = (path, interrupt=false, mode=None))]
    fn open_drv(&self, py: Python<'_>, path: &str, interrupt: bool, mode: Option<&str>) -> PyResult<Handle> {
        self.open_on(py, interrupt, mode, || Ok(Arc::new(ugds::platform::ugds_drv::UgdsDrvPlatform::open(path)?)))
    }

    /// Opens a handle on a controller bound to vfio-pci, by PCI address.
    /// `interface`: "auto" (the vfio cdev and iommufd where the kernel has
    /// them, else the IOMMU group), "cdev" or "group".
    #[pyo3(signature = (bdf, interrupt=false, interface="auto", mode=None))]
    fn open_vfio(
        &self,
        py: Python<'_>,
        bdf: &str,
        interrupt: bool,
        interface: &str,
        mode: Option<&str>,
    ) -> PyResult<Handle> {
        let via: ugds::platform::vfio::VfioInterface = interface.parse().map_err(err)?;
        self.open_on(py, interrupt, mode, || Ok(Arc::new(ugds::platform::vfio::VfioPlatform::open_with(bdf, via)?)))
    }

    /// Opens a handle on a namespace of an NVMe/TCP controller: `addr` is
    /// "host:port" (4420 by convention), `nqn` the subsystem's NQN; ugds's
    /// own initiator in user space, one connection per queue, header and
    /// data digests with `digests`; `interrupt` sleeps until a socket has
    /// data instead of spinning on it.
    #[pyo3(signature = (addr, nqn, digests=false, nsid=None, interrupt=false, mode=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn open_tcp(
        &self,
        py: Python<'_>,
        addr: &str,
        nqn: &str,
        digests: bool,
        nsid: Option<u32>,
        interrupt: bool,
        mode: Option<&str>,
    ) -> PyResult<Handle> {
        let mut t = ugds::fabrics::TcpTarget::new(addr, nqn);
        t.digests = ugds::fabrics::Digests { header: digests, data: digests };
        let opts = options(interrupt, mode)?.nsid(nsid);
        py.allow_threads(|| self.inner.open_tcp(&t, opts)).map(Handle::from).map_err(err)
    }

    /// Opens a handle on namespace `nsid` (the first when None) of the
    /// NVMe/RDMA controller `nqn` at `addr` ("address:port"), through
    /// ugds's own initiator (rdma-core loaded at run time), on host
    /// memory, each registered buffer registered with the RDMA device so
    /// that the target moves its data (`copy=True`: none registered, every
    /// command's data copied through the queues' own memory); `interrupt`
    /// sleeps on the queues' completion channels instead of polling them.
    #[pyo3(signature = (addr, nqn, nsid=None, interrupt=false, mode=None, copy=false))]
    #[allow(clippy::too_many_arguments)]
    fn open_rdma(
        &self,
        py: Python<'_>,
        addr: &str,
        nqn: &str,
        nsid: Option<u32>,
        interrupt: bool,
        mode: Option<&str>,
        copy: bool,
    ) -> PyResult<Handle> {
        let mut t = ugds::fabrics::RdmaTarget::new(addr, nqn);
        t.register_memory = !copy;
        let opts = options(interrupt, mode)?.nsid(nsid);
        py.allow_threads(|| self.inner.open_rdma(&t, opts)).map(Handle::from).map_err(err)
    }

    /// Registers `nbytes` at address `ptr`: `kind` is "host", "cuda" or
    /// "hip". `owner` (what keeps the memory allocated, and any buffer
    /// export that keeps it from moving) is held as long as the
    /// registration, and past it while I/O may still reach the memory.
    /// `tensor`, a torch tensor, is checked at every I/O to still have its
    /// storage at `ptr`. Prefer `Driver.register(obj)`, which finds the
    /// address of a tensor and holds what it needs.
    #[pyo3(signature = (ptr, nbytes, kind="host", owner=None, tensor=None))]
    fn register_raw(
        &self,
        ptr: u64,
        nbytes: usize,
        kind: &str,
        owner: Option<PyObject>,
        tensor: Option<PyObject>,
    ) -> PyResult<Buffer> {
        sweep(&self.inner, &self.graveyard);
        // SAFETY: the caller (the Python layer) passes memory that `owner`
        // keeps allocated; Buffer holds `owner` until deregistration, and
        // hands it to the graveyard if it goes while I/O holds the memory.
        let token = unsafe {
            match kind {
                "host" => self.inner.register(ptr as *mut u8, nbytes),
                "cuda" => self.inner.register_cuda(ptr, nbytes),
                "hip" => self.inner.register_hip(ptr, nbytes),
                other => {
                    return Err(InvalidArgument::new_err(format!("unknown memory kind {other:?} (host, cuda, hip)")))
                }
            }
        }
        .map_err(err)?;
        let device = self.inner.device_memory(&token).map_err(err)?.is_some();
        Ok(Buffer {
            token,
            device,
            owner: Mutex::new(owner),
            tensor,
            driver: self.inner.clone(),
            graveyard: self.graveyard.clone(),
        })
    }

    /// Deregisters a buffer; refused (BusyError) while I/O is in flight on it.
    fn deregister(&self, buf: &Buffer) -> PyResult<()> {
        sweep(&self.inner, &self.graveyard);
        self.inner.deregister(&buf.token).map_err(err)?;
        buf.owner.lock().recover().take();
        Ok(())
    }

    /// Registrations of collected buffers still held by I/O (their memory
    /// is kept alive until it completes).
    #[getter]
    fn pending_releases(&self) -> usize {
        sweep(&self.inner, &self.graveyard);
        self.graveyard.lock().recover().len()
    }

    /// Exports registered GPU memory as a dma-buf: `(fd, offset, length)`.
    /// The caller owns `fd` (close it with `os.close`).
    fn export_dmabuf(&self, buf: &Buffer) -> PyResult<(i32, u64, usize)> {
        let x = self.inner.export_dmabuf(&buf.token).map_err(err)?;
        Ok((std::os::fd::IntoRawFd::into_raw_fd(x.fd), x.offset, x.len))
    }
}

/// A registered buffer. Keep it to do I/O. It holds the memory's owner (and
/// a buffer export, so a bytearray cannot be resized under it) until it is
/// deregistered; when it is collected it deregisters itself, or, if I/O
/// still holds it, keeps the owner alive until that I/O is done.
#[pyclass(module = "ugds._ugds", frozen)]
struct Buffer {
    token: BufferToken,
    device: bool,
    owner: Mutex<Option<PyObject>>,
    /// A torch tensor whose storage must still be at `token.base`.
    tensor: Option<PyObject>,
    driver: ugds::Driver,
    graveyard: Graveyard,
}

impl Buffer {
    /// Refuses I/O if a registered torch tensor's storage moved or shrank
    /// (`resize_`, `set_`): the registration would name memory the tensor
    /// no longer owns.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
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

/// One controller and namespace. read/write are synchronous and release
/// the GIL; any number of threads may use one handle.
#[pyclass(module = "ugds._ugds", frozen)]
struct Handle {
    /// Shared with the volumes made of it.
    inner: Arc<ugds::Handle>,
    /// The batch contexts on it, ended when it closes.
    batches: Arc<batch::Batches>,
}

impl Handle {
    /// One stream-ordered request (an ordered batch of one).
    fn one_async(
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
    fn vectored_async(
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

/// Several handles as one: striped (RAID 0) or concatenated. read, write,
/// readv and writev as on a Handle; a request spanning members runs on them
/// at once and completes whole, or raises naming the member that failed.
/// The members stay usable on their own.
#[pyclass(module = "ugds._ugds", frozen)]
struct Volume {
    inner: ugds::Volume,
    /// The members' batch registries: a volume batch context is on each.
    batches: Vec<Arc<batch::Batches>>,
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
    fn one_async(
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

    fn vectored(
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

/// The registrations of (buffer, offset, length) segments, each buffer
/// checked live.
fn checked_tokens(py: Python<'_>, segments: &[(PyRef<'_, Buffer>, usize, usize)]) -> PyResult<Vec<ugds::BufferToken>> {
    segments
        .iter()
        .map(|(b, _, _)| {
            b.check(py)?;
            Ok(b.token)
        })
        .collect()
}

/// The segments as the library takes them, on `tokens` (in order).
fn as_segments<'t>(
    tokens: &'t [ugds::BufferToken],
    segments: &[(PyRef<'_, Buffer>, usize, usize)],
) -> Vec<ugds::Segment<'t>> {
    tokens.iter().zip(segments).map(|(t, (_, off, len))| ugds::Segment::new(t, *off, *len)).collect()
}

/// A late-bound value for stream-ordered I/O: read when the stream reaches
/// the operation, so it may be set after the call that enqueues it.
#[pyclass(module = "ugds._ugds", frozen)]
struct Cell {
    v: Arc<AtomicU64>,
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
enum Arg<'py> {
    Cell(PyRef<'py, Cell>),
    Int(u64),
}

impl Arg<'_> {
    fn cell(&self) -> Arc<AtomicU64> {
        match self {
            Arg::Cell(c) => c.v.clone(),
            Arg::Int(v) => Arc::new(AtomicU64::new(*v)),
        }
    }
}

fn op(name: &str) -> PyResult<BatchOp> {
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

/// An emulated NVMe/TCP target on 127.0.0.1 (a memory namespace of `size`
/// bytes in blocks of `block_size`), for trying `Driver.open_tcp` without
/// one: `addr` and `nqn` name it. Stops listening when collected.
#[pyclass(module = "ugds")]
struct EmuTcpTarget {
    inner: ugds_emu::tcp::EmuTcpTarget,
}

#[pymethods]
impl EmuTcpTarget {
    #[new]
    #[pyo3(signature = (size=64<<20, block_size=4096))]
    fn new(size: u64, block_size: u32) -> PyResult<Self> {
        if block_size == 0 || !block_size.is_power_of_two() || size % block_size as u64 != 0 || size == 0 {
            return Err(err(ugds::Error::InvalidArgument(format!(
                "size {size} in blocks of {block_size}: a power-of-two block size that divides the size"
            ))));
        }
        let cfg = ugds_emu::tcp::EmuTcpConfig { blocks: size / block_size as u64, block_size, ..Default::default() };
        let inner = ugds_emu::tcp::EmuTcpTarget::start(cfg).map_err(|e| err(ugds::Error::io("listen", e)))?;
        Ok(EmuTcpTarget { inner })
    }

    /// "127.0.0.1:port".
    #[getter]
    fn addr(&self) -> String {
        self.inner.addr().to_string()
    }

    /// The subsystem's NQN.
    #[getter]
    fn nqn(&self) -> String {
        self.inner.nqn().to_string()
    }
}

#[pymodule]
fn _ugds(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The library's messages go to standard error at UGDS_LOG's level.
    ugds::log::install_from_env(ugds::log::Level::WARN);
    let py = m.py();
    m.add_class::<Driver>()?;
    m.add_class::<Handle>()?;
    m.add_class::<Volume>()?;
    m.add_class::<EmuTcpTarget>()?;
    m.add_class::<Buffer>()?;
    m.add_class::<Batch>()?;
    m.add_class::<Stream>()?;
    m.add_class::<StreamResult>()?;
    m.add_class::<Cell>()?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("NotRegistered", py.get_type::<NotRegistered>())?;
    m.add("AlreadyRegistered", py.get_type::<AlreadyRegistered>())?;
    m.add("BusyError", py.get_type::<BusyError>())?;
    m.add("TimeoutError", py.get_type::<TimeoutError>())?;
    m.add("WedgedError", py.get_type::<WedgedError>())?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("GpuError", py.get_type::<GpuError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
