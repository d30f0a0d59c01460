//! A controller another process owns, reached from this one: the platform
//! of an attached process.
//!
//! The owner (`ugds serve`, or a process serving its controller) keeps the
//! admin queue and every mapping for the device. An attached process gets,
//! over a unix socket ([`wire`]): the controller's registers shared by
//! descriptor, I/O queue pairs of its own (numbered 1.. here, a block of
//! the controller's queue ids at the owner), and controller addresses for
//! memory it shares by descriptor (its queues, PRP pages and
//! [`SharedMemory`] buffers: the owner maps the same pages for the
//! device). After that it submits and reaps with no system call and no
//! message per I/O: a doorbell is a store into the shared registers.
//!
//! Safety across processes rests on the owner: it keeps its own mapping of
//! every page it mapped for the device until the queues that could reach
//! them are deleted, so memory this process frees is never given back to
//! the system under DMA. If the owner goes away the registers read all
//! ones (as a removed device's do) and every call here fails.

pub mod wire;

use crate::dma::{DmaBuffer, DmaRegion, DmaRelease};
use crate::sys::shared::{futex_wake, SharedMemory};
use crate::sys::unix::Seqpacket;
use crate::sys::{EventFd, PAGE_SIZE};
use crate::{Error, HostMapping, Platform, Recover, Result};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use ugds_nvme::{regs, Cqe, Iova, Sqe, IDENTIFY_LEN};
use wire::{op, Reader, Writer};

/// Admin work an attached process asks of the controller's owner: the
/// engine uses it in place of an admin queue of its own.
pub trait RemoteAdmin: Send + Sync {
    /// Runs `sqe` at the owner, which checks it is this process's to run
    /// (Identify; creating, deleting and aborting on its own queues);
    /// `data` receives the page the command returns.
    fn admin(&self, sqe: &Sqe, data: Option<&mut [u8; IDENTIFY_LEN]>) -> Result<Cqe>;

    /// Reserves up to `want` I/O queue pairs, numbered 1..=n here; n.
    fn reserve_queues(&self, want: u16) -> Result<u16>;

    /// Deletes every queue of this process at the owner, submission
    /// queues before completion queues: after this the controller reaches
    /// none of its rings.
    fn release_queues(&self) -> Result<()>;

    /// This process's share of each namespace: part `.0` of `.1` equal
    /// LBA ranges (0 of 1: the whole namespace, shared).
    fn share(&self) -> (u32, u32);
}

/// The controller's registers as the owner shares them: `len` bytes at
/// `offset` of `fd`, and the word a sleeping emulated controller waits on
/// (a real controller has none: a doorbell store is all it needs).
#[derive(Debug, Clone)]
pub struct SharedRegisters {
    /// The file behind the registers.
    pub fd: Arc<OwnedFd>,
    /// Where they start in it.
    pub offset: u64,
    /// How many bytes (the doorbells included).
    pub len: usize,
    /// Byte offset, in the shared range, of the word to wake after a
    /// doorbell when it is non-zero.
    pub wake: Option<usize>,
    /// A device's BAR (accessed as MMIO) rather than a sealed memfd (the
    /// emulated controller's register file, accessed by atomics).
    pub device: bool,
}

/// The owner's registers as this process maps them.
enum Registers {
    /// The emulated controller's register file.
    Memory(SharedMemory),
    /// A controller's BAR0: volatile accesses; retired when the owner goes.
    Device(crate::sys::vfio::Mmio),
}

impl Registers {
    #[inline]
    fn read32(&self, off: usize) -> u32 {
        match self {
            Registers::Memory(m) => m.word(off).map_or(u32::MAX, |w| w.load(Ordering::Acquire)),
            Registers::Device(m) => m.read32(off),
        }
    }

    /// A doorbell write at `off` (already checked to be ours).
    #[inline]
    fn ring(&self, off: usize, val: u32) {
        match self {
            // Release: the queue entries written before this doorbell are
            // visible to the controller thread that acquires it.
            Registers::Memory(m) => {
                if let Some(w) = m.word(off) {
                    w.store(val, Ordering::Release)
                }
            }
            // The engine's barrier before the doorbell orders the entries.
            Registers::Device(m) => m.write32(off, val),
        }
    }
}

/// The socket and what the owner mapped for this process.
struct Session {
    sock: Mutex<Seqpacket>,
    gone: AtomicBool,
    /// Set by this platform's drop: the hang-up that follows is ours.
    closing: AtomicBool,
    /// DMA memory this process allocated, by controller address.
    dma: Mutex<HashMap<u64, SharedMemory>>,
}

