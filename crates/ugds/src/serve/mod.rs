//! One process owns a controller and serves it to others on one host:
//! `ugds serve`, or any process that starts a [`Server`].
//!
//! The owner brings the controller up, keeps its admin queue, and on a
//! unix socket hands each attached process ([`ugds_platform::attach`]) a
//! block of I/O queue ids, the registers by descriptor, and controller
//! addresses for the memory it shares. Per attached process it checks
//! every admin command against what is that process's (its queue ids, its
//! mappings), and when the process goes (closes, exits, is killed) deletes
//! its submission queues, then its completion queues, and only then
//! removes its mappings: the owner's own mapping of each page keeps it
//! alive until the controller can no longer reach it.
//!
//! Trust, stated plainly: a process of another user is refused at attach
//! (the socket's peer credentials). Processes of one user trust each other
//! as SPDK's do: an attached process writes its commands straight to its
//! submission queues, so nothing but its own library keeps its commands
//! within its share of the namespace or its PRPs within its own memory.

mod client;

use crate::engine::NvmeController;
use client::Client;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use ugds_platform::attach::{wire, SharedRegisters};
use ugds_platform::sys::unix::Seqpacket;
use ugds_platform::{Error, Platform, Recover, Result};

/// How a controller is served.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Each namespace split into this many equal LBA ranges, one per
    /// attached process (1: every process shares the whole namespace).
    pub parts: u32,
    /// Most I/O queue pairs one process gets; 0: a quarter of what the
    /// controller grants (at least 2, at most 16), so that one process
    /// asking for one per CPU leaves room for others.
    pub queues_per_process: u16,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions { parts: 1, queues_per_process: 0 }
    }
}

/// What a server has done, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServeStats {
    /// Processes attached now.
    pub attached: u64,
    /// Processes that have attached since the start.
    pub sessions: u64,
    /// Sessions refused at attach (another user, no parts or queues left).
    pub refused: u64,
    /// Requests refused (not the process's queue or memory, malformed).
    pub bad_requests: u64,
    /// Queue pairs in use by attached processes.
    pub queues_in_use: u64,
    /// Mappings made for attached processes and not yet removed.
    pub mappings: u64,
    /// Sessions whose queues could not all be deleted: their memory is
    /// kept mapped on purpose.
    pub leaked: u64,
}

#[derive(Default)]
struct Counters {
    sessions: AtomicU64,
    refused: AtomicU64,
    bad_requests: AtomicU64,
    mappings: AtomicU64,
    leaked: AtomicU64,
}

/// An attached process's session: its id, its thread, its socket.
type Session = (u64, JoinHandle<()>, Arc<Seqpacket>);

/// What the sessions share: the controller and who holds what.
struct Owner {
    ctrl: NvmeController,
    platform: Arc<dyn Platform>,
    regs: SharedRegisters,
    opts: ServeOptions,
    /// Queue ids 1..=granted: whether each is held (index = qid).
    qids: Mutex<Vec<bool>>,
    /// Interrupt vectors: whether each is held (index = vector; 0, the
    /// admin queue's, always).
    vectors: Mutex<Vec<bool>>,
    /// Which process holds each part (when split).
    parts: Mutex<Vec<bool>>,
    attached: Mutex<Vec<Session>>,
    counters: Counters,
    stop: AtomicBool,
    uid: u32,
}

impl Owner {
    /// How attached processes' GPU memory reaches the controller: by IPC
    /// handle where the controller is emulated (its copies use the owner's
    /// runtime), else as a dma-buf its platform imports (ugds_drv; vfio-pci
    /// refuses, as it does in one process).
    fn gpu_route(&self) -> u32 {
        match self.platform.copies_device_memory() {
            true if cfg!(feature = "gpu") => wire::gpu::IPC,
            true => wire::gpu::NONE,
            false => wire::gpu::DMABUF,
        }
    }

    /// Reserves up to `want` consecutive queue ids: (first, count).
    fn take_qids(&self, want: u16) -> Option<(u16, u16)> {
        take_run(&mut self.qids.lock().recover(), want)
    }

    fn give_qids(&self, first: u16, n: u16) {
        give_run(&mut self.qids.lock().recover(), first, n)
    }

    /// Reserves up to `want` consecutive interrupt vectors: (first, count).
    fn take_vectors(&self, want: u16) -> Option<(u16, u16)> {
        if want == 0 {
            return None;
        }
        take_run(&mut self.vectors.lock().recover(), want)
    }

    fn give_vectors(&self, first: u16, n: u16) {
        give_run(&mut self.vectors.lock().recover(), first, n)
    }

    fn take_part(&self) -> Option<u32> {
        let mut parts = self.parts.lock().recover();
        let i = parts.iter().position(|t| !t)?;
        parts[i] = true;
        Some(i as u32)
    }

    fn give_part(&self, part: u32) {
        if let Some(p) = self.parts.lock().recover().get_mut(part as usize) {
            *p = false;
        }
    }
}

