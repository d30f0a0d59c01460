//! The library's entry point: buffer registration and handle opening.

use crate::engine::Controller;
#[cfg(feature = "gpu")]
use crate::gpu::cuda::Memory;
use crate::gpu::{DeviceMemory, DmabufExport};
use crate::handle::{DriverInner, Handle, HandleInner, HandleOptions};
use crate::registry::{BufferToken, Visibility};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use ugds_platform::Platform;
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// Library state: the buffer registry and the open handles. Opening it does
/// no device work (the paper's `uGDSDriverOpen`); handles do.
#[derive(Clone)]
pub struct Driver {
    pub(crate) inner: Arc<DriverInner>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").finish_non_exhaustive()
    }
}

/// Handle ids, unique in the process (not per driver): a thread's
/// remembered registration is keyed by handle id and token, and must never
/// match another driver's handle.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

impl Default for Driver {
    fn default() -> Self {
        Driver::open()
    }
}

impl Driver {
    /// New library state.
    ///
    /// The first in a process also starts reading the library's own code
    /// into the page cache (`MADV_WILLNEED` on the object holding it): with
    /// the binary out of the cache, the first handle's set-up would
    /// otherwise fault it in from the disk a few pages at a time.
    pub fn open() -> Driver {
        static PREFETCH: std::sync::Once = std::sync::Once::new();
        PREFETCH.call_once(|| {
            let bytes = ugds_platform::sys::prefetch_object(Driver::open as fn() -> Driver as usize);
            tracing::debug!(bytes, "the library's code asked into the page cache");
        });
        Driver { inner: Arc::new(DriverInner::default()) }
    }

    /// Brings up the controller behind `platform` and opens a handle on one
    /// of its namespaces.
    pub fn open_handle(&self, platform: Arc<dyn Platform>, opts: HandleOptions) -> Result<Handle> {
        let ctrl = Controller::bring_up_with(platform, Self::queues_wanted(&opts), opts.shadow_doorbells)?;
        self.open_controller(ctrl, opts)
    }

    /// Opens a handle on a file (on any filesystem) or a block device
    /// through the kernel: io_uring, with `O_DIRECT` where memory, offset
    /// and size are aligned as the file needs, the page cache otherwise.
    /// Offsets and sizes are multiples of 512 bytes; the file's size when
    /// opened is the handle's capacity. Opened for reading and writing, or
    /// for reading only where writing is not allowed (a write then fails
    /// with [`Error::Nvme`], Namespace Write Protected, and changes
    /// nothing). Host memory only for now: registering GPU memory while
    /// such a handle is open is refused as unsupported.
    pub fn open_file(&self, path: impl AsRef<std::path::Path>, opts: HandleOptions) -> Result<Handle> {
        let platform = Arc::new(ugds_platform::kernel::KernelPlatform::open(path)?);
        self.open_kernel(platform, opts)
    }

    /// As [`open_file`](Self::open_file), on a descriptor the caller opened
    /// (kept open by a duplicate; its file position is not used).
    pub fn open_fd(&self, fd: std::os::fd::BorrowedFd<'_>, opts: HandleOptions) -> Result<Handle> {
        let platform = Arc::new(ugds_platform::kernel::KernelPlatform::from_fd(fd)?);
        self.open_kernel(platform, opts)
    }

    fn open_kernel(&self, platform: Arc<ugds_platform::kernel::KernelPlatform>, opts: HandleOptions) -> Result<Handle> {
        let source = platform.clone();
        let handle = with_copies_prepared(|| {
            let polled = opts.completion == crate::engine::Completion::Poll;
            let ctrl =
                crate::engine::KernelController::new(platform, Self::queues_wanted(&opts), opts.kernel_ring, polled)?
                    .cache_policy(opts.cache);
            self.open_controller(Controller::Kernel(Box::new(ctrl)), opts)
        })?;
        // The bounce slab the first reads into GPU memory cut their
        // buffers from is pinned in the handle's buffer source now, not by
        // the first of them (a ring then only copies the table).
        if let Some((slab, index)) = crate::engine::bounce::current_slab() {
            // SAFETY: bounce slabs are mapped for the process's life and
            // their slot numbers are theirs alone (generation 1).
            unsafe { source.hold_fixed(index, 1, slab.0 as *mut u8, slab.1) };
        }
        Ok(handle)
    }