impl Session {
    /// Sends `req` and returns the reply, its status checked; a hang-up
    /// marks the owner gone.
    fn call(&self, req: &Writer, fds: &[std::os::fd::BorrowedFd<'_>]) -> Result<Vec<u8>> {
        if self.gone.load(Ordering::Acquire) {
            return Err(Error::DeviceGone);
        }
        let sock = self.sock.lock().recover();
        let mut buf = vec![0u8; wire::MAX_MESSAGE];
        let sent = sock.send(&req.0, fds);
        let got = sent.and_then(|()| sock.recv(&mut buf));
        match got {
            Ok((0, _)) | Err(Error::Os { errno: libc::EPIPE | libc::ECONNRESET, .. }) => {
                self.gone.store(true, Ordering::Release);
                Err(Error::DeviceGone)
            }
            Err(e) => Err(e),
            Ok((n, _)) => {
                buf.truncate(n);
                Reader::new(&buf).status()?;
                Ok(buf)
            }
        }
    }

    /// Maps `len` bytes at `offset` of `fd` for the controller; the
    /// controller address of the first byte.
    fn map(&self, fd: std::os::fd::BorrowedFd<'_>, offset: u64, len: usize) -> Result<u64> {
        let mut req = Writer::new(op::MAP);
        req.u64(offset).u64(len as u64);
        let reply = self.call(&req, &[fd])?;
        let mut r = Reader::new(&reply);
        r.status()?;
        r.u64()
    }

    fn unmap(&self, iova: u64) -> Result<()> {
        let mut req = Writer::new(op::UNMAP);
        req.u64(iova);
        self.call(&req, &[]).map(drop)
    }
}

impl DmaRelease for Session {
    fn release(&self, region: &DmaRegion) {
        let iova = region.iova(0);
        if let Err(e) = self.unmap(iova) {
            // The owner keeps its mapping until this session ends.
            tracing::debug!("unmap of DMA memory at {iova:#x} left to the owner: {e}");
        }
        self.dma.lock().recover().remove(&iova);
    }
}

/// Most interrupt vectors one attached process asks for.
pub const MAX_VECTORS: u16 = 64;

/// A controller owned by another process, as this process's [`Platform`].
pub struct AttachPlatform {
    path: PathBuf,
    session: Arc<Session>,
    regs: Arc<Registers>,
    wake: Option<usize>,
    dstrd: u8,
    /// Bytes of doorbells this process may ring, from local queue 1's
    /// (0 before reserving).
    doorbells: AtomicUsize,
    /// How far the owner's doorbells of our queues lie past the local ones.
    shift: AtomicUsize,
    /// Interrupt vectors granted (local 1..=n; 0 is no vector).
    vectors: AtomicU16,
    /// Their eventfds, fetched from the owner at first use (index = vector).
    events: Box<[std::sync::OnceLock<EventFd>]>,
    share: (u32, u32),
    /// How this process's GPU memory reaches the owner (`wire::gpu`).
    gpu: u32,
    watcher: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for AttachPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachPlatform").field("path", &self.path).finish_non_exhaustive()
    }
}

impl AttachPlatform {
    /// Attaches to the controller served at the socket `path`.
    pub fn connect(path: &Path) -> Result<AttachPlatform> {
        AttachPlatform::over(Seqpacket::connect(path)?, path)
    }

