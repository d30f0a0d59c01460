//! An NVMe/TCP target emulated in-process, on 127.0.0.1: the test double
//! for a fabrics controller (Linux's nvmet-tcp is the real one, run in the
//! QEMU guest). One controller of one memory-backed namespace; a thread per
//! connection; the admin commands an initiator needs (Connect, Property Get
//! and Set, Identify, Set Features Number of Queues, Keep Alive, Abort) and
//! the I/O commands (Read, Write, Flush, Write Zeroes, Dataset Management).
//!
//! Reads answer with C2HData PDUs of at most [`EmuTcpConfig::c2h_chunk`]
//! bytes, the last with SUCCESS (no CapsuleResp) or followed by one, in
//! turn; writes carry their data in the capsule up to the in-capsule size,
//! else are asked for it with one R2T, answered by H2CData PDUs of at most
//! MAXH2CDATA. Header and data digests as the host asks. What the host
//! sends is checked (lengths, tags, offsets, digests) and counted
//! ([`EmuTcpStats::host_errors`]); a fault ([`TcpFault`]) makes the target
//! misbehave once on an I/O queue.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use ugds_nvme::tcp::{self, flags, pdu_type, CommonHeader, Digests};
use ugds_nvme::{IdentifyController, IdentifyNamespace, LbaFormat, IDENTIFY_LEN};
use ugds_platform::Recover;

/// What the target is.
#[derive(Clone, Debug)]
pub struct EmuTcpConfig {
    /// The namespace: blocks and block size.
    pub blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// The most bytes of one H2CData PDU (MAXH2CDATA).
    pub maxh2cdata: u32,
    /// Bytes of write data an I/O command's capsule may carry.
    pub in_capsule: u32,
    /// The most bytes of one C2HData PDU.
    pub c2h_chunk: u32,
    /// I/O queues granted at most.
    pub max_queues: u16,
    /// CAP.MQES as reported (zero-based entries per queue; 0 is invalid,
    /// for a host to refuse).
    pub mqes: u16,
    /// NSZE as Identify Namespace reports it, when it should differ from
    /// `blocks` (a size no host should believe).
    pub reported_nsze: Option<u64>,
    /// How long Keep Alive takes to be answered (a slow admin queue).
    pub keep_alive_delay: std::time::Duration,
}

impl Default for EmuTcpConfig {
    fn default() -> EmuTcpConfig {
        EmuTcpConfig {
            blocks: 16384,
            block_size: 4096,
            maxh2cdata: 32 << 10,
            in_capsule: 8192,
            c2h_chunk: 64 << 10,
            max_queues: 8,
            mqes: 127,
            reported_nsze: None,
            keep_alive_delay: std::time::Duration::ZERO,
        }
    }
}

/// A misbehaviour, once, on the next I/O command of any I/O queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TcpFault {
    /// Behave.
    None,
    /// A read's C2HData with a wrong data digest (with data digests on;
    /// a wrong header digest otherwise).
    BadDigest,
    /// A read's C2HData beyond the command's data.
    DataOutOfRange,
    /// Close the connection instead of answering (the target removed, the
    /// connection reset).
    Reset,
    /// Never answer (the command stays outstanding).
    Silent,
    /// A read's data as two PDUs of half its length, both at offset 0,
    /// then success: the second half never lands.
    DataOverlap,
    /// A read's second half sent twice and its first half never, then
    /// success.
    DataRepeated,
    /// A write's R2T sent again after its data came, asking for the same
    /// bytes (a target that asks for ever, bounded at 400 here).
    R2tRepeated,
}

