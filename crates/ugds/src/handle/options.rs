//! How a handle is set up, and what it reports about itself: its options,
//! close modes, states and queues.

use super::scheduler::Placement;
use crate::engine::{CachePolicy, Completion, KernelRing};
use crate::mode::{mode_by_name, Mode};
use std::sync::Arc;
use std::time::Duration;

/// How a handle is set up.
///
/// Built from [`HandleOptions::default`] with the setters below (the
/// struct is `#[non_exhaustive]`: new options can come without breaking
/// callers).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HandleOptions {
    /// Namespace to use; the first active one when `None`.
    pub nsid: Option<u32>,
    /// Polling (default) or interrupt completion.
    pub completion: Completion,
    /// Queue pairs shared by synchronous callers: by default one per CPU
    /// the process may run on, at least 4 and at most 32. The controller
    /// may grant fewer: those beyond 4 then make room for the lendable
    /// queues asked for. Threads beyond them share queues, and threads on
    /// one queue wait for each other.
    pub sync_queues: u16,
    /// Queue pairs lent whole to [`IoQueue`](crate::IoQueue)s.
    pub async_queues: u16,
    /// Entries per I/O queue (capped by the controller's MQES).
    pub queue_depth: u16,
    /// How long a command may take before the handle is wedged.
    pub timeout: Duration,
    /// Set up batch contexts (and stream-ordered I/O): on a deep queue pair
    /// of their own when the controller grants at least two I/O queues, on
    /// the one synchronous queue pair when it grants one.
    pub batch_queue: bool,
    /// Deep queue pairs for batch contexts, when `batch_queue` is on and
    /// the controller grants enough (one is always left for synchronous
    /// I/O): each new context goes on the one with the fewest contexts, so
    /// that threads with a context each do not share one queue's lock (as
    /// SPDK gives each thread its own queue pair). The first also carries
    /// stream-ordered I/O. Default 1.
    pub batch_queues: u16,
    /// Entries of each batch queue (capped by MQES).
    pub batch_depth: u16,
    /// PRP-list pages of each batch queue: how many multi-page commands may
    /// be in flight on it at once.
    pub batch_prp_pages: u16,
    /// Use shadow doorbells (Doorbell Buffer Config) when the controller
    /// offers them, as virtual controllers in VMs do: most doorbell MMIO
    /// writes, each a VM exit there, are replaced by memory writes. On by
    /// default only where a doorbell write traps to a hypervisor (see
    /// [`trapping_hypervisor`]): under software emulation (QEMU's TCG) they
    /// cost more than the writes they save (measured in
    /// `docs/benchmarks.md`), and physical controllers do not offer them.
    pub shadow_doorbells: bool,
    /// The kernel path only: how its rings hand work to the kernel and take
    /// completions (see [`KernelRing`]).
    pub kernel_ring: KernelRing,
    /// The kernel path only: whether reads and writes go through the page
    /// cache (see [`CachePolicy`]; `Auto` by default).
    pub cache: CachePolicy,
    /// Publish the queue statistics to `DIR/ugds-PID-HANDLE.stats` for other
    /// processes (`ugds stats`, `ugds top`) while the handle is open; see
    /// [`publish`](crate::publish). `None` (the default): not published.
    pub stats_dir: Option<std::path::PathBuf>,
    /// Trace each queue pair's last `trace` commands (opcode, CID, LBA,
    /// blocks, submission and completion times, status) and count their
    /// latencies: [`Handle::trace`](crate::Handle::trace),
    /// [`Handle::queue_latency`](crate::Handle::queue_latency), and a dump
    /// to the log when the handle wedges. Two clock reads per command; 0
    /// (the default): not traced, at the cost of a branch per command. At
    /// most [`MAX_TRACE`].
    pub trace: usize,
    /// How synchronous requests are placed on the queue pairs (see
    /// [`Placement`]): on the least loaded by default.
    pub placement: Placement,
    /// Synchronous requests larger than this keep at most this many bytes
    /// (whole commands, at least one) on the device while other work waits,
    /// as their [`Priority`](crate::Priority) says; 0: never held back. [256 KiB]
    pub chunk_bytes: usize,
    /// How each synchronous request is served (see [`Mode`]): `None` (the
    /// default), as `completion` says with the scheduler's interleaving.
    pub mode: Option<Arc<dyn Mode>>,
    /// Send a vectored request as one command whose data is a Scatter
    /// Gather List when the controller takes SGLs (Identify's SGLS) and the
    /// request fits one command (MDTS, one page of descriptors); else, and
    /// when false, as PRP windows (a command or more per segment).
    pub sgl: bool,
    /// What `from_env` could not read, refused at open.
    pub(crate) env_error: Option<String>,
}