    /// Opens a handle on a namespace of the NVMe/TCP controller `target`
    /// names (ugds's own initiator, in user space: the admin queue and each
    /// I/O queue on a connection of their own, Keep Alive on a timer). Host
    /// and GPU memory (the latter through pinned host buffers). Polled
    /// completion spins on the sockets; interrupt completion sleeps until a
    /// socket has data (the platform's epoll thread signals the queue's
    /// vector).
    pub fn open_tcp(&self, target: &crate::fabrics::TcpTarget, opts: HandleOptions) -> Result<Handle> {
        with_copies_prepared(|| {
            let ctrl = crate::engine::tcp::TcpController::connect(target, Self::queues_wanted(&opts))?;
            self.open_controller(Controller::Tcp(Box::new(ctrl)), opts)
        })
    }

    /// Opens a handle on a namespace of the NVMe/RDMA controller `target`
    /// names (ugds's own initiator, through rdma-core loaded at run time:
    /// the admin queue and each I/O queue on a connection of their own).
    /// Host memory only, each command's data copied through the queue's
    /// registered memory (GPU memory is refused when registered); polled
    /// completion only (interrupt completion is refused).
    pub fn open_rdma(&self, target: &crate::fabrics::RdmaTarget, opts: HandleOptions) -> Result<Handle> {
        let ctrl = crate::engine::rdma::RdmaController::connect(target, Self::queues_wanted(&opts))?;
        self.open_controller(Controller::Rdma(Box::new(ctrl)), opts)
    }

    fn queues_wanted(opts: &HandleOptions) -> u16 {
        opts.sync_queues_wanted().saturating_add(opts.async_queues).saturating_add(opts.batch_queues_wanted())
    }

    fn open_controller(&self, ctrl: Controller, opts: HandleOptions) -> Result<Handle> {
        let id = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        let t0 = std::time::Instant::now();
        let inner = HandleInner::new(id, self.inner.clone(), ctrl, opts)?;
        let inner = Arc::new(inner);
        let t_queues = t0.elapsed();
        crate::stream_ops::start_engine(&inner)?;
        let t_engine = t0.elapsed();
        inner.start_publishing()?;
        let t_map = t0.elapsed();
        if inner.bounces_device_memory() {
            // Before the handle list's lock: other opens and registrations
            // do not wait for the slab's pinning.
            let _ = self.inner.registry.for_each(|e| {
                e.device.as_ref().map(warm_bounce_pool);
                Ok(())
            });
        }
        let mut handles = self.inner.handles.lock().recover();
        let platform = inner.platform().clone();
        let mapped = self.inner.registry.for_each(|e| e.map_for(id, &platform));
        // Where an open's time goes (`UGDS_LOG=debug`).
        tracing::debug!(
            handle = id,
            queues_us = t_queues.as_micros() as u64,
            stream_engine_us = (t_engine - t_queues).as_micros() as u64,
            publishing_us = (t_map - t_engine).as_micros() as u64,
            registrations_us = (t0.elapsed() - t_map).as_micros() as u64,
            "handle opened"
        );
        if let Err(e) = mapped {
            self.inner.registry.for_each(|e| {
                e.unmap_for(id);
                Ok(())
            })?;
            return Err(e);
        }
        handles.retain(|(_, w)| w.strong_count() > 0);
        handles.push((id, Arc::downgrade(&inner)));
        Ok(Handle { inner })
    }

    /// Registers `len` bytes of host memory at `base` for I/O, mapping it
    /// for every open handle (and every handle opened later).
    ///
    /// # Safety
    /// The memory must stay valid until [`Driver::deregister`] succeeds for
    /// the returned token, and must not be read or written by anyone else
    /// while an I/O call on it is in progress.
    pub unsafe fn register(&self, base: *mut u8, len: usize) -> Result<BufferToken> {
        self.insert(base as usize, len, None, Visibility::Public)
    }

    /// Registers host memory for one caller alone (a just-in-time
    /// registration): found only by the returned token, never by address,
    /// so it neither conflicts with a registration of the same memory nor
    /// can be used or deregistered by anyone without the token.
    ///
    /// # Safety
    /// As for [`register`](Self::register).
    pub unsafe fn register_private(&self, base: *mut u8, len: usize) -> Result<BufferToken> {
        self.insert(base as usize, len, None, Visibility::Private)
    }