/// What the target saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmuTcpStats {
    /// Connections accepted.
    pub connections: u64,
    /// Read and Write commands.
    pub reads: u64,
    /// Writes.
    pub writes: u64,
    /// Writes whose data came in the capsule.
    pub in_capsule_writes: u64,
    /// R2Ts sent.
    pub r2ts: u64,
    /// H2CData PDUs received.
    pub h2c_pdus: u64,
    /// Bytes of data in them.
    pub h2c_bytes: u64,
    /// Keep Alive commands.
    pub keep_alives: u64,
    /// PDUs from the host that broke the protocol (the target's error
    /// counter: a correct initiator leaves it at zero).
    pub host_errors: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    in_capsule_writes: AtomicU64,
    r2ts: AtomicU64,
    h2c_pdus: AtomicU64,
    h2c_bytes: AtomicU64,
    keep_alives: AtomicU64,
    host_errors: AtomicU64,
}

struct Shared {
    cfg: EmuTcpConfig,
    nqn: String,
    data: Mutex<Vec<u8>>,
    fault: Mutex<TcpFault>,
    /// CC as the host last set it.
    cc: Mutex<u32>,
    counters: Counters,
    stop: AtomicBool,
}

/// The target; see the module docs. Stops listening when dropped
/// (connections end when their hosts close them).
pub struct EmuTcpTarget {
    addr: String,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EmuTcpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuTcpTarget").field("addr", &self.addr).field("stats", &self.stats()).finish()
    }
}

/// The subsystem NQN the target exports.
pub const EMU_TCP_NQN: &str = "nqn.2026-12.io.ugds:emulated-tcp";

impl EmuTcpTarget {
    /// Listens on 127.0.0.1 (a free port).
    pub fn start(cfg: EmuTcpConfig) -> std::io::Result<EmuTcpTarget> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?.to_string();
        let bytes = cfg.blocks as usize * cfg.block_size as usize;
        let shared = Arc::new(Shared {
            cfg,
            nqn: EMU_TCP_NQN.into(),
            data: Mutex::new(vec![0u8; bytes]),
            fault: Mutex::new(TcpFault::None),
            cc: Mutex::new(0),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        std::thread::Builder::new().name("ugds-emu-tcp".into()).spawn(move || {
            for conn in l.incoming() {
                if s.stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                s.counters.connections.fetch_add(1, Ordering::Relaxed);
                let s = s.clone();
                let _ = std::thread::Builder::new().name("ugds-emu-tcp-conn".into()).spawn(move || {
                    if let Err(e) = serve(conn, &s) {
                        tracing::debug!("emulated NVMe/TCP target: connection ended: {e}");
                    }
                });
            }
        })?;
        Ok(EmuTcpTarget { addr, shared })
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The subsystem's NQN.
    pub fn nqn(&self) -> &str {
        &self.shared.nqn
    }

    /// Misbehaves once, as `f` says, on the next I/O command.
    pub fn set_fault(&self, f: TcpFault) {
        *self.shared.fault.lock().recover() = f;
    }

    /// What the target saw.
    pub fn stats(&self) -> EmuTcpStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EmuTcpStats {
            connections: get(&c.connections),
            reads: get(&c.reads),
            writes: get(&c.writes),
            in_capsule_writes: get(&c.in_capsule_writes),
            r2ts: get(&c.r2ts),
            h2c_pdus: get(&c.h2c_pdus),
            h2c_bytes: get(&c.h2c_bytes),
            keep_alives: get(&c.keep_alives),
            host_errors: get(&c.host_errors),
        }
    }

    /// `len` bytes of the namespace at byte `offset`.
    pub fn read_back(&self, offset: usize, len: usize) -> Vec<u8> {
        self.shared.data.lock().recover()[offset..offset + len].to_vec()
    }

    /// Writes `bytes` into the namespace at byte `offset`.
    pub fn fill(&self, offset: usize, bytes: &[u8]) {
        self.shared.data.lock().recover()[offset..offset + bytes.len()].copy_from_slice(bytes);
    }
}

impl Drop for EmuTcpTarget {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wakes the accepting thread to see the flag.
        let _ = TcpStream::connect(&self.addr);
    }
}

type Res<T> = Result<T, String>;