/// The most commands a queue pair's trace keeps.
pub const MAX_TRACE: usize = 1 << 20;

/// One synchronous queue pair per CPU the process may run on, within 4..=32
/// (measured on the H200 VM's 16 cores through the kernel path:
/// docs/benchmarks.md, "several threads on one handle").
fn default_sync_queues() -> u16 {
    std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(4, 32) as u16
}

impl Default for HandleOptions {
    fn default() -> Self {
        HandleOptions {
            nsid: None,
            completion: Completion::Poll,
            sync_queues: default_sync_queues(),
            async_queues: 4,
            queue_depth: 256,
            timeout: Duration::from_secs(30),
            batch_queue: true,
            batch_queues: 1,
            batch_depth: 1024,
            batch_prp_pages: 128,
            shadow_doorbells: trapping_hypervisor().is_some(),
            kernel_ring: KernelRing::Plain,
            cache: CachePolicy::Auto,
            stats_dir: None,
            trace: 0,
            placement: Placement::LeastLoaded,
            chunk_bytes: 256 << 10,
            mode: None,
            sgl: true,
            env_error: None,
        }
    }
}

impl HandleOptions {
    /// About how many bytes of DMA memory a handle with these options
    /// allocates on a controller for its queues (submission and completion
    /// rings, PRP-list pages, the admin queue, Identify buffers), registered
    /// buffers not counted: what vfio-pci and ugds_drv pin besides them
    /// (the engine's own figures; a controller with a smaller MQES gives
    /// smaller queues).
    pub fn queue_memory(&self) -> usize {
        const PAGE: usize = 4096;
        let queue = |entries: u16, prp_pages: u16| {
            let e = entries.max(2) as usize;
            (e * 64).next_multiple_of(PAGE)
                + (e * 16).next_multiple_of(PAGE)
                + (prp_pages as usize).clamp(1, e - 1) * PAGE
        };
        let admin = crate::engine::pcie::ADMIN_ENTRIES;
        let io = (self.sync_queues_wanted() + self.async_queues) as usize
            * queue(self.queue_depth, self.queue_depth.saturating_sub(1));
        let batch = self.batch_queues_wanted() as usize * queue(self.batch_depth, self.batch_prp_pages);
        io + batch + queue(admin, admin - 1) + 3 * ugds_nvme::IDENTIFY_LEN
    }

    /// Whether the handle gets synchronous queues without a vector beside
    /// those with one: its mode both polls and sleeps (see [`Mode::polls`]).
    pub(crate) fn split_sync(&self) -> bool {
        self.completion == Completion::Poll && self.mode.as_ref().is_some_and(|m| m.interrupts() && m.polls())
    }

    /// Synchronous queue pairs to ask the controller for: twice
    /// `sync_queues` when [`split_sync`](Self::split_sync).
    pub(crate) fn sync_queues_wanted(&self) -> u16 {
        let n = self.sync_queues.max(1);
        if self.split_sync() {
            n.saturating_mul(2)
        } else {
            n
        }
    }

    /// Batch queue pairs to ask the controller for.
    pub(crate) fn batch_queues_wanted(&self) -> u16 {
        if self.batch_queue {
            self.batch_queues.max(1)
        } else {
            0
        }
    }

    /// Sets the namespace to use (`None`: the first active one).
    pub fn nsid(mut self, nsid: Option<u32>) -> Self {
        self.nsid = nsid;
        self
    }

    /// Sets polling or interrupt completion.
    pub fn completion(mut self, completion: Completion) -> Self {
        self.completion = completion;
        self
    }

