//! NVMe over TCP, the host side: a connection to a target (Linux's nvmet-tcp,
//! SPDK's, an array's), its handshake, commands as capsules and their data
//! and completions as PDUs (`ugds_nvme::tcp`), every receive bounded by the
//! connection's timeout. On it, the admin queue: Fabrics Connect, the
//! controller's registers through Property Get and Set, and admin commands
//! with their data (Identify).
//!
//! - [`probe`]: connect the admin queue, enable the controller, identify it
//!   and its namespaces, and leave (`ugds identify --tcp`).
//! - [`TcpController`]: a controller for the engine (`Driver::open_tcp`),
//!   with Keep Alive on a timer, whose I/O queues ([`TcpQueue`]) are one
//!   connection each.

mod controller;
mod queue;

pub use controller::TcpController;
pub use queue::TcpQueue;

use super::fabrics::{self as shared, Broken, Capsules, Names};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};
use ugds_nvme::fabrics::CNTLID_DYNAMIC;
use ugds_nvme::regs::{self, Cap, Version};
use ugds_nvme::tcp::{self, CommonHeader, Digests, Framing, Pdu, PduError};
use ugds_nvme::{Cid, Cqe, IdentifyController, Sqe};
use ugds_platform::{Error, Result};

/// The most bytes one PDU from the target may have: a C2HData of up to
/// 1 MiB and its header, digests and padding.
const MAX_PDU: u32 = (1 << 20) + 256;

/// Where a target is and how to talk to it.
#[derive(Clone, Debug)]
pub struct TcpTarget {
    /// `host:port` (4420 is NVMe/TCP's port).
    pub addr: String,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// The host's NQN.
    pub hostnqn: String,
    /// The host's identifier.
    pub hostid: [u8; 16],
    /// The digests to ask for.
    pub digests: Digests,
    /// The longest any connect, send or receive may take.
    pub timeout: Duration,
    /// The keep-alive timeout asked for at Connect (Keep Alive goes every
    /// half of it); zero: none asked for, none sent.
    pub keep_alive: Duration,
}

impl TcpTarget {
    pub(crate) fn names(&self) -> Names<'_> {
        Names {
            addr: &self.addr,
            subnqn: &self.subnqn,
            hostnqn: &self.hostnqn,
            hostid: self.hostid,
            timeout: self.timeout,
            keep_alive: self.keep_alive,
        }
    }

    /// A target at `addr` exporting `subnqn`, with this host named by a
    /// fixed NQN, no digests, a 10-second timeout.
    pub fn new(addr: &str, subnqn: &str) -> TcpTarget {
        TcpTarget {
            addr: addr.to_string(),
            subnqn: subnqn.to_string(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:75676473-0000-4000-8000-000000000001".into(),
            hostid: [0x75, 0x67, 0x64, 0x73, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 1],
            digests: Digests::default(),
            timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(30),
        }
    }
}

/// One NVMe/TCP connection (one queue).
#[derive(Debug)]
pub struct TcpConnection {
    stream: TcpStream,
    addr: String,
    framing: Framing,
    maxh2cdata: u32,
    timeout: Duration,
    qid: u16,
    next_cid: u16,
    out: Vec<u8>,
    pdu: Vec<u8>,
    /// Why the connection can no longer be used (an error left it between
    /// PDUs, or the target closed it).
    broken: Broken,
}

