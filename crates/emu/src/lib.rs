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
//! after it, then parks; any register write wakes it. An idle handle costs
//! no CPU.

mod controller;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;
use ugds_nvme::{regs, Iova, Status};
use ugds_platform::device::{DeviceMemory, DeviceRuntime};
use ugds_platform::dma::{DmaBuffer, DmaRegion, DmaRelease};
use ugds_platform::sys::{Anonymous, EventFd, PAGE_SIZE};
use ugds_platform::{Error, Result};
use ugds_platform::{HostMapping, Platform};

/// Where a namespace keeps its blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backing {
    /// Anonymous memory, zero at start, lost at drop.
    Memory,
    /// A file: block `n` is at byte `n * block_size`. The file is created if
    /// missing and extended (sparsely) to the namespace size.
    File(PathBuf),
    /// A file read and written with `O_DIRECT` (no page cache), through an
    /// aligned bounce buffer: for benchmarks against a real disk. The
    /// namespace's block size must be a multiple of the file system's.
    DirectFile(PathBuf),
    /// A file the caller opened: read and written through a duplicate of
    /// its descriptor (never reopened by name, so an unlinked or renamed
    /// file is still the one served), never extended; `O_DIRECT` when the
    /// caller's descriptor has it.
    Descriptor(SharedFd),
}

/// A descriptor shared by configurations (equal when it is the same one).
#[derive(Clone, Debug)]
pub struct SharedFd(pub Arc<std::os::fd::OwnedFd>);

impl PartialEq for SharedFd {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedFd {}

/// One namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NamespaceConfig {
    /// Logical block size in bytes: 512 or 4096.
    pub block_size: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    /// Where the data lives.
    pub backing: Backing,
}

impl NamespaceConfig {
    /// A memory-backed namespace of `bytes` bytes (rounded down to blocks).
    pub fn memory(bytes: u64, block_size: u32) -> Self {
        NamespaceConfig { block_size, blocks: bytes / block_size as u64, backing: Backing::Memory }
    }

    /// A file-backed namespace of `bytes` bytes.
    pub fn file(path: impl Into<PathBuf>, bytes: u64, block_size: u32) -> Self {
        NamespaceConfig { block_size, blocks: bytes / block_size as u64, backing: Backing::File(path.into()) }
    }

    /// A namespace of `bytes` bytes (at most the file's size) on a file the
    /// caller opened; see [`Backing::Descriptor`].
    pub fn descriptor(fd: std::os::fd::OwnedFd, bytes: u64, block_size: u32) -> Self {
        NamespaceConfig {
            block_size,
            blocks: bytes / block_size as u64,
            backing: Backing::Descriptor(SharedFd(Arc::new(fd))),
        }
    }

    /// A namespace of `bytes` bytes on a file opened with `O_DIRECT`.
    pub fn direct_file(path: impl Into<PathBuf>, bytes: u64, block_size: u32) -> Self {
        NamespaceConfig { block_size, blocks: bytes / block_size as u64, backing: Backing::DirectFile(path.into()) }
    }
}

/// A latency and bandwidth model: each command completes `latency` after the
/// (serialised) transfer of its bytes at `bytes_per_sec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LatencyModel {
    /// Fixed time per command.
    pub latency: Duration,
    /// Transfer rate; 0 means unlimited.
    pub bytes_per_sec: u64,
}

impl LatencyModel {
    /// `latency` per command, and transfers at `bytes_per_sec` (0: no limit).
    pub fn new(latency: Duration, bytes_per_sec: u64) -> LatencyModel {
        LatencyModel { latency, bytes_per_sec }
    }
}

