//! NVMe/TCP PDUs (the NVMe over Fabrics TCP transport binding): what the
//! host sends, built; what the controller sends, parsed and checked. Pure:
//! the connection that carries them is the transport's.
//!
//! Every PDU starts with an 8-byte common header (type, flags, header
//! length, data offset, total length). After the connection's ICReq and
//! ICResp, commands go as CapsuleCmd (the 64-byte entry, then in-capsule
//! data), completions come back as CapsuleResp (the 16-byte entry), data
//! to the host as C2HData, and data to the controller as H2CData when an
//! R2T asks for it. Header and data digests (CRC32C) are used where the
//! ICReq asked for them and the ICResp granted them.
//!
//! Parsing never trusts a length: a PDU whose fields disagree (lengths,
//! offsets, a type the host does not expect, a digest that does not match)
//! is an error naming what is wrong, for the transport to end the
//! connection with, never to wait on.

use crate::{Cqe, Sqe};

/// PDU types.
pub mod pdu_type {
    /// Initialize Connection Request (host to controller).
    pub const IC_REQ: u8 = 0x00;
    /// Initialize Connection Response.
    pub const IC_RESP: u8 = 0x01;
    /// Host to controller Terminate Connection Request.
    pub const H2C_TERM_REQ: u8 = 0x02;
    /// Controller to host Terminate Connection Request.
    pub const C2H_TERM_REQ: u8 = 0x03;
    /// Command Capsule.
    pub const CAPSULE_CMD: u8 = 0x04;
    /// Response Capsule.
    pub const CAPSULE_RESP: u8 = 0x05;
    /// Host to controller data.
    pub const H2C_DATA: u8 = 0x06;
    /// Controller to host data.
    pub const C2H_DATA: u8 = 0x07;
    /// Ready to Transfer.
    pub const R2T: u8 = 0x09;
}

/// Common header flags.
pub mod flags {
    /// A header digest follows the header.
    pub const HDGSTF: u8 = 1 << 0;
    /// A data digest follows the data.
    pub const DDGSTF: u8 = 1 << 1;
    /// C2HData and H2CData: the last data PDU of the command.
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData: the command succeeded; no CapsuleResp follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// Bytes of the common header.
pub const CH_LEN: usize = 8;
/// Bytes of a digest.
pub const DIGEST_LEN: usize = 4;
/// Bytes of the ICReq and ICResp PDUs.
pub const IC_LEN: usize = 128;
/// Header bytes of CapsuleCmd (the common header and the entry).
pub const CAPSULE_CMD_HLEN: usize = CH_LEN + Sqe::SIZE;
/// Header bytes of CapsuleResp, C2HData, H2CData, R2T and TermReq.
pub const SHORT_HLEN: usize = 24;
/// The most error data a TermReq carries.
pub const TERM_DATA_MAX: usize = 128;
/// The least MAXH2CDATA a controller may grant.
pub const MIN_MAXH2CDATA: u32 = 4096;

/// Which digests a connection uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    /// CRC32C of each PDU header, after the header.
    pub header: bool,
    /// CRC32C of each PDU's data, after the data.
    pub data: bool,
}

impl Digests {
    fn bits(self) -> u8 {
        self.header as u8 | (self.data as u8) << 1
    }

    fn header_len(self) -> usize {
        if self.header {
            DIGEST_LEN
        } else {
            0
        }
    }