    /// Attaches over a connected socket (`path` names it in messages).
    pub fn over(sock: Seqpacket, path: &Path) -> Result<AttachPlatform> {
        crate::sys::shared::share_host_buffers();
        let mut req = Writer::new(op::HELLO);
        req.u32(wire::VERSION);
        sock.send(&req.0, &[])?;
        let mut buf = vec![0u8; wire::MAX_MESSAGE];
        let (n, mut fds) = sock.recv(&mut buf)?;
        if n == 0 {
            return Err(Error::Platform(format!("{}: the owner closed the connection", path.display())));
        }
        let mut r = Reader::new(&buf[..n]);
        r.status()?;
        let (len, offset, wake, dstrd, part, parts) = (r.u64()?, r.u64()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let device = r.u32()? != 0;
        let gpu = r.u32()?;
        let fd = fds.pop().ok_or_else(|| Error::InvalidArgument("the owner sent no register file".into()))?;
        let len = usize::try_from(len).map_err(|_| Error::InvalidArgument("register file too long".into()))?;
        if len < regs::DOORBELL_BASE + 8 || len % PAGE_SIZE != 0 || dstrd > 15 || parts == 0 || part >= parts {
            return Err(Error::InvalidArgument(format!(
                "the owner's welcome is malformed ({len} register bytes, dstrd {dstrd}, part {part} of {parts})"
            )));
        }
        let wake = (wake != u32::MAX).then_some(wake as usize);
        let regs = if device {
            // The device file is held by the mapping alone from here on.
            Registers::Device(crate::sys::vfio::Mmio::map(&fd, len, offset)?)
        } else {
            let m = SharedMemory::from_fd(Arc::new(fd), offset, len)?;
            if wake.is_some_and(|w| m.word(w).is_none()) {
                return Err(Error::InvalidArgument("the owner's wake word lies outside its registers".into()));
            }
            Registers::Memory(m)
        };
        let regs = Arc::new(regs);
        let session = Arc::new(Session {
            sock: Mutex::new(sock),
            gone: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            dma: Default::default(),
        });
        let (watched, held, named) = (session.clone(), regs.clone(), path.display().to_string());
        let watcher = std::thread::Builder::new()
            .name("ugds-attach".into())
            .spawn(move || {
                // Waits for the owner's hang-up (or this platform's drop).
                let fd = watched.sock.lock().recover().as_fd().try_clone_to_owned();
                if let Ok(fd) = fd {
                    let mut p = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::RDHUP)];
                    while rustix::event::poll(&mut p, None).is_err() {}
                }
                watched.gone.store(true, Ordering::Release);
                if !watched.closing.load(Ordering::Acquire) {
                    tracing::error!(
                        "{named}: the controller's owner has gone; I/O on this attachment fails from now on \
                         (commands in flight end as the device gone)"
                    );
                }
                // Let the device go: the owner's kernel side (vfio, the
                // module) stops the controller once no process holds it.
                if let Registers::Device(m) = &*held {
                    m.retire();
                }
            })
            .map_err(|e| Error::io("spawn the attach watcher", e))?;
        Ok(AttachPlatform {
            path: path.to_owned(),
            session,
            regs,
            wake,
            dstrd: dstrd as u8,
            doorbells: AtomicUsize::new(0),
            shift: AtomicUsize::new(0),
            vectors: AtomicU16::new(0),
            events: (0..=MAX_VECTORS).map(|_| std::sync::OnceLock::new()).collect(),
            share: (part, parts),
            gpu,
            watcher: Some(watcher),
        })
    }

    /// Whether the owner has gone away.
    pub fn owner_gone(&self) -> bool {
        self.session.gone.load(Ordering::Acquire)
    }

    /// The doorbell offset at the owner of local doorbell `off`, when it is
    /// one of this process's queues' (local queues 1..=n: the span from
    /// queue 1's SQ tail doorbell to queue n's CQ head doorbell, moved by
    /// `base - 1` queues).
    #[inline]
    fn doorbell(&self, off: usize) -> Option<usize> {
        let lo = regs::sq_tail_doorbell(1, self.dstrd);
        let span = self.doorbells.load(Ordering::Relaxed);
        let rel = off.wrapping_sub(lo);
        if rel >= span || rel & ((4usize << self.dstrd) - 1) != 0 {
            return None;
        }
        Some(off + self.shift.load(Ordering::Relaxed))
    }
}

impl Drop for AttachPlatform {
    fn drop(&mut self) {
        // The owner sees the hang-up and deletes what is left of ours.
        self.session.closing.store(true, Ordering::Release);
        self.session.sock.lock().recover().shutdown();
        if let Some(t) = self.watcher.take() {
            let _ = t.join();
        }
    }
}

impl Platform for AttachPlatform {
    fn describe(&self) -> String {
        format!("attached to {}", self.path.display())
    }

    fn read32(&self, off: usize) -> u32 {
        if self.owner_gone() {
            return u32::MAX;
        }
        self.regs.read32(off)
    }

