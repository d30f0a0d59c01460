//! A PCIe NVMe controller: bring-up, admin commands and shutdown.
//!
//! Bring-up, in the order the spec gives (section 3.5.1): disable if
//! enabled and wait for CSTS.RDY=0; admin queue attributes and addresses;
//! enable and wait for CSTS.RDY=1; Identify Controller, the active namespace
//! list and each namespace; Set Features (Number of Queues); then the I/O
//! queues, each completion queue before its submission queue. Admin commands
//! are polled to a deadline, never slept on.

use super::info::{ControllerInfo, NamespaceInfo};
use super::qpair::{NvmeQueue, Owner};
use super::transport::Transport;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use ugds_nvme::cmd::cns;
use ugds_nvme::identify::{parse_active_ns_list, IdentifyController, IdentifyNamespace};
use ugds_nvme::regs::{self, Aqa, Cap, Cc, Csts};
use ugds_nvme::{Cid, Cqe, Nsid, Qid, Sqe, IDENTIFY_LEN};
use ugds_platform::dma::DmaBuffer;
use ugds_platform::Platform;
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// Entries in each admin queue.
pub(crate) const ADMIN_ENTRIES: u16 = 32;

/// How long an admin command may take before the controller is given up.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// An NVMe controller brought up by the engine.
pub struct NvmeController {
    platform: Arc<dyn Platform>,
    admin: Admin,
    info: ControllerInfo,
    dstrd: u8,
    ready_timeout: Duration,
    /// Shadow doorbell and EventIdx pages, when configured.
    dbbuf: Option<Arc<DmaBuffer>>,
    /// Set once this controller object disabled the controller: from then
    /// on the controller may belong to a newer bring-up, which a late drop
    /// of this one must not disable.
    stopped: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for NvmeController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeController").field("info", &self.info).finish_non_exhaustive()
    }
}

struct AdminQueue {
    qp: NvmeQueue,
    data: DmaBuffer,
}

/// Where admin commands go.
enum Admin {
    /// An admin queue of this process's; dropped only once the controller
    /// is disabled (see `Drop`).
    Local(Box<ManuallyDrop<Mutex<AdminQueue>>>),
    /// The owner of a controller this process is attached to
    /// ([`Platform::remote_admin`]).
    Remote,
}

impl NvmeController {
    /// Resets and enables the controller behind `platform`, identifies it,
    /// and asks for `want_io_queues` I/O queue pairs.
    #[cfg_attr(not(feature = "engine-internals"), allow(dead_code))]
    pub fn bring_up(platform: Arc<dyn Platform>, want_io_queues: u16) -> Result<NvmeController> {
        NvmeController::bring_up_with(platform, want_io_queues, false)
    }

    /// As [`bring_up`](Self::bring_up); with `shadow_doorbells`, configures
    /// Doorbell Buffer Config when the controller offers it (OACS bit 8),
    /// and I/O queues created afterwards use it.
    pub fn bring_up_with(
        platform: Arc<dyn Platform>,
        want_io_queues: u16,
        shadow_doorbells: bool,
    ) -> Result<NvmeController> {
        let cap = Cap(platform.read64(regs::CAP));
        if cap.0 == u64::MAX {
            return Err(Error::DeviceGone);
        }
        if cap.css() & 1 == 0 {
            return Err(Error::Unsupported("controller does not support the NVM command set".into()));
        }
        if cap.mpsmin() != 0 {
            return Err(Error::Unsupported(format!(
                "controller's minimum page size is {} bytes; ugds uses 4096",
                4096u64 << cap.mpsmin()
            )));
        }
        let ready_timeout = Duration::from_millis(500 * cap.to().max(1) as u64);
        let dstrd = cap.dstrd();
        let version = regs::Version(platform.read32(regs::VS));

        // Disable first: the controller may have been left enabled.
        let cc = Cc(platform.read32(regs::CC));
        if cc.en() {
            // SAFETY: disabling stops the controller's DMA.
            unsafe { platform.write32(regs::CC, cc.0 & !1) };
        }
        wait_ready(&*platform, false, ready_timeout)?;

        let admin_entries = ADMIN_ENTRIES.min(cap.mqes().saturating_add(1)).max(2);
        let qp = NvmeQueue::new(platform.clone(), Qid::ADMIN, admin_entries, dstrd, Some(0))?;
        // SAFETY: the admin queues are DMA memory of this platform, owned
        // by `qp`, which the controller object keeps until it is disabled.
        unsafe {
            platform.write32(regs::AQA, Aqa::new(admin_entries, admin_entries).0);
            platform.write64(regs::ASQ, qp.sq_iova());
            platform.write64(regs::ACQ, qp.cq_iova());
            platform.write32(regs::CC, Cc::enable(0).0);
        }
        wait_ready(&*platform, true, ready_timeout)?;

        let data = platform.alloc_dma(IDENTIFY_LEN)?;
        let mut ctrl = NvmeController {
            platform: platform.clone(),
            admin: Admin::Local(Box::new(ManuallyDrop::new(Mutex::new(AdminQueue { qp, data })))),
            info: ControllerInfo {
                cap,
                version,
                identify: IdentifyController::default(),
                namespaces: vec![],
                skipped: vec![],
                io_queues: 0,
                max_transfer: None,
                page_size: 4096,
                platform: platform.describe(),
            },
            dstrd,
            ready_timeout,
            dbbuf: None,
            stopped: Default::default(),
        };

        ctrl.identify_all()?;
        let want = want_io_queues.max(1);
        let cqe = ctrl.admin_command(Sqe::set_num_queues(Cid(0), want, want), "Set Features (Number of Queues)")?;
        let granted = ((cqe.dw0 & 0xffff) as u16).min((cqe.dw0 >> 16) as u16).saturating_add(1);
        if shadow_doorbells && ctrl.info.identify.oacs & IdentifyController::OACS_DBBUF != 0 {
            // Page 0: shadow doorbells; page 1: EventIdx (both zeroed).
            let pages = Arc::new(platform.alloc_dma(2 * IDENTIFY_LEN)?);
            let sqe = Sqe::doorbell_buffer_config(Cid(0), pages.iova(0), pages.iova(IDENTIFY_LEN));
            match ctrl.admin_command(sqe, "Doorbell Buffer Config") {
                Ok(_) => ctrl.dbbuf = Some(pages),
                Err(e) => tracing::warn!("shadow doorbells not used: {e}"),
            }
        }
        ctrl.info.io_queues = granted.min(want);
        tracing::debug!(io_queues = ctrl.info.io_queues, "controller up");
        Ok(ctrl)
    }

