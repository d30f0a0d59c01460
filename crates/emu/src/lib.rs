//! An NVMe controller emulated in-process: the default target, and the test
//! double for the SSD in everything above the platform layer.
//!
//! The driver sees registers, doorbells, queues in DMA memory, PRP lists and
//! interrupts exactly as it would on a device; the controller runs on its own
//! thread and reaches memory only through its IOVA table, so a PRP entry
//! that points at memory nobody mapped is a DMA fault, counted and completed
//! with Data Transfer Error, never a stray write.
//!
//! What can be configured ([`EmuConfig`]): namespaces (block size 512 or
//! 4096, size, backed by memory or by a file), MDTS, MQES, the number of I/O
//! queue pairs, a null mode that moves no data (to measure the driver alone),
//! a latency and bandwidth model, and interrupt vectors (eventfds). Faults
//! are injected at run time through [`EmuControl`]: an error status on chosen
//! commands, a lost completion, a stall, controller fatal status.
//!
//! The controller thread spins while there is work and for a short window
//! after it, then sleeps on a futex; any register write wakes it. An idle
//! handle costs no CPU. The registers and that futex word live in a memfd,
//! so that processes attached through `ugds serve` ring doorbells and wake
//! the controller as this one does ([`Platform::share_registers`]).

mod config;
mod controller;
pub mod descriptor;
mod fault;
mod stats;
pub mod tcp;

pub use config::{Backing, EmuConfig, LatencyModel, NamespaceConfig, SharedFd};
pub use fault::{Fault, FaultAction, FaultTarget, IdentifyLies};
pub use stats::EmuStats;
use stats::{Counters, DriverCounters};
use ugds_platform::Recover;

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use ugds_nvme::{regs, Iova};
use ugds_platform::attach::SharedRegisters;
use ugds_platform::device::{DeviceMemory, DeviceRuntime};
use ugds_platform::dma::{DmaBuffer, DmaRegion, DmaRelease};
use ugds_platform::sys::shared::{futex_wake, SharedMemory};
use ugds_platform::sys::{Anonymous, EventFd, PAGE_SIZE};
use ugds_platform::{Error, Result};
use ugds_platform::{HostMapping, Platform};

/// The controller's view of host memory: IOVA ranges and the host memory
/// behind each. Removing an entry takes the write lock, which waits for the
/// controller to finish any access it is making under the read lock.
struct IovaTable {
    map: BTreeMap<u64, IovaEntry>,
    next: u64,
    /// Bumped on every removal; the controller re-validates cached queue
    /// addresses when it changes.
    version: u64,
    /// Entries of device memory (the controller checks commands for them
    /// only while there are some).
    devices: usize,
}

struct IovaEntry {
    len: usize,
    /// Host address, or device address when `device` is set.
    host: usize,
    /// GPU memory, reached through the runtime's copy engine.
    device: Option<Arc<dyn DeviceRuntime>>,
    /// Memory the platform allocated (queues, PRP pages); freed on removal.
    owned: Option<Anonymous>,
}

/// IOVAs start here, so that a zero or small PRP is always a fault.
const IOVA_BASE: u64 = 0x1_0000_0000;

impl IovaTable {
    fn insert(&mut self, host: usize, len: usize, owned: Option<Anonymous>) -> u64 {
        self.insert_entry(IovaEntry { len, host, device: None, owned })
    }

    fn insert_entry(&mut self, e: IovaEntry) -> u64 {
        let iova = self.next;
        // Leave an unmapped page after every range so overruns fault.
        self.next += (e.len.next_multiple_of(PAGE_SIZE) + PAGE_SIZE) as u64;
        self.devices += e.device.is_some() as usize;
        self.map.insert(iova, e);
        iova
    }

    fn remove(&mut self, iova: u64) -> bool {
        self.version += 1;
        match self.map.remove(&iova) {
            Some(e) => {
                self.devices -= e.device.is_some() as usize;
                true
            }
            None => false,
        }
    }

    /// Host address of `iova..iova+len`, when the whole range lies in one
    /// mapping of host memory.
    fn translate(&self, iova: u64, len: usize) -> Option<NonNull<u8>> {
        match self.translate_data(iova, len)? {
            (host, None) => NonNull::new(host as *mut u8),
            (_, Some(_)) => None,
        }
    }

    /// Address of `iova..iova+len` in host memory, or in GPU memory with
    /// the runtime that reaches it.
    fn translate_data(&self, iova: u64, len: usize) -> Option<(usize, Option<&Arc<dyn DeviceRuntime>>)> {
        let (&start, e) = self.map.range(..=iova).next_back()?;
        let off = (iova - start) as usize;
        if off.checked_add(len)? > e.len {
            return None;
        }
        Some((e.host + off, e.device.as_ref()))
    }
}

