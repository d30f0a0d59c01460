//! A controller at the other end of an NVMe/RDMA connection. What it needs
//! of a platform is memory the target can reach. Every connection of the
//! controller is in one protection domain (the admin queue's, on the
//! device the route runs through), and [`map_host`](Platform::map_host)
//! registers the caller's buffer there as a memory region: a command on
//! it names the buffer itself, by its virtual address and the region's
//! key ([`RdmaPlatform::reach`]), and the target moves the data straight
//! to or from it. A buffer the device refused to register (the memlock
//! limit, say), or every buffer when registration is off, is reached
//! through each queue's own registered memory and copied; memory mapped
//! by neither way is never touched. The region lives as long as the
//! mapping: `unmap_host` deregisters it, after which the device cannot
//! reach the memory. GPU memory ([`map_device`](Platform::map_device)) is
//! registered from its dma-buf (`ibv_reg_dmabuf_mr`) at its device
//! address, and is only ever reached by the target: where the device
//! cannot register it (soft RoCE cannot), it is refused with the device's
//! answer. No registers (the engine speaks through Property Get and Set). Its interrupts are the completion channels': a queue that
//! sleeps between looks arms its completion queue and has the channel's
//! descriptor watched ([`RdmaPlatform::watch`], [`crate::readiness`]), and
//! the queue's vector is signalled when a completion arrives.

use crate::device::DeviceMemory;
use crate::dma::DmaBuffer;
use crate::readiness::ReadinessVectors;
use crate::sys::verbs::{Device, MemoryRegion};
use crate::sys::EventFd;
use crate::{Error, HostMapping, Platform, Result};
use std::os::fd::{AsRawFd, BorrowedFd};
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
    /// Every mapping (registered in it or not), by start address.
    regions: RwLock<Vec<Region>>,
    /// The cookie of the next mapping.
    next_cookie: AtomicU64,
    /// Raised at each unmapping: a [`ReachCache`] of an older one is stale.
    generation: AtomicU64,
}

/// A mapped buffer: the span it covers, and its memory region (none: host
/// memory reached through the queues' copies).
#[derive(Debug)]
struct Region {
    start: u64,
    end: u64,
    cookie: u64,
    mr: Option<MemoryRegion>,
    device: bool,
}

/// A queue's copy of the mapping its last command's data was in, so that
/// a run of commands on one buffer does not read the shared table.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReachCache {
    /// The platform's generation when it was taken (0: empty).
    generation: u64,
    start: u64,
    end: u64,
    reach: Option<Reach>,
}

impl ReachCache {
    /// The cached answer for `addr..addr+len`, if the mapping holds all of
    /// it and none was unmapped since (`generation`).
    fn get(&self, generation: u64, addr: u64, len: u32) -> Option<Reach> {
        let end = addr.checked_add(len as u64)?;
        (self.generation == generation && self.start <= addr && end <= self.end).then_some(self.reach?)
    }
}