    /// Sets queue pairs shared by synchronous callers.
    pub fn sync_queues(mut self, sync_queues: u16) -> Self {
        self.sync_queues = sync_queues;
        self
    }

    /// Sets queue pairs lent whole to `IoQueue`s.
    pub fn async_queues(mut self, async_queues: u16) -> Self {
        self.async_queues = async_queues;
        self
    }

    /// Sets entries per I/O queue.
    pub fn queue_depth(mut self, queue_depth: u16) -> Self {
        self.queue_depth = queue_depth;
        self
    }

    /// Sets how long a command may take.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets whether to set up batch contexts.
    pub fn batch_queue(mut self, batch_queue: bool) -> Self {
        self.batch_queue = batch_queue;
        self
    }

    /// Sets how many queue pairs batch contexts are spread over (see
    /// [`batch_queues`](Self::batch_queues); 0 counts as 1).
    pub fn batch_queues(mut self, n: u16) -> Self {
        self.batch_queues = n;
        self
    }

    /// Sets entries of each batch queue.
    pub fn batch_depth(mut self, batch_depth: u16) -> Self {
        self.batch_depth = batch_depth;
        self
    }

    /// Sets PRP-list pages of each batch queue.
    pub fn batch_prp_pages(mut self, batch_prp_pages: u16) -> Self {
        self.batch_prp_pages = batch_prp_pages;
        self
    }

    /// Sets whether to use shadow doorbells.
    pub fn shadow_doorbells(mut self, shadow_doorbells: bool) -> Self {
        self.shadow_doorbells = shadow_doorbells;
        self
    }

    /// Sets whether the kernel path reads through the page cache (see
    /// [`CachePolicy`]; ignored elsewhere).
    pub fn cache(mut self, cache: CachePolicy) -> Self {
        self.cache = cache;
        self
    }

    /// Sets how the kernel path's rings run (ignored elsewhere).
    pub fn kernel_ring(mut self, kernel_ring: KernelRing) -> Self {
        self.kernel_ring = kernel_ring;
        self
    }

    /// Sets where the queue statistics are published (see
    /// [`stats_dir`](Self::stats_dir)); the directory must exist.
    pub fn stats_dir(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.stats_dir = dir;
        self
    }

    /// Sets how many commands each queue pair's trace keeps (see
    /// [`trace`](Self::trace); 0: none).
    pub fn trace(mut self, depth: usize) -> Self {
        self.trace = depth;
        self
    }

    /// Sets how synchronous requests are placed (see [`Placement`]).
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Sets the size above which synchronous requests are interleaved
    /// (see [`chunk_bytes`](Self::chunk_bytes); 0: never).
    pub fn chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self
    }

    /// Sets whether vectored requests may go as SGLs (see [`sgl`](Self::sgl)).
    pub fn sgl(mut self, sgl: bool) -> Self {
        self.sgl = sgl;
        self
    }

    /// Sets how synchronous requests are served (see [`Mode`]; `None`: as
    /// [`completion`](Self::completion) says).
    pub fn mode(mut self, mode: Option<Arc<dyn Mode>>) -> Self {
        self.mode = mode;
        self
    }
}

