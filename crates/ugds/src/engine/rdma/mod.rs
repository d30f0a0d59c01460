//! NVMe over RDMA, the host side: one reliable connection per queue
//! (rdma-core's librdmacm and libibverbs, loaded at run time; see
//! `ugds_platform::sys::rdma_cm`), the connection request carrying
//! NVMe/RDMA's private data (`ugds_nvme::rdma`), each command sent as a
//! 64-byte capsule by RDMA SEND, its completion received into a posted
//! receive, and its data moved by the target itself: RDMA WRITE into, or
//! RDMA READ from, host memory registered with the connection's device and
//! named in the command's Keyed SGL Data Block.
//!
//! [`RdmaSession`]: the admin queue (Connect, Property Get and Set,
//! enable, Identify) and one I/O queue, each running one command at a
//! time, data through a registered host buffer of the queue's own (at most
//! [`STAGING`] bytes a command): what `ugds rdma --connect` uses.
//! [`RdmaController`] and [`RdmaIoQueue`]: the same controller behind a
//! `Handle` (`Driver::open_rdma`), each I/O queue with up to `IO_ENTRIES - 1`
//! commands in flight, all its connections in one protection domain. A
//! command on a buffer the caller registered names that buffer (its memory
//! region, registered by the platform, `ugds_platform::rdma`), and the
//! target moves the data to or from it; any other command's data is staged
//! in a slot of the queue's registered memory and copied. Tested against
//! Linux's nvmet-rdma over soft RoCE in the QEMU `rdma` configuration. GPU
//! memory is registered through `ibv_reg_dmabuf_mr` where the device can;
//! soft RoCE cannot (refused by the platform), so that is not run here.

mod controller;
mod queue;

pub use controller::RdmaController;
pub use queue::RdmaIoQueue;

use super::fabrics::{self, Broken, Capsules, Names};
use super::tcp::FabricsProbe;
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds_nvme::fabrics::CNTLID_DYNAMIC;
use ugds_nvme::rdma::{self as wire, CmAnswer};
use ugds_nvme::regs::{self, Cap, Version};
use ugds_nvme::{Cid, Cqe, Lba, Nsid, NvmOpcode, Sqe};
use ugds_platform::dma::DmaBuffer;
use ugds_platform::sys::rdma_cm::{Answer, Connection};
use ugds_platform::sys::verbs::{self, Device, MemoryRegion, Poster, Sge, WorkCompletion};
use ugds_platform::{Error, Result};

/// Bytes of data one command may move through a queue's registered buffer.
pub const STAGING: usize = 128 << 10;

/// Entries of the admin queue and of a session's queues (nvmet-rdma allows
/// at most 32 on the admin queue).
const ENTRIES: u16 = 32;

/// Entries an I/O queue asks for at most: the Linux host's
/// NVME_RDMA_MAX_QUEUE_SIZE, which nvmet-rdma serves.
pub(super) const IO_ENTRIES: u16 = 128;

const SQE_AT: usize = 0;
const CQE_AT: usize = 64;
const DATA_AT: usize = 4096;
/// The `wr_id` of the command's SEND (receives use their slot's index).
const SEND_ID: u64 = u64::MAX;
/// The `wr_id` of the receive posted just before a queue pair is moved to
/// the error state, so that at least one receive is there to be flushed.
const DRAIN_ID: u64 = 1 << 62;

/// Where an NVMe/RDMA target is and how to talk to it.
#[derive(Clone, Debug)]
pub struct RdmaTarget {
    /// `address:port` (4420 is NVMe/RDMA's), an address on an RDMA device's
    /// network (soft RoCE's netdev, say).
    pub addr: String,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// The host's NQN.
    pub hostnqn: String,
    /// The host's identifier.
    pub hostid: [u8; 16],
    /// The longest any connection step or command may take.
    pub timeout: Duration,
    /// Register the caller's buffers with the RDMA device, so that the
    /// target moves their data itself (the default). Off: the target only
    /// ever reaches each queue's own memory, and every command's data is
    /// copied through it (no memory pinned per buffer; a command given up
    /// on can never write the caller's memory).
    pub register_memory: bool,
}

impl RdmaTarget {
    /// A target at `addr` exporting `subnqn`, with this host named as the
    /// NVMe/TCP initiator names it, a 10-second timeout, the caller's
    /// buffers registered.
    pub fn new(addr: &str, subnqn: &str) -> RdmaTarget {
        let t = super::tcp::TcpTarget::new(addr, subnqn);
        RdmaTarget {
            addr: t.addr,
            subnqn: t.subnqn,
            hostnqn: t.hostnqn,
            hostid: t.hostid,
            timeout: t.timeout,
            register_memory: true,
        }
    }

