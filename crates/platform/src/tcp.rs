//! A controller at the other end of an NVMe/TCP connection. What it needs
//! of a platform is memory: the connection's queues copy each command's
//! data between the socket and the caller's buffer themselves, so host
//! memory is addressed by its own virtual address (a command's data is
//! contiguous there), and GPU memory by a window above
//! [`DEVICE_IOVA_BASE`](crate::window::DEVICE_IOVA_BASE) that the queues
//! copy through pinned host buffers ([`crate::window`]). It has no
//! registers: the engine speaks to the controller through the connection
//! (Property Get and Set). Its interrupts are the sockets': a queue that
//! sleeps between looks has its socket watched ([`TcpPlatform::watch`],
//! [`crate::readiness`]), and the queue's vector is signalled when data
//! arrives.

use crate::device::{DeviceMemory, DeviceRuntime};
use crate::dma::DmaBuffer;
use crate::readiness::ReadinessVectors;
use crate::sys::EventFd;
use crate::window::DeviceWindows;
use crate::{HostMapping, Platform, Result};
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use ugds_nvme::regs;

/// Interrupt vectors (eventfds) a controller over TCP has.
const VECTORS: u16 = 64;

/// The memory side of an NVMe/TCP controller; see the module docs.
#[derive(Debug)]
pub struct TcpPlatform {
    /// `host:port`, and the subsystem's NQN.
    addr: String,
    subnqn: String,
    devices: DeviceWindows,
    vectors: ReadinessVectors,
}

impl TcpPlatform {
    /// The platform of the controller of `subnqn` at `addr` (for what it
    /// says of itself; nothing is connected here).
    pub fn new(addr: &str, subnqn: &str) -> Result<TcpPlatform> {
        Ok(TcpPlatform {
            addr: addr.to_string(),
            subnqn: subnqn.to_string(),
            devices: DeviceWindows::default(),
            vectors: ReadinessVectors::new(VECTORS, "ugds-tcp-irq")?,
        })
    }

    /// Signals `vector` once when `socket` has something to read (or is
    /// closed); [`rearm`](Self::rearm) after each look for the next time.
    pub fn watch(&self, socket: BorrowedFd<'_>, vector: u16) -> Result<()> {
        self.vectors.watch(socket, vector)
    }

    /// Watches `socket` again (see [`watch`](Self::watch)): signalled at
    /// once if it has something to read now.
    pub fn rearm(&self, socket: BorrowedFd<'_>, vector: u16) -> Result<()> {
        self.vectors.rearm(socket, vector)
    }

    /// Stops watching `socket`.
    pub fn unwatch(&self, socket: BorrowedFd<'_>) {
        self.vectors.unwatch(socket)
    }

    /// The GPU memory at window address `addr` for `len` bytes (see
    /// [`DeviceWindows::at`]).
    pub fn device_at(&self, addr: u64, len: usize) -> Option<(u64, Arc<dyn DeviceRuntime>)> {
        self.devices.at(addr, len)
    }
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

    unsafe fn write32(&self, _off: usize, _val: u32) {}

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        DmaBuffer::anonymous(len)
    }

    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        HostMapping::identity(vaddr, len)
    }

    unsafe fn map_device(&self, mem: &DeviceMemory) -> Result<HostMapping> {
        Ok(self.devices.map(mem))
    }

    fn copies_device_memory(&self) -> bool {
        true
    }

    unsafe fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        self.devices.unmap(mapping);
        Ok(())
    }

    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>> {
        Ok(self.vectors.get(vector))
    }

    fn interrupt_vectors(&self) -> u16 {
        self.vectors.count()
    }
}