    /// The controller behind an attached platform (see
    /// [`ugds_platform::attach`]): nothing is reset or enabled, admin
    /// commands go to the owner, and `want_io_queues` queue pairs are
    /// reserved there (numbered from 1 here).
    pub fn attach(platform: Arc<dyn Platform>, want_io_queues: u16) -> Result<NvmeController> {
        let Some(remote) = platform.remote_admin() else {
            return Err(Error::InvalidArgument(format!("{} is not an attached controller", platform.describe())));
        };
        let cap = Cap(platform.read64(regs::CAP));
        if cap.0 == u64::MAX {
            return Err(Error::DeviceGone);
        }
        if !Csts(platform.read32(regs::CSTS)).rdy() {
            return Err(Error::Platform(format!("{}: the owner's controller is not ready", platform.describe())));
        }
        let granted = remote.reserve_queues(want_io_queues.max(1))?;
        let mut ctrl = NvmeController {
            platform: platform.clone(),
            admin: Admin::Remote,
            info: ControllerInfo {
                cap,
                version: regs::Version(platform.read32(regs::VS)),
                identify: IdentifyController::default(),
                namespaces: vec![],
                skipped: vec![],
                io_queues: granted,
                max_transfer: None,
                page_size: 4096,
                platform: platform.describe(),
            },
            dstrd: cap.dstrd(),
            ready_timeout: Duration::from_millis(500 * cap.to().max(1) as u64),
            dbbuf: None,
            stopped: Default::default(),
        };
        ctrl.identify_all()?;
        tracing::debug!(io_queues = granted, "attached");
        Ok(ctrl)
    }

    /// Identify Controller, the active namespace list and each namespace,
    /// into `info`.
    fn identify_all(&mut self) -> Result<()> {
        let id = IdentifyController::parse(&self.identify(cns::CONTROLLER, 0)?);
        let list = parse_active_ns_list(&self.identify(cns::ACTIVE_NS_LIST, 0)?);
        let (mut namespaces, mut skipped) = (Vec::new(), Vec::new());
        for nsid in list {
            let ns = IdentifyNamespace::parse(&self.identify(cns::NAMESPACE, nsid)?);
            match ns.usable().and_then(|u| self.nvm_command_set(nsid).map(|()| u)) {
                Ok((blocks, block_size)) => namespaces.push(NamespaceInfo { nsid, block_size, blocks }),
                Err(why) => {
                    tracing::warn!(nsid, "namespace skipped: {why}");
                    skipped.push((nsid, why));
                }
            }
        }
        self.info.max_transfer = id.max_transfer_bytes(4096);
        self.info.identify = id;
        self.info.namespaces = namespaces;
        self.info.skipped = skipped;
        Ok(())
    }

    /// The owner's admin service, when attached.
    fn remote(&self) -> Option<&dyn ugds_platform::attach::RemoteAdmin> {
        match self.admin {
            Admin::Remote => self.platform.remote_admin(),
            Admin::Local(_) => None,
        }
    }