/// State shared between the driver-side platform and the controller thread.
struct Shared {
    /// The register file, then on the next page the word the controller
    /// thread sleeps on (non-zero while it sleeps): shared memory, so that
    /// attached processes ring doorbells and wake it too.
    regs: SharedMemory,
    nregs: usize,
    stop: AtomicBool,
    iova: RwLock<IovaTable>,
    stats: Counters,
    driver_stats: DriverCounters,
    faults: Mutex<Vec<Fault>>,
    faults_armed: AtomicBool,
    vectors: Vec<EventFd>,
    /// Surprise removal: registers read all ones, nothing is processed.
    removed: AtomicBool,
}

impl Shared {
    fn reg(&self, off: usize) -> Option<&AtomicU32> {
        if off % 4 != 0 {
            return None;
        }
        self.registers().get(off / 4)
    }

    /// The register file as words.
    fn registers(&self) -> &[AtomicU32] {
        &self.regs.words()[..self.nregs]
    }

    /// The word the controller thread sleeps on.
    fn sleeping(&self) -> &AtomicU32 {
        self.regs.word(self.wake_offset()).expect("the wake page follows the registers")
    }

    fn wake_offset(&self) -> usize {
        (self.nregs * 4).next_multiple_of(PAGE_SIZE)
    }

    fn wake(&self) {
        // Pairs with the controller's fence before it re-checks for work and
        // sleeps: either it sees our register write, or we see `sleeping`.
        // Clearing the word makes a wait that has not started yet return at
        // once (futex_wait finds it changed): no wake-up is lost.
        fence(Ordering::SeqCst);
        if self.sleeping().load(Ordering::Relaxed) != 0 && self.sleeping().swap(0, Ordering::Relaxed) != 0 {
            futex_wake(self.sleeping());
        }
    }
}

impl DmaRelease for Shared {
    fn release(&self, region: &DmaRegion) {
        self.iova.write().recover().remove(region.iova(0));
    }
}

/// Run-time control of an emulated controller: counters and fault injection.
#[derive(Clone)]
pub struct EmuControl {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EmuControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuControl").finish_non_exhaustive()
    }
}

impl EmuControl {
    /// The controller's counters now.
    pub fn stats(&self) -> EmuStats {
        self.shared.stats.snapshot(&self.shared.driver_stats)
    }

    /// Arms a fault.
    pub fn inject(&self, fault: Fault) {
        let mut f = self.shared.faults.lock().recover();
        f.push(fault);
        self.shared.faults_armed.store(true, Ordering::Release);
    }

    /// Removes the device by surprise, as a hot unplug does: from now on
    /// every register reads all ones, writes go nowhere, and no command is
    /// fetched or completed.
    pub fn surprise_remove(&self) {
        self.shared.removed.store(true, Ordering::Release);
        self.shared.wake();
    }

    /// Disarms every fault not yet used up.
    pub fn clear_faults(&self) {
        self.shared.faults.lock().recover().clear();
        self.shared.faults_armed.store(false, Ordering::Release);
    }
}

/// The emulated controller as a [`Platform`].
pub struct EmuPlatform {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    max_io_queues: u16,
}

impl std::fmt::Debug for EmuPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuPlatform").finish_non_exhaustive()
    }
}

impl EmuPlatform {
    /// Builds the controller (opening or creating backing files) and starts
    /// its thread. The controller starts disabled, as after power-on.
    pub fn new(config: EmuConfig) -> Result<EmuPlatform> {
        config.validate()?;
        let namespaces = controller::Namespace::open_all(&config)?;
        let nregs = regs::bar_len(config.max_io_queues, 0).div_ceil(4);
        let mem = SharedMemory::new((nregs * 4).next_multiple_of(PAGE_SIZE) + PAGE_SIZE)?;
        let regs = mem.words();
        let cap = regs::Cap::new(config.mqes, true, 20, 0, 0, 4);
        regs[regs::CAP / 4].store(cap.0 as u32, Ordering::Relaxed);
        regs[regs::CAP / 4 + 1].store((cap.0 >> 32) as u32, Ordering::Relaxed);
        regs[regs::VS / 4].store(regs::Version::V1_4.0, Ordering::Relaxed);
        let vectors = (0..config.interrupt_vectors).map(|_| EventFd::new()).collect::<Result<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            regs: mem,
            nregs,
            stop: AtomicBool::new(false),
            iova: RwLock::new(IovaTable { map: BTreeMap::new(), next: IOVA_BASE, version: 0, devices: 0 }),
            stats: Counters::default(),
            driver_stats: DriverCounters::default(),
            faults: Mutex::new(Vec::new()),
            faults_armed: AtomicBool::new(false),
            vectors,
            removed: AtomicBool::new(false),
        });
        let max_io_queues = config.max_io_queues;
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ugds-emu".into())
            .spawn(move || controller::Controller::new(s, config, namespaces).run())
            .map_err(|e| Error::io("spawn emulator thread", e))?;
        Ok(EmuPlatform { shared, thread: Some(thread), max_io_queues })
    }

    /// Counters and fault injection for this controller.
    pub fn control(&self) -> EmuControl {
        EmuControl { shared: self.shared.clone() }
    }
}