impl HandleOptions {
    /// Interrupt completion when `UGDS_INTERRUPT_MODE=1`, as in the paper
    /// (`0` or unset: polling); the kernel path's ring mode from
    /// `UGDS_KERNEL_RING` (`plain`, `sqpoll`, `iopoll`) and its
    /// [`CachePolicy`] from `UGDS_CACHE_POLICY` (`auto`, `direct`,
    /// `buffered`); another value of any of the three makes the open fail;
    /// statistics published to `UGDS_STATS_DIR` when it is set;
    /// `UGDS_TRACE=N` traces each queue's last N commands;
    /// `UGDS_SYNC_QUEUES=N` sets [`sync_queues`](Self::sync_queues) and
    /// `UGDS_BATCH_QUEUES=N` [`batch_queues`](Self::batch_queues);
    /// `UGDS_SHADOW_DOORBELLS=1|0` sets
    /// [`shadow_doorbells`](Self::shadow_doorbells); `UGDS_MODE` names a
    /// built-in [`Mode`] (an unknown name, a `UGDS_SHADOW_DOORBELLS` other
    /// than 0 or 1, or a `UGDS_SYNC_QUEUES`, `UGDS_BATCH_QUEUES` or
    /// `UGDS_TRACE` that is not a number, makes the open fail).
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), with the variables `var` gives.
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let mut o = HandleOptions::default();
        match var("UGDS_INTERRUPT_MODE").as_deref() {
            None | Some("" | "0") => {}
            Some("1") => o.completion = Completion::Interrupt,
            Some(v) => o.env_error = Some(format!("UGDS_INTERRUPT_MODE={v:?} is neither 0 nor 1")),
        }
        match var("UGDS_KERNEL_RING").as_deref() {
            None | Some("" | "plain") => {}
            Some("sqpoll") => o.kernel_ring = KernelRing::SqPoll,
            Some("iopoll") => o.kernel_ring = KernelRing::IoPoll,
            Some(v) => o.env_error = Some(format!("UGDS_KERNEL_RING={v:?} is not plain, sqpoll or iopoll")),
        }
        match CachePolicy::from_var(var("UGDS_CACHE_POLICY").as_deref()) {
            Ok(p) => o.cache = p.unwrap_or(o.cache),
            Err(e) => o.env_error = Some(e),
        }
        o.stats_dir = var("UGDS_STATS_DIR").filter(|d| !d.is_empty()).map(Into::into);
        if let Some(v) = var("UGDS_TRACE").filter(|v| !v.is_empty()) {
            match v.parse() {
                Ok(n) => o.trace = n,
                Err(_) => o.env_error = Some(format!("UGDS_TRACE={v:?} is not a number of commands")),
            }
        }
        if let Some(v) = var("UGDS_SYNC_QUEUES") {
            match v.parse() {
                Ok(n) if n > 0 => o.sync_queues = n,
                _ => o.env_error = Some(format!("UGDS_SYNC_QUEUES={v:?} is not a number of queue pairs (1 or more)")),
            }
        }
        if let Some(v) = var("UGDS_BATCH_QUEUES") {
            match v.parse() {
                Ok(n) => o.batch_queues = n,
                Err(_) => o.env_error = Some(format!("UGDS_BATCH_QUEUES={v:?} is not a number of queue pairs")),
            }
        }
        match var("UGDS_SHADOW_DOORBELLS").as_deref() {
            None | Some("") => {}
            Some("1") => o.shadow_doorbells = true,
            Some("0") => o.shadow_doorbells = false,
            Some(v) => o.env_error = Some(format!("UGDS_SHADOW_DOORBELLS={v:?} is neither 0 nor 1")),
        }
        match var("UGDS_MODE").as_deref() {
            None | Some("") => {}
            Some(name) => match mode_by_name(name) {
                Ok(m) => o.mode = Some(m),
                Err(e) => o.env_error = Some(format!("UGDS_MODE: {e}")),
            },
        }
        o
    }
}

/// The hardware-assisted hypervisor this process runs under, by its CPUID
/// signature (leaf 0x4000_0000, present when CPUID.1:ECX bit 31 says a
/// hypervisor is): there an MMIO doorbell write to a virtual controller is a
/// VM exit, which shadow doorbells exist to avoid. `None` on bare metal, on
/// other architectures, and under QEMU's TCG (it names no such hypervisor),
/// where every instruction is emulated and the shadow page costs the
/// device model more than the doorbell write it saves. Asked once per
/// process: under a hypervisor CPUID itself is a VM exit.
pub fn trapping_hypervisor() -> Option<&'static str> {
    static ONCE: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *ONCE.get_or_init(cpuid_hypervisor)
}

fn cpuid_hypervisor() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        if __cpuid(1).ecx & (1 << 31) == 0 {
            return None;
        }
        let r = __cpuid(0x4000_0000);
        let mut sig = [0u8; 12];
        for (i, w) in [r.ebx, r.ecx, r.edx].into_iter().enumerate() {
            sig[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        return match &sig {
            b"KVMKVMKVM\0\0\0" => Some("KVM"),
            b"Microsoft Hv" => Some("Hyper-V"),
            b"VMwareVMware" => Some("VMware"),
            b"XenVMMXenVMM" => Some("Xen"),
            b"ACRNACRNACRN" => Some("ACRN"),
            b"bhyve bhyve " => Some("bhyve"),
            _ => None,
        };
    }
    #[allow(unreachable_code)]
    None
}

