//! A controller of any transport, brought up by the engine: one enum over
//! the PCIe controller ([`super::pcie`]), the kernel path's stand-in
//! ([`super::kernel`]) and the fabrics controllers ([`super::tcp`],
//! [`super::rdma`]), each call dispatched by a match.

use super::info::ControllerInfo;
use super::kernel::KernelController;
use super::pcie::NvmeController;
use super::queue::QueuePair;
use super::rdma::RdmaController;
use super::tcp::TcpController;
use std::sync::Arc;
use ugds_nvme::regs::{self, Csts};
use ugds_nvme::{Cqe, Sqe};
use ugds_platform::Platform;
use ugds_platform::{Error, Result};

/// A controller brought up by the engine: an NVMe controller, or the
/// kernel path's stand-in for one.
#[derive(Debug)]
#[non_exhaustive]
pub enum Controller {
    /// An NVMe controller on a platform.
    Nvme(Box<NvmeController>),
    /// A file or block device through the kernel (see [`super::uring`]).
    Kernel(Box<KernelController>),
    /// A controller over NVMe/TCP (see [`super::tcp`]).
    Tcp(Box<TcpController>),
    /// A controller over NVMe/RDMA (see [`super::rdma`]).
    Rdma(Box<RdmaController>),
}

impl Controller {
    /// Whether its queues move GPU memory through the process's bounce
    /// buffers ([`super::bounce`]): the kernel path and NVMe/TCP.
    pub fn bounces_device_memory(&self) -> bool {
        matches!(self, Controller::Kernel(_) | Controller::Tcp(_))
    }

    /// Resets and enables the controller behind `platform` (see
    /// [`NvmeController::bring_up`]).
    #[cfg_attr(not(feature = "engine-internals"), allow(dead_code))]
    pub fn bring_up(platform: Arc<dyn Platform>, want_io_queues: u16) -> Result<Controller> {
        NvmeController::bring_up(platform, want_io_queues).map(|c| Controller::Nvme(Box::new(c)))
    }

    /// As [`bring_up`](Self::bring_up), with shadow doorbells when offered;
    /// a controller another process owns is attached to instead
    /// ([`NvmeController::attach`]).
    pub fn bring_up_with(
        platform: Arc<dyn Platform>,
        want_io_queues: u16,
        shadow_doorbells: bool,
    ) -> Result<Controller> {
        let c = if platform.remote_admin().is_some() {
            NvmeController::attach(platform, want_io_queues)?
        } else {
            NvmeController::bring_up_with(platform, want_io_queues, shadow_doorbells)?
        };
        Ok(Controller::Nvme(Box::new(c)))
    }

    /// What bring-up learned.
    pub fn info(&self) -> &ControllerInfo {
        match self {
            Controller::Nvme(c) => c.info(),
            Controller::Kernel(c) => c.info(),
            Controller::Tcp(c) => c.info(),
            Controller::Rdma(c) => c.info(),
        }
    }

    /// The platform the controller lives on.
    pub fn platform(&self) -> &Arc<dyn Platform> {
        match self {
            Controller::Nvme(c) => c.platform(),
            Controller::Kernel(c) => c.dyn_platform(),
            Controller::Tcp(c) => c.dyn_platform(),
            Controller::Rdma(c) => c.dyn_platform(),
        }
    }

    /// Whether I/O queues use shadow doorbells.
    pub fn shadow_doorbells(&self) -> bool {
        matches!(self, Controller::Nvme(c) if c.shadow_doorbells())
    }

    /// Current controller status (the kernel path: always ready; over
    /// fabrics: through Property Get, all ones when the target no longer answers).
    pub fn csts(&self) -> Csts {
        match self {
            Controller::Tcp(c) => Csts(c.csts()),
            Controller::Rdma(c) => Csts(c.csts()),
            _ => Csts(self.platform().read32(regs::CSTS)),
        }
    }

    /// Runs an admin command to completion (the kernel path has none).
    pub fn admin_command(&self, sqe: Sqe, op: &'static str) -> Result<Cqe> {
        match self {
            Controller::Nvme(c) => c.admin_command(sqe, op),
            Controller::Kernel(_) => Err(Error::Unsupported(format!("{op}: no admin commands on the kernel path"))),
            Controller::Tcp(c) => c.admin_command(sqe, op),
            Controller::Rdma(c) => c.admin_command(sqe, op),
        }
    }

    /// Creates I/O queue pair `qid`: on a controller, rings and the admin
    /// commands; on the kernel path, an io_uring ring.
    pub fn create_io_qpair(&self, qid: u16, entries: u16, vector: Option<u16>) -> Result<QueuePair> {
        self.create_io_qpair_with(qid, entries, vector, u16::MAX)
    }

    /// As [`create_io_qpair`](Self::create_io_qpair) with a PRP-list page
    /// pool of `prp_pages` (a controller's; the kernel path needs none).
    pub fn create_io_qpair_with(
        &self,
        qid: u16,
        entries: u16,
        vector: Option<u16>,
        prp_pages: u16,
    ) -> Result<QueuePair> {
        match self {
            Controller::Nvme(c) => c.create_io_qpair_with(qid, entries, vector, prp_pages).map(QueuePair::Nvme),
            Controller::Kernel(c) => c.create_ring(qid, entries, vector).map(QueuePair::from),
            Controller::Tcp(c) => c.create_queue(qid, entries, vector).map(QueuePair::from),
            Controller::Rdma(c) => c.create_queue(qid, entries, vector).map(QueuePair::from),
        }
    }

    /// Deletes a queue pair: after this nothing reaches its memory.
    pub fn delete_io_qpair(&self, qp: &QueuePair) -> Result<()> {
        match (self, qp) {
            (Controller::Nvme(c), QueuePair::Nvme(q)) => c.delete_io_qpair(q),
            // A ring ends with its descriptor; the kernel completes (or
            // cancels) what is in flight first.
            (Controller::Kernel(_), QueuePair::Uring(_)) => Ok(()),
            // A connection ends when its queue goes.
            (Controller::Tcp(_), QueuePair::Tcp(_)) | (Controller::Rdma(_), QueuePair::Rdma(_)) => Ok(()),
            _ => Err(Error::InvalidArgument("a queue pair of another transport".into())),
        }
    }

    /// Normal shutdown, then disable (the kernel path: nothing to do).
    pub fn shutdown(&self) -> Result<()> {
        match self {
            Controller::Nvme(c) => c.shutdown(),
            Controller::Kernel(_) => Ok(()),
            Controller::Tcp(c) => c.shutdown(),
            Controller::Rdma(c) => c.shutdown(),
        }
    }

    /// Disables the controller (the kernel path: nothing to do).
    pub fn disable(&self) -> Result<()> {
        match self {
            Controller::Nvme(c) => c.disable(),
            Controller::Kernel(_) => Ok(()),
            Controller::Tcp(c) => c.disable(),
            Controller::Rdma(c) => c.disable(),
        }
    }
}
