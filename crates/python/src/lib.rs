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
mod buffer;
mod emu;
mod handle;
mod serve;
mod stream;
mod volume;

use batch::Batch;
use buffer::Buffer;
use emu::EmuTcpTarget;
use handle::{as_segments, checked_tokens, op, Arg, Cell, Handle};
use serve::Server;
use stream::{Stream, StreamResult};
use volume::Volume;

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

    /// Opens a handle on the controller `ugds serve` serves at the unix
    /// socket `socket`: I/O queue pairs of this process's own, no admin
    /// queue. Host memory for such a handle comes from `alloc_host` (the
    /// owner maps the same pages for the device; other memory is private
    /// to this process and refused).
    #[pyo3(signature = (socket, interrupt=false, mode=None))]
    fn open_attached(
        &self,
        py: Python<'_>,
        socket: std::path::PathBuf,
        interrupt: bool,
        mode: Option<&str>,
    ) -> PyResult<Handle> {
        self.open_on(py, interrupt, mode, || Ok(Arc::new(ugds::platform::attach::AttachPlatform::connect(&socket)?)))
    }

    /// `nbytes` of zeroed, page-aligned host memory for I/O (shared memory
    /// once this process has attached: see `open_attached`). Prefer
    /// `Driver.alloc_host`, which returns it as a writable buffer.
    fn host_memory(&self, nbytes: usize) -> PyResult<HostMemory> {
        let mut b = ugds::HostBuffer::new(nbytes).map_err(err)?;
        let ptr = b.as_mut_ptr() as u64;
        Ok(HostMemory { _buf: b, ptr, nbytes })
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

/// Host memory from `Driver.host_memory`: freed when collected (a
/// registration of it holds this object).
#[pyclass(module = "ugds._ugds", frozen)]
struct HostMemory {
    _buf: ugds::HostBuffer,
    #[pyo3(get)]
    ptr: u64,
    #[pyo3(get)]
    nbytes: usize,
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
    m.add_class::<HostMemory>()?;
    m.add_class::<Server>()?;
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
