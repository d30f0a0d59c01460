//! What an emulated controller is: namespaces, limits, queues, a latency
//! model.

use crate::IdentifyLies;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use ugds_platform::{Error, Result};

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
    /// Take SGLs for I/O commands, and say so in Identify (SGLS 01b), as
    /// QEMU's controller does.
    pub sgl: bool,
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
            sgl: true,
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
    /// Takes SGLs or not (see [`EmuConfig::sgl`]).
    pub fn sgl(mut self, on: bool) -> Self {
        self.sgl = on;
        self
    }
    /// Sets the latency model.
    pub fn latency(mut self, m: Option<LatencyModel>) -> Self {
        self.latency = m;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
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