impl TcpConnection {
    /// Connects to `t` and does the handshake (ICReq, ICResp): digests
    /// granted only as asked, the connect and the handshake together
    /// bounded by `t.timeout` (a target that trickles its ICResp does not
    /// get a timeout per byte).
    pub fn connect(t: &TcpTarget, qid: u16) -> Result<TcpConnection> {
        let deadline = Instant::now() + t.timeout;
        let addr = t
            .addr
            .to_socket_addrs()
            .map_err(|e| os(&format!("resolving {}", t.addr), e))?
            .next()
            .ok_or_else(|| Error::InvalidArgument(format!("{}: no address", t.addr)))?;
        let stream =
            TcpStream::connect_timeout(&addr, t.timeout).map_err(|e| os(&format!("connecting to {addr}"), e))?;
        stream.set_nodelay(true).map_err(|e| os("TCP_NODELAY", e))?;
        stream.set_read_timeout(Some(t.timeout)).map_err(|e| os("SO_RCVTIMEO", e))?;
        stream.set_write_timeout(Some(t.timeout)).map_err(|e| os("SO_SNDTIMEO", e))?;
        let mut c = TcpConnection {
            stream,
            addr: t.addr.clone(),
            framing: Framing::default(),
            maxh2cdata: 0,
            timeout: t.timeout,
            qid,
            next_cid: 0,
            out: Vec::new(),
            pdu: Vec::new(),
            broken: Broken::default(),
        };
        c.send_raw(&tcp::ic_req(0, t.digests, 0), deadline)?;
        let mut resp = [0u8; tcp::IC_LEN];
        c.read_exact(&mut resp, None, deadline)?;
        let ic = tcp::parse_ic_resp(&resp, t.digests).map_err(|e| c.protocol(e))?;
        c.framing = Framing { digests: ic.digests, cpda: ic.cpda };
        c.maxh2cdata = ic.maxh2cdata;
        Ok(c)
    }

    /// The digests in use.
    pub fn digests(&self) -> Digests {
        self.framing.digests
    }

    /// The stream, the framing and MAXH2CDATA, for an I/O queue to take
    /// over.
    fn into_parts(self) -> (TcpStream, Framing, u32) {
        (self.stream, self.framing, self.maxh2cdata)
    }

    fn protocol(&self, e: PduError) -> Error {
        Error::Platform(format!("NVMe/TCP from {}: {e}; the connection is closed", self.addr))
    }