    fn data_len(self) -> usize {
        if self.data {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// What the handshake settled for the PDUs the host sends: the digests and
/// the data alignment the controller asked for (CPDA).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Framing {
    /// The connection's digests.
    pub digests: Digests,
    /// Data of host PDUs starts at a multiple of `(cpda + 1) * 4` bytes.
    pub cpda: u8,
}

/// The CRC32C digest of `bytes`, as NVMe/TCP places it (little-endian).
pub fn digest(bytes: &[u8]) -> [u8; DIGEST_LEN] {
    crc32c::crc32c(bytes).to_le_bytes()
}

/// The CRC32C of bytes that follow bytes whose CRC32C is `crc`: a data
/// digest computed as the data comes in pieces (start from 0).
pub fn digest_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// What is wrong with a PDU the controller sent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PduError {
    /// Fewer bytes than the PDU needs.
    #[error("PDU of {got} bytes: {want} needed")]
    Short {
        /// Bytes needed.
        want: usize,
        /// Bytes there are.
        got: usize,
    },
    /// A type the host does not take here.
    #[error("unexpected PDU type {0:#04x}")]
    Type(u8),
    /// A header length other than the type's.
    #[error("PDU type {ty:#04x} with a header of {hlen} bytes ({want} expected)")]
    HeaderLength {
        /// The type.
        ty: u8,
        /// Its header length.
        hlen: u8,
        /// The type's.
        want: usize,
    },
    /// A total length that does not fit the header, the digests and the data.
    #[error("PDU type {ty:#04x} of {plen} bytes: {why}")]
    Length {
        /// The type.
        ty: u8,
        /// Its total length.
        plen: u32,
        /// What does not fit.
        why: String,
    },
    /// A header digest that does not match.
    #[error("header digest mismatch on PDU type {ty:#04x}: {got:#010x} received, {want:#010x} computed")]
    HeaderDigest {
        /// The type.
        ty: u8,
        /// The digest in the PDU.
        got: u32,
        /// The digest of the header.
        want: u32,
    },
    /// A data digest that does not match.
    #[error("data digest mismatch on PDU type {ty:#04x}: {got:#010x} received, {want:#010x} computed")]
    DataDigest {
        /// The type.
        ty: u8,
        /// The digest in the PDU.
        got: u32,
        /// The digest of the data.
        want: u32,
    },
    /// A field with a value the host did not ask for or cannot take.
    #[error("{0}")]
    Field(String),
}

/// The common header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonHeader {
    /// PDU type.
    pub pdu_type: u8,
    /// Flags.
    pub flags: u8,
    /// Header length (digest not included).
    pub hlen: u8,
    /// Where the data starts (0: no data).
    pub pdo: u8,
    /// Total length.
    pub plen: u32,
}