    fn names(&self) -> Names<'_> {
        Names {
            addr: &self.addr,
            subnqn: &self.subnqn,
            hostnqn: &self.hostnqn,
            hostid: self.hostid,
            timeout: self.timeout,
            // No keep-alive asked for: a session's commands keep it alive.
            keep_alive: Duration::ZERO,
        }
    }
}

/// One queue's connection: its registered buffer (the command capsule, the
/// receive slots, the data), the RDMA connection, and what the queue
/// knows.
pub struct RdmaQueue {
    // Field order is drop order: the region before the connection (whose
    // queue pair goes first in its own drop), the memory last.
    mr: MemoryRegion,
    conn: Connection,
    mem: DmaBuffer,
    poster: Poster,
    addr: String,
    qid: u16,
    /// Receives posted (one per entry: a response for every command the
    /// queue may have out), in response slots at `CQE_AT`.
    receives: usize,
    next_cid: u16,
    timeout: Duration,
    /// Why the queue can no longer be used.
    broken: Broken,
}

impl std::fmt::Debug for RdmaQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaQueue").field("addr", &self.addr).field("qid", &self.qid).finish_non_exhaustive()
    }
}

impl RdmaQueue {
    /// Connects queue `qid` of `t` (joining controller `cntlid`; 0xffff for
    /// the admin queue): resolves the address to a device and route,
    /// registers the queue's buffer, posts its receives, and connects with
    /// NVMe/RDMA's private data. A refusal says why, in the target's words.
    pub fn connect(t: &RdmaTarget, qid: u16, cntlid: u16) -> Result<RdmaQueue> {
        RdmaQueue::connect_sized(t, qid, cntlid, ENTRIES, DATA_AT + STAGING, 8, false, None)
    }

    /// As [`connect`](Self::connect), for a queue of `entries` (at most
    /// [`IO_ENTRIES`]; a receive posted for each, and room for one more:
    /// see [`DRAIN_ID`]) with `mem_len` bytes of registered memory and room
    /// for `sends` SENDs not yet completed; its completion queue with a
    /// completion channel when `notify`; in `shared`'s protection domain
    /// when the route runs through its device.
    #[allow(clippy::too_many_arguments)]
    fn connect_sized(
        t: &RdmaTarget,
        qid: u16,
        cntlid: u16,
        entries: u16,
        mem_len: usize,
        sends: usize,
        notify: bool,
        shared: Option<&Arc<Device>>,
    ) -> Result<RdmaQueue> {
        debug_assert!((2..=IO_ENTRIES).contains(&entries));
        let receives = entries as usize;
        let peer = t
            .addr
            .to_socket_addrs()
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", t.addr)))?
            .next()
            .ok_or_else(|| Error::InvalidArgument(format!("{}: no address", t.addr)))?;
        // Dropped in the reverse order on an error below: the region, the
        // connection (its queue pair and posted receives), the memory.
        let mem = DmaBuffer::anonymous(mem_len)?;
        let mut conn = Connection::new(
            peer,
            t.timeout,
            (receives + 1 + sends) as u32,
            sends as u32,
            receives as u32 + 1,
            notify,
            shared,
        )?;
        // SAFETY: `mem` outlives the region: dropped after it here and in
        // the queue (field order).
        let mr = unsafe { conn.device().register_host(mem.vaddr(), mem.len())? };
        let poster = conn.poster()?;
        for slot in 0..receives {
            post_receive(&poster, &mr, slot)?;
        }
        let private = wire::cm_request(qid, receives as u16, entries - 1, cntlid);
        let answer = conn.connect(&private, t.timeout)?;
        let q = RdmaQueue {
            mr,
            conn,
            mem,
            poster,
            addr: t.addr.clone(),
            qid,
            receives,
            next_cid: 0,
            timeout: t.timeout,
            broken: Broken::default(),
        };
        match answer {
            Answer::Established(data) => match wire::parse_accept(&data) {
                Some(CmAnswer::Accepted { crqsize: 0 }) => Err(Error::Platform(format!(
                    "NVMe/RDMA: {} accepted queue {qid} with a receive queue of 0 commands",
                    t.addr
                ))),
                _ => Ok(q),
            },
            // Status 0 is no NVMe/RDMA status: the RDMA layer refused (no
            // listener on that port).
            Answer::Rejected(data) => Err(match wire::parse_reject(&data) {
                Some(CmAnswer::Rejected { status }) if status != 0 => Error::Platform(format!(
                    "NVMe/RDMA: {} refused queue {qid}: {} (status {status})",
                    t.addr,
                    wire::reject_reason(status)
                )),
                _ => Error::Platform(format!(
                    "NVMe/RDMA: {} refused the connection of queue {qid} (no NVMe/RDMA port there?)",
                    t.addr
                )),
            }),
        }
    }

