//! An NVMe/RDMA controller brought up from user space, behind a `Handle`:
//! the admin queue on a connection of its own (Fabrics Connect, the
//! registers through Property Get and Set, Identify, Set Features Number
//! of Queues), and one more connection for each I/O queue
//! ([`RdmaIoQueue`]). No keep-alive is asked for at Connect, so none is
//! sent.

use super::queue::{memory_for, sends_for};
use super::{RdmaIoQueue, RdmaQueue, RdmaTarget, ENTRIES, IO_ENTRIES, STAGING};
use crate::engine::fabrics::{self, connect_queue, enable, identify, queues_granted, read_cap, Capsules};
use crate::engine::{ControllerInfo, NamespaceInfo};
use std::sync::{Arc, Mutex};
use ugds_nvme::fabrics::CNTLID_DYNAMIC;
use ugds_nvme::regs::{self, Version};
use ugds_nvme::{Cid, IdentifyController, Sqe};
use ugds_platform::rdma::RdmaPlatform;
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// An NVMe/RDMA controller; see the module docs.
pub struct RdmaController {
    target: RdmaTarget,
    rdma: Arc<RdmaPlatform>,
    platform: Arc<dyn ugds_platform::Platform>,
    admin: Mutex<RdmaQueue>,
    info: ControllerInfo,
    cntlid: u16,
    /// (nsid, block size) of each namespace, for the queues.
    blocks: Vec<(u32, u32)>,
}

impl std::fmt::Debug for RdmaController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaController")
            .field("addr", &self.target.addr)
            .field("subnqn", &self.target.subnqn)
            .field("cntlid", &self.cntlid)
            .finish_non_exhaustive()
    }
}

impl RdmaController {
    /// Connects to `t`'s controller, enables it and asks for
    /// `want_io_queues` I/O queues.
    pub fn connect(t: &RdmaTarget, want_io_queues: u16) -> Result<RdmaController> {
        let n = t.names();
        let mut admin = RdmaQueue::connect(t, 0, CNTLID_DYNAMIC)?;
        let cntlid = connect_queue(&mut admin, &n, 0, ENTRIES, CNTLID_DYNAMIC)?;
        let cap = read_cap(&mut admin, &n)?;
        let version = Version(admin.property_get(regs::VS, false)? as u32);
        enable(&mut admin, &n, cap)?;
        let (identify, namespaces) = identify(&mut admin)?;
        if namespaces.is_empty() {
            return Err(Error::InvalidArgument(format!("{} ({}): no namespace this host can use", t.subnqn, t.addr)));
        }
        let want = want_io_queues.max(1);
        let cqe =
            admin.run("Set Features (Number of Queues)", Sqe::set_num_queues(Cid(0), want, want), &[], &mut [])?;
        let io_queues = queues_granted(cqe.dw0, want);
        // A command's data fits its slot's area.
        let max_transfer = identify.max_transfer_bytes(4096 << cap.mpsmin()).unwrap_or(STAGING).min(STAGING);
        // Every queue's connection in the admin queue's protection domain,
        // where the caller's buffers are registered.
        let rdma = Arc::new(RdmaPlatform::new(&t.addr, &t.subnqn, admin.conn.device().clone(), t.register_memory)?);
        let platform: Arc<dyn ugds_platform::Platform> = rdma.clone();
        // The engine's SGLs describe memory segments, which this transport
        // does not take (its own Keyed SGL names a slot's area): vectored
        // requests go as one command per contiguous piece.
        let identify = IdentifyController { sgls: 0, ..identify };
        let info = ControllerInfo {
            cap,
            version,
            identify,
            namespaces: namespaces
                .iter()
                .map(|&(nsid, blocks, block_size)| NamespaceInfo { nsid, block_size, blocks })
                .collect(),
            skipped: Vec::new(),
            io_queues,
            max_transfer: Some(max_transfer),
            page_size: 4096,
            platform: platform.describe(),
        };
        tracing::info!(addr = %t.addr, subnqn = %t.subnqn, cntlid, io_queues, "NVMe/RDMA controller connected");
        Ok(RdmaController {
            target: t.clone(),
            rdma,
            platform,
            admin: Mutex::new(admin),
            info,
            cntlid,
            blocks: namespaces.iter().map(|&(nsid, _, bs)| (nsid, bs)).collect(),
        })
    }

    /// What bring-up learned.
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// The platform, as the engine's.
    pub fn dyn_platform(&self) -> &Arc<dyn ugds_platform::Platform> {
        &self.platform
    }

    /// Runs an admin command that moves no data (Abort, Set and Get
    /// Features' values); commands with data are refused here.
    pub fn admin_command(&self, sqe: Sqe, op: &'static str) -> Result<ugds_nvme::Cqe> {
        fabrics::admin_command_on(&self.admin, sqe, op, "NVMe/RDMA", &self.target.addr)
    }

    /// CSTS through Property Get; all ones (gone) when the admin queue no
    /// longer answers, 0 (nothing known) while another command holds it
    /// past [`fabrics::ADMIN_BUSY_WAIT`].
    pub fn csts(&self) -> u32 {
        fabrics::csts_on(&self.admin, "NVMe/RDMA", &self.target.addr)
    }

    /// I/O queue `qid` of up to `entries` (at most [`IO_ENTRIES`], and
    /// what CAP.MQES allows) on a connection of its own. With a `vector`,
    /// its completion queue reports to a completion channel the platform
    /// watches, which signals the vector (interrupt completion).
    pub fn create_queue(&self, qid: u16, entries: u16, vector: Option<u16>) -> Result<RdmaIoQueue> {
        if vector.is_some_and(|v| v >= self.platform.interrupt_vectors()) {
            return Err(Error::InvalidArgument(format!("no interrupt vector {} over NVMe/RDMA", vector.unwrap())));
        }
        let entries = entries.clamp(2, self.info.cap.mqes().saturating_add(1).min(IO_ENTRIES));
        let mut q = RdmaQueue::connect_sized(
            &self.target,
            qid,
            self.cntlid,
            entries,
            memory_for(entries),
            sends_for(entries),
            vector.is_some(),
            Some(self.rdma.device()),
        )?;
        connect_queue(&mut q, &self.target.names(), qid, entries, self.cntlid)?;
        RdmaIoQueue::new(q, entries, self.blocks.clone(), self.rdma.clone(), vector)
    }

    /// Normal shutdown (CC.SHN, then CSTS.SHST complete, for up to the
    /// target's timeout).
    pub fn shutdown(&self) -> Result<()> {
        fabrics::shut_down_waited(&mut *self.admin.lock().recover(), self.target.timeout)
    }

    /// Disables the controller (CC.EN cleared).
    pub fn disable(&self) -> Result<()> {
        self.admin.lock().recover().property_set(regs::CC, 0)
    }
}