/// How the emulated controller looks and behaves.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EmuConfig {
    /// Namespaces, given NSIDs 1, 2, ... in order.
    pub namespaces: Vec<NamespaceConfig>,
    /// Maximum Data Transfer Size as Identify reports it: `4 KiB << mdts`,
    /// 0 for no limit.
    pub mdts: u8,
    /// Maximum Queue Entries Supported, zero-based, as CAP.MQES.
    pub mqes: u16,
    /// I/O queue pairs the controller grants at most.
    pub max_io_queues: u16,
    /// Complete I/O commands without moving data.
    pub null: bool,
    /// Delay completions by this model.
    pub latency: Option<LatencyModel>,
    /// Interrupt vectors (eventfds), vector 0 for the admin queue.
    pub interrupt_vectors: u16,
    /// How long the controller thread spins after its last work before parking.
    pub spin: Duration,
    /// Complete the commands fetched in one sweep of a submission queue in
    /// the reverse of their order (the spec allows any order).
    pub reverse_completions: bool,
    /// Threads that move the data of reads and writes on file-backed
    /// namespaces, several commands at once as an SSD works on them; 0: the
    /// controller thread does it, one command at a time. Not used with a
    /// latency model.
    pub io_workers: usize,
    /// What Identify claims that is not so.
    pub lies: IdentifyLies,
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig {
            namespaces: vec![NamespaceConfig::memory(64 << 20, 512)],
            mdts: 5,
            mqes: 1023,
            max_io_queues: 16,
            null: false,
            latency: None,
            interrupt_vectors: 17,
            spin: Duration::from_micros(100),
            reverse_completions: false,
            io_workers: 0,
            lies: IdentifyLies::default(),
        }
    }
}

impl EmuConfig {
    /// Replaces the namespaces.
    pub fn namespaces(mut self, ns: Vec<NamespaceConfig>) -> Self {
        self.namespaces = ns;
        self
    }
    /// Sets MDTS (log2 of 4 KiB units; 0 = unlimited).
    pub fn mdts(mut self, mdts: u8) -> Self {
        self.mdts = mdts;
        self
    }
    /// Sets MQES (zero-based).
    pub fn mqes(mut self, mqes: u16) -> Self {
        self.mqes = mqes;
        self
    }
    /// Sets the number of I/O queue pairs granted at most.
    pub fn max_io_queues(mut self, n: u16) -> Self {
        self.max_io_queues = n;
        self
    }
    /// Makes Identify claim what is not so.
    pub fn identify_lies(mut self, lies: IdentifyLies) -> Self {
        self.lies = lies;
        self
    }
    /// Sets the number of interrupt vectors (vector 0 is the admin queue's).
    pub fn interrupt_vectors(mut self, n: u16) -> Self {
        self.interrupt_vectors = n;
        self
    }
    /// Null mode: commands complete without moving data.
    pub fn null(mut self, null: bool) -> Self {
        self.null = null;
        self
    }
    /// Moves data with `n` worker threads (see [`EmuConfig::io_workers`]).
    pub fn io_workers(mut self, n: usize) -> Self {
        self.io_workers = n;
        self
    }

    /// Completes each sweep's commands in reverse order.
    pub fn reverse_completions(mut self, on: bool) -> Self {
        self.reverse_completions = on;
        self
    }
    /// Sets the latency model.
    pub fn latency(mut self, m: Option<LatencyModel>) -> Self {
        self.latency = m;
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.namespaces.is_empty() {
            return bad("the emulated controller needs at least one namespace".into());
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            if ns.block_size != 512 && ns.block_size != 4096 {
                return bad(format!("namespace {}: block size {} is not 512 or 4096", i + 1, ns.block_size));
            }
            if ns.blocks == 0 {
                return bad(format!("namespace {}: size is zero", i + 1));
            }
        }
        if self.mqes < 1 {
            return bad("MQES must allow at least two entries".into());
        }
        if self.max_io_queues == 0 || self.max_io_queues > 1024 {
            return bad(format!("{} I/O queues: 1..=1024 supported", self.max_io_queues));
        }
        if self.mdts > 12 {
            return bad(format!("MDTS {} is larger than this emulator supports (12)", self.mdts));
        }
        Ok(())
    }
}

/// Counters the controller keeps; tests read them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EmuStats {
    /// Commands fetched from any submission queue.
    pub commands: u64,
    /// Read commands completed successfully.
    pub reads: u64,
    /// Write commands completed successfully.
    pub writes: u64,
    /// Bytes moved by reads.
    pub bytes_read: u64,
    /// Bytes moved by writes.
    pub bytes_written: u64,
    /// DMA faults: PRPs or queue addresses that were unmapped or misaligned.
    pub dma_faults: u64,
    /// Doorbell writes with a value outside the queue, or for no queue.
    pub invalid_doorbells: u64,
    /// Interrupts signalled.
    pub interrupts: u64,
    /// Doorbell writes the driver made (submission and completion).
    pub doorbell_writes: u64,
    /// Completions deliberately dropped by fault injection.
    pub lost_completions: u64,
    /// Controller resets (CC.EN 1 to 0).
    pub resets: u64,
}