    unsafe fn write32(&self, off: usize, val: u32) {
        // Only this process's doorbells: the controller's own registers
        // are the owner's.
        let Some(off) = self.doorbell(off) else {
            tracing::warn!("register write at {off:#x} refused: an attached process rings its own doorbells only");
            return;
        };
        if self.owner_gone() {
            return;
        }
        self.regs.ring(off, val);
        if let (Some(o), Registers::Memory(m)) = (self.wake, &*self.regs) {
            if let Some(word) = m.word(o) {
                // Pairs with the emulated controller's fence before it
                // re-checks for work and sleeps: it sees our store, or we
                // see it asleep. Clearing the word makes a wait not yet
                // started return at once.
                fence(Ordering::SeqCst);
                if word.load(Ordering::Relaxed) != 0 && word.swap(0, Ordering::Relaxed) != 0 {
                    futex_wake(word);
                }
            }
        }
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        let mem = SharedMemory::new(len)?;
        let iova = self.session.map(mem.as_fd(), 0, mem.len())?;
        // SAFETY: `mem` is page-aligned and `mem.len()` bytes; it lives in
        // the session's table until the DmaBuffer built here is released.
        let region =
            unsafe { DmaRegion::new(NonNull::new(mem.as_ptr()).expect("mmap is not null"), mem.len(), Iova(iova)) };
        self.session.dma.lock().recover().insert(iova, mem);
        Ok(DmaBuffer::new(region, self.session.clone()))
    }

    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        let span = HostMapping::span(vaddr, len)?;
        let Some(shared) = SharedMemory::find(span.0, span.1) else {
            return Err(Error::Unsupported(format!(
                "{}: {len} bytes at {vaddr:p} are private to this process; an attached process registers memory it \
                 shares with the owner (ugds's host buffers)",
                self.describe()
            )));
        };
        let iova = self.session.map(shared.fd.as_fd(), shared.offset, span.1)?;
        // SAFETY: the owner maps the same pages at `iova` until unmapped,
        // and keeps its own mapping of them until then.
        Ok(unsafe { HostMapping::contiguous(vaddr, span, iova) })
    }

    unsafe fn map_device(&self, mem: &crate::device::DeviceMemory) -> Result<HostMapping> {
        let (reply, len) = match self.gpu {
            // A dma-buf, which the owner's platform imports (ugds_drv);
            // the exporter keeps the memory while it is imported.
            wire::gpu::DMABUF => {
                let x = mem.runtime.export_dmabuf(mem.ptr, mem.len)?;
                let mut req = Writer::new(op::MAPDMABUF);
                req.u64(x.offset).u64(x.len as u64);
                (self.session.call(&req, &[x.fd.as_fd()])?, x.len)
            }
            // The runtime's IPC handle, which the owner opens and its
            // emulated controller copies through.
            wire::gpu::IPC => {
                let x = mem.runtime.export_ipc(mem.ptr, mem.len)?;
                let mut req = Writer::new(op::MAPIPC);
                req.bytes(&x.handle).bytes(&x.device).u64(x.offset).u64(x.len as u64).u64(x.ptr);
                (self.session.call(&req, &[])?, x.len)
            }
            _ => {
                return Err(Error::Unsupported(format!(
                    "{}: the owner's controller cannot reach GPU memory of another process (vfio-pci cannot \
                     import a GPU's dma-buf)",
                    self.describe()
                )))
            }
        };
        let mut r = Reader::new(&reply);
        r.status()?;
        let (first, first_offset) = (r.u64()?, r.u64()? as usize);
        let npages = (first_offset + len).div_ceil(PAGE_SIZE);
        let pages: Arc<[u64]> = (0..npages).map(|i| first + (i * PAGE_SIZE) as u64).collect();
        // SAFETY: the owner's platform reaches these pages until the
        // mapping named `first` is unmapped there.
        Ok(unsafe { HostMapping::from_parts(pages, first_offset, first) })
    }

    fn copies_device_memory(&self) -> bool {
        // The owner's emulated controller copies with the runtime: a
        // stream-ordered I/O stages GPU memory here as it would there.
        self.gpu == wire::gpu::IPC
    }

    unsafe fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        if self.session.dma.lock().recover().contains_key(&mapping.cookie()) {
            return Err(Error::InvalidArgument(format!(
                "IOVA {:#x} is a DMA buffer of the platform's own",
                mapping.cookie()
            )));
        }
        self.session.unmap(mapping.cookie())
    }

    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>> {
        if vector == 0 || vector > self.vectors.load(Ordering::Acquire) {
            return Ok(None);
        }
        let cell = &self.events[vector as usize];
        if let Some(e) = cell.get() {
            return Ok(Some(e));
        }
        let mut req = Writer::new(op::VECTOR);
        req.u32(vector as u32);
        let sock = self.session.sock.lock().recover();
        sock.send(&req.0, &[])?;
        let mut buf = vec![0u8; wire::MAX_MESSAGE];
        let (n, mut fds) = sock.recv(&mut buf)?;
        drop(sock);
        if n == 0 {
            self.session.gone.store(true, Ordering::Release);
            return Err(Error::DeviceGone);
        }
        Reader::new(&buf[..n]).status()?;
        let fd = fds.pop().ok_or_else(|| Error::InvalidArgument("the owner sent no eventfd".into()))?;
        let _ = cell.set(EventFd::from_fd(fd));
        Ok(cell.get())
    }

    /// Vector 0 (the admin queue's, the owner's) and this process's 1..=n.
    fn interrupt_vectors(&self) -> u16 {
        match self.vectors.load(Ordering::Acquire) {
            0 => 0,
            n => n + 1,
        }
    }

    fn remote_admin(&self) -> Option<&dyn RemoteAdmin> {
        Some(self)
    }

    fn gone(&self) -> bool {
        self.owner_gone()
    }
}

