//! An NVMe/TCP controller brought up from user space: the admin queue on a
//! connection of its own (Connect with a keep-alive timeout, the registers
//! through Property Get and Set, Identify, Set Features Number of Queues),
//! Keep Alive sent on a timer by a thread of its own, and one more
//! connection for each I/O queue ([`TcpQueue`]).

use super::queue::{QueueSetup, TcpQueue};
use super::{TcpConnection, TcpTarget};
use crate::engine::fabrics::{self, connect_queue, enable, identify, queues_granted, read_cap, Capsules};
use crate::engine::{ControllerInfo, NamespaceInfo};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ugds_nvme::fabrics::CNTLID_DYNAMIC;
use ugds_nvme::regs::{self, Version};
use ugds_nvme::{Cid, IdentifyController, Sqe};
use ugds_platform::tcp::TcpPlatform;
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// Entries of the admin queue asked for at Connect.
const ADMIN_ENTRIES: u16 = 32;

/// The largest command the engine makes (larger requests are split): a
/// bounce buffer's largest size class holds it, and it keeps one command
/// from holding the connection long.
const MAX_TRANSFER: usize = 1 << 20;

/// Keep Alive opcode.
const KEEP_ALIVE: u8 = 0x18;

/// An NVMe/TCP controller; see the module docs.
pub struct TcpController {
    target: TcpTarget,
    platform: Arc<TcpPlatform>,
    dyn_platform: Arc<dyn ugds_platform::Platform>,
    admin: Arc<Mutex<TcpConnection>>,
    info: ControllerInfo,
    cntlid: u16,
    /// Bytes of write data that go in an I/O command's capsule.
    in_capsule: usize,
    /// (nsid, block size) of each namespace, for the queues.
    blocks: Vec<(u32, u32)>,
    /// Stops the keep-alive thread (by being dropped).
    keep_alive: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl std::fmt::Debug for TcpController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpController")
            .field("addr", &self.target.addr)
            .field("subnqn", &self.target.subnqn)
            .field("cntlid", &self.cntlid)
            .finish_non_exhaustive()
    }
}

impl TcpController {
    /// Connects to `t`'s controller, enables it and asks for
    /// `want_io_queues` I/O queues.
    pub fn connect(t: &TcpTarget, want_io_queues: u16) -> Result<TcpController> {
        let mut c = TcpConnection::connect(t, 0)?;
        let n = t.names();
        let cntlid = connect_queue(&mut c, &n, 0, ADMIN_ENTRIES, CNTLID_DYNAMIC)?;
        let cap = read_cap(&mut c, &n)?;
        let version = Version(c.property_get(regs::VS, false)? as u32);
        enable(&mut c, &n, cap)?;
        let (identify, namespaces) = identify(&mut c)?;
        if namespaces.is_empty() {
            return Err(Error::InvalidArgument(format!("{} ({}): no namespace this host can use", t.subnqn, t.addr)));
        }
        let want = want_io_queues.max(1);
        let cqe = c.run("Set Features (Number of Queues)", Sqe::set_num_queues(Cid(0), want, want), &[], &mut [])?;
        let io_queues = queues_granted(cqe.dw0, want);
        let in_capsule = identify.in_capsule_data();
        let max_transfer = identify.max_transfer_bytes(4096 << cap.mpsmin()).unwrap_or(MAX_TRANSFER).min(MAX_TRANSFER);
        let platform = Arc::new(TcpPlatform::new(&t.addr, &t.subnqn)?);
        // The controller's SGLs describe data on the wire (the transport's
        // data block); the engine's SGLs describe memory segments, which
        // this transport does not take: vectored requests go as one command
        // per contiguous piece, as on a controller without SGLs.
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
            platform: ugds_platform::Platform::describe(&*platform),
        };
        tracing::info!(
            addr = %t.addr, subnqn = %t.subnqn, cntlid, io_queues, in_capsule, digests = ?c.digests(),
            "NVMe/TCP controller connected"
        );
        let admin = Arc::new(Mutex::new(c));
        let keep_alive = (!t.keep_alive.is_zero()).then(|| start_keep_alive(admin.clone(), t.keep_alive));
        Ok(TcpController {
            target: t.clone(),
            dyn_platform: platform.clone(),
            platform,
            admin,
            info,
            cntlid,
            in_capsule,
            blocks: namespaces.iter().map(|&(nsid, _, bs)| (nsid, bs)).collect(),
            keep_alive,
        })
    }

    /// What bring-up learned.
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// The platform, as the engine's.
    pub fn dyn_platform(&self) -> &Arc<dyn ugds_platform::Platform> {
        &self.dyn_platform
    }

    /// Runs an admin command that moves no data (Abort, Set and Get
    /// Features' values, Keep Alive); commands with data are refused here.
    pub fn admin_command(&self, sqe: Sqe, op: &'static str) -> Result<ugds_nvme::Cqe> {
        fabrics::admin_command_on(&self.admin, sqe, op, "NVMe/TCP", &self.target.addr)
    }

    /// CSTS through Property Get; all ones (gone) when the admin queue no
    /// longer answers, 0 (nothing known) while another command holds it
    /// past [`fabrics::ADMIN_BUSY_WAIT`].
    pub fn csts(&self) -> u32 {
        fabrics::csts_on(&self.admin, "NVMe/TCP", &self.target.addr)
    }

    /// I/O queue `qid` of `entries` on a connection of its own; with a
    /// `vector`, the platform signals it when the socket has data (see
    /// `platform::tcp`), else its waiters poll the socket.
    pub fn create_queue(&self, qid: u16, entries: u16, vector: Option<u16>) -> Result<TcpQueue> {
        let entries = entries.clamp(2, self.info.cap.mqes().saturating_add(1));
        let mut c = TcpConnection::connect(&self.target, qid)?;
        connect_queue(&mut c, &self.target.names(), qid, entries, self.cntlid)?;
        let (stream, framing, maxh2cdata) = c.into_parts();
        let setup = QueueSetup {
            stream,
            addr: self.target.addr.clone(),
            framing,
            maxh2cdata,
            in_capsule: self.in_capsule,
            qid,
            entries,
            blocks: self.blocks.clone(),
            vector,
        };
        TcpQueue::new(setup, self.platform.clone())
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

impl Drop for TcpController {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.keep_alive.take() {
            drop(stop);
            let _ = thread.join();
        }
    }
}

/// Sends Keep Alive on `admin` every half of `kato` until the sender is
/// dropped.
fn start_keep_alive(
    admin: Arc<Mutex<TcpConnection>>,
    kato: Duration,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("ugds-keep-alive".into())
        .spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(kato / 2) {
                let r = admin.lock().recover().execute(Sqe::new(KEEP_ALIVE, Cid(0)), &[], &mut []);
                match r {
                    Ok(cqe) if cqe.is_success() => {}
                    Ok(cqe) => tracing::warn!("NVMe/TCP Keep Alive failed: {:?}", cqe.status()),
                    Err(e) => tracing::warn!("NVMe/TCP Keep Alive not sent: {e}"),
                }
            }
        })
        .expect("spawn the keep-alive thread");
    (tx, thread)
}