/// One connection.
struct Conn<'a> {
    s: TcpStream,
    sh: &'a Shared,
    digests: Digests,
    qid: u16,
    ttag: u16,
    /// Responses so far (every other read ends with SUCCESS in its data).
    reads: u64,
    /// Commands that came while a write's data was awaited, in order.
    pending: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
}

fn serve(s: TcpStream, sh: &Shared) -> Res<()> {
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut c = Conn { s, sh, digests: Digests::default(), qid: 0, ttag: 0, reads: 0, pending: Default::default() };
    let mut icreq = [0u8; tcp::IC_LEN];
    c.s.read_exact(&mut icreq).map_err(|e| e.to_string())?;
    if icreq[0] != pdu_type::IC_REQ {
        return Err("no ICReq".into());
    }
    c.digests = Digests { header: icreq[11] & 1 != 0, data: icreq[11] & 2 != 0 };
    let mut resp = [0u8; tcp::IC_LEN];
    let ch = CommonHeader { pdu_type: pdu_type::IC_RESP, flags: 0, hlen: 128, pdo: 0, plen: 128 };
    resp[..8].copy_from_slice(&ch.to_bytes());
    resp[11] = icreq[11] & 3;
    resp[12..16].copy_from_slice(&sh.cfg.maxh2cdata.to_le_bytes());
    c.s.write_all(&resp).map_err(|e| e.to_string())?;
    loop {
        let (hdr, data) = match c.pending.pop_front() {
            Some(p) => p,
            None => c.recv()?,
        };
        if hdr[0] != pdu_type::CAPSULE_CMD {
            return c.host_error(format!("PDU type {:#x} where a command was due", hdr[0]));
        }
        let sqe: [u8; 64] = hdr[8..72].try_into().expect("64 bytes");
        c.command(&sqe, data)?;
    }
}

fn le32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("four bytes"))
}

