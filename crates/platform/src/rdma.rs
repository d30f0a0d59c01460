//! A controller at the other end of an NVMe/RDMA connection. What it needs
//! of a platform is memory the target can reach. Every connection of the
//! controller is in one protection domain (the admin queue's, on the
//! device the route runs through), and [`map_host`](Platform::map_host)
//! registers the caller's buffer there as a memory region: a command on
//! it names the buffer itself, by its virtual address and the region's
//! key ([`RdmaPlatform::region`]), and the target moves the data straight
//! to or from it. Memory not registered (the engine's own, or a buffer the
//! device refused to register: the memlock limit, say) goes through each
//! queue's own registered memory and is copied. The region lives as long
//! as the mapping: `unmap_host` deregisters it, after which the device
//! cannot reach the memory. GPU memory is refused: registering it with the
//! device (`ibv_reg_dmabuf_mr`) is not built, and soft RoCE, the one RDMA
//! device tested, cannot. No registers (the engine speaks through Property
//! Get and Set). Its interrupts are the completion channels': a queue that
//! sleeps between looks arms its completion queue and has the channel's
//! descriptor watched ([`RdmaPlatform::watch`], [`crate::readiness`]), and
//! the queue's vector is signalled when a completion arrives.

use crate::device::DeviceMemory;
use crate::dma::DmaBuffer;
use crate::readiness::ReadinessVectors;
use crate::sys::verbs::{Device, MemoryRegion};
use crate::sys::EventFd;
use crate::{Error, HostMapping, Platform, Result};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
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
    /// The protection domain the controller's connections share.
    device: Arc<Device>,
    /// Whether `map_host` registers buffers (else all data is copied).
    register: bool,
    /// The caller's buffers registered in it, by start address.
    regions: RwLock<Vec<Region>>,
    /// The cookie of the next registration (0: none, identity only).
    next_cookie: AtomicU64,
}

/// A buffer registered with the device: the page span it covers.
#[derive(Debug)]
struct Region {
    start: u64,
    end: u64,
    cookie: u64,
    mr: MemoryRegion,
}

impl RdmaPlatform {
    /// The platform of the controller of `subnqn` at `addr`, whose
    /// connections share `device`'s protection domain (nothing is
    /// connected here); buffers mapped are registered there when
    /// `register`.
    pub fn new(addr: &str, subnqn: &str, device: Arc<Device>, register: bool) -> Result<RdmaPlatform> {
        Ok(RdmaPlatform {
            addr: addr.to_string(),
            subnqn: subnqn.to_string(),
            vectors: ReadinessVectors::new(VECTORS, "ugds-rdma-irq")?,
            device,
            register,
            regions: RwLock::new(Vec::new()),
            next_cookie: AtomicU64::new(1),
        })
    }

    /// The device and protection domain the controller's connections share.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The key of a registered buffer that holds all of `addr..addr+len`,
    /// if one does (then the target may move those bytes itself).
    pub fn region(&self, addr: u64, len: u32) -> Option<u32> {
        let regions = self.regions.read().unwrap_or_else(PoisonError::into_inner);
        covering(&regions, |r| (r.start, r.end), addr, len).map(|r| r.mr.rkey())
    }

    /// Buffers registered with the device now.
    pub fn regions(&self) -> usize {
        self.regions.read().unwrap_or_else(PoisonError::into_inner).len()
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

/// The entry of `sorted` (by start; spans may overlap) whose span
/// `start..end` holds all of `addr..addr+len`.
fn covering<T>(sorted: &[T], span: impl Fn(&T) -> (u64, u64), addr: u64, len: u32) -> Option<&T> {
    let end = addr.checked_add(len as u64)?;
    // Look back from the last one starting at or before `addr`: an earlier,
    // longer one may hold what a later, shorter one does not.
    let at = sorted.partition_point(|r| span(r).0 <= addr);
    sorted[..at].iter().rev().find(|r| span(r).1 >= end)
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

    /// Registers the page span of the buffer with the device. A refusal
    /// (the memlock limit, say) is not an error: the buffer is then
    /// reached through the queues' own memory, as the engine's is.
    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        let mut mapping = HostMapping::identity(vaddr, len)?;
        mapping.cookie = 0;
        if !self.register {
            return Ok(mapping);
        }
        let (start, span) = HostMapping::span(vaddr, len)?;
        // SAFETY: the caller keeps the memory mapped until `unmap_host`,
        // which drops the region.
        match unsafe { self.device.register_host(start as *mut u8, span) } {
            Ok(mr) => {
                let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
                let r = Region { start: start as u64, end: (start + span) as u64, cookie, mr };
                let mut regions = self.regions.write().unwrap_or_else(PoisonError::into_inner);
                let at = regions.partition_point(|x| x.start <= r.start);
                regions.insert(at, r);
                mapping.cookie = cookie;
            }
            Err(e) => {
                tracing::warn!(
                    "NVMe/RDMA: {} bytes at {start:#x} not registered with {} ({e}); their data is copied through the queues' memory",
                    span,
                    self.device.info().name
                );
            }
        }
        Ok(mapping)
    }

    unsafe fn map_device(&self, _mem: &DeviceMemory) -> Result<HostMapping> {
        Err(Error::Unsupported(
            "GPU memory over NVMe/RDMA: registering it with the RDMA device (ibv_reg_dmabuf_mr) is not built; \
             use host memory, or NVMe/TCP, which copies GPU memory through pinned buffers"
                .into(),
        ))
    }

    /// Deregisters the buffer: the device no longer reaches it once this
    /// returns.
    fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        if mapping.cookie != 0 {
            let mut regions = self.regions.write().unwrap_or_else(PoisonError::into_inner);
            if let Some(i) = regions.iter().position(|r| r.cookie == mapping.cookie) {
                // Dropped outside the lock (ibv_dereg_mr is a system call).
                let r = regions.remove(i);
                drop(regions);
                drop(r);
            }
        }
        Ok(())
    }

    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>> {
        Ok(self.vectors.get(vector))
    }

    fn interrupt_vectors(&self) -> u16 {
        self.vectors.count()
    }
}

#[cfg(test)]
mod tests {
    use super::covering;

    #[test]
    fn a_command_is_named_by_a_registration_that_holds_all_of_it() {
        let spans = [(0x1000u64, 0x3000u64), (0x2000, 0x2800), (0x8000, 0x9000)];
        let find = |addr, len| covering(&spans, |s| *s, addr, len).copied();
        assert_eq!(find(0x1000, 0x2000), Some((0x1000, 0x3000)), "all of the first");
        assert_eq!(find(0x2100, 0x100), Some((0x2000, 0x2800)), "the later, closer one");
        assert_eq!(find(0x2700, 0x200), Some((0x1000, 0x3000)), "past the shorter one: the longer, earlier one");
        assert_eq!(find(0x2f00, 0x200), None, "runs past every registration");
        assert_eq!(find(0x500, 0x100), None, "before the first");
        assert_eq!(find(0x4000, 0x10), None, "between two");
        assert_eq!(find(0x8fff, 1), Some((0x8000, 0x9000)), "the last byte");
        assert_eq!(find(u64::MAX - 4, 16), None, "wraps the address space");
        assert_eq!(covering(&[] as &[(u64, u64)], |s| *s, 0x1000, 1), None);
    }
}
