//! What NVMe over Fabrics transports share above their capsules: a queue
//! that runs one command at a time with its data ([`Capsules`], which
//! NVMe/TCP's and NVMe/RDMA's connections implement), and on it the admin
//! queue's bring-up: Fabrics Connect, the registers through Property Get
//! and Set, enabling the controller, Identify.

use std::time::{Duration, Instant};
use ugds_nvme::fabrics::{self, ConnectData, Connected};
use ugds_nvme::identify::parse_active_ns_list;
use ugds_nvme::regs::{self, Cap, Cc, Csts};
use ugds_nvme::{Cid, Cqe, IdentifyController, IdentifyNamespace, Nsid, NvmOpcode, Sqe, IDENTIFY_LEN};
use ugds_platform::{Error, Result};

/// A queue of a fabrics controller that runs one command at a time.
pub(crate) trait Capsules {
    /// Runs one command, `data_out` its data to the controller or
    /// `data_in` where its data from the controller goes (at most one of
    /// them non-empty). Returns the completion (a failed status is the
    /// caller's to judge); a transport failure is an error.
    fn execute(&mut self, sqe: Sqe, data_out: &[u8], data_in: &mut [u8]) -> Result<Cqe>;

    /// Runs `sqe` and fails on an error status, named `op`.
    fn run(&mut self, op: &'static str, sqe: Sqe, data_out: &[u8], data_in: &mut [u8]) -> Result<Cqe> {
        let cqe = self.execute(sqe, data_out, data_in)?;
        if !cqe.is_success() {
            return Err(Error::Nvme { op, status: cqe.status() });
        }
        Ok(cqe)
    }

    /// The 4- or 8-byte (`wide`) register at `offset`.
    fn property_get(&mut self, offset: usize, wide: bool) -> Result<u64> {
        let cqe = self.run("Property Get", Sqe::property_get(Cid(0), offset as u32, wide), &[], &mut [])?;
        Ok(fabrics::property_value(&cqe))
    }

    /// Sets the 4-byte register at `offset`.
    fn property_set(&mut self, offset: usize, value: u32) -> Result<()> {
        self.run("Property Set", Sqe::property_set(Cid(0), offset as u32, false, value as u64), &[], &mut [])?;
        Ok(())
    }
}

/// Why a fabrics queue can no longer be used, once a command on it failed
/// in the transport (whatever was half sent or half received stays so).
#[derive(Debug, Default)]
pub(crate) struct Broken(Option<String>);

impl Broken {
    /// An error naming the earlier failure (`queue`: which queue, for the
    /// message), if there was one.
    pub fn check(&self, queue: impl FnOnce() -> String) -> Result<()> {
        match &self.0 {
            Some(why) => Err(Error::Platform(format!("{}: failed earlier ({why})", queue()))),
            None => Ok(()),
        }
    }

    /// Records `e` as the queue's end.
    pub fn set(&mut self, e: &Error) {
        self.0 = Some(e.to_string());
    }
}

/// Who connects to what: the host's names and the subsystem's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Names<'a> {
    /// The target's address, for messages.
    pub addr: &'a str,
    pub subnqn: &'a str,
    pub hostnqn: &'a str,
    pub hostid: [u8; 16],
    /// The longest a wait may take.
    pub timeout: Duration,
    /// The keep-alive timeout asked for on the admin queue (zero: none).
    pub keep_alive: Duration,
}

/// Connects queue `qid` of `entries` on `c`: the controller's ID, or a
/// clear error for a refusal.
pub(crate) fn connect_queue(c: &mut impl Capsules, n: &Names, qid: u16, entries: u16, cntlid: u16) -> Result<u16> {
    let data = ConnectData { hostid: n.hostid, cntlid, subnqn: n.subnqn.to_string(), hostnqn: n.hostnqn.to_string() };
    let data = data.to_bytes().map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let kato = if qid == 0 { n.keep_alive.as_millis().min(u32::MAX as u128) as u32 } else { 0 };
    let cqe = c.execute(Sqe::connect(Cid(0), qid, entries, kato), &data, &mut [])?;
    match Connected::from_cqe(&cqe) {
        Connected::Controller(id) => Ok(id),
        Connected::InvalidParameter { in_data, offset } => Err(Error::InvalidArgument(format!(
            "{} refused Connect of queue {qid}: the {} at byte {offset} (the subsystem NQN is at 256, the host NQN at 512)",
            n.addr,
            if in_data { "data's field" } else { "command's field" }
        ))),
        Connected::Refused { .. } => Err(Error::Nvme { op: "Connect", status: cqe.status() }),
    }
}