/// How [`Handle::close`](crate::Handle::close) treats I/O still in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Drain {
    /// Refuse with [`Error::Busy`](crate::Error::Busy) if anything is in flight.
    NoWait,
    /// Wait up to this long, then refuse with [`Error::Busy`](crate::Error::Busy).
    Timeout(Duration),
    /// Wait as long as it takes. A [`Batch`](crate::Batch) or an
    /// [`IoQueue`](crate::IoQueue) holds its handle open while it exists,
    /// so the thread that closes drops its own first (the C and Python
    /// bindings end a handle's batch contexts at its close).
    Forever,
    /// For a wedged handle: reset the controller, which stops its DMA, then
    /// release everything the stuck commands held.
    ForceAfterReset,
}

/// Where a handle stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandleState {
    /// Serving I/O.
    Open,
    /// A command timed out; only a forced teardown releases it.
    Wedged,
    /// Closed.
    Closed,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> HandleOptions {
        HandleOptions::from_vars(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn the_environment_sets_the_queue_counts_and_refuses_what_is_not_one() {
        let o = with(&[("UGDS_SYNC_QUEUES", "16"), ("UGDS_BATCH_QUEUES", "3")]);
        assert_eq!((o.sync_queues, o.batch_queues, o.env_error.is_none()), (16, 3, true));
        let d = with(&[]);
        assert_eq!((d.sync_queues, d.env_error.is_none()), (HandleOptions::default().sync_queues, true));
        for bad in ["0", "many", "-1", "70000"] {
            let o = with(&[("UGDS_SYNC_QUEUES", bad)]);
            assert!(o.env_error.as_deref().is_some_and(|e| e.contains("UGDS_SYNC_QUEUES")), "{bad}: {:?}", o.env_error);
        }
        assert!(with(&[("UGDS_BATCH_QUEUES", "x")]).env_error.is_some());
        assert!(with(&[("UGDS_CACHE_POLICY", "sometimes")]).env_error.is_some());
        assert_eq!(with(&[("UGDS_INTERRUPT_MODE", "1")]).completion, Completion::Interrupt);
    }

    #[test]
    fn the_environment_sets_the_completion_and_ring_modes_and_refuses_other_values() {
        assert_eq!(with(&[("UGDS_INTERRUPT_MODE", "0")]).completion, Completion::Poll);
        assert_eq!(with(&[("UGDS_KERNEL_RING", "sqpoll")]).kernel_ring, KernelRing::SqPoll);
        assert_eq!(with(&[("UGDS_KERNEL_RING", "iopoll")]).kernel_ring, KernelRing::IoPoll);
        let plain = with(&[("UGDS_KERNEL_RING", "plain"), ("UGDS_INTERRUPT_MODE", "")]);
        assert_eq!((plain.kernel_ring, plain.completion, plain.env_error), (KernelRing::Plain, Completion::Poll, None));
        assert!(with(&[("UGDS_SHADOW_DOORBELLS", "1")]).shadow_doorbells);
        assert!(!with(&[("UGDS_SHADOW_DOORBELLS", "0")]).shadow_doorbells);
        assert_eq!(with(&[("UGDS_TRACE", "8")]).trace, 8);
        assert_eq!(with(&[("UGDS_TRACE", ""), ("UGDS_SHADOW_DOORBELLS", "")]).env_error, None);
        for (name, bad) in [
            ("UGDS_INTERRUPT_MODE", "yes"),
            ("UGDS_KERNEL_RING", "sqpol"),
            ("UGDS_SHADOW_DOORBELLS", "on"),
            ("UGDS_TRACE", "all"),
        ] {
            let o = with(&[(name, bad)]);
            assert!(o.env_error.as_deref().is_some_and(|e| e.contains(name) && e.contains(bad)), "{:?}", o.env_error);
        }
    }
}