impl RemoteAdmin for AttachPlatform {
    fn admin(&self, sqe: &Sqe, data: Option<&mut [u8; IDENTIFY_LEN]>) -> Result<Cqe> {
        let mut req = Writer::new(op::ADMIN);
        req.bytes(&sqe.to_bytes());
        let reply = self.session.call(&req, &[])?;
        let mut r = Reader::new(&reply);
        r.status()?;
        let dw: [u32; 4] = [r.u32()?, r.u32()?, r.u32()?, r.u32()?];
        if r.u32()? != 0 {
            let page = r.bytes(IDENTIFY_LEN)?;
            if let Some(out) = data {
                out.copy_from_slice(page);
            }
        }
        Ok(Cqe::from_dwords(dw))
    }

    fn reserve_queues(&self, want: u16) -> Result<u16> {
        let mut req = Writer::new(op::QUEUES);
        // One vector per queue pair at most (shared beyond what is granted).
        req.u32(want as u32).u32(want.min(MAX_VECTORS) as u32);
        let reply = self.session.call(&req, &[])?;
        let mut r = Reader::new(&reply);
        r.status()?;
        let (n, base) = (r.u32()?, r.u32()?);
        if n == 0 || n > want as u32 || base == 0 || base + n > u16::MAX as u32 {
            return Err(Error::InvalidArgument(format!("the owner granted {n} queue pairs from {base}")));
        }
        let (vectors, _first) = (r.u32()?, r.u32()?);
        if vectors > MAX_VECTORS as u32 {
            return Err(Error::InvalidArgument(format!("the owner granted {vectors} interrupt vectors")));
        }
        self.vectors.store(vectors as u16, Ordering::Release);
        let pair = 2 * (4usize << self.dstrd);
        self.shift.store((base as usize - 1) * pair, Ordering::Relaxed);
        self.doorbells.store(n as usize * pair, Ordering::Release);
        Ok(n as u16)
    }

    fn release_queues(&self) -> Result<()> {
        self.session.call(&Writer::new(op::DETACH), &[]).map(drop)
    }

    fn share(&self) -> (u32, u32) {
        self.share
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbells_of_the_process_queues_move_to_the_owners_and_no_others_pass() {
        let (a, b) = Seqpacket::pair().unwrap();
        // An owner that welcomes with a page of registers, dstrd 0.
        let owner = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            b.recv(&mut buf).unwrap();
            let regs = SharedMemory::new(8192).unwrap();
            let mut w = Writer::new(0);
            w.u64(8192).u64(0).u32(u32::MAX).u32(0).u32(0).u32(1).u32(0).u32(wire::gpu::NONE);
            b.send(&w.0, &[regs.as_fd()]).unwrap();
            b.recv(&mut buf).unwrap(); // QUEUES
            let mut w = Writer::new(0);
            w.u32(2).u32(5).u32(0).u32(0);
            b.send(&w.0, &[]).unwrap();
            let _ = b.recv(&mut buf);
        });
        let p = AttachPlatform::over(a, Path::new("test")).unwrap();
        assert_eq!(p.doorbell(0x1008), None, "nothing before queues are reserved");
        assert_eq!(p.reserve_queues(4).unwrap(), 2);
        // Local queue 1 -> owner's 5, local 2 -> 6; SQ tail then CQ head.
        assert_eq!(p.doorbell(0x1008), Some(0x1000 + 5 * 8));
        assert_eq!(p.doorbell(0x100c), Some(0x1000 + 5 * 8 + 4));
        assert_eq!(p.doorbell(0x1014), Some(0x1000 + 6 * 8 + 4));
        for refused in [0x14, 0x1000, 0x1004, 0x1018, 0x1009, usize::MAX, 0] {
            assert_eq!(p.doorbell(refused), None, "{refused:#x}");
        }
        drop(p);
        owner.join().unwrap();
    }
}