/// CAP through Property Get, with the values the engine divides or
/// clamps by checked: a target's CAP.MQES of 0 (invalid: a queue of one
/// entry) is refused here, naming the field, never met as a panic later.
pub(crate) fn read_cap(c: &mut impl Capsules, n: &Names) -> Result<Cap> {
    let cap = Cap(c.property_get(regs::CAP, true)?);
    if cap.mqes() == 0 {
        return Err(Error::Platform(format!(
            "{}: CAP.MQES is 0 (queues of one entry; the smallest valid value is 1)",
            n.addr
        )));
    }
    Ok(cap)
}

/// I/O queues granted by Set Features (Number of Queues)'s `dw0` (the
/// zero-based counts of submission and completion queues), at most `want`.
pub(crate) fn queues_granted(dw0: u32, want: u16) -> u16 {
    ((dw0 & 0xffff).min(dw0 >> 16) + 1).min(want as u32) as u16
}

/// Enables the controller on its admin queue (CC.EN, then CSTS.RDY polled
/// for up to CAP.TO or the timeout, whichever is longer).
pub(crate) fn enable(c: &mut impl Capsules, n: &Names, cap: Cap) -> Result<()> {
    c.property_set(regs::CC, Cc::enable(0).0)?;
    let limit = n.timeout.max(Duration::from_millis(cap.to() as u64 * 500));
    let deadline = Instant::now() + limit;
    loop {
        let csts = Csts(c.property_get(regs::CSTS, false)? as u32);
        if csts.cfs() {
            return Err(Error::ControllerFatal);
        }
        if csts.rdy() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::NotReady { ready: true, after: limit });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A normal shutdown (CC.SHN), not waited for: the connection closes next.
pub(crate) fn shut_down(c: &mut impl Capsules) -> Result<()> {
    c.property_set(regs::CC, Cc::enable(0).with_shn(regs::shutdown::NORMAL).0)
}

/// A normal shutdown (CC.SHN), then CSTS.SHST polled until complete, for
/// up to `timeout` (a controller handle's close: the connection stays).
pub(crate) fn shut_down_waited(c: &mut impl Capsules, timeout: Duration) -> Result<()> {
    shut_down(c)?;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if Csts(c.property_get(regs::CSTS, false)? as u32).shst() == regs::shutdown::COMPLETE {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(Error::NotReady { ready: false, after: timeout })
}

/// CSTS through Property Get; all ones (gone) when the admin queue no
/// longer answers (`transport` and `addr` name it in the warning).
pub(crate) fn csts(c: &mut impl Capsules, transport: &str, addr: &str) -> u32 {
    match c.property_get(regs::CSTS, false) {
        Ok(v) => v as u32,
        Err(e) => {
            tracing::warn!(%addr, "{transport}: CSTS not read ({e}); taken as gone");
            u32::MAX
        }
    }
}

/// How long a command waits for the admin queue while another holds it
/// (Keep Alive, on its timer): the timeout ladder's CSTS and Abort never
/// wait behind a slow admin reply, which has a deadline of its own.
pub(crate) const ADMIN_BUSY_WAIT: Duration = Duration::from_millis(100);

/// The admin queue behind `m`, if it comes free within [`ADMIN_BUSY_WAIT`].
pub(crate) fn admin_queue<C>(m: &std::sync::Mutex<C>) -> Option<std::sync::MutexGuard<'_, C>> {
    let deadline = Instant::now() + ADMIN_BUSY_WAIT;
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            // A command that panicked left it between commands at worst.
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

/// [`admin_command`] on the admin queue behind `m`: `Busy` when another
/// command holds it past [`ADMIN_BUSY_WAIT`].
pub(crate) fn admin_command_on<C: Capsules>(
    m: &std::sync::Mutex<C>,
    sqe: Sqe,
    op: &'static str,
    transport: &str,
    addr: &str,
) -> Result<Cqe> {
    let Some(mut c) = admin_queue(m) else {
        tracing::warn!(%addr, "{transport}: {op} not sent: the admin queue waits on another command's reply");
        return Err(Error::Busy { what: "admin queue (another command waits on the target's reply)", inflight: 1 });
    };
    admin_command(&mut *c, sqe, op, transport)
}

/// [`csts`] on the admin queue behind `m`: 0 (nothing known, not gone)
/// when another command holds it past [`ADMIN_BUSY_WAIT`], so that the
/// timeout ladder goes on.
pub(crate) fn csts_on<C: Capsules>(m: &std::sync::Mutex<C>, transport: &str, addr: &str) -> u32 {
    match admin_queue(m) {
        Some(mut c) => csts(&mut *c, transport, addr),
        None => {
            tracing::warn!(%addr, "{transport}: CSTS not read: the admin queue waits on another reply");
            0
        }
    }
}

/// Runs an admin command that moves no data (Abort, Set and Get Features'
/// values, Keep Alive); one with data is refused, its `op` and `transport`
/// named.
pub(crate) fn admin_command(c: &mut impl Capsules, sqe: Sqe, op: &'static str, transport: &str) -> Result<Cqe> {
    if sqe.prp1 != 0 || sqe.prp2 != 0 {
        return Err(Error::Unsupported(format!("{op}: admin commands that move data, over {transport}")));
    }
    let cqe = c.execute(sqe, &[], &mut [])?;
    if !cqe.is_success() {
        return Err(Error::Nvme { op, status: cqe.status() });
    }
    Ok(cqe)
}

/// Which way an I/O command's data goes over a fabric, and how many bytes:
/// `None` for a command without data (or on a namespace not in `blocks`,
/// (nsid, block size) pairs: the target answers Invalid Namespace), else
/// `(to the target, bytes)`.
pub(crate) fn command_data(sqe: &Sqe, blocks: &[(u32, u32)]) -> Option<(bool, u64)> {
    let bs = blocks.iter().find(|b| b.0 == sqe.nsid).map_or(0, |b| b.1 as u64);
    match NvmOpcode::from_u8(sqe.opcode()) {
        Some(NvmOpcode::Read) if bs != 0 => Some((false, sqe.nlb() as u64 * bs)),
        Some(NvmOpcode::Write) if bs != 0 => Some((true, sqe.nlb() as u64 * bs)),
        // The ranges: 16 bytes each.
        Some(NvmOpcode::DatasetManagement) => Some((true, ((sqe.cdw10 & 0xff) as u64 + 1) * 16)),
        _ => None,
    }
}

/// An active namespace with a usable format: (nsid, blocks, block size).
pub(crate) type Namespace = (u32, u64, u32);

/// Identify Controller, and each active namespace with a usable format;
/// an error naming why when there are namespaces and none is usable.
pub(crate) fn identify(c: &mut impl Capsules) -> Result<(IdentifyController, Vec<Namespace>)> {
    let mut page = vec![0u8; IDENTIFY_LEN];
    c.run("Identify", Sqe::identify(Cid(0), 1, Nsid(0), 0), &[], &mut page)?;
    let identify = IdentifyController::parse(page[..].try_into().expect("one page"));
    c.run("Identify", Sqe::identify(Cid(0), 2, Nsid(0), 0), &[], &mut page)?;
    let (mut namespaces, mut skipped) = (Vec::new(), Vec::new());
    for nsid in parse_active_ns_list(page[..].try_into().expect("one page")) {
        c.run("Identify", Sqe::identify(Cid(0), 0, Nsid(nsid), 0), &[], &mut page)?;
        let ns = IdentifyNamespace::parse(page[..].try_into().expect("one page"));
        match ns.usable() {
            Ok((blocks, bs)) => namespaces.push((nsid, blocks, bs)),
            Err(why) => {
                tracing::warn!(nsid, "namespace skipped: {why}");
                skipped.push(format!("namespace {nsid}: {why}"));
            }
        }
    }
    if namespaces.is_empty() && !skipped.is_empty() {
        return Err(Error::Unsupported(format!("no namespace this host can use ({})", skipped.join("; "))));
    }
    Ok((identify, namespaces))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ugds_nvme::Lba;

    #[test]
    fn granted_queues_never_wrap() {
        assert_eq!(queues_granted(0x0003_0007, 8), 4);
        assert_eq!(queues_granted(0x0007_0007, 4), 4);
        // 65,536 granted: more than a u16 holds, not zero.
        assert_eq!(queues_granted(0xffff_ffff, 16), 16);
        assert_eq!(queues_granted(0xffff_ffff, u16::MAX), u16::MAX);
    }

    #[test]
    fn a_commands_data_is_sized_by_its_namespace_and_opcode() {
        let blocks = [(1, 512), (2, 4096)];
        let rw = |op, nsid, nlb| Sqe::rw(op, Cid(0), Nsid(nsid), Lba(0), nlb, 0, 0);
        assert_eq!(command_data(&rw(NvmOpcode::Read, 1, 8), &blocks), Some((false, 4096)));
        assert_eq!(command_data(&rw(NvmOpcode::Write, 2, 3), &blocks), Some((true, 3 * 4096)));
        // A namespace the queue does not know moves nothing (the target
        // answers Invalid Namespace); nor do Flush and Write Zeroes.
        assert_eq!(command_data(&rw(NvmOpcode::Read, 9, 8), &blocks), None);
        assert_eq!(command_data(&Sqe::flush(Cid(0), Nsid(1)), &blocks), None);
        assert_eq!(command_data(&Sqe::write_zeroes(Cid(0), Nsid(1), Lba(0), 8), &blocks), None);
        // Dataset Management: its ranges, 16 bytes each (NR is zero-based).
        let dsm = Sqe::dataset_management(Cid(0), Nsid(1), 3, 0x1000, true);
        assert_eq!(command_data(&dsm, &blocks), Some((true, 48)));
    }
}