/// How a command reaches its data ([`RdmaPlatform::reach`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// In a registered region of host memory: the target moves it, named
    /// with this key (or it is copied, by a queue outside the domain).
    Direct(u32),
    /// In a registered region of device memory: only the target may move
    /// it, named with this key.
    Device(u32),
    /// In mapped host memory not registered: copied through the queue.
    Copy,
    /// In nothing mapped: the command must not run.
    Unknown,
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
            generation: AtomicU64::new(1),
        })
    }

    /// The device and protection domain the controller's connections share.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// How a command whose data is `addr..addr+len` reaches it: the
    /// mapping that holds all of it says. `cache` (the calling queue's)
    /// answers while that mapping is the one it holds and nothing was
    /// unmapped since; else the table does, and the cache takes its answer.
    /// (A mapping in use is never unmapped: the registry refuses while a
    /// request holds the buffer, and a request's registration happens
    /// before its submission, so a stale cache is always seen as such.)
    pub fn reach(&self, cache: &mut ReachCache, addr: u64, len: u32) -> Reach {
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(r) = cache.get(generation, addr, len) {
            return r;
        }
        let regions = self.regions.read().unwrap_or_else(PoisonError::into_inner);
        let Some(found) = covering(&regions, |r| (r.start, r.end), addr, len) else {
            return Reach::Unknown;
        };
        let reach = match found {
            Region { mr: Some(mr), device: true, .. } => Reach::Device(mr.rkey()),
            Region { mr: Some(mr), .. } => Reach::Direct(mr.rkey()),
            Region { mr: None, .. } => Reach::Copy,
        };
        *cache = ReachCache { generation, start: found.start, end: found.end, reach: Some(reach) };
        reach
    }

    /// Records a mapping of `start..end` (of device memory when `device`);
    /// its cookie.
    fn insert(&self, start: u64, end: u64, mr: Option<MemoryRegion>, device: bool) -> u64 {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let mut regions = self.regions.write().unwrap_or_else(PoisonError::into_inner);
        let at = regions.partition_point(|x| x.start <= start);
        regions.insert(at, Region { start, end, cookie, mr, device });
        cookie
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

    unsafe fn write32(&self, _off: usize, _val: u32) {}

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        DmaBuffer::anonymous(len)
    }

    /// Registers the page span of the buffer with the device. A refusal
    /// (the memlock limit, say) is not an error: the buffer is then
    /// reached through the queues' own memory.
    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        let mut mapping = HostMapping::identity(vaddr, len)?;
        let (start, span) = HostMapping::span(vaddr, len)?;
        let mr = if self.register {
            // SAFETY: the caller keeps the memory mapped until
            // `unmap_host`, which drops the region.
            match unsafe { self.device.register_host(start as *mut u8, span) } {
                Ok(mr) => Some(mr),
                Err(e) => {
                    tracing::warn!(
                        "NVMe/RDMA: {span} bytes at {start:#x} not registered with {} ({e}); their data is copied through the queues' memory",
                        self.device.info().name
                    );
                    None
                }
            }
        } else {
            None
        };
        mapping.cookie = self.insert(start as u64, (start + span) as u64, mr, false);
        Ok(mapping)
    }

    /// Registers the memory from its dma-buf (the runtime's export), at
    /// its device address: commands name it by that address, and only the
    /// target ever reaches it. Refused, with the device's answer, where
    /// the device cannot (soft RoCE has no dma-buf memory regions).
    unsafe fn map_device(&self, mem: &DeviceMemory) -> Result<HostMapping> {
        let refused = |why: String| {
            Error::Unsupported(format!(
                "GPU memory over NVMe/RDMA: {} cannot register {mem:?} ({why}); \
                 use host memory, or NVMe/TCP, which copies GPU memory through pinned buffers",
                self.device.info().name
            ))
        };
        let x = mem.runtime.export_dmabuf(mem.ptr, mem.len).map_err(|e| refused(format!("no dma-buf: {e}")))?;
        // The kernel holds the dma-buf for the region's life: the
        // descriptor is closed when `x` goes.
        let mr = self
            .device
            .register_dmabuf(x.fd.as_raw_fd(), x.offset, mem.len, mem.ptr)
            .map_err(|e| refused(e.to_string()))?;
        let (start, span) = crate::device::page_span(mem.ptr, mem.len);
        let cookie = self.insert(mem.ptr, mem.ptr + mem.len as u64, Some(mr), true);
        // SAFETY: the initiator names GPU memory by its own address, which
        // the RDMA device reaches through the region registered above
        // (kept until `unmap_host` of this cookie).
        let mapping = unsafe { HostMapping::contiguous(mem.ptr as *const u8, (start as usize, span), start) };
        // SAFETY: the same pages, under the region's name.
        Ok(unsafe { HostMapping::from_parts(mapping.pages, mapping.first_offset, cookie) })
    }

    /// Deregisters the buffer: the device no longer reaches it once this
    /// returns.
    unsafe fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        let mut regions = self.regions.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = regions.iter().position(|r| r.cookie == mapping.cookie) {
            let r = regions.remove(i);
            // Every queue's cached mapping is stale from here on.
            self.generation.fetch_add(1, Ordering::Release);
            // Deregistered outside the lock (ibv_dereg_mr is a system call).
            drop(regions);
            drop(r);
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
    use super::{covering, Reach, ReachCache};

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

    #[test]
    fn a_cached_mapping_answers_only_within_it_and_until_an_unmapping() {
        let c = ReachCache { generation: 7, start: 0x1000, end: 0x3000, reach: Some(Reach::Direct(42)) };
        assert_eq!(c.get(7, 0x1000, 0x2000), Some(Reach::Direct(42)), "all of it");
        assert_eq!(c.get(7, 0x2fff, 1), Some(Reach::Direct(42)), "its last byte");
        assert_eq!(c.get(7, 0x2fff, 2), None, "past its end");
        assert_eq!(c.get(7, 0xfff, 2), None, "before its start");
        assert_eq!(c.get(8, 0x1000, 16), None, "something was unmapped since");
        assert_eq!(ReachCache::default().get(1, 0, 1), None, "empty");
        assert_eq!(c.get(7, u64::MAX, 2), None, "wraps the address space");
    }
}