impl Drop for EmuPlatform {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Platform for EmuPlatform {
    fn describe(&self) -> String {
        format!("emulated controller ({} I/O queue pairs max)", self.max_io_queues)
    }

    fn read32(&self, off: usize) -> u32 {
        // Reads outside the register file, or of a removed device, return
        // all ones, as a PCI read of nothing does.
        if self.shared.removed.load(Ordering::Acquire) {
            return u32::MAX;
        }
        self.shared.reg(off).map_or(u32::MAX, |r| r.load(Ordering::Acquire))
    }

    unsafe fn write32(&self, off: usize, val: u32) {
        if self.shared.removed.load(Ordering::Acquire) {
            return;
        }
        let writable = matches!(off, regs::INTMS | regs::INTMC | regs::CC | regs::NSSR | regs::AQA)
            || (regs::ASQ..regs::ACQ + 8).contains(&off)
            || off >= regs::DOORBELL_BASE;
        match self.shared.reg(off) {
            Some(r) if writable => {
                if off >= regs::DOORBELL_BASE {
                    self.shared.driver_stats.doorbell_writes.fetch_add(1, Ordering::Relaxed);
                }
                // Release: the queue entries written before this doorbell are
                // visible to the controller thread that acquires it.
                r.store(val, Ordering::Release);
            }
            _ => {
                if off >= regs::DOORBELL_BASE {
                    self.shared.driver_stats.invalid_doorbells.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
        }
        self.shared.wake();
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        let mem = Anonymous::populated(len)?;
        let (host, len) = (mem.as_ptr(), mem.len());
        let iova = self.shared.iova.write().recover().insert(host as usize, len, Some(mem));
        // SAFETY: `mem` is page-aligned, `len` bytes long, and is owned by the
        // IOVA table entry until `release` removes it, which only the drop of
        // the DmaBuffer built here does.
        let region = unsafe { DmaRegion::new(NonNull::new(host).expect("mmap is not null"), len, Iova(iova)) };
        Ok(DmaBuffer::new(region, self.shared.clone()))
    }

    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        let span = HostMapping::span(vaddr, len)?;
        let iova = self.shared.iova.write().recover().insert(span.0, span.1, None);
        // SAFETY: the IOVA table translates `iova` to the span until
        // `unmap_host` removes the entry.
        Ok(unsafe { HostMapping::contiguous(vaddr, span, iova) })
    }

    unsafe fn map_device(&self, mem: &DeviceMemory) -> Result<HostMapping> {
        let (start, len) = ugds_platform::device::page_span(mem.ptr, mem.len);
        let entry = IovaEntry { len, host: start as usize, device: Some(mem.runtime.clone()), owned: None };
        let iova = self.shared.iova.write().recover().insert_entry(entry);
        // SAFETY: as in `map_host`, for the GPU memory's pages.
        Ok(unsafe { HostMapping::contiguous(mem.ptr as *const u8, (start as usize, len), iova) })
    }

    fn copies_device_memory(&self) -> bool {
        true
    }

    unsafe fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        let cookie = mapping.cookie();
        let mut table = self.shared.iova.write().recover();
        match table.map.get(&cookie) {
            None => Err(Error::Platform(format!("no mapping at IOVA {cookie:#x}"))),
            // A DmaBuffer's memory: only its drop frees it.
            Some(e) if e.owned.is_some() => {
                Err(Error::InvalidArgument(format!("IOVA {cookie:#x} is a DMA buffer of the platform's own")))
            }
            Some(_) => {
                table.remove(cookie);
                Ok(())
            }
        }
    }

    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>> {
        Ok(self.shared.vectors.get(vector as usize))
    }

    fn interrupt_vectors(&self) -> u16 {
        self.shared.vectors.len() as u16
    }

    fn share_registers(&self) -> Result<SharedRegisters> {
        Ok(SharedRegisters {
            fd: self.shared.regs.fd().clone(),
            offset: 0,
            len: self.shared.regs.len(),
            wake: Some(self.shared.wake_offset()),
            device: false,
        })
    }
}