impl Conn<'_> {
    /// The next PDU from the host: its header (without digest) and data
    /// (without digest), digests checked.
    fn recv(&mut self) -> Res<(Vec<u8>, Vec<u8>)> {
        let mut ch = [0u8; 8];
        self.s.read_exact(&mut ch).map_err(|e| e.to_string())?;
        let h = CommonHeader::parse(&ch);
        if (h.plen as usize) < h.hlen as usize || h.plen > (16 << 20) {
            return self.host_error(format!("PDU length {}", h.plen));
        }
        let mut pdu = ch.to_vec();
        pdu.resize(h.plen as usize, 0);
        self.s.read_exact(&mut pdu[8..]).map_err(|e| e.to_string())?;
        let hlen = h.hlen as usize;
        let hd = if self.digests.header { 4 } else { 0 };
        let header_ok = |pdu: &[u8]| {
            h.flags & flags::HDGSTF != 0 && pdu.len() >= hlen + 4 && pdu[hlen..hlen + 4] == tcp::digest(&pdu[..hlen])
        };
        if self.digests.header && !header_ok(&pdu) {
            return self.host_error("header digest".into());
        }
        let data = if h.pdo != 0 {
            let dd = if self.digests.data { 4 } else { 0 };
            let (pdo, end) = (h.pdo as usize, pdu.len() - dd);
            if pdo < hlen + hd || pdo > end {
                return self.host_error(format!("data offset {pdo}"));
            }
            if self.digests.data && (h.flags & flags::DDGSTF == 0 || pdu[end..] != tcp::digest(&pdu[pdo..end])) {
                return self.host_error("data digest".into());
            }
            pdu[pdo..end].to_vec()
        } else {
            Vec::new()
        };
        pdu.truncate(hlen);
        Ok((pdu, data))
    }

    fn host_error<T>(&self, what: String) -> Res<T> {
        self.sh.counters.host_errors.fetch_add(1, Ordering::Relaxed);
        Err(format!("the host broke the protocol: {what}"))
    }

    /// A PDU's bytes: `hdr` (its common header filled in here), its
    /// digest, `data`, its digest.
    fn pdu(&self, mut hdr: Vec<u8>, data: &[u8], pflags: u8) -> Vec<u8> {
        let hlen = hdr.len();
        let hd = if self.digests.header { 4 } else { 0 };
        let dd = if self.digests.data && !data.is_empty() { 4 } else { 0 };
        let pdo = if data.is_empty() { 0 } else { hlen + hd };
        let plen = hlen + hd + data.len() + dd;
        let mut f = pflags;
        if hd > 0 {
            f |= flags::HDGSTF;
        }
        if dd > 0 {
            f |= flags::DDGSTF;
        }
        let ch = CommonHeader { pdu_type: hdr[0], flags: f, hlen: hlen as u8, pdo: pdo as u8, plen: plen as u32 };
        hdr[..8].copy_from_slice(&ch.to_bytes());
        if hd > 0 {
            let d = tcp::digest(&hdr);
            hdr.extend_from_slice(&d);
        }
        hdr.extend_from_slice(data);
        if dd > 0 {
            hdr.extend_from_slice(&tcp::digest(data));
        }
        hdr
    }

    fn send(&mut self, b: &[u8]) -> Res<()> {
        self.s.write_all(b).map_err(|e| e.to_string())
    }

    fn respond(&mut self, cid: u16, status: u16, dw0: u32, dw1: u32) -> Res<()> {
        let mut h = vec![0u8; 24];
        h[0] = pdu_type::CAPSULE_RESP;
        h[8..12].copy_from_slice(&dw0.to_le_bytes());
        h[12..16].copy_from_slice(&dw1.to_le_bytes());
        h[18..20].copy_from_slice(&self.qid.to_le_bytes());
        h[20..22].copy_from_slice(&cid.to_le_bytes());
        h[22..24].copy_from_slice(&(status << 1).to_le_bytes());
        let b = self.pdu(h, &[], 0);
        self.send(&b)
    }

    /// C2HData for command `cid`: `data` in chunks, then a CapsuleResp
    /// (or SUCCESS on the last chunk, every other time).
    fn send_data(&mut self, cid: u16, data: &[u8], fault: TcpFault) -> Res<()> {
        if matches!(fault, TcpFault::DataOverlap | TcpFault::DataRepeated) && data.len() >= 2 {
            return self.send_misplaced(cid, data, fault);
        }
        self.reads += 1;
        let with_success = self.reads % 2 == 0;
        let chunk = self.sh.cfg.c2h_chunk.max(1) as usize;
        let mut off = 0;
        while off < data.len() {
            let n = chunk.min(data.len() - off);
            let last = off + n == data.len();
            let mut h = vec![0u8; 24];
            h[0] = pdu_type::C2H_DATA;
            h[8..10].copy_from_slice(&cid.to_le_bytes());
            let datao = if fault == TcpFault::DataOutOfRange { data.len() as u32 } else { off as u32 };
            h[12..16].copy_from_slice(&datao.to_le_bytes());
            h[16..20].copy_from_slice(&(n as u32).to_le_bytes());
            let f = if last && with_success {
                flags::LAST_PDU | flags::SUCCESS
            } else if last {
                flags::LAST_PDU
            } else {
                0
            };
            let mut b = self.pdu(h, &data[off..off + n], f);
            if fault == TcpFault::BadDigest {
                // One bit of the data digest off (of the header digest
                // without data digests; of the data without either).
                let at = if self.digests.data {
                    b.len() - 1
                } else if self.digests.header {
                    24
                } else {
                    b.len() - 1
                };
                b[at] ^= 1;
            }
            self.send(&b)?;
            off += n;
        }
        if !with_success {
            self.respond(cid, 0, 0, 0)?;
        }
        Ok(())
    }

    /// A read's data in two halves, placed wrong as `fault` says, the last
    /// PDU with SUCCESS.
    fn send_misplaced(&mut self, cid: u16, data: &[u8], fault: TcpFault) -> Res<()> {
        let half = data.len() / 2;
        let pieces: [(u32, &[u8]); 2] = match fault {
            TcpFault::DataOverlap => [(0, &data[..half]), (0, &data[half..])],
            _ => [(half as u32, &data[half..]), (half as u32, &data[half..])],
        };
        for (i, (datao, piece)) in pieces.into_iter().enumerate() {
            let mut h = vec![0u8; 24];
            h[0] = pdu_type::C2H_DATA;
            h[8..10].copy_from_slice(&cid.to_le_bytes());
            h[12..16].copy_from_slice(&datao.to_le_bytes());
            h[16..20].copy_from_slice(&(piece.len() as u32).to_le_bytes());
            let f = if i == 1 { flags::LAST_PDU | flags::SUCCESS } else { 0 };
            let b = self.pdu(h, piece, f);
            self.send(&b)?;
        }
        Ok(())
    }

    /// One command, with the data that came in its capsule.
    fn command(&mut self, sqe: &[u8; 64], data: Vec<u8>) -> Res<()> {
        let (opc, cid, nsid) = (sqe[0], u16::from_le_bytes([sqe[2], sqe[3]]), le32(sqe, 4));
        let dw = |i: usize| le32(sqe, 40 + 4 * i);
        // The data block descriptor: length and identifier.
        let (sgl_len, sgl_id) = (le32(sqe, 32), sqe[39]);
        // Over fabrics every command's data pointer is an SGL (PSDT 01b),
        // as nvmet insists.
        if sqe[1] >> 6 != 1 {
            self.sh.counters.host_errors.fetch_add(1, Ordering::Relaxed);
            return self.respond(cid, 0x02, 0, 0);
        }
        if self.qid == 0 && opc != 0x7f {
            return self.admin(opc, cid, sqe, &data);
        }
        if opc == 0x7f {
            return self.fabrics(cid, sqe, &data);
        }
        let fault = std::mem::replace(&mut *self.sh.fault.lock().recover(), TcpFault::None);
        match fault {
            TcpFault::Reset => {
                let _ = self.s.shutdown(std::net::Shutdown::Both);
                return Err("reset, as the fault asked".into());
            }
            TcpFault::Silent => return Ok(()),
            _ => {}
        }
        if nsid != 1 {
            return self.respond(cid, 0x0b, 0, 0);
        }
        let bs = self.sh.cfg.block_size as u64;
        let (slba, nlb) = (dw(0) as u64 | (dw(1) as u64) << 32, (dw(2) & 0xffff) as u64 + 1);
        let in_range = slba.checked_add(nlb).is_some_and(|e| e <= self.sh.cfg.blocks);
        let (off, len) = ((slba * bs) as usize, (nlb * bs) as usize);
        match opc {
            0x02 | 0x01 | 0x08 if !in_range => self.respond(cid, 0x80, 0, 0),
            0x02 | 0x01 if sgl_len as usize != len => self.respond(cid, 0x0f, 0, 0),
            0x02 => {
                self.sh.counters.reads.fetch_add(1, Ordering::Relaxed);
                let bytes = self.sh.data.lock().recover()[off..off + len].to_vec();
                self.send_data(cid, &bytes, fault)
            }
            0x01 => {
                self.sh.counters.writes.fetch_add(1, Ordering::Relaxed);
                let bytes = if sgl_id == 0x01 {
                    if data.len() != len || len > self.sh.cfg.in_capsule as usize {
                        return self.host_error(format!("{} bytes in the capsule of a write of {len}", data.len()));
                    }
                    self.sh.counters.in_capsule_writes.fetch_add(1, Ordering::Relaxed);
                    data
                } else {
                    self.collect(cid, len, fault)?
                };
                self.sh.data.lock().recover()[off..off + len].copy_from_slice(&bytes);
                self.respond(cid, 0, 0, 0)
            }
            0x08 => {
                self.sh.data.lock().recover()[off..off + len].fill(0);
                self.respond(cid, 0, 0, 0)
            }
            // Flush; Dataset Management (its ranges in the capsule).
            0x00 | 0x09 => self.respond(cid, 0, 0, 0),
            _ => self.respond(cid, 0x01, 0, 0),
        }
    }

    /// An R2T for `len` bytes at `offset` of command `cid`, tagged `ttag`.
    fn r2t(&mut self, cid: u16, ttag: u16, offset: u32, len: u32) -> Res<()> {
        let mut h = vec![0u8; 24];
        h[0] = pdu_type::R2T;
        h[8..10].copy_from_slice(&cid.to_le_bytes());
        h[10..12].copy_from_slice(&ttag.to_le_bytes());
        h[12..16].copy_from_slice(&offset.to_le_bytes());
        h[16..20].copy_from_slice(&len.to_le_bytes());
        let b = self.pdu(h, &[], 0);
        self.send(&b)?;
        self.sh.counters.r2ts.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A write's data through one R2T and the H2CData PDUs that answer it
    /// (under `fault`, then the same R2T again).
    fn collect(&mut self, cid: u16, len: usize, fault: TcpFault) -> Res<Vec<u8>> {
        self.ttag = self.ttag.wrapping_add(1);
        let ttag = self.ttag;
        self.r2t(cid, ttag, 0, len as u32)?;
        let mut got = Vec::with_capacity(len);
        while got.len() < len {
            let (hdr, data) = self.recv()?;
            if hdr[0] == pdu_type::CAPSULE_CMD {
                // Another command, sent before the R2T came: later.
                self.pending.push_back((hdr, data));
                continue;
            }
            self.sh.counters.h2c_pdus.fetch_add(1, Ordering::Relaxed);
            self.sh.counters.h2c_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
            let (cccid, tag, datao) =
                (u16::from_le_bytes([hdr[8], hdr[9]]), u16::from_le_bytes([hdr[10], hdr[11]]), le32(&hdr, 12));
            let last = hdr[1] & flags::LAST_PDU != 0;
            if hdr[0] != pdu_type::H2C_DATA
                || cccid != cid
                || tag != ttag
                || datao as usize != got.len()
                || le32(&hdr, 16) as usize != data.len()
                || data.len() > self.sh.cfg.maxh2cdata as usize
                || got.len() + data.len() > len
                || last != (got.len() + data.len() == len)
            {
                return self.host_error(format!(
                    "H2CData type {:#x} cid {cccid:#x} tag {tag} at {datao} of {} bytes (last {last}) for command {cid:#x} tag {ttag}, {} of {len} bytes in",
                    hdr[0],
                    data.len(),
                    got.len()
                ));
            }
            got.extend_from_slice(&data);
        }
        if fault == TcpFault::R2tRepeated {
            // The same bytes asked for again and again: a correct host
            // refuses the first repeat and ends the connection, so that
            // what it sends stays bounded by the command's length.
            for _ in 0..400 {
                self.r2t(cid, ttag, 0, len as u32)?;
            }
            while let Ok((hdr, data)) = self.recv() {
                if hdr[0] == pdu_type::H2C_DATA {
                    self.sh.counters.h2c_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
            }
            return Err("R2Ts repeated until the host closed the connection".into());
        }
        Ok(got)
    }

    fn fabrics(&mut self, cid: u16, sqe: &[u8; 64], data: &[u8]) -> Res<()> {
        let dw = |i: usize| le32(sqe, 40 + 4 * i);
        match sqe[4] {
            // Connect: the subsystem NQN at 256 of its data.
            0x01 => {
                let nqn = data.get(256..512).map(|b| String::from_utf8_lossy(b).trim_end_matches('\0').to_string());
                if nqn.as_deref() != Some(self.sh.nqn.as_str()) {
                    // Invalid Parameters in the data, at byte 256.
                    return self.respond(cid, 0x182, 1 << 16 | 256, 0);
                }
                self.qid = (dw(0) >> 16) as u16;
                self.respond(cid, 0, 1, 0)
            }
            // Property Get.
            0x04 => {
                let cc = *self.sh.cc.lock().recover();
                let v: u64 = match dw(1) {
                    // MQES (127 unless configured), CQR, TO 1 (500 ms), NVM command set.
                    0x00 => self.sh.cfg.mqes as u64 | 1 << 16 | 1 << 24 | 1 << 37,
                    0x08 => 0x0001_0300,
                    0x14 => cc as u64,
                    // CSTS: RDY as CC.EN; SHST complete once CC.SHN is set.
                    0x1c => (cc & 1) as u64 | if cc >> 14 & 3 != 0 { 2 << 2 } else { 0 },
                    _ => 0,
                };
                self.respond(cid, 0, v as u32, (v >> 32) as u32)
            }
            // Property Set.
            0x00 => {
                if dw(1) == 0x14 {
                    *self.sh.cc.lock().recover() = dw(2);
                }
                self.respond(cid, 0, 0, 0)
            }
            _ => self.respond(cid, 0x01, 0, 0),
        }
    }

    fn admin(&mut self, opc: u8, cid: u16, sqe: &[u8; 64], _data: &[u8]) -> Res<()> {
        let dw = |i: usize| le32(sqe, 40 + 4 * i);
        match opc {
            // Identify.
            0x06 => {
                let page: Vec<u8> = match dw(0) & 0xff {
                    1 => {
                        let mut id = IdentifyController::parse(&[0u8; IDENTIFY_LEN]);
                        id.mn = "ugds emulated NVMe/TCP target".into();
                        id.sn = "UGDSTCP0001".into();
                        id.cntlid = 1;
                        id.nn = 1;
                        id.sqes = 0x66;
                        id.cqes = 0x44;
                        id.ioccsz = (64 + self.sh.cfg.in_capsule) / 16;
                        id.oncs = IdentifyController::ONCS_DSM | IdentifyController::ONCS_WRITE_ZEROES;
                        // SGLs supported, as nvmet says (fabrics carry data
                        // by SGL only).
                        id.sgls = 1;
                        id.to_bytes().to_vec()
                    }
                    2 => {
                        let mut p = vec![0u8; IDENTIFY_LEN];
                        p[0] = 1;
                        p
                    }
                    _ if le32(sqe, 4) == 1 => {
                        let mut ns = IdentifyNamespace::parse(&[0u8; IDENTIFY_LEN]);
                        let nsze = self.sh.cfg.reported_nsze.unwrap_or(self.sh.cfg.blocks);
                        (ns.nsze, ns.ncap, ns.nlbaf) = (nsze, nsze, 0);
                        let lbads = self.sh.cfg.block_size.trailing_zeros() as u8;
                        ns.lbaf = vec![LbaFormat { ms: 0, lbads, rp: 0 }];
                        ns.to_bytes().to_vec()
                    }
                    _ => return self.respond(cid, 0x0b, 0, 0),
                };
                self.send_data(cid, &page, TcpFault::None)
            }
            // Set Features, Number of Queues.
            0x09 if dw(0) & 0xff == 7 => {
                let n = ((dw(1) & 0xffff) + 1).min(self.sh.cfg.max_queues as u32) - 1;
                self.respond(cid, 0, n | n << 16, 0)
            }
            // Keep Alive.
            0x18 => {
                self.sh.counters.keep_alives.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(self.sh.cfg.keep_alive_delay);
                self.respond(cid, 0, 0, 0)
            }
            // Abort: not aborted.
            0x08 => self.respond(cid, 0, 1, 0),
            _ => self.respond(cid, 0x01, 0, 0),
        }
    }
}