    #[cfg(feature = "gpu")]
    /// [`register_cuda`](Self::register_cuda) for one caller alone; see
    /// [`register_private`](Self::register_private).
    ///
    /// # Safety
    /// As for [`register_cuda`](Self::register_cuda).
    pub unsafe fn register_cuda_private(&self, ptr: u64, len: usize) -> Result<BufferToken> {
        let cuda = crate::gpu::cuda::Cuda::get()?;
        match cuda.classify(ptr, len)? {
            Memory::Host => self.insert(ptr as usize, len, None, Visibility::Private),
            Memory::Device(d) => self.insert(ptr as usize, len, Some(d), Visibility::Private),
        }
    }

    /// Private registrations still held (`(held, with I/O in flight)`):
    /// those of calls whose I/O timed out keep their pages until the
    /// handle is torn down.
    pub fn private_registrations(&self) -> (usize, usize) {
        self.inner.registry.private_count()
    }

    /// Registers a test double's device memory (see `engine::slow_gpu`).
    #[cfg(test)]
    pub(crate) fn register_test_device(&self, mem: DeviceMemory) -> Result<BufferToken> {
        self.insert(mem.ptr as usize, mem.len, Some(mem), Visibility::Public)
    }

    fn insert(&self, base: usize, len: usize, device: Option<DeviceMemory>, v: Visibility) -> Result<BufferToken> {
        if device.is_none() && len as u64 > ugds_platform::sys::physical_memory() {
            // No process can pin more than the machine has; checked before
            // any page list is allocated.
            return Err(Error::InvalidArgument(format!(
                "{len} bytes of host memory is more than this machine's {} bytes",
                ugds_platform::sys::physical_memory()
            )));
        }
        if let Some(d) = &device {
            // Outside the handle list's lock (see `warm_bounce_pool`); a
            // handle opened meanwhile warms the pool itself.
            let bounces = self
                .inner
                .handles
                .lock()
                .recover()
                .iter()
                .any(|(_, w)| w.upgrade().is_some_and(|h| h.bounces_device_memory()));
            if bounces {
                warm_bounce_pool(d);
            }
        }
        let handles = self.inner.handles.lock().recover();
        let live: Vec<_> = handles.iter().filter_map(|(id, w)| w.upgrade().map(|h| (*id, h))).collect();
        let live: Vec<_> = live.into_iter().map(|(id, h)| (id, h.platform().clone())).collect();
        self.inner.registry.insert(base, len, device, &live, v)
    }

    #[cfg(feature = "gpu")]
    /// Registers memory CUDA knows: device memory from `cuMemAlloc` (or
    /// torch, CuPy), checked to be a plain device allocation of the current
    /// context with the range inside it; or host memory (pinned or not),
    /// registered as [`register`](Self::register) does.
    ///
    /// # Safety
    /// The memory must stay allocated until [`Driver::deregister`] succeeds,
    /// and must not be used by anyone else while an I/O on it is in progress.
    pub unsafe fn register_cuda(&self, ptr: u64, len: usize) -> Result<BufferToken> {
        let cuda = crate::gpu::cuda::Cuda::get()?;
        match cuda.classify(ptr, len)? {
            Memory::Host => self.insert(ptr as usize, len, None, Visibility::Public),
            Memory::Device(d) => self.insert(ptr as usize, len, Some(d), Visibility::Public),
        }
    }

    #[cfg(feature = "gpu")]
    /// Registers memory HIP knows; see [`register_cuda`](Self::register_cuda).
    ///
    /// # Safety
    /// As for [`register_cuda`](Self::register_cuda).
    pub unsafe fn register_hip(&self, ptr: u64, len: usize) -> Result<BufferToken> {
        let hip = crate::gpu::hip::Hip::get()?;
        match hip.classify(ptr, len)? {
            Memory::Host => self.insert(ptr as usize, len, None, Visibility::Public),
            Memory::Device(d) => self.insert(ptr as usize, len, Some(d), Visibility::Public),
        }
    }