    fn exchange(&mut self, mut sqe: Sqe, data_out: &[u8], data_in: &mut [u8]) -> Result<Cqe> {
        let len = data_out.len().max(data_in.len());
        if len > STAGING {
            return Err(Error::InvalidArgument(format!(
                "NVMe/RDMA: {len} bytes in one command; this queue moves at most {STAGING}"
            )));
        }
        let cid = Cid(self.next_cid);
        self.next_cid = self.next_cid.wrapping_add(1) % 0xffff;
        sqe.set_cid(cid);
        // Every command names its data with a Keyed SGL Data Block, one of
        // length 0 when it has none (nvmet-rdma refuses other descriptors).
        sqe = if len > 0 {
            self.mem.write_bytes(DATA_AT, data_out);
            sqe.with_keyed_data(self.mr.addr() + DATA_AT as u64, len as u32, self.mr.rkey())
        } else {
            sqe.with_keyed_data(0, 0, 0)
        };
        self.mem.write_sqe(SQE_AT, &sqe);
        let sge = Sge { addr: self.mr.addr() + SQE_AT as u64, length: 64, lkey: self.mr.lkey() };
        self.poster.send(SEND_ID, sge, false)?;
        let started = Instant::now();
        let (mut sent, mut done) = (false, None);
        let mut wcs = [WorkCompletion::default(); 8];
        while !sent || done.is_none() {
            let n = self.conn.cq().poll(&mut wcs)?;
            for wc in &wcs[..n] {
                if wc.status != 0 {
                    return Err(Error::Platform(format!(
                        "NVMe/RDMA: {} of command {:#06x} on queue {} to {}: {} (status {}, vendor error {:#x})",
                        if wc.wr_id == SEND_ID { "the send" } else { "a receive" },
                        cid.0,
                        self.qid,
                        self.addr,
                        verbs::wc_status_str(wc.status),
                        wc.status,
                        wc.vendor_err
                    )));
                }
                if wc.wr_id == SEND_ID {
                    sent = true;
                    continue;
                }
                let slot = wc.wr_id as usize;
                if wc.opcode != verbs::WC_RECV || slot >= self.receives || wc.byte_len != 16 {
                    return Err(Error::Platform(format!(
                        "NVMe/RDMA: from {}: a completion of {} bytes (opcode {}, request {}) where a 16-byte response was due",
                        self.addr, wc.byte_len, wc.opcode, wc.wr_id
                    )));
                }
                let cqe = self.mem.read_cqe(CQE_AT + slot * 16);
                post_receive(&self.poster, &self.mr, slot)?;
                if cqe.cid != cid.0 {
                    return Err(Error::Platform(format!(
                        "NVMe/RDMA: {} answered command {:#06x} while {:#06x} was the one sent",
                        self.addr, cqe.cid, cid.0
                    )));
                }
                done = Some(cqe);
            }
            if n == 0 {
                if started.elapsed() > self.timeout {
                    return Err(Error::Timeout { qid: self.qid, cid: Some(cid), after: self.timeout });
                }
                if self.conn.disconnected() {
                    return Err(Error::Platform(format!("NVMe/RDMA: {} disconnected queue {}", self.addr, self.qid)));
                }
                std::thread::yield_now();
            }
        }
        let cqe = done.expect("loop ends with it");
        if cqe.is_success() {
            self.mem.read_bytes(DATA_AT, data_in);
        }
        Ok(cqe)
    }
}

/// Posts the receive of response slot `slot`.
fn post_receive(poster: &Poster, mr: &MemoryRegion, slot: usize) -> Result<()> {
    poster.recv(slot as u64, response_sge(mr, slot))
}