impl CommonHeader {
    /// Reads the first eight bytes of a PDU.
    pub fn parse(b: &[u8; CH_LEN]) -> CommonHeader {
        CommonHeader {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// The eight bytes.
    pub fn to_bytes(self) -> [u8; CH_LEN] {
        let p = self.plen.to_le_bytes();
        [self.pdu_type, self.flags, self.hlen, self.pdo, p[0], p[1], p[2], p[3]]
    }

    /// How many bytes the PDU this header starts has in all, checked
    /// against the type's header length and `max` (what the host takes in
    /// one PDU): what to read before [`parse`] sees it whole. Refuses a
    /// type the controller never sends.
    pub fn pdu_len(&self, max: u32) -> Result<usize, PduError> {
        let want = match self.pdu_type {
            pdu_type::IC_RESP => IC_LEN,
            pdu_type::CAPSULE_RESP | pdu_type::C2H_DATA | pdu_type::R2T | pdu_type::C2H_TERM_REQ => SHORT_HLEN,
            t => return Err(PduError::Type(t)),
        };
        if self.hlen as usize != want {
            return Err(PduError::HeaderLength { ty: self.pdu_type, hlen: self.hlen, want });
        }
        if (self.plen as usize) < want || self.plen > max {
            return Err(PduError::Length {
                ty: self.pdu_type,
                plen: self.plen,
                why: format!("not between its header's {want} bytes and the {max} the host takes"),
            });
        }
        Ok(self.plen as usize)
    }
}

/// The host's ICReq: `hpda` (the data alignment the host asks of the
/// controller's PDUs, in dwords less one), the digests it asks for, and
/// `maxr2t` (outstanding R2Ts per command, zero-based).
pub fn ic_req(hpda: u8, digests: Digests, maxr2t: u32) -> [u8; IC_LEN] {
    let mut b = [0u8; IC_LEN];
    let ch = CommonHeader { pdu_type: pdu_type::IC_REQ, flags: 0, hlen: IC_LEN as u8, pdo: 0, plen: IC_LEN as u32 };
    b[..CH_LEN].copy_from_slice(&ch.to_bytes());
    // PFV 0 (bytes 8-9), HPDA, DGST, MAXR2T.
    b[10] = hpda;
    b[11] = digests.bits();
    b[12..16].copy_from_slice(&maxr2t.to_le_bytes());
    b
}

/// What the controller's ICResp granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcResp {
    /// The data alignment the controller asks of the host's PDUs (dwords
    /// less one).
    pub cpda: u8,
    /// The digests the connection uses.
    pub digests: Digests,
    /// The most data bytes in one H2CData PDU.
    pub maxh2cdata: u32,
}

/// Reads the controller's ICResp, checked against what the host asked
/// (`asked`: digests it did not ask for are a protocol error).
pub fn parse_ic_resp(b: &[u8], asked: Digests) -> Result<IcResp, PduError> {
    if b.len() < IC_LEN {
        return Err(PduError::Short { want: IC_LEN, got: b.len() });
    }
    let ch = CommonHeader::parse(b[..CH_LEN].try_into().expect("eight bytes"));
    if ch.pdu_type != pdu_type::IC_RESP {
        return Err(PduError::Type(ch.pdu_type));
    }
    if ch.hlen as usize != IC_LEN || ch.plen as usize != IC_LEN || b.len() != IC_LEN {
        return Err(PduError::Length {
            ty: ch.pdu_type,
            plen: ch.plen,
            why: format!("an ICResp is {IC_LEN} bytes (header {}, received {})", ch.hlen, b.len()),
        });
    }
    let pfv = u16::from_le_bytes([b[8], b[9]]);
    if pfv != 0 {
        return Err(PduError::Field(format!("ICResp: PDU format version {pfv} (0 supported)")));
    }
    let cpda = b[10];
    if cpda > 31 {
        return Err(PduError::Field(format!("ICResp: CPDA {cpda} (31 at most)")));
    }
    let dgst = b[11];
    let digests = Digests { header: dgst & 1 != 0, data: dgst & 2 != 0 };
    if dgst & !3 != 0 || (digests.header && !asked.header) || (digests.data && !asked.data) {
        return Err(PduError::Field(format!("ICResp: digests {dgst:#x} granted, {:#x} asked for", asked.bits())));
    }
    let maxh2cdata = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
    if maxh2cdata < MIN_MAXH2CDATA || maxh2cdata % 4 != 0 {
        return Err(PduError::Field(format!("ICResp: MAXH2CDATA {maxh2cdata} (a multiple of 4, at least 4096)")));
    }
    Ok(IcResp { cpda, digests, maxh2cdata })
}

/// Where data starts in a PDU sent to the controller: after the header
/// and its digest, aligned as CPDA asks.
fn data_offset(hlen: usize, digests: Digests, cpda: u8) -> usize {
    let at = hlen + digests.header_len();
    let align = (cpda as usize + 1) * 4;
    if cpda == 0 {
        at
    } else {
        at.div_ceil(align) * align
    }
}

/// Appends a PDU of header `hdr` (its common header's lengths filled in
/// here) and `data` to `out`, with the connection's digests.
fn build(out: &mut Vec<u8>, hdr: &mut [u8], data: &[u8], flags_: u8, framing: Framing) {
    let Framing { digests, cpda } = framing;
    let hlen = hdr.len();
    let (pdo, plen) = if data.is_empty() {
        (0, hlen + digests.header_len())
    } else {
        let pdo = data_offset(hlen, digests, cpda);
        (pdo, pdo + data.len() + digests.data_len())
    };
    let f = flags_
        | if digests.header { flags::HDGSTF } else { 0 }
        | if digests.data && !data.is_empty() { flags::DDGSTF } else { 0 };
    hdr[1] = f;
    hdr[2] = hlen as u8;
    hdr[3] = pdo as u8;
    hdr[4..8].copy_from_slice(&(plen as u32).to_le_bytes());
    let start = out.len();
    out.extend_from_slice(hdr);
    if digests.header {
        out.extend_from_slice(&digest(hdr));
    }
    if !data.is_empty() {
        out.resize(start + pdo, 0);
        out.extend_from_slice(data);
        if digests.data {
            out.extend_from_slice(&digest(data));
        }
    }
    debug_assert_eq!(out.len() - start, plen);
}

/// Appends a CapsuleCmd of `sqe` with `data` in the capsule (empty: none)
/// to `out`.
pub fn capsule_cmd(out: &mut Vec<u8>, sqe: &Sqe, data: &[u8], framing: Framing) {
    // On the stack: a capsule per command allocates nothing but `out`'s growth.
    let mut hdr = [0u8; CAPSULE_CMD_HLEN];
    hdr[0] = pdu_type::CAPSULE_CMD;
    hdr[CH_LEN..].copy_from_slice(&sqe.to_bytes());
    build(out, &mut hdr, data, 0, framing);
}

/// Appends an H2CData PDU to `out`: `data` at offset `datao` of command
/// `cccid`'s data, answering the R2T of tag `ttag`; `last` for the last
/// PDU of that R2T.
pub fn h2c_data(out: &mut Vec<u8>, cccid: u16, ttag: u16, datao: u32, data: &[u8], last: bool, framing: Framing) {
    let mut hdr = [0u8; SHORT_HLEN];
    hdr[0] = pdu_type::H2C_DATA;
    hdr[8..10].copy_from_slice(&cccid.to_le_bytes());
    hdr[10..12].copy_from_slice(&ttag.to_le_bytes());
    hdr[12..16].copy_from_slice(&datao.to_le_bytes());
    hdr[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
    build(out, &mut hdr, data, if last { flags::LAST_PDU } else { 0 }, framing);
}

/// A PDU from the controller, after the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pdu<'a> {
    /// A completion.
    CapsuleResp(Cqe),
    /// Data of command `cccid` at offset `datao` of its data.
    C2HData {
        /// The command.
        cccid: u16,
        /// Where the bytes go in the command's data.
        datao: u32,
        /// The bytes.
        data: &'a [u8],
        /// The command's last data PDU.
        last: bool,
        /// The command succeeded and no CapsuleResp follows.
        success: bool,
    },
    /// The controller is ready for `r2tl` bytes of command `cccid`'s data
    /// at offset `r2to`, to be sent with tag `ttag`.
    R2T {
        /// The command.
        cccid: u16,
        /// The transfer's tag.
        ttag: u16,
        /// Offset in the command's data.
        r2to: u32,
        /// Bytes.
        r2tl: u32,
    },
    /// The controller ends the connection: why (FES) and where (FEI).
    TermReq {
        /// Fatal Error Status.
        fes: u16,
        /// Fatal Error Information.
        fei: u32,
    },
}

/// Reads a whole PDU `b` (exactly its total length; see
/// [`CommonHeader::pdu_len`]) on a connection with `digests`: lengths,
/// offsets and digests checked.
pub fn parse(b: &[u8], digests: Digests) -> Result<Pdu<'_>, PduError> {
    let ch = prelude(b, digests, true)?;
    let ty = ch.pdu_type;
    if ty != pdu_type::C2H_DATA {
        return parse_short(b, ch, digests).map(|h| match h {
            Head::CapsuleResp(cqe) => Pdu::CapsuleResp(cqe),
            Head::R2T { cccid, ttag, r2to, r2tl } => Pdu::R2T { cccid, ttag, r2to, r2tl },
            Head::TermReq { fes, fei } => Pdu::TermReq { fes, fei },
            Head::C2HData { .. } => unreachable!("not a C2HData"),
        });
    }
    let pdo = ch.pdo as usize;
    if pdo < CH_LEN || pdo > b.len() {
        return Err(PduError::Length { ty, plen: ch.plen, why: format!("data offset {pdo} outside the PDU") });
    }
    let Head::C2HData { cccid, datao, datal, last, success } = c2h_head(&b[..pdo], ch, digests)? else {
        unreachable!("a C2HData's head")
    };
    let data = &b[pdo..pdo + datal as usize];
    if digests.data {
        let at = pdo + datal as usize;
        check_data_digest(data, b[at..at + DIGEST_LEN].try_into().expect("four bytes"))?;
    }
    Ok(Pdu::C2HData { cccid, datao, data, last, success })
}