    /// Sends all of `b` by `deadline`.
    fn send_raw(&mut self, mut b: &[u8], deadline: Instant) -> Result<()> {
        while !b.is_empty() {
            let left = self.left(deadline, None)?;
            self.stream.set_write_timeout(Some(left)).map_err(|e| os("SO_SNDTIMEO", e))?;
            match self.stream.write(b) {
                Ok(0) => return Err(self.io_error("sending to", std::io::ErrorKind::WriteZero.into())),
                Ok(n) => b = &b[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(self.io_error("sending to", e)),
            }
        }
        Ok(())
    }

    /// The time left until `deadline`, or the timeout's error naming the
    /// command waited for (`cid`).
    fn left(&self, deadline: Instant, cid: Option<Cid>) -> Result<Duration> {
        match deadline.checked_duration_since(Instant::now()) {
            Some(d) if !d.is_zero() => Ok(d),
            _ => Err(Error::Timeout { qid: self.qid, cid, after: self.timeout }),
        }
    }

    /// A failed send or receive: a closed or reset connection says so.
    fn io_error(&self, what: &str, e: std::io::Error) -> Error {
        use std::io::ErrorKind::*;
        match e.kind() {
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => {
                Error::Platform(format!("NVMe/TCP: {} closed the connection ({e})", self.addr))
            }
            _ => os(&format!("{what} {}", self.addr), e),
        }
    }

    /// Reads exactly `b.len()` bytes by `deadline` (however the target
    /// spreads them); a timeout names the command waited for (`cid`), a
    /// closed connection says so.
    fn read_exact(&mut self, mut b: &mut [u8], cid: Option<Cid>, deadline: Instant) -> Result<()> {
        while !b.is_empty() {
            let left = self.left(deadline, cid)?;
            self.stream.set_read_timeout(Some(left)).map_err(|e| os("SO_RCVTIMEO", e))?;
            match self.stream.read(b) {
                Ok(0) => return Err(self.io_error("receiving from", std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => b = &mut b[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(self.io_error("receiving from", e)),
            }
        }
        Ok(())
    }

    fn exchange(&mut self, mut sqe: Sqe, data_out: &[u8], data_in: &mut [u8]) -> Result<Cqe> {
        let cid = Cid(self.next_cid);
        self.next_cid = self.next_cid.wrapping_add(1) % 0xffff;
        sqe.set_cid(cid);
        // Every command over fabrics describes its data with an SGL (PSDT
        // 01b), none too: nvmet refuses a PRP command as Invalid Field.
        sqe = if !data_out.is_empty() {
            sqe.with_in_capsule_data(data_out.len() as u32)
        } else {
            sqe.with_transport_data(data_in.len() as u32)
        };
        self.out.clear();
        tcp::capsule_cmd(&mut self.out, &sqe, data_out, self.framing);
        // One deadline for the whole exchange: the capsule, then every PDU
        // until the completion, however the target spreads its bytes.
        let deadline = Instant::now() + self.timeout;
        let out = std::mem::take(&mut self.out);
        let r = self.send_raw(&out, deadline);
        self.out = out;
        r?;
        let mut got = 0usize;
        loop {
            let mut ch = [0u8; tcp::CH_LEN];
            self.read_exact(&mut ch, Some(cid), deadline)?;
            let len = CommonHeader::parse(&ch).pdu_len(MAX_PDU).map_err(|e| self.protocol(e))?;
            let mut pdu = std::mem::take(&mut self.pdu);
            pdu.clear();
            pdu.extend_from_slice(&ch);
            pdu.resize(len, 0);
            let r = self.read_exact(&mut pdu[tcp::CH_LEN..], Some(cid), deadline);
            let done = r.and_then(|()| match tcp::parse(&pdu, self.framing.digests).map_err(|e| self.protocol(e))? {
                Pdu::CapsuleResp(cqe) if cqe.cid == cid.0 => Ok(Some(cqe)),
                Pdu::C2HData { cccid, datao, data, last, success } if cccid == cid.0 => {
                    let (at, want) = (datao as usize, data_in.len());
                    let Some(dst) = data_in.get_mut(at..at + data.len()) else {
                        return Err(self.protocol(PduError::Field(format!(
                            "C2HData of {} bytes at {at} for a command of {} bytes",
                            data.len(),
                            data_in.len()
                        ))));
                    };
                    // In order, each byte once (as on an I/O queue).
                    if at != got || (last && at + data.len() != want) {
                        return Err(self.protocol(PduError::Field(format!(
                            "C2HData of {} bytes at {at}{} for command {:#06x}, whose next byte due is {got} of {want}",
                            data.len(),
                            if last { " marked last" } else { "" },
                            cid.0,
                        ))));
                    }
                    dst.copy_from_slice(data);
                    got += data.len();
                    // SUCCESS: the command succeeded and no response follows.
                    Ok((last && success).then_some(Cqe { dw0: 0, dw1: 0, sqhd: 0, sqid: 0, cid: cid.0, status: 0 }))
                }
                Pdu::TermReq { fes, fei } => Err(Error::Platform(format!(
                    "NVMe/TCP: {} ended the connection (FES {fes:#x}, FEI {fei:#x})",
                    self.addr
                ))),
                other => {
                    Err(self.protocol(PduError::Field(format!("while waiting for command {:#06x}: {other:?}", cid.0))))
                }
            });
            self.pdu = pdu;
            if let Some(cqe) = done? {
                if cqe.is_success() && got != data_in.len() {
                    return Err(self.protocol(PduError::Field(format!(
                        "command {:#06x} completed with {got} of its {} bytes of data",
                        cid.0,
                        data_in.len()
                    ))));
                }
                return Ok(cqe);
            }
        }
    }
}

impl Capsules for TcpConnection {
    /// Runs one command: its capsule (with `data_out` in it, where the
    /// command sends data), then the target's PDUs until its completion,
    /// copying C2HData into `data_in`. Returns the completion (a failed
    /// status is the caller's to judge); a PDU that breaks the protocol
    /// (another command's, data outside `data_in`, an R2T for a command that
    /// sent its data in the capsule, a bad digest) or a target that ends
    /// the connection is an error.
    fn execute(&mut self, sqe: Sqe, data_out: &[u8], data_in: &mut [u8]) -> Result<Cqe> {
        self.broken.check(|| format!("NVMe/TCP to {}: the connection", self.addr))?;
        let r = self.exchange(sqe, data_out, data_in);
        if let Err(e) = &r {
            // Whatever was half read or half sent stays so: the connection
            // is not used again.
            self.broken.set(e);
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
        r
    }
}

fn os(op: &str, e: std::io::Error) -> Error {
    Error::Os { op: op.to_string().into(), errno: e.raw_os_error().unwrap_or(libc::EIO) }
}

/// What [`probe`] found.
#[derive(Clone, Debug)]
pub struct FabricsProbe {
    /// The controller the target gave this host.
    pub cntlid: u16,
    /// Its capabilities.
    pub cap: Cap,
    /// Its version.
    pub version: Version,
    /// The digests the connection used.
    pub digests: Digests,
    /// Identify Controller.
    pub identify: IdentifyController,
    /// Active namespaces: (nsid, blocks, block size in bytes).
    pub namespaces: Vec<(u32, u64, u32)>,
}

/// Connects the admin queue of `t`, enables the controller, identifies it
/// and its active namespaces, shuts it down and disconnects.
pub fn probe(t: &TcpTarget) -> Result<FabricsProbe> {
    let mut c = TcpConnection::connect(t, 0)?;
    // No keep-alive: the probe leaves at once.
    let t = &TcpTarget { keep_alive: Duration::ZERO, ..t.clone() };
    let n = t.names();
    let cntlid = shared::connect_queue(&mut c, &n, 0, 32, CNTLID_DYNAMIC)?;
    let cap = shared::read_cap(&mut c, &n)?;
    let version = Version(c.property_get(regs::VS, false)? as u32);
    shared::enable(&mut c, &n, cap)?;
    let (identify, namespaces) = shared::identify(&mut c)?;
    // A normal shutdown; the connection closes when `c` goes.
    let _ = shared::shut_down(&mut c);
    Ok(FabricsProbe { cntlid, cap, version, digests: c.digests(), identify, namespaces })
}

#[cfg(test)]
mod gpu_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use ugds_nvme::fabrics;
    use ugds_nvme::tcp::{flags, pdu_type};
    use ugds_nvme::{IdentifyNamespace, LbaFormat, IDENTIFY_LEN};

    /// How the test target misbehaves.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Fault {
        None,
        /// Closes the connection after the handshake.
        CloseAfterHandshake,
        /// Never answers Connect.
        Silent,
        /// Identify's data with a wrong data digest.
        BadDataDigest,
        /// Answers Identify with a PDU type a controller never sends.
        WrongType,
        /// Identify's data beyond the command's length.
        DataOutOfRange,
        /// Identify's data as two PDUs both at offset 0, then SUCCESS.
        DataOverlap,
        /// The ICResp one byte every 50 ms (6.4 s in all).
        TrickleIcResp,
        /// Identify's PDU one byte every 20 ms (about 80 s in all).
        TrickleIdentify,
        /// CAP.MQES 0.
        Mqes0,
    }

    /// Writes `b` one byte at a time, `gap` apart; false once the host has
    /// gone.
    fn trickle(s: &mut std::net::TcpStream, b: &[u8], gap: Duration) -> bool {
        b.iter().all(|&x| {
            std::thread::sleep(gap);
            s.write_all(&[x]).is_ok()
        })
    }

    /// A target of one controller with one namespace (2048 blocks of 512
    /// bytes), on 127.0.0.1, speaking NVMe/TCP as far as `probe` needs: a
    /// test double for nvmet (the QEMU guest runs the real one).
    fn target(fault: Fault, grant: Digests) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut icreq = [0u8; tcp::IC_LEN];
            s.read_exact(&mut icreq).unwrap();
            let mut resp = [0u8; tcp::IC_LEN];
            let ch = CommonHeader { pdu_type: pdu_type::IC_RESP, flags: 0, hlen: 128, pdo: 0, plen: 128 };
            resp[..8].copy_from_slice(&ch.to_bytes());
            resp[11] = grant.header as u8 | (grant.data as u8) << 1;
            resp[12..16].copy_from_slice(&65536u32.to_le_bytes());
            if fault == Fault::TrickleIcResp {
                trickle(&mut s, &resp, Duration::from_millis(50));
                return;
            }
            s.write_all(&resp).unwrap();
            if fault == Fault::CloseAfterHandshake {
                return;
            }
            let hd = if grant.header { 4 } else { 0 };
            let mut ready = false;
            loop {
                let mut ch = [0u8; 8];
                if s.read_exact(&mut ch).is_err() {
                    return;
                }
                let ch = CommonHeader::parse(&ch);
                let mut rest = vec![0u8; ch.plen as usize - 8];
                s.read_exact(&mut rest).unwrap();
                assert_eq!(ch.pdu_type, pdu_type::CAPSULE_CMD);
                let sqe: [u8; 64] = rest[..64].try_into().unwrap();
                let (opc, cid) = (sqe[0], u16::from_le_bytes([sqe[2], sqe[3]]));
                let dw = |i: usize| u32::from_le_bytes(sqe[i..i + 4].try_into().unwrap());
                if fault == Fault::Silent {
                    std::thread::sleep(Duration::from_secs(5));
                    return;
                }
                let mut respond = |dw0: u32, dw1: u32| {
                    let mut h = vec![0u8; 24];
                    h[0] = pdu_type::CAPSULE_RESP;
                    h[1] = if grant.header { flags::HDGSTF } else { 0 };
                    h[2] = 24;
                    h[4..8].copy_from_slice(&(24 + hd as u32).to_le_bytes());
                    h[8..12].copy_from_slice(&dw0.to_le_bytes());
                    h[12..16].copy_from_slice(&dw1.to_le_bytes());
                    h[20..22].copy_from_slice(&cid.to_le_bytes());
                    if grant.header {
                        let d = tcp::digest(&h);
                        h.extend_from_slice(&d);
                    }
                    s.write_all(&h).unwrap();
                };
                match (opc, sqe[4]) {
                    (0x7f, fabrics::fctype::CONNECT) => respond(1, 0),
                    (0x7f, fabrics::fctype::PROPERTY_GET) => {
                        let v: u64 = match dw(44) as usize {
                            regs::CAP if fault == Fault::Mqes0 => 1 << 37,
                            regs::CAP => 0x0000_0020_0000_07ff | 1 << 37, // MQES 2047, TO 0, CSS NVM
                            regs::VS => 0x0002_0000,
                            regs::CSTS => ready as u64,
                            _ => 0,
                        };
                        respond(v as u32, (v >> 32) as u32)
                    }
                    (0x7f, fabrics::fctype::PROPERTY_SET) => {
                        ready = dw(48) & 1 == 1; // CC.EN
                        respond(0, 0)
                    }
                    (0x06, _) => {
                        let page: Vec<u8> = match dw(40) & 0xff {
                            1 => {
                                let mut id = IdentifyController::parse(&[0u8; IDENTIFY_LEN]);
                                id.mn = "ugds test target".into();
                                id.cntlid = 1;
                                id.to_bytes().to_vec()
                            }
                            2 => {
                                let mut p = vec![0u8; IDENTIFY_LEN];
                                p[0] = 1;
                                p
                            }
                            _ => {
                                let mut ns = IdentifyNamespace::parse(&[0u8; IDENTIFY_LEN]);
                                ns.nsze = 2048;
                                ns.lbaf = vec![LbaFormat { ms: 0, lbads: 9, rp: 0 }];
                                ns.to_bytes().to_vec()
                            }
                        };
                        if fault == Fault::DataOverlap {
                            // Two halves, both at offset 0: the second half
                            // of the page never lands.
                            for (i, half) in page.chunks(page.len() / 2).enumerate() {
                                let mut h = vec![0u8; 24];
                                h[0] = pdu_type::C2H_DATA;
                                h[1] = if i == 1 { flags::LAST_PDU | flags::SUCCESS } else { 0 };
                                h[2] = 24;
                                h[3] = 24;
                                h[4..8].copy_from_slice(&((24 + half.len()) as u32).to_le_bytes());
                                h[8..10].copy_from_slice(&cid.to_le_bytes());
                                h[16..20].copy_from_slice(&(half.len() as u32).to_le_bytes());
                                h.extend_from_slice(half);
                                s.write_all(&h).unwrap();
                            }
                            continue;
                        }
                        let datal = if fault == Fault::DataOutOfRange { 8192 } else { page.len() };
                        let data = if datal > page.len() { vec![0u8; datal] } else { page };
                        let dd = if grant.data { 4 } else { 0 };
                        let mut h = vec![0u8; 24];
                        h[0] = if fault == Fault::WrongType { pdu_type::H2C_DATA } else { pdu_type::C2H_DATA };
                        h[1] = flags::LAST_PDU
                            | flags::SUCCESS
                            | if grant.header { flags::HDGSTF } else { 0 }
                            | if grant.data { flags::DDGSTF } else { 0 };
                        h[2] = 24;
                        h[3] = (24 + hd) as u8;
                        h[4..8].copy_from_slice(&((24 + hd + datal + dd) as u32).to_le_bytes());
                        h[8..10].copy_from_slice(&cid.to_le_bytes());
                        h[16..20].copy_from_slice(&(datal as u32).to_le_bytes());
                        if grant.header {
                            let d = tcp::digest(&h);
                            h.extend_from_slice(&d);
                        }
                        h.extend_from_slice(&data);
                        if grant.data {
                            let mut d = tcp::digest(&data);
                            if fault == Fault::BadDataDigest {
                                d[0] ^= 1;
                            }
                            h.extend_from_slice(&d);
                        }
                        if fault == Fault::TrickleIdentify {
                            trickle(&mut s, &h, Duration::from_millis(20));
                            return;
                        }
                        s.write_all(&h).unwrap();
                    }
                    other => panic!("the test target got {other:?}"),
                }
            }
        });
        addr
    }