/// The longest run of free entries from 1, up to `want` long, taken:
/// (first, count).
fn take_run(held: &mut [bool], want: u16) -> Option<(u16, u16)> {
    let mut best: Option<(u16, u16)> = None;
    let mut q = 1usize;
    while q < held.len() {
        if held[q] {
            q += 1;
            continue;
        }
        let start = q;
        while q < held.len() && !held[q] && q - start < want as usize {
            q += 1;
        }
        let run = (start as u16, (q - start) as u16);
        if best.is_none_or(|b| run.1 > b.1) {
            best = Some(run);
        }
        if run.1 == want {
            break;
        }
    }
    let (first, n) = best?;
    for h in &mut held[first as usize..(first + n) as usize] {
        *h = true;
    }
    Some((first, n))
}

fn give_run(held: &mut [bool], first: u16, n: u16) {
    for h in &mut held[first as usize..(first + n) as usize] {
        *h = false;
    }
}

/// A controller served to other processes at a unix socket.
pub struct Server {
    owner: Arc<Owner>,
    path: PathBuf,
    listener: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Server {
    /// Brings up the controller behind `platform` and serves it at `path`
    /// (a socket file this creates; it must not exist).
    pub fn start(platform: Arc<dyn Platform>, path: &Path, opts: ServeOptions) -> Result<Server> {
        if opts.parts == 0 {
            return Err(Error::InvalidArgument("a namespace is split into at least 1 part".into()));
        }
        let regs = platform.share_registers()?;
        let ctrl = NvmeController::bring_up_with(platform.clone(), u16::MAX - 1, false)?;
        let granted = ctrl.info().io_queues;
        let mut opts = opts;
        if opts.queues_per_process == 0 {
            opts.queues_per_process = (granted / 4).clamp(2, 16).min(granted);
        }
        let vectors = (0..platform.interrupt_vectors().max(1)).map(|v| v == 0).collect();
        let listener = Seqpacket::listen(path)?;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let owner = Arc::new(Owner {
            ctrl,
            platform,
            regs,
            opts: opts.clone(),
            qids: Mutex::new(vec![false; granted as usize + 1]),
            vectors: Mutex::new(vectors),
            parts: Mutex::new(vec![false; if opts.parts > 1 { opts.parts as usize } else { 0 }]),
            attached: Mutex::new(Vec::new()),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            uid,
        });
        let o = owner.clone();
        let thread = std::thread::Builder::new()
            .name("ugds-serve".into())
            .spawn(move || listen(o, listener))
            .map_err(|e| Error::io("spawn the serving thread", e))?;
        tracing::info!(path = %path.display(), queues = granted, "serving");
        Ok(Server { owner, path: path.to_owned(), listener: Some(thread) })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The I/O queue pairs the controller granted, all for attached processes.
    pub fn queues(&self) -> u16 {
        self.owner.ctrl.info().io_queues
    }

    /// Most queue pairs one process gets (the option, resolved).
    pub fn queues_per_process(&self) -> u16 {
        self.owner.opts.queues_per_process
    }

    /// What the server has done so far.
    pub fn stats(&self) -> ServeStats {
        let c = &self.owner.counters;
        let attached = self.owner.attached.lock().recover().iter().filter(|(_, t, _)| !t.is_finished()).count();
        let queues = self.owner.qids.lock().recover().iter().filter(|h| **h).count();
        ServeStats {
            attached: attached as u64,
            sessions: c.sessions.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            bad_requests: c.bad_requests.load(Ordering::Relaxed),
            queues_in_use: queues as u64,
            mappings: c.mappings.load(Ordering::Relaxed),
            leaked: c.leaked.load(Ordering::Relaxed),
        }
    }

    /// Stops serving: every attached process is cut off (its queues
    /// deleted, then its mappings removed), then the controller is shut
    /// down. Dropping the server does the same.
    pub fn stop(mut self) -> Result<()> {
        self.stop_now()
    }

    fn stop_now(&mut self) -> Result<()> {
        let Some(t) = self.listener.take() else { return Ok(()) };
        self.owner.stop.store(true, Ordering::Release);
        let _ = t.join();
        let sessions: Vec<_> = std::mem::take(&mut *self.owner.attached.lock().recover());
        for (_, _, sock) in &sessions {
            sock.shutdown();
        }
        for (_, t, _) in sessions {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
        self.owner.ctrl.shutdown()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(e) = self.stop_now() {
            tracing::error!("stopping the server: {e}");
        }
    }
}

/// Accepts attaching processes until stopped.
fn listen(owner: Arc<Owner>, listener: Seqpacket) {
    let mut next_id = 1u64;
    while !owner.stop.load(Ordering::Acquire) {
        let sock = match listener.accept(Duration::from_millis(100)) {
            Ok(Some(s)) => Arc::new(s),
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let id = next_id;
        next_id += 1;
        let (o, s) = (owner.clone(), sock.clone());
        let spawned = std::thread::Builder::new().name(format!("ugds-serve-{id}")).spawn(move || Client::serve(o, s));
        match spawned {
            Ok(t) => {
                let mut attached = owner.attached.lock().recover();
                attached.retain(|(_, t, _)| !t.is_finished());
                attached.push((id, t, sock));
            }
            Err(e) => tracing::error!("no thread for an attaching process: {e}"),
        }
    }
}