    /// Whether the controller belongs to another process.
    pub fn attached(&self) -> bool {
        matches!(self.admin, Admin::Remote)
    }

    /// What bring-up learned.
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// The platform the controller lives on.
    pub fn platform(&self) -> &Arc<dyn Platform> {
        &self.platform
    }

    /// Whether I/O queues use shadow doorbells.
    pub fn shadow_doorbells(&self) -> bool {
        self.dbbuf.is_some()
    }

    /// Current controller status.
    pub fn csts(&self) -> Csts {
        Csts(self.platform.read32(regs::CSTS))
    }

    /// Ok when namespace `nsid` takes the NVM command set (a controller
    /// that answers no descriptor list predates command sets: NVM), else
    /// why not: a zoned namespace's writes must follow its zones' write
    /// pointers, which plain block I/O does not.
    fn nvm_command_set(&self, nsid: u32) -> std::result::Result<(), String> {
        let page = match self.identify(cns::NS_DESCRIPTORS, nsid) {
            Ok(p) => p,
            Err(Error::Nvme { .. }) => return Ok(()),
            Err(e) => return Err(format!("its descriptor list could not be read ({e})")),
        };
        match ugds_nvme::identify::parse_ns_descriptors_csi(&page) {
            Ok(None | Some(ugds_nvme::identify::csi::NVM)) => Ok(()),
            Ok(Some(c)) => Err(format!(
                "its command set is {} (CSI {c:#x}), not NVM: ugds moves plain blocks only",
                ugds_nvme::identify::csi_name(c)
            )),
            Err(why) => Err(format!("its descriptor list is malformed: {why}")),
        }
    }

    /// Identify with `cns` for `nsid`: the page the controller returns.
    pub fn identify(&self, cns: u8, nsid: u32) -> Result<[u8; IDENTIFY_LEN]> {
        let Admin::Local(admin) = &self.admin else {
            let mut out = [0u8; IDENTIFY_LEN];
            let sqe = Sqe::identify(Cid(0), cns, Nsid(nsid), 0);
            let cqe = self.remote_admin()?.admin(&sqe, Some(&mut out))?;
            let status = cqe.status();
            return if status.is_success() { Ok(out) } else { Err(Error::Nvme { op: "Identify", status }) };
        };
        let mut admin = admin.lock().recover();
        let prp1 = admin.data.iova(0);
        let sqe = Sqe::identify(Cid(0), cns, Nsid(nsid), prp1);
        run_admin(&mut admin.qp, &*self.platform, sqe, "Identify")?;
        let mut out = [0u8; IDENTIFY_LEN];
        admin.data.read_bytes(0, &mut out);
        Ok(out)
    }

    /// Runs an admin command to completion (polled) and returns its entry.
    pub fn admin_command(&self, sqe: Sqe, op: &'static str) -> Result<Cqe> {
        let Admin::Local(admin) = &self.admin else {
            let cqe = self.remote_admin()?.admin(&sqe, None)?;
            let status = cqe.status();
            return if status.is_success() { Ok(cqe) } else { Err(Error::Nvme { op, status }) };
        };
        let mut admin = admin.lock().recover();
        run_admin(&mut admin.qp, &*self.platform, sqe, op)
    }

    fn remote_admin(&self) -> Result<&dyn ugds_platform::attach::RemoteAdmin> {
        self.remote().ok_or_else(|| Error::Platform("an attached controller without its owner".into()))
    }

    /// Allocates queue pair `qid` with a PRP-list page pool of
    /// `prp_pages` (capped by its depth) and creates it on the controller,
    /// the completion queue first.
    pub fn create_io_qpair_with(
        &self,
        qid: u16,
        entries: u16,
        vector: Option<u16>,
        prp_pages: u16,
    ) -> Result<NvmeQueue> {
        let entries = entries.min(self.info.cap.mqes().saturating_add(1)).max(2);
        let mut qp =
            NvmeQueue::with_prp_pages(self.platform.clone(), Qid(qid), entries, self.dstrd, vector, prp_pages)?;
        self.admin_command(
            Sqe::create_io_cq(Cid(0), Qid(qid), entries, qp.cq_iova(), vector.unwrap_or(0), vector.is_some()),
            "Create I/O Completion Queue",
        )?;
        if let Err(e) = self.admin_command(
            Sqe::create_io_sq(Cid(0), Qid(qid), entries, qp.sq_iova(), Qid(qid)),
            "Create I/O Submission Queue",
        ) {
            self.admin_command(Sqe::delete_io_cq(Cid(0), Qid(qid)), "Delete I/O Completion Queue")?;
            return Err(e);
        }
        if let Some(pages) = &self.dbbuf {
            qp.use_shadow_doorbells(pages.clone());
        }
        Ok(qp)
    }