/// Counters the driver side bumps (in `write32`), kept off the cache lines
/// the controller thread writes.
#[derive(Default)]
#[repr(align(128))]
struct DriverCounters {
    doorbell_writes: AtomicU64,
    invalid_doorbells: AtomicU64,
}

#[derive(Default)]
#[repr(align(128))]
struct Counters {
    commands: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    dma_faults: AtomicU64,
    invalid_doorbells: AtomicU64,
    interrupts: AtomicU64,
    lost_completions: AtomicU64,
    resets: AtomicU64,
}

impl Counters {
    fn snapshot(&self, d: &DriverCounters) -> EmuStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EmuStats {
            commands: l(&self.commands),
            reads: l(&self.reads),
            writes: l(&self.writes),
            bytes_read: l(&self.bytes_read),
            bytes_written: l(&self.bytes_written),
            dma_faults: l(&self.dma_faults),
            invalid_doorbells: l(&self.invalid_doorbells) + l(&d.invalid_doorbells),
            interrupts: l(&self.interrupts),
            doorbell_writes: l(&d.doorbell_writes),
            lost_completions: l(&self.lost_completions),
            resets: l(&self.resets),
        }
    }
}

/// Which commands a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultTarget {
    /// I/O commands, optionally only this opcode.
    Io(Option<u8>),
    /// Admin commands, optionally only this opcode.
    Admin(Option<u8>),
}

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultAction {
    /// Complete with this status (no data is moved).
    Status(Status),
    /// Fetch the command, never complete it.
    LoseCompletion,
    /// Complete it (normally) only after this long.
    Stall(Duration),
    /// Set Controller Fatal Status and stop processing commands.
    Fatal,
    /// Complete it normally, and post the same completion again before the
    /// next command of its submission queue completes (a broken controller
    /// repeating a completion after the host gave the CID to a new command).
    Duplicate,
    /// Post a completion naming this CID (out of range, or not in flight)
    /// before the command's own.
    ExtraCompletion(u16),
    /// Complete it reporting this SQ head (out of range, or behind the one
    /// reported before).
    SqHead(u16),
    /// Flip the phase tag of its completion slot over the slot's stale
    /// fields; the real entry is never seen.
    EarlyPhase,
}

/// What the emulated controller's Identify data claims that is not so (a
/// broken or hostile controller); `None` tells the truth. The controller
/// still works by the truth: its backing's size, its block size, its MDTS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdentifyLies {
    /// Namespace size (NSZE, NCAP, NUSE) in blocks.
    pub nsze: Option<u64>,
    /// LBADS of the LBA format in use.
    pub lbads: Option<u8>,
    /// FLBAS: the index of the format in use.
    pub flbas: Option<u8>,
    /// MDTS.
    pub mdts: Option<u8>,
}

impl IdentifyLies {
    /// Claims `blocks` blocks.
    pub fn nsze(blocks: u64) -> IdentifyLies {
        IdentifyLies { nsze: Some(blocks), ..IdentifyLies::default() }
    }
    /// Claims blocks of `1 << lbads` bytes.
    pub fn lbads(lbads: u8) -> IdentifyLies {
        IdentifyLies { lbads: Some(lbads), ..IdentifyLies::default() }
    }
    /// Claims format `flbas` is in use.
    pub fn flbas(flbas: u8) -> IdentifyLies {
        IdentifyLies { flbas: Some(flbas), ..IdentifyLies::default() }
    }
    /// Claims MDTS `mdts`.
    pub fn mdts(mdts: u8) -> IdentifyLies {
        IdentifyLies { mdts: Some(mdts), ..IdentifyLies::default() }
    }
}

