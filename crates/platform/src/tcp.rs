//! A controller at the other end of an NVMe/TCP connection. What it needs
//! of a platform is memory: the connection's queues copy each command's
//! data between the socket and the caller's buffer themselves, so host
//! memory is addressed by its own virtual address (a command's data is
//! contiguous there), and GPU memory by a window above
//! [`DEVICE_IOVA_BASE`](crate::window::DEVICE_IOVA_BASE) that the queues
//! copy through pinned host buffers ([`crate::window`]). It has no
//! registers and no interrupts: the engine speaks to the controller
//! through the connection (Property Get and Set), and its queues poll
//! their sockets.

use crate::device::{DeviceMemory, DeviceRuntime};
use crate::dma::{DmaBuffer, DmaRegion, DmaRelease};
use crate::sys::{Anonymous, EventFd};
use crate::window::DeviceWindows;
use crate::{HostMapping, Platform, Result};
use std::ptr::NonNull;
use std::sync::Arc;
use ugds_nvme::{regs, Iova};

/// The memory side of an NVMe/TCP controller; see the module docs.
#[derive(Debug)]
pub struct TcpPlatform {
    /// `host:port`, and the subsystem's NQN.
    addr: String,
    subnqn: String,
    devices: DeviceWindows,
}

impl TcpPlatform {
    /// The platform of the controller of `subnqn` at `addr` (for what it
    /// says of itself; nothing is connected here).
    pub fn new(addr: &str, subnqn: &str) -> TcpPlatform {
        TcpPlatform { addr: addr.to_string(), subnqn: subnqn.to_string(), devices: DeviceWindows::default() }
    }

    /// The GPU memory at window address `addr` for `len` bytes (see
    /// [`DeviceWindows::at`]).
    pub fn device_at(&self, addr: u64, len: usize) -> Option<(u64, Arc<dyn DeviceRuntime>)> {
        self.devices.at(addr, len)
    }
}

/// Memory the platform allocated, kept until its last user goes.
struct Owned(#[allow(dead_code)] Anonymous);

impl DmaRelease for Owned {
    fn release(&self, _region: &DmaRegion) {}
}

impl Platform for TcpPlatform {
    fn describe(&self) -> String {
        format!("NVMe/TCP controller of {} at {} (ugds's initiator)", self.subnqn, self.addr)
    }

    /// No registers here: ready, as far as the engine's register reads go
    /// (the controller's own status comes through Property Get).
    fn read32(&self, off: usize) -> u32 {
        (off == regs::CSTS) as u32
    }

    fn write32(&self, _off: usize, _val: u32) {}

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        let mem = Anonymous::populated(len)?;
        let (ptr, len) = (mem.as_ptr(), mem.len());
        // SAFETY: `mem` is a fresh mapping of `len` bytes, kept alive by the
        // buffer's release hook; its "controller address" is its own
        // address, which only this process's queues read.
        let region = unsafe { DmaRegion::new(NonNull::new(ptr).expect("mmap is not null"), len, Iova(ptr as u64)) };
        Ok(DmaBuffer::new(region, Arc::new(Owned(mem))))
    }

    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        let span = HostMapping::span(vaddr, len)?;
        Ok(HostMapping::contiguous(vaddr, span, span.0 as u64))
    }

    unsafe fn map_device(&self, mem: &DeviceMemory) -> Result<HostMapping> {
        Ok(self.devices.map(mem))
    }

    fn copies_device_memory(&self) -> bool {
        true
    }

    fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        self.devices.unmap(mapping);
        Ok(())
    }

    fn interrupt(&self, _vector: u16) -> Result<Option<&EventFd>> {
        Ok(None)
    }

    fn interrupt_vectors(&self) -> u16 {
        0
    }
}