    fn t(addr: &str, digests: Digests) -> TcpTarget {
        TcpTarget { digests, timeout: Duration::from_millis(500), ..TcpTarget::new(addr, "nqn.2026-12.io.ugds:test") }
    }

    #[test]
    fn probe_connects_enables_and_identifies() {
        for d in [Digests::default(), Digests { header: true, data: true }] {
            let p = probe(&t(&target(Fault::None, d), d)).unwrap();
            assert_eq!(p.cntlid, 1);
            assert_eq!(p.cap.mqes(), 2047);
            assert_eq!(p.identify.mn, "ugds test target");
            assert_eq!(p.namespaces, vec![(1, 2048, 512)]);
            assert_eq!(p.digests, d);
        }
    }

    /// A target that sends a little now and then gets one deadline for
    /// the handshake and one per admin exchange, not one per receive.
    #[test]
    fn a_trickling_target_meets_one_deadline_per_exchange() {
        for fault in [Fault::TrickleIcResp, Fault::TrickleIdentify] {
            let started = Instant::now();
            let e = probe(&t(&target(fault, Digests::default()), Digests::default())).unwrap_err();
            assert!(matches!(e, Error::Timeout { qid: 0, .. }), "{e}");
            // 500 ms each; a per-receive timeout would wait for all of it
            // (6.4 s, 80 s).
            assert!(started.elapsed() < Duration::from_secs(3), "{fault:?} took {:?}", started.elapsed());
        }
    }