/// A PDU from the controller read up to its data (see [`head_len`]): what
/// a transport needs to put a C2HData's bytes where they belong itself,
/// without a copy through a buffer of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// A completion.
    CapsuleResp(Cqe),
    /// `datal` bytes of command `cccid`'s data at `datao` follow (then
    /// their digest, where the connection uses data digests).
    C2HData {
        /// The command.
        cccid: u16,
        /// Where the bytes go in the command's data.
        datao: u32,
        /// How many bytes follow.
        datal: u32,
        /// The command's last data PDU.
        last: bool,
        /// The command succeeded and no CapsuleResp follows.
        success: bool,
    },
    /// As [`Pdu::R2T`].
    R2T {
        /// The command.
        cccid: u16,
        /// The transfer's tag.
        ttag: u16,
        /// Offset in the command's data.
        r2to: u32,
        /// Bytes.
        r2tl: u32,
    },
    /// As [`Pdu::TermReq`].
    TermReq {
        /// Fatal Error Status.
        fes: u16,
        /// Fatal Error Information.
        fei: u32,
    },
}

/// How many bytes of the PDU that `ch` starts come before its data: a
/// C2HData's data offset, the whole length of any other PDU. Check `ch`
/// with [`CommonHeader::pdu_len`] first.
pub fn head_len(ch: &CommonHeader) -> usize {
    match ch.pdu_type {
        pdu_type::C2H_DATA if ch.pdo as usize >= CH_LEN && (ch.pdo as u32) < ch.plen => ch.pdo as usize,
        _ => ch.plen as usize,
    }
}

