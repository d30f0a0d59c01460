//! One attached process, as its owner sees it: its queue ids, its
//! mappings, the checks on each of its requests, and the teardown when it
//! goes.

use super::Owner;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use ugds_nvme::{AdminOpcode, Cid, Cqe, Qid, Sqe, IDENTIFY_LEN};
use ugds_platform::attach::wire::{self, op, Reader, Writer};
use ugds_platform::sys::shared::SharedMemory;
use ugds_platform::sys::unix::Seqpacket;
use ugds_platform::{Error, HostMapping, Result};

/// A range of the process's memory mapped for the controller.
struct Mapped {
    /// What keeps the pages: kept until the controller can no longer
    /// reach them.
    keep: Keep,
    /// Bytes from the first page's start (for the ring checks).
    len: usize,
    mapping: HostMapping,
}

enum Keep {
    /// The owner's own mapping of a shared memfd's pages.
    Memory(#[allow(dead_code)] SharedMemory),
    /// A dma-buf the platform imported (it holds its own reference too).
    Dmabuf(#[allow(dead_code)] OwnedFd),
    /// GPU memory of another process, opened by its runtime's IPC handle:
    /// closed only after the mapping is removed.
    #[cfg(feature = "gpu")]
    Ipc(#[allow(dead_code)] crate::gpu::cuda::IpcMemory),
    /// GPU memory of the owner's own process (an owner that also attaches
    /// to itself): the process's registration keeps it.
    #[cfg(feature = "gpu")]
    OwnGpu,
}

/// The owner's side of one attached process.
pub(super) struct Client {
    owner: Arc<Owner>,
    pid: i32,
    /// Its queue ids at the controller: first, count (local 1..=count).
    qids: Option<(u16, u16)>,
    /// Its interrupt vectors: first, count (local 1..=count).
    vectors: Option<(u16, u16)>,
    part: Option<u32>,
    /// Created completion queues: local qid -> ring address.
    cqs: BTreeMap<u16, u64>,
    /// Created submission queues: local qid -> (ring address, its CQ).
    sqs: BTreeMap<u16, (u64, u16)>,
    maps: BTreeMap<u64, Mapped>,
}

impl Client {
    /// Serves one process until it hangs up or the server stops, then
    /// tears down what it held.
    pub(super) fn serve(owner: Arc<Owner>, sock: Arc<Seqpacket>) {
        let pid = match sock.peer() {
            Ok(p) if p.uid == owner.uid => p.pid,
            Ok(p) => {
                owner.counters.refused.fetch_add(1, Ordering::Relaxed);
                let e = Error::Os {
                    op: format!(
                        "attach refused: process {} runs as uid {}, the owner as uid {}",
                        p.pid, p.uid, owner.uid
                    )
                    .into(),
                    errno: libc::EACCES,
                };
                let _ = sock.send(&Writer::error(&e).0, &[]);
                return;
            }
            Err(e) => {
                tracing::warn!("attach refused: no peer credentials: {e}");
                return;
            }
        };
        let mut c = Client {
            owner,
            pid,
            qids: None,
            vectors: None,
            part: None,
            cqs: BTreeMap::new(),
            sqs: BTreeMap::new(),
            maps: BTreeMap::new(),
        };
        let mut buf = vec![0u8; wire::MAX_MESSAGE];
        let mut hello = false;
        loop {
            let (n, fds) = match sock.recv(&mut buf) {
                Ok((0, _)) => break,
                Ok(got) => got,
                Err(e) => {
                    tracing::debug!(pid, "session ends: {e}");
                    break;
                }
            };
            let reply = c.handle(&buf[..n], fds, &mut hello);
            let sent = match reply {
                Ok((w, fd)) => match &fd {
                    Some(fd) => sock.send(&w.0, &[fd.as_fd()]),
                    None => sock.send(&w.0, &[]),
                },
                Err(e) => {
                    c.owner.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(pid, "request refused: {e}");
                    sock.send(&Writer::error(&e).0, &[])
                }
            };
            if sent.is_err() {
                break;
            }
        }
        c.teardown();
    }

    /// One request: the reply, and a descriptor to send with it.
    fn handle(&mut self, msg: &[u8], fds: Vec<OwnedFd>, hello: &mut bool) -> Result<(Writer, Option<Arc<OwnedFd>>)> {
        let mut r = Reader::new(msg);
        let code = r.u32()?;
        if code != op::MAP && code != op::MAPDMABUF && !fds.is_empty() {
            return Err(Error::InvalidArgument(format!("request {code} carries descriptors it has no use for")));
        }
        if !*hello && code != op::HELLO {
            return Err(Error::InvalidArgument("the first request must be HELLO".into()));
        }
        let mut w = Writer::new(0);
        match code {
            op::HELLO => {
                let version = r.u32()?;
                if *hello || version != wire::VERSION {
                    return Err(Error::InvalidArgument(format!(
                        "HELLO: version {version} (the owner speaks {}), or a second HELLO",
                        wire::VERSION
                    )));
                }
                let parts = self.owner.opts.parts;
                let part = if parts > 1 {
                    let p = self.owner.take_part().ok_or_else(|| {
                        self.owner.counters.refused.fetch_add(1, Ordering::Relaxed);
                        Error::InvalidArgument(format!("all {parts} parts of the namespace are held"))
                    })?;
                    self.part = Some(p);
                    p
                } else {
                    0
                };
                *hello = true;
                self.owner.counters.sessions.fetch_add(1, Ordering::Relaxed);
                let regs = &self.owner.regs;
                w.u64(regs.len as u64).u64(regs.offset).u32(regs.wake.map_or(u32::MAX, |o| o as u32));
                w.u32(self.owner.ctrl.info().cap.dstrd() as u32).u32(part).u32(parts.max(1)).u32(regs.device as u32);
                w.u32(self.owner.gpu_route());
                Ok((w, Some(regs.fd.clone())))
            }
            op::QUEUES => {
                let want = r.u32()?.clamp(1, self.owner.opts.queues_per_process as u32) as u16;
                if !self.sqs.is_empty() || !self.cqs.is_empty() {
                    return Err(Error::InvalidArgument(
                        "this session's queue pairs are in use by another handle: attach again for a second handle"
                            .into(),
                    ));
                }
                let want_vectors = r.u32()?.min(want as u32) as u16;
                // A new handle on the same attachment: the blocks go back first.
                if let Some((first, n)) = self.qids.take() {
                    self.owner.give_qids(first, n);
                }
                if let Some((first, n)) = self.vectors.take() {
                    self.owner.give_vectors(first, n);
                }
                let (first, n) = self.owner.take_qids(want).ok_or_else(|| {
                    Error::Unsupported(format!(
                        "no I/O queue pair left of the controller's {}",
                        self.owner.ctrl.info().io_queues
                    ))
                })?;
                self.qids = Some((first, n));
                // Vectors where the owner has some to spare; without, the
                // process's queues poll.
                self.vectors = self.owner.take_vectors(want_vectors);
                let (vfirst, vn) = self.vectors.unwrap_or((0, 0));
                tracing::info!(pid = self.pid, first, n, vfirst, vn, "queue pairs and vectors reserved");
                w.u32(n as u32).u32(first as u32).u32(vn as u32).u32(vfirst as u32);
                Ok((w, None))
            }
            op::VECTOR => {
                let v = self.device_vector(r.u32()?)?;
                match self.owner.platform.interrupt(v)? {
                    Some(efd) => Ok((
                        w,
                        Some(Arc::new(efd.as_fd().try_clone_to_owned().map_err(|e| Error::io("dup an eventfd", e))?)),
                    )),
                    None => Err(Error::Unsupported(format!("vector {v} has no eventfd at the owner"))),
                }
            }
            op::MAP => {
                let (offset, len) = (r.u64()?, r.u64()?);
                let [fd]: [OwnedFd; 1] = fds.try_into().map_err(|f: Vec<OwnedFd>| {
                    Error::InvalidArgument(format!("MAP carries {} descriptors, not 1", f.len()))
                })?;
                let len = usize::try_from(len).map_err(|_| Error::InvalidArgument("MAP: length too large".into()))?;
                let iova = self.map(Arc::new(fd), offset, len)?;
                w.u64(iova);
                Ok((w, None))
            }
            op::MAPDMABUF => {
                let (offset, len) = (r.u64()?, r.u64()?);
                let [fd]: [OwnedFd; 1] = fds.try_into().map_err(|f: Vec<OwnedFd>| {
                    Error::InvalidArgument(format!("MAPDMABUF carries {} descriptors, not 1", f.len()))
                })?;
                let len =
                    usize::try_from(len).map_err(|_| Error::InvalidArgument("MAPDMABUF: length too large".into()))?;
                let (first, first_offset) = self.map_dmabuf(fd, offset, len)?;
                w.u64(first).u64(first_offset as u64);
                Ok((w, None))
            }
            op::MAPIPC => {
                let x = ugds_platform::device::IpcExport {
                    handle: r.bytes(64)?.try_into().expect("64 bytes"),
                    device: r.bytes(16)?.try_into().expect("16 bytes"),
                    offset: r.u64()?,
                    len: usize::try_from(r.u64()?)
                        .map_err(|_| Error::InvalidArgument("MAPIPC: length too large".into()))?,
                    ptr: r.u64()?,
                };
                let (first, first_offset) = self.map_ipc(&x)?;
                w.u64(first).u64(first_offset as u64);
                Ok((w, None))
            }
            op::UNMAP => {
                self.unmap(r.u64()?)?;
                Ok((w, None))
            }
            op::ADMIN => {
                let b = r.bytes(Sqe::SIZE)?;
                let dw: [u32; 16] =
                    std::array::from_fn(|i| u32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()));
                let (cqe, data) = self.admin(Sqe::from_dwords(dw))?;
                w.u32(cqe.dw0).u32(cqe.dw1).u32(cqe.dw2()).u32(cqe.dw3());
                match data {
                    Some(page) => w.u32(1).bytes(&page),
                    None => w.u32(0),
                };
                Ok((w, None))
            }
            op::DETACH => {
                self.delete_queues()?;
                Ok((w, None))
            }
            other => Err(Error::InvalidArgument(format!("unknown request {other}"))),
        }
    }

    fn map(&mut self, fd: Arc<OwnedFd>, offset: u64, len: usize) -> Result<u64> {
        let mem = SharedMemory::from_fd(fd, offset, len)?;
        // SAFETY: `mem` is the owner's own mapping of the pages; it is kept
        // in `maps` until the mapping is removed, and removed only once no
        // queue of this process can reach it.
        let mapping = unsafe { self.owner.platform.map_host(mem.as_ptr(), len)? };
        let pages = mapping.pages();
        let contiguous = pages.windows(2).all(|p| p[1] == p[0] + 4096);
        if !contiguous || mapping.first_offset() != 0 {
            // SAFETY: just made, not used by any command.
            let _ = unsafe { self.owner.platform.unmap_host(&mapping) };
            return Err(Error::Unsupported(format!(
                "{} maps this memory in pieces; attached processes need contiguous controller addresses",
                self.owner.platform.describe()
            )));
        }
        let iova = pages[0];
        self.maps.insert(iova, Mapped { keep: Keep::Memory(mem), len, mapping });
        self.owner.counters.mappings.fetch_add(1, Ordering::Relaxed);
        Ok(iova)
    }

    /// Imports `len` bytes at `offset` of a dma-buf (GPU memory) for the
    /// controller: the first page's controller address and the offset of
    /// the range in it.
    fn map_dmabuf(&mut self, fd: OwnedFd, offset: u64, len: usize) -> Result<(u64, usize)> {
        if len == 0 {
            return Err(Error::ZeroSize);
        }
        // SAFETY: the exporter keeps the memory while it is imported; the
        // mapping is kept in `maps` until no queue of this process can
        // reach it.
        let mapping = unsafe { self.owner.platform.import_dmabuf(fd.as_fd(), offset, len)? };
        let pages = mapping.pages();
        if pages.is_empty() || !pages.windows(2).all(|p| p[1] == p[0] + 4096) {
            // SAFETY: just made, not used by any command.
            let _ = unsafe { self.owner.platform.unmap_host(&mapping) };
            return Err(Error::Unsupported(format!(
                "{} maps this dma-buf in pieces; attached processes need contiguous controller addresses",
                self.owner.platform.describe()
            )));
        }
        let (first, first_offset) = (pages[0], mapping.first_offset());
        let span = pages.len() * 4096;
        self.maps.insert(first, Mapped { keep: Keep::Dmabuf(fd), len: span, mapping });
        self.owner.counters.mappings.fetch_add(1, Ordering::Relaxed);
        Ok((first, first_offset))
    }

    /// Opens GPU memory the process named by its runtime's IPC handle and
    /// maps it for an emulated controller, which copies to and from it with
    /// the owner's runtime: the first page's controller address and the
    /// offset of the range in it.
    #[cfg(feature = "gpu")]
    fn map_ipc(&mut self, x: &ugds_platform::device::IpcExport) -> Result<(u64, usize)> {
        if self.owner.gpu_route() != wire::gpu::IPC {
            return Err(Error::Unsupported(format!(
                "{} takes GPU memory as dma-bufs (MAPDMABUF), not by IPC handle",
                self.owner.platform.describe()
            )));
        }
        if x.len == 0 {
            return Err(Error::ZeroSize);
        }
        let cuda = crate::gpu::cuda::Cuda::get()?;
        // A runtime does not open its own handles: memory of this very
        // process is registered as it is.
        let (keep, mem) = if self.pid as u32 == std::process::id() {
            match cuda.classify(x.ptr, x.len)? {
                crate::gpu::cuda::Memory::Device(m) => (Keep::OwnGpu, m),
                crate::gpu::cuda::Memory::Host => {
                    return Err(Error::InvalidArgument(format!("{:#x} is not GPU memory", x.ptr)))
                }
            }
        } else {
            let open = cuda.open_ipc(x)?;
            let mem = open.memory().clone();
            (Keep::Ipc(open), mem)
        };
        // SAFETY: the memory stays open (`keep`, or the process's own
        // registration) until the mapping is removed, which happens only
        // once no queue of this process can reach it.
        let mapping = unsafe { self.owner.platform.map_device(&mem)? };
        let pages = mapping.pages();
        let (first, first_offset) = (pages[0], mapping.first_offset());
        let span = pages.len() * 4096;
        self.maps.insert(first, Mapped { keep, len: span, mapping });
        self.owner.counters.mappings.fetch_add(1, Ordering::Relaxed);
        Ok((first, first_offset))
    }

    #[cfg(not(feature = "gpu"))]
    fn map_ipc(&mut self, _: &ugds_platform::device::IpcExport) -> Result<(u64, usize)> {
        Err(Error::Unsupported("this owner is built without GPU support".into()))
    }

    fn unmap(&mut self, iova: u64) -> Result<()> {
        let m =
            self.maps.get(&iova).ok_or_else(|| Error::InvalidArgument(format!("no mapping of yours at {iova:#x}")))?;
        let in_use = self.queue_rings().find(|&(_, ring)| ring >= iova && ring < iova + m.len as u64);
        if let Some((qid, _)) = in_use {
            return Err(Error::InvalidArgument(format!(
                "{iova:#x} holds the rings of your queue {qid}, still created"
            )));
        }
        let m = self.maps.remove(&iova).expect("found above");
        // SAFETY: no queue of this process's reaches it (checked above);
        // its commands are the process's own to have finished.
        unsafe { self.owner.platform.unmap_host(&m.mapping)? };
        self.owner.counters.mappings.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// (local qid, ring address) of each created queue.
    fn queue_rings(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.cqs.iter().map(|(&q, &r)| (q, r)).chain(self.sqs.iter().map(|(&q, &(r, _))| (q, r)))
    }

    /// The controller's id of local queue `qid`, when it is this process's.
    fn device_qid(&self, qid: u32) -> Result<u16> {
        match self.qids {
            Some((first, n)) if (1..=n as u32).contains(&qid) => Ok(first + qid as u16 - 1),
            Some((_, n)) => Err(Error::InvalidArgument(format!("queue {qid} is not yours (you hold 1..={n})"))),
            None => Err(Error::InvalidArgument("no queue pairs reserved yet".into())),
        }
    }

    /// The controller's vector of local vector `v`, when it is this process's.
    fn device_vector(&self, v: u32) -> Result<u16> {
        match self.vectors {
            Some((first, n)) if (1..=n as u32).contains(&v) => Ok(first + v as u16 - 1),
            Some((_, n)) => {
                Err(Error::InvalidArgument(format!("interrupt vector {v} is not yours (you hold 1..={n})")))
            }
            None => Err(Error::InvalidArgument(format!("interrupt vector {v}: you hold none (your queues poll)"))),
        }
    }

    /// Refuses a ring that does not lie in one mapping of this process's.
    fn within(&self, iova: u64, len: u64) -> Result<()> {
        let fits = self
            .maps
            .range(..=iova)
            .next_back()
            // Rings live in shared host memory only, never in a dma-buf.
            .is_some_and(|(&start, m)| {
                matches!(m.keep, Keep::Memory(_))
                    && iova.checked_add(len).is_some_and(|end| end <= start + m.len as u64)
            });
        if fits && iova % 4096 == 0 {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{len} bytes at {iova:#x} are not a page-aligned range of your mappings"
            )))
        }
    }

    /// Checks an admin command is this process's to run, runs it with the
    /// controller's queue ids in place of its own, and keeps track.
    fn admin(&mut self, mut sqe: Sqe) -> Result<(Cqe, Option<[u8; IDENTIFY_LEN]>)> {
        let local = |dw: u32| dw & 0xffff;
        let entries = |sqe: &Sqe| (sqe.cdw10 >> 16) as u64 + 1;
        let ctrl = &self.owner.ctrl;
        match AdminOpcode::from_u8(sqe.opcode()) {
            Some(AdminOpcode::Identify) => match ctrl.identify((sqe.cdw10 & 0xff) as u8, sqe.nsid) {
                Ok(page) => Ok((Cqe::default(), Some(page))),
                Err(e) => status_of(e).map(|c| (c, None)),
            },
            Some(AdminOpcode::CreateIoCq) => {
                let qid = local(sqe.cdw10) as u16;
                let device = self.device_qid(qid as u32)?;
                if self.cqs.contains_key(&qid) {
                    return Err(Error::InvalidArgument(format!("completion queue {qid} exists")));
                }
                if sqe.cdw11 & 1 == 0 {
                    return Err(Error::InvalidArgument(
                        "an attached process's completion queues are physically contiguous".into(),
                    ));
                }
                if sqe.cdw11 & 2 != 0 {
                    // Interrupts on: the vector must be one of its own.
                    let v = self.device_vector(sqe.cdw11 >> 16)?;
                    sqe.cdw11 = (sqe.cdw11 & 0xffff) | (v as u32) << 16;
                }
                self.within(sqe.prp1, entries(&sqe) * Cqe::SIZE as u64)?;
                sqe.cdw10 = (sqe.cdw10 & 0xffff_0000) | device as u32;
                let c = run(ctrl, sqe, "Create I/O Completion Queue")?;
                if c.status().is_success() {
                    self.cqs.insert(qid, sqe.prp1);
                }
                Ok((c, None))
            }
            Some(AdminOpcode::CreateIoSq) => {
                let qid = local(sqe.cdw10) as u16;
                let cqid = (sqe.cdw11 >> 16) as u16;
                let (device, device_cq) = (self.device_qid(qid as u32)?, self.device_qid(cqid as u32)?);
                if self.sqs.contains_key(&qid) || !self.cqs.contains_key(&cqid) || sqe.cdw11 & 1 == 0 {
                    return Err(Error::InvalidArgument(format!(
                        "submission queue {qid} exists, or its completion queue {cqid} does not, or it is not contiguous"
                    )));
                }
                self.within(sqe.prp1, entries(&sqe) * Sqe::SIZE as u64)?;
                sqe.cdw10 = (sqe.cdw10 & 0xffff_0000) | device as u32;
                sqe.cdw11 = (sqe.cdw11 & 0xffff) | (device_cq as u32) << 16;
                let c = run(ctrl, sqe, "Create I/O Submission Queue")?;
                if c.status().is_success() {
                    self.sqs.insert(qid, (sqe.prp1, cqid));
                }
                Ok((c, None))
            }
            Some(AdminOpcode::DeleteIoSq) => {
                let qid = local(sqe.cdw10) as u16;
                let device = self.device_qid(qid as u32)?;
                if !self.sqs.contains_key(&qid) {
                    return Err(Error::InvalidArgument(format!("no submission queue {qid} of yours")));
                }
                sqe.cdw10 = (sqe.cdw10 & 0xffff_0000) | device as u32;
                let c = run(ctrl, sqe, "Delete I/O Submission Queue")?;
                if c.status().is_success() {
                    self.sqs.remove(&qid);
                }
                Ok((c, None))
            }
            Some(AdminOpcode::DeleteIoCq) => {
                let qid = local(sqe.cdw10) as u16;
                let device = self.device_qid(qid as u32)?;
                if !self.cqs.contains_key(&qid) || self.sqs.values().any(|&(_, cq)| cq == qid) {
                    return Err(Error::InvalidArgument(format!(
                        "no completion queue {qid} of yours, or a submission queue still completes to it"
                    )));
                }
                sqe.cdw10 = (sqe.cdw10 & 0xffff_0000) | device as u32;
                let c = run(ctrl, sqe, "Delete I/O Completion Queue")?;
                if c.status().is_success() {
                    self.cqs.remove(&qid);
                }
                Ok((c, None))
            }
            Some(AdminOpcode::Abort) => {
                let sqid = local(sqe.cdw10) as u16;
                let device = self.device_qid(sqid as u32)?;
                if !self.sqs.contains_key(&sqid) {
                    return Err(Error::InvalidArgument(format!("no submission queue {sqid} of yours")));
                }
                sqe.cdw10 = (sqe.cdw10 & 0xffff_0000) | device as u32;
                run(ctrl, sqe, "Abort").map(|c| (c, None))
            }
            _ => Err(Error::InvalidArgument(format!(
                "admin opcode {:#04x} is the owner's: an attached process identifies, and creates, deletes and aborts                  on its own queues",
                sqe.opcode()
            ))),
        }
    }

    /// Deletes every queue of this process's: submission queues, then
    /// completion queues.
    fn delete_queues(&mut self) -> Result<()> {
        let ctrl = &self.owner.ctrl;
        let mut first_error = None;
        for (&qid, _) in self.sqs.clone().iter() {
            let device = self.device_qid(qid as u32)?;
            match ctrl.admin_command(Sqe::delete_io_sq(Cid(0), Qid(device)), "Delete I/O Submission Queue") {
                Ok(_) => {
                    self.sqs.remove(&qid);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        for (&qid, _) in self.cqs.clone().iter() {
            if self.sqs.values().any(|&(_, cq)| cq == qid) {
                continue;
            }
            let device = self.device_qid(qid as u32)?;
            match ctrl.admin_command(Sqe::delete_io_cq(Cid(0), Qid(device)), "Delete I/O Completion Queue") {
                Ok(_) => {
                    self.cqs.remove(&qid);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// After the session: the queues first; the mappings only once no
    /// queue is left to reach them (otherwise they are kept, on purpose).
    fn teardown(&mut self) {
        let deleted = self.delete_queues();
        if let Err(e) = deleted {
            self.owner.counters.leaked.fetch_add(1, Ordering::Relaxed);
            tracing::error!(pid = self.pid, "queues of a departed process not deleted ({e}): its memory stays mapped");
            let leak = std::mem::take(&mut self.maps);
            std::mem::forget(leak);
            return;
        }
        for (_, m) in std::mem::take(&mut self.maps) {
            // SAFETY: every queue of this process is deleted: the controller
            // reaches none of its rings, and its commands went with them.
            if let Err(e) = unsafe { self.owner.platform.unmap_host(&m.mapping) } {
                tracing::warn!(pid = self.pid, "unmap after the session: {e}");
            }
            self.owner.counters.mappings.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some((first, n)) = self.qids.take() {
            self.owner.give_qids(first, n);
        }
        if let Some((first, n)) = self.vectors.take() {
            self.owner.give_vectors(first, n);
        }
        if let Some(p) = self.part.take() {
            self.owner.give_part(p);
        }
        tracing::info!(pid = self.pid, "detached");
    }
}

/// Runs an admin command; an error status comes back as its entry.
fn run(ctrl: &crate::engine::NvmeController, sqe: Sqe, op: &'static str) -> Result<Cqe> {
    ctrl.admin_command(sqe, op).or_else(status_of)
}

/// A command's error status as the entry the process's engine reads;
/// any other error as it is.
fn status_of(e: Error) -> Result<Cqe> {
    match e {
        Error::Nvme { status, .. } => Ok(Cqe { status: status.to_field(false), ..Cqe::default() }),
        other => Err(other),
    }
}
