//! A controller at the other end of an NVMe/RDMA connection. What it needs
//! of a platform is memory: each queue moves a command's data through
//! memory of its own registered with the RDMA device, and copies between
//! that and the caller's buffer, so host memory is addressed by its own
//! virtual address (a command's data is contiguous there). GPU memory is
//! refused: registering it with the device (`ibv_reg_dmabuf_mr`) is not
//! built, and soft RoCE, the one RDMA device tested, cannot. No registers
//! (the engine speaks through Property Get and Set). Its interrupts are
//! the completion channels': a queue that sleeps between looks arms its
//! completion queue and has the channel's descriptor watched
//! ([`RdmaPlatform::watch`], [`crate::readiness`]), and the queue's vector
//! is signalled when a completion arrives.

use crate::device::DeviceMemory;
use crate::dma::DmaBuffer;
use crate::readiness::ReadinessVectors;
use crate::sys::EventFd;
use crate::{Error, HostMapping, Platform, Result};
use std::os::fd::BorrowedFd;
use ugds_nvme::regs;

/// Interrupt vectors (eventfds) a controller over RDMA has.
const VECTORS: u16 = 64;

/// The memory side of an NVMe/RDMA controller; see the module docs.
#[derive(Debug)]
pub struct RdmaPlatform {
    /// `address:port`, and the subsystem's NQN.
    addr: String,
    subnqn: String,
    vectors: ReadinessVectors,
}

impl RdmaPlatform {
    /// The platform of the controller of `subnqn` at `addr` (for what it
    /// says of itself; nothing is connected here).
    pub fn new(addr: &str, subnqn: &str) -> Result<RdmaPlatform> {
        Ok(RdmaPlatform {
            addr: addr.to_string(),
            subnqn: subnqn.to_string(),
            vectors: ReadinessVectors::new(VECTORS, "ugds-rdma-irq")?,
        })
    }

    /// Signals `vector` once when `channel` (a completion channel's
    /// descriptor) has an event; [`rearm`](Self::rearm) after each look.
    pub fn watch(&self, channel: BorrowedFd<'_>, vector: u16) -> Result<()> {
        self.vectors.watch(channel, vector)
    }

    /// Watches `channel` again: signalled at once if it has an event now.
    pub fn rearm(&self, channel: BorrowedFd<'_>, vector: u16) -> Result<()> {
        self.vectors.rearm(channel, vector)
    }

    /// Stops watching `channel`.
    pub fn unwatch(&self, channel: BorrowedFd<'_>) {
        self.vectors.unwatch(channel)
    }
}

impl Platform for RdmaPlatform {
    fn describe(&self) -> String {
        format!("NVMe/RDMA controller of {} at {} (ugds's initiator)", self.subnqn, self.addr)
    }

    /// No registers here: ready, as far as the engine's register reads go
    /// (the controller's own status comes through Property Get).
    fn read32(&self, off: usize) -> u32 {
        (off == regs::CSTS) as u32
    }

    fn write32(&self, _off: usize, _val: u32) {}

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        DmaBuffer::anonymous(len)
    }

    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        HostMapping::identity(vaddr, len)
    }

    unsafe fn map_device(&self, _mem: &DeviceMemory) -> Result<HostMapping> {
        Err(Error::Unsupported(
            "GPU memory over NVMe/RDMA: registering it with the RDMA device (ibv_reg_dmabuf_mr) is not built; \
             use host memory, or NVMe/TCP, which copies GPU memory through pinned buffers"
                .into(),
        ))
    }

    fn unmap_host(&self, _mapping: &HostMapping) -> Result<()> {
        Ok(())
    }

    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>> {
        Ok(self.vectors.get(vector))
    }

    fn interrupt_vectors(&self) -> u16 {
        self.vectors.count()
    }
}