/// Response slot `slot` of the queue's memory, as a receive's buffer.
fn response_sge(mr: &MemoryRegion, slot: usize) -> Sge {
    Sge { addr: mr.addr() + (CQE_AT + slot * 16) as u64, length: 16, lkey: mr.lkey() }
}

impl Capsules for RdmaQueue {
    /// Runs one command and waits for its completion (and its send's),
    /// polling the completion queue for up to the target's timeout; any
    /// failed work request, a response for another command, or a
    /// disconnection is an error, after which the queue is not used again.
    fn execute(&mut self, sqe: Sqe, data_out: &[u8], data_in: &mut [u8]) -> Result<Cqe> {
        self.broken.check(|| format!("NVMe/RDMA to {}: queue {}", self.addr, self.qid))?;
        let r = self.exchange(sqe, data_out, data_in);
        if let Err(e) = &r {
            // A refused request never reached the wire.
            if !matches!(e, Error::InvalidArgument(_)) {
                self.broken.set(e);
            }
        }
        r
    }
}

/// An NVMe/RDMA controller's admin queue and one I/O queue, each running
/// one command at a time; see the module docs. Shut down (CC.SHN) and
/// disconnected on drop.
#[derive(Debug)]
pub struct RdmaSession {
    admin: RdmaQueue,
    io: RdmaQueue,
    probe: FabricsProbe,
}

impl RdmaSession {
    /// Connects the admin queue, enables the controller, identifies it,
    /// asks for one I/O queue and connects it.
    pub fn connect(t: &RdmaTarget) -> Result<RdmaSession> {
        let n = t.names();
        let mut admin = RdmaQueue::connect(t, 0, CNTLID_DYNAMIC)?;
        let cntlid = fabrics::connect_queue(&mut admin, &n, 0, ENTRIES, CNTLID_DYNAMIC)?;
        let cap = Cap(admin.property_get(regs::CAP, true)?);
        let version = Version(admin.property_get(regs::VS, false)? as u32);
        fabrics::enable(&mut admin, &n, cap)?;
        let (identify, namespaces) = fabrics::identify(&mut admin)?;
        admin.run("Set Features (Number of Queues)", Sqe::set_num_queues(Cid(0), 1, 1), &[], &mut [])?;
        let mut io = RdmaQueue::connect(t, 1, cntlid)?;
        fabrics::connect_queue(&mut io, &n, 1, ENTRIES, cntlid)?;
        let probe = FabricsProbe { cntlid, cap, version, digests: Default::default(), identify, namespaces };
        Ok(RdmaSession { admin, io, probe })
    }

    /// What the controller said of itself and its namespaces.
    pub fn probe(&self) -> &FabricsProbe {
        &self.probe
    }

    /// The block size of namespace `nsid`.
    fn block_size(&self, nsid: u32) -> Result<u32> {
        self.probe
            .namespaces
            .iter()
            .find(|n| n.0 == nsid)
            .map(|n| n.2)
            .ok_or_else(|| Error::InvalidArgument(format!("no usable namespace {nsid} on {}", self.admin.addr)))
    }

    fn io(&mut self, op: NvmOpcode, nsid: u32, offset: u64, out: &[u8], into: &mut [u8]) -> Result<()> {
        let bs = self.block_size(nsid)? as u64;
        let len = out.len().max(into.len()) as u64;
        if len == 0 || offset % bs != 0 || len % bs != 0 {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes at {offset}: whole blocks of {bs} bytes, at least one"
            )));
        }
        let sqe = Sqe::rw(op, Cid(0), Nsid(nsid), Lba(offset / bs), (len / bs) as u32, 0, 0);
        let name = if op == NvmOpcode::Write { "Write" } else { "Read" };
        self.io.run(name, sqe, out, into).map(|_| ())
    }

    /// Reads `into.len()` bytes (whole blocks, at most [`STAGING`]) at
    /// `offset` of namespace `nsid`.
    pub fn read(&mut self, nsid: u32, offset: u64, into: &mut [u8]) -> Result<()> {
        self.io(NvmOpcode::Read, nsid, offset, &[], into)
    }

    /// Writes `data` (whole blocks, at most [`STAGING`]) at `offset` of
    /// namespace `nsid`.
    pub fn write(&mut self, nsid: u32, offset: u64, data: &[u8]) -> Result<()> {
        self.io(NvmOpcode::Write, nsid, offset, data, &mut [])
    }
}

impl Drop for RdmaSession {
    fn drop(&mut self) {
        let _ = fabrics::shut_down(&mut self.admin);
    }
}