    /// Registers `len` bytes at `offset` of a dma-buf that another driver
    /// exported (a GPU's, an RDMA NIC's, a udmabuf); see [`crate::gpu::dmabuf`].
    /// The descriptor is duplicated: the caller may close its own. Returns
    /// the token; offsets in I/O calls count from the registered range.
    pub fn register_dmabuf(&self, fd: std::os::fd::BorrowedFd<'_>, offset: u64, len: usize) -> Result<BufferToken> {
        let d = std::sync::Arc::new(crate::gpu::dmabuf::Dmabuf::new(fd, offset, len)?);
        let base = d.base();
        self.insert(base, len, Some(DeviceMemory { ptr: base as u64, len, runtime: d }), Visibility::Public)
    }

    /// Exports registered GPU memory as a dma-buf, for other consumers
    /// (an RDMA NIC's `ibv_reg_dmabuf_mr`, another driver). The caller owns
    /// the returned descriptor.
    pub fn export_dmabuf(&self, token: &BufferToken) -> Result<DmabufExport> {
        match self.inner.registry.device_memory(token)? {
            Some(d) => d.runtime.export_dmabuf(d.ptr, d.len),
            None => Err(Error::Unsupported("dma-buf export of host memory".into())),
        }
    }

    /// Whether the registration is GPU memory (and whose).
    pub fn device_memory(&self, token: &BufferToken) -> Result<Option<DeviceMemory>> {
        self.inner.registry.device_memory(token)
    }

    /// Deregisters a buffer: refused (and nothing changed) while I/O is in
    /// flight on it or when the token is stale.
    pub fn deregister(&self, token: &BufferToken) -> Result<()> {
        let _handles = self.inner.handles.lock().recover();
        self.inner.registry.remove(token)
    }

    /// The registration whose range holds `addr`, if any.
    pub fn token_containing(&self, addr: *const u8) -> Option<BufferToken> {
        self.inner.registry.containing(addr as usize)
    }

    /// The current registration at `base`, if any (for callers that keep
    /// base addresses, as the C API does).
    pub fn token_at(&self, base: *const u8) -> Option<BufferToken> {
        self.inner.registry.token_at(base as usize)
    }
}

/// GPU memory registered where a handle copies it through bounce buffers:
/// the first bounce slab is made and pinned now, not by the first read
/// (a failure is left for that read to report).
fn warm_bounce_pool(d: &DeviceMemory) {
    if let Err(e) = crate::engine::bounce::warm(&*d.runtime) {
        tracing::debug!("bounce buffers not made ahead of the first command: {e}");
    }
}

/// Opens a handle that copies GPU memory through bounce buffers (`open`)
/// while, on a thread of its own, what the first GPU registration would
/// otherwise make is made: the copy engine of the opening thread's CUDA
/// context and the first bounce slab (on the H100, about 1 ms each). Only
/// where the process already initialised CUDA and this thread has a
/// context current (`Cuda::if_loaded`): a host-only program loads and
/// initialises no GPU runtime.
/// Joined before the open returns; a failure is logged and left to the
/// registration to meet again.
fn with_copies_prepared(open: impl FnOnce() -> Result<Handle>) -> Result<Handle> {
    #[cfg(feature = "gpu")]
    let prep = crate::gpu::cuda::Cuda::if_loaded().and_then(|cuda| {
        let ctx = cuda.context_of_thread()?;
        if cuda.has_context(ctx) && crate::engine::bounce::warmed() {
            // Made by an earlier open or registration: no thread needed.
            return None;
        }
        let spawned = std::thread::Builder::new().name("ugds-copy-prep".into()).spawn(move || {
            let t0 = std::time::Instant::now();
            let made = cuda.context(ctx).and_then(|rt| crate::engine::bounce::warm(&*rt));
            match made {
                Ok(()) => tracing::debug!(us = t0.elapsed().as_micros() as u64, "copy engine and bounce slab made"),
                Err(e) => tracing::debug!("copies not prepared while the handle opened: {e}"),
            }
        });
        spawned.map_err(|e| tracing::debug!("no thread to prepare copies on: {e}")).ok()
    });
    let opened = open();
    #[cfg(feature = "gpu")]
    if let Some(t) = prep {
        let _ = t.join();
    }
    opened
}