    /// Deletes a queue pair on the controller: submission queue, then
    /// completion queue. After this the controller no longer reaches its rings.
    pub fn delete_io_qpair(&self, qp: &NvmeQueue) -> Result<()> {
        self.admin_command(Sqe::delete_io_sq(Cid(0), qp.qid()), "Delete I/O Submission Queue")?;
        self.admin_command(Sqe::delete_io_cq(Cid(0), qp.qid()), "Delete I/O Completion Queue")?;
        Ok(())
    }

    /// Normal shutdown (CC.SHN), then disable. Bounded by CAP.TO. An
    /// attached process's queues are deleted at the owner instead: the
    /// controller is not its to stop.
    pub fn shutdown(&self) -> Result<()> {
        if self.attached() {
            return self.disable();
        }
        let cc = Cc(self.platform.read32(regs::CC));
        if cc.en() && !self.csts().cfs() {
            // SAFETY: a shutdown notification starts no DMA.
            unsafe { self.platform.write32(regs::CC, cc.with_shn(regs::shutdown::NORMAL).0) };
            let deadline = Instant::now() + self.ready_timeout;
            while self.csts().shst() != regs::shutdown::COMPLETE {
                if Instant::now() > deadline {
                    tracing::warn!("controller did not report shutdown complete; disabling anyway");
                    break;
                }
                std::thread::yield_now();
            }
        }
        self.disable()
    }

    /// Disables the controller (CC.EN=0) and waits for CSTS.RDY=0: from
    /// then on the controller performs no DMA and every queue is gone.
    ///
    /// Attached: every queue of this process is deleted at the owner
    /// (submission queues first), after which the controller reaches none
    /// of them; the controller itself goes on serving the others.
    pub fn disable(&self) -> Result<()> {
        if let Some(remote) = self.remote() {
            remote.release_queues()?;
            self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
            return Ok(());
        }
        let cc = Cc(self.platform.read32(regs::CC));
        // SAFETY: disabling stops the controller's DMA.
        unsafe { self.platform.write32(regs::CC, cc.0 & !1 & !(3 << 14)) };
        wait_ready(&*self.platform, false, self.ready_timeout)?;
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for NvmeController {
    /// The admin queue's memory is freed only when the controller is
    /// disabled; if it cannot be disabled, the memory is leaked instead.
    fn drop(&mut self) {
        if self.attached() {
            // The owner deletes what is left of ours when we hang up.
            return;
        }
        let stopped = self.stopped.load(std::sync::atomic::Ordering::SeqCst);
        let enabled = !stopped && (Cc(self.platform.read32(regs::CC)).en() || self.csts().rdy());
        if enabled && self.disable().is_err() {
            tracing::error!("controller did not disable: its admin queue memory is leaked on purpose");
            return;
        }
        if let Admin::Local(admin) = &mut self.admin {
            // SAFETY: dropped once, here; the controller is disabled and can
            // no longer reach the admin queue.
            unsafe { ManuallyDrop::drop(&mut **admin) };
        }
    }
}

fn wait_ready(p: &dyn Platform, ready: bool, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let csts = Csts(p.read32(regs::CSTS));
        if csts.is_gone() {
            return Err(Error::DeviceGone);
        }
        if csts.rdy() == ready {
            return Ok(());
        }
        if ready && csts.cfs() {
            return Err(Error::ControllerFatal);
        }
        if Instant::now() > deadline {
            return Err(Error::NotReady { ready, after: timeout });
        }
        std::thread::yield_now();
    }
}

fn run_admin(qp: &mut NvmeQueue, p: &dyn Platform, sqe: Sqe, op: &'static str) -> Result<Cqe> {
    // Admin data buffers are single pages: PRP1 is already in the entry.
    let cid = qp.submit(sqe, None, Owner::Own(0)).map_err(Error::from)?;
    qp.ring_sq_doorbell();
    let deadline = Instant::now() + ADMIN_TIMEOUT;
    let mut spins = 0u32;
    loop {
        let mut got = None;
        qp.process_completions(1, |_, cqe| got = Some(*cqe));
        if let Some(cqe) = got {
            if cqe.cid != cid.0 {
                tracing::warn!(expected = cid.0, got = cqe.cid, "unexpected admin completion");
                continue;
            }
            let status = cqe.status();
            return if status.is_success() { Ok(cqe) } else { Err(Error::Nvme { op, status }) };
        }
        spins = spins.wrapping_add(1);
        if spins % 1024 == 0 {
            let csts = Csts(p.read32(regs::CSTS));
            if csts.is_gone() {
                return Err(Error::DeviceGone);
            }
            if csts.cfs() {
                return Err(Error::ControllerFatal);
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout { qid: 0, cid: Some(cid), after: ADMIN_TIMEOUT });
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}
