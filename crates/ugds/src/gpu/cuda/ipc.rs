//! CUDA memory shared with another process by IPC handle: how an owner
//! whose controller is emulated reaches the GPU memory of a process
//! attached to it (`serve`), which its copy engine then copies to and from.

use super::api::*;
use super::{Cuda, CudaContext};
use crate::gpu::DeviceMemory;
use std::sync::Arc;
use ugds_platform::device::IpcExport;
use ugds_platform::{Error, Result};

impl Cuda {
    /// Opens GPU memory another process named with
    /// [`DeviceRuntime::export_ipc`](crate::gpu::DeviceRuntime::export_ipc): its allocation, in the primary context
    /// of the device with that UUID, and the range in it. The memory stays
    /// open until the returned object is dropped.
    pub fn open_ipc(self: &Arc<Self>, x: &IpcExport) -> Result<IpcMemory> {
        let device = (0..self.device_count()? as i32)
            .find(|&d| {
                let mut uuid = [0u8; 16];
                // SAFETY: writes 16 bytes.
                let r = unsafe { (self.api.device_get_uuid)(&mut uuid, d) };
                r == SUCCESS && uuid == x.device
            })
            .ok_or_else(|| Error::InvalidArgument("no GPU of this process has the exporter's device UUID".into()))?;
        let ctx = self.primary_context(device)?;
        let (mut base, mut size) = (0u64, 0usize);
        self.with_context(ctx, || {
            // SAFETY: writes one device pointer; the handle is 64 bytes as
            // the exporter's runtime wrote them.
            let r = unsafe {
                (self.api.ipc_open_mem_handle)(&mut base, IpcMemHandle(x.handle), IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
            };
            self.check("cuIpcOpenMemHandle", r)
        })?;
        let mut open = IpcMemory { cuda: self.clone(), ctx: ctx as usize, base, mem: None };
        self.with_context(ctx, || {
            // SAFETY: writes the allocation's base and size.
            self.check("cuMemGetAddressRange", unsafe {
                (self.api.mem_get_address_range)(&mut base, &mut size, open.base)
            })
        })?;
        if x.len == 0 || x.offset.checked_add(x.len as u64).is_none_or(|end| end > size as u64) {
            return Err(Error::InvalidArgument(format!(
                "{} bytes at offset {:#x} run past the {size}-byte allocation the handle names",
                x.len, x.offset
            )));
        }
        open.mem = Some(DeviceMemory { ptr: open.base + x.offset, len: x.len, runtime: self.context(ctx as usize)? });
        Ok(open)
    }
}

/// GPU memory of another process, opened by its IPC handle
/// ([`Cuda::open_ipc`]); closed when dropped.
pub struct IpcMemory {
    cuda: Arc<Cuda>,
    ctx: usize,
    base: u64,
    mem: Option<DeviceMemory>,
}

impl IpcMemory {
    /// The range, as registered memory of this process.
    pub fn memory(&self) -> &DeviceMemory {
        self.mem.as_ref().expect("set once opened")
    }
}

impl std::fmt::Debug for IpcMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IPC-opened {:?}", self.mem)
    }
}

impl Drop for IpcMemory {
    fn drop(&mut self) {
        let closed = self.cuda.with_context(self.ctx as Ctx, || {
            // SAFETY: opened by `open_ipc`; the owner of this object no
            // longer lets a controller reach it.
            self.cuda.check("cuIpcCloseMemHandle", unsafe { (self.cuda.api.ipc_close_mem_handle)(self.base) })
        });
        if let Err(e) = closed {
            tracing::warn!("GPU memory of another process not closed: {e}");
        }
    }
}

impl CudaContext {
    /// [`DeviceRuntime::export_ipc`](crate::gpu::DeviceRuntime::export_ipc): the allocation's IPC handle.
    pub(super) fn ipc_export(&self, ptr: u64, len: usize) -> Result<IpcExport> {
        let (base, size) = self.cuda.allocation(ptr)?;
        if ptr.checked_add(len as u64).is_none_or(|end| end > base + size as u64) {
            return Err(Error::GpuPointerRange { ptr, len, alloc_base: base, alloc_len: size });
        }
        let mut handle = IpcMemHandle([0; 64]);
        let mut device = [0u8; 16];
        self.cuda.with_context(self.ctx as Ctx, || {
            // SAFETY: writes one 64-byte handle for the allocation at `base`.
            let r = unsafe { (self.cuda.api.ipc_get_mem_handle)(&mut handle, base) };
            if r == ERROR_INVALID_VALUE || r == ERROR_NOT_SUPPORTED {
                return Err(Error::Unsupported(format!(
                    "CUDA cannot name the allocation at {base:#x} for another process (IPC takes memory of \
                     cuMemAlloc, not of cuMemCreate pools or managed memory)"
                )));
            }
            self.cuda.check("cuIpcGetMemHandle", r)?;
            // SAFETY: writes 16 bytes.
            self.cuda.check("cuDeviceGetUuid", unsafe { (self.cuda.api.device_get_uuid)(&mut device, self.device) })
        })?;
        Ok(IpcExport { handle: handle.0, device, offset: ptr - base, len, ptr })
    }
}