/// A fault: skip `skip` matching commands, then apply `action` to the next
/// `count` of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Which commands.
    pub target: FaultTarget,
    /// Matching commands to let through first.
    pub skip: u32,
    /// Matching commands to hit.
    pub count: u32,
    /// What to do to them.
    pub action: FaultAction,
}

impl Fault {
    /// The next matching command gets `action`.
    pub fn next(target: FaultTarget, action: FaultAction) -> Fault {
        Fault { target, skip: 0, count: 1, action }
    }
}

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
    _owned: Option<Anonymous>,
}

/// IOVAs start here, so that a zero or small PRP is always a fault.
const IOVA_BASE: u64 = 0x1_0000_0000;

impl IovaTable {
    fn insert(&mut self, host: usize, len: usize, owned: Option<Anonymous>) -> u64 {
        self.insert_entry(IovaEntry { len, host, device: None, _owned: owned })
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
    regs: Box<[AtomicU32]>,
    sleeping: AtomicBool,
    thread: OnceLock<Thread>,
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
        self.regs.get(off / 4)
    }

    fn wake(&self) {
        // Pairs with the controller's fence before it re-checks for work and
        // parks: either it sees our register write, or we see `sleeping`.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }
}

impl DmaRelease for Shared {
    fn release(&self, region: &DmaRegion) {
        self.iova.write().unwrap_or_else(|p| p.into_inner()).remove(region.iova(0));
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
        let mut f = self.shared.faults.lock().unwrap_or_else(|p| p.into_inner());
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
        self.shared.faults.lock().unwrap_or_else(|p| p.into_inner()).clear();
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
        let regs: Box<[AtomicU32]> = (0..nregs).map(|_| AtomicU32::new(0)).collect();
        let cap = regs::Cap::new(config.mqes, true, 20, 0, 0, 4);
        regs[regs::CAP / 4].store(cap.0 as u32, Ordering::Relaxed);
        regs[regs::CAP / 4 + 1].store((cap.0 >> 32) as u32, Ordering::Relaxed);
        regs[regs::VS / 4].store(regs::Version::V1_4.0, Ordering::Relaxed);
        let vectors = (0..config.interrupt_vectors).map(|_| EventFd::new()).collect::<Result<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            regs,
            sleeping: AtomicBool::new(false),
            thread: OnceLock::new(),
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
        let _ = shared.thread.set(thread.thread().clone());
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

    fn write32(&self, off: usize, val: u32) {
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
        let iova = self.shared.iova.write().unwrap_or_else(|p| p.into_inner()).insert(host as usize, len, Some(mem));
        // SAFETY: `mem` is page-aligned, `len` bytes long, and is owned by the
        // IOVA table entry until `release` removes it, which only the drop of
        // the DmaBuffer built here does.
        let region = unsafe { DmaRegion::new(NonNull::new(host).expect("mmap is not null"), len, Iova(iova)) };
        Ok(DmaBuffer::new(region, self.shared.clone()))
    }

    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        let span = HostMapping::span(vaddr, len)?;
        let iova = self.shared.iova.write().unwrap_or_else(|p| p.into_inner()).insert(span.0, span.1, None);
        Ok(HostMapping::contiguous(vaddr, span, iova))
    }

    unsafe fn map_device(&self, mem: &DeviceMemory) -> Result<HostMapping> {
        let (start, len) = ugds_platform::device::page_span(mem.ptr, mem.len);
        let entry = IovaEntry { len, host: start as usize, device: Some(mem.runtime.clone()), _owned: None };
        let iova = self.shared.iova.write().unwrap_or_else(|p| p.into_inner()).insert_entry(entry);
        Ok(HostMapping::contiguous(mem.ptr as *const u8, (start as usize, len), iova))
    }

    fn copies_device_memory(&self) -> bool {
        true
    }

    fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        if self.shared.iova.write().unwrap_or_else(|p| p.into_inner()).remove(mapping.cookie) {
            Ok(())
        } else {
            Err(Error::Platform(format!("no mapping at IOVA {:#x}", mapping.cookie)))
        }
    }

    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>> {
        Ok(self.shared.vectors.get(vector as usize))
    }

    fn interrupt_vectors(&self) -> u16 {
        self.shared.vectors.len() as u16
    }
}