    #[test]
    fn a_target_that_breaks_the_protocol_is_an_error_never_a_hang() {
        let both = Digests { header: true, data: true };
        let e = probe(&t(&target(Fault::CloseAfterHandshake, both), both)).unwrap_err();
        assert!(e.to_string().contains("closed the connection"), "{e}");
        let started = Instant::now();
        let e = probe(&t(&target(Fault::Silent, both), both)).unwrap_err();
        assert!(matches!(e, Error::Timeout { qid: 0, .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(3), "bounded by the timeout");
        let e = probe(&t(&target(Fault::BadDataDigest, both), both)).unwrap_err();
        assert!(e.to_string().contains("data digest mismatch"), "{e}");
        let e = probe(&t(&target(Fault::WrongType, both), both)).unwrap_err();
        assert!(e.to_string().contains("unexpected PDU type 0x06"), "{e}");
        let e = probe(&t(&target(Fault::DataOutOfRange, Digests::default()), Digests::default())).unwrap_err();
        assert!(e.to_string().contains("for a command of 4096 bytes"), "{e}");
        // Identify's page in two halves at the same offset: not a page.
        let e = probe(&t(&target(Fault::DataOverlap, Digests::default()), Digests::default())).unwrap_err();
        assert!(
            e.to_string().contains("at 0 marked last for command") && e.to_string().contains("next byte due is 2048"),
            "{e}"
        );
        let e = probe(&t(&target(Fault::Mqes0, both), both)).unwrap_err();
        assert!(e.to_string().contains("CAP.MQES is 0"), "{e}");
        // Digests granted that were not asked for.
        let e = probe(&t(&target(Fault::None, both), Digests::default())).unwrap_err();
        assert!(e.to_string().contains("digests"), "{e}");
        // Nobody listening.
        let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        assert!(matches!(probe(&t(&free, both)), Err(Error::Os { .. })));
    }
}