/// Reads the first [`head_len`] bytes of a PDU: for a C2HData its header
/// (the data and its digest are the caller's to read, and to check with
/// [`check_data_digest`]), for any other PDU all of it. Lengths, offsets
/// and the header digest are checked as [`parse`] checks them.
pub fn parse_head(b: &[u8], digests: Digests) -> Result<Head, PduError> {
    let ch = prelude(b, digests, false)?;
    if b.len() != head_len(&ch) {
        let why = format!("{} bytes read before its data, {} expected", b.len(), head_len(&ch));
        return Err(PduError::Length { ty: ch.pdu_type, plen: ch.plen, why });
    }
    match ch.pdu_type {
        pdu_type::C2H_DATA => c2h_head(b, ch, digests),
        _ => parse_short(b, ch, digests),
    }
}

/// Checks a data digest `got` (as it came, little-endian) against `data`.
pub fn check_data_digest(data: &[u8], got: [u8; DIGEST_LEN]) -> Result<(), PduError> {
    let (got, want) = (u32::from_le_bytes(got), crc32c::crc32c(data));
    if got != want {
        return Err(PduError::DataDigest { ty: pdu_type::C2H_DATA, got, want });
    }
    Ok(())
}

/// The checks every PDU from the controller passes: its type, its header
/// length, a total length at least that (and `b`'s own where `whole`),
/// and its header digest.
fn prelude(b: &[u8], digests: Digests, whole: bool) -> Result<CommonHeader, PduError> {
    if b.len() < CH_LEN {
        return Err(PduError::Short { want: CH_LEN, got: b.len() });
    }
    let ch = CommonHeader::parse(b[..CH_LEN].try_into().expect("eight bytes"));
    let ty = ch.pdu_type;
    if ty == pdu_type::IC_RESP {
        return Err(PduError::Type(ty));
    }
    ch.pdu_len(u32::MAX)?;
    let hlen = ch.hlen as usize;
    if whole && ch.plen as usize != b.len() {
        return Err(PduError::Length { ty, plen: ch.plen, why: format!("{} bytes received", b.len()) });
    }
    // A TermReq is read as it comes: the controller is ending the connection.
    if digests.header && ty != pdu_type::C2H_TERM_REQ {
        if ch.flags & flags::HDGSTF == 0 {
            return Err(PduError::Field(format!("PDU type {ty:#04x} without the header digest the connection uses")));
        }
        if b.len() < hlen + DIGEST_LEN {
            let why = format!("no room for the header digest after {hlen} bytes");
            return Err(PduError::Length { ty, plen: ch.plen, why });
        }
        let got = u32::from_le_bytes(b[hlen..hlen + DIGEST_LEN].try_into().expect("four bytes"));
        let want = crc32c::crc32c(&b[..hlen]);
        if got != want {
            return Err(PduError::HeaderDigest { ty, got, want });
        }
    }
    Ok(ch)
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// A whole CapsuleResp, R2T or TermReq (past [`prelude`]).
fn parse_short(b: &[u8], ch: CommonHeader, digests: Digests) -> Result<Head, PduError> {
    let (ty, hlen) = (ch.pdu_type, ch.hlen as usize);
    let hd = if ty == pdu_type::C2H_TERM_REQ { 0 } else { digests.header_len() };
    let len_err = |why: String| PduError::Length { ty, plen: ch.plen, why };
    match ty {
        pdu_type::CAPSULE_RESP | pdu_type::R2T => {
            if b.len() != hlen + hd || ch.pdo != 0 {
                return Err(len_err(format!(
                    "a header of {hlen} bytes{} and no data",
                    if hd > 0 { ", its digest" } else { "" }
                )));
            }
            if ty == pdu_type::CAPSULE_RESP {
                let d: [u32; 4] = std::array::from_fn(|i| u32_at(b, CH_LEN + 4 * i));
                return Ok(Head::CapsuleResp(Cqe::from_dwords(d)));
            }
            Ok(Head::R2T { cccid: u16_at(b, 8), ttag: u16_at(b, 10), r2to: u32_at(b, 12), r2tl: u32_at(b, 16) })
        }
        pdu_type::C2H_TERM_REQ => {
            if b.len() > SHORT_HLEN + TERM_DATA_MAX {
                return Err(len_err(format!("a TermReq carries at most {TERM_DATA_MAX} bytes of error data")));
            }
            Ok(Head::TermReq { fes: u16_at(b, 8), fei: u32_at(b, 10) })
        }
        t => Err(PduError::Type(t)),
    }
}

/// A C2HData's header `b` (its first PDO bytes, past [`prelude`]): the
/// data's offset and length checked against the PDU's total length.
fn c2h_head(b: &[u8], ch: CommonHeader, digests: Digests) -> Result<Head, PduError> {
    let (ty, hlen) = (ch.pdu_type, ch.hlen as usize);
    let (hd, dd) = (digests.header_len(), digests.data_len());
    let pdo = ch.pdo as usize;
    if pdo < hlen + hd || b.len() < pdo {
        let why = format!("data offset {pdo} inside its header of {hlen} bytes and digest of {hd}");
        return Err(PduError::Length { ty, plen: ch.plen, why });
    }
    let datal = u32_at(b, 16) as usize;
    if pdo.checked_add(datal).and_then(|e| e.checked_add(dd)) != Some(ch.plen as usize) {
        let why = format!("data offset {pdo} and data length {datal} do not fit (header {hlen}, digests {hd}+{dd})");
        return Err(PduError::Length { ty, plen: ch.plen, why });
    }
    if datal == 0 {
        return Err(PduError::Field("C2HData with no data".into()));
    }
    if digests.data && ch.flags & flags::DDGSTF == 0 {
        return Err(PduError::Field("C2HData without the data digest the connection uses".into()));
    }
    let (last, success) = (ch.flags & flags::LAST_PDU != 0, ch.flags & flags::SUCCESS != 0);
    if success && !last {
        return Err(PduError::Field("C2HData with SUCCESS but not LAST_PDU".into()));
    }
    Ok(Head::C2HData { cccid: u16_at(b, 8), datao: u32_at(b, 12), datal: datal as u32, last, success })
}

#[cfg(test)]
mod tests;
