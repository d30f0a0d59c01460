//! Tests of the parent module.

use super::*;
use crate::Cid;

const BOTH: Digests = Digests { header: true, data: true };

#[test]
fn a_c2h_data_head_is_read_without_its_data() {
    // A C2HData of 8 bytes at offset 4096 of command 7, both digests.
    let data = [0xabu8; 8];
    let mut h = vec![0u8; SHORT_HLEN];
    let plen = (SHORT_HLEN + DIGEST_LEN + data.len() + DIGEST_LEN) as u32;
    let ch = CommonHeader {
        pdu_type: pdu_type::C2H_DATA,
        flags: flags::HDGSTF | flags::DDGSTF | flags::LAST_PDU,
        hlen: SHORT_HLEN as u8,
        pdo: (SHORT_HLEN + DIGEST_LEN) as u8,
        plen,
    };
    h[..CH_LEN].copy_from_slice(&ch.to_bytes());
    h[8..10].copy_from_slice(&7u16.to_le_bytes());
    h[12..16].copy_from_slice(&4096u32.to_le_bytes());
    h[16..20].copy_from_slice(&8u32.to_le_bytes());
    let d = digest(&h);
    h.extend_from_slice(&d);
    assert_eq!(head_len(&ch), h.len());
    let head = parse_head(&h, BOTH).unwrap();
    assert_eq!(head, Head::C2HData { cccid: 7, datao: 4096, datal: 8, last: true, success: false });
    assert!(check_data_digest(&data, digest(&data)).is_ok());
    assert!(matches!(check_data_digest(&data, [0; 4]), Err(PduError::DataDigest { .. })));
    // The whole PDU parses to the same.
    let mut whole = h.clone();
    whole.extend_from_slice(&data);
    whole.extend_from_slice(&digest(&data));
    assert!(matches!(parse(&whole, BOTH), Ok(Pdu::C2HData { cccid: 7, datao: 4096, .. })));
    // A head of the wrong length, a data length that does not fit the
    // PDU, a data offset inside the header: errors, never a panic.
    assert!(matches!(parse_head(&h[..h.len() - 1], BOTH), Err(PduError::Length { .. })));
    let mut long = h.clone();
    long[16..20].copy_from_slice(&9u32.to_le_bytes());
    let d = digest(&long[..SHORT_HLEN]);
    long[SHORT_HLEN..].copy_from_slice(&d);
    assert!(matches!(parse_head(&long, BOTH), Err(PduError::Length { .. })));
    for pdo in [8u8, 12, 20] {
        let mut short = h[..pdo as usize].to_vec();
        short[3] = pdo;
        let c = CommonHeader::parse(short[..CH_LEN].try_into().unwrap());
        let _ = head_len(&c);
        assert!(parse_head(&short, Digests::default()).is_err());
    }
}

#[test]
fn crc32c_is_the_castagnoli_check_value() {
    // The standard check value of CRC-32C over "123456789".
    assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(digest(b"123456789"), [0x83, 0x92, 0x06, 0xe3]);
}

#[test]
fn ic_req_and_ic_resp() {
    let r = ic_req(0, BOTH, 0);
    assert_eq!((r[0], r[2], u32::from_le_bytes(r[4..8].try_into().unwrap())), (0, 128, 128));
    assert_eq!(r[11], 3);
    let mut resp = [0u8; IC_LEN];
    resp[..CH_LEN].copy_from_slice(&CommonHeader { pdu_type: 1, flags: 0, hlen: 128, pdo: 0, plen: 128 }.to_bytes());
    resp[11] = 1;
    resp[12..16].copy_from_slice(&131072u32.to_le_bytes());
    let ok = parse_ic_resp(&resp, BOTH).unwrap();
    assert_eq!(ok, IcResp { cpda: 0, digests: Digests { header: true, data: false }, maxh2cdata: 131072 });
    // Digests not asked for, a small MAXH2CDATA, a wrong length, a wrong type.
    assert!(matches!(parse_ic_resp(&resp, Digests::default()), Err(PduError::Field(_))));
    let mut small = resp;
    small[12..16].copy_from_slice(&1024u32.to_le_bytes());
    assert!(matches!(parse_ic_resp(&small, BOTH), Err(PduError::Field(_))));
    assert!(matches!(parse_ic_resp(&resp[..100], BOTH), Err(PduError::Short { .. })));
    let mut wrong = resp;
    wrong[0] = pdu_type::CAPSULE_RESP;
    assert_eq!(parse_ic_resp(&wrong, BOTH), Err(PduError::Type(5)));
}

#[test]
fn capsule_cmd_with_in_capsule_data_and_digests() {
    let sqe = Sqe::connect(Cid(1), 0, 32, 15_000);
    let data = [7u8; 1024];
    let mut out = Vec::new();
    capsule_cmd(&mut out, &sqe, &data, Framing { digests: BOTH, cpda: 0 });
    let ch = CommonHeader::parse(out[..8].try_into().unwrap());
    assert_eq!((ch.pdu_type, ch.hlen, ch.pdo), (pdu_type::CAPSULE_CMD, 72, 76));
    assert_eq!(ch.flags, flags::HDGSTF | flags::DDGSTF);
    assert_eq!(ch.plen as usize, 72 + 4 + 1024 + 4);
    assert_eq!(out.len(), ch.plen as usize);
    assert_eq!(out[72..76], digest(&out[..72]));
    assert_eq!(out[76..1100], data);
    assert_eq!(out[1100..], digest(&data));
    assert_eq!(out[8..72], sqe.to_bytes());
    // No digests, CPDA 3 (16-byte alignment): data at 80.
    let mut out = Vec::new();
    capsule_cmd(&mut out, &sqe, &data, Framing { digests: Digests::default(), cpda: 3 });
    assert_eq!((out[3], out.len()), (80, 80 + 1024));
    // No data: no PDO.
    let mut out = Vec::new();
    capsule_cmd(&mut out, &Sqe::property_get(Cid(2), 0, true), &[], Framing::default());
    assert_eq!((out[3], out.len()), (0, 72));
}

/// A controller PDU as a target would send it.
fn c2h(ty: u8, fields: &[u8], data: &[u8], flags_: u8, d: Digests) -> Vec<u8> {
    let mut hdr = vec![0u8; SHORT_HLEN];
    hdr[0] = ty;
    hdr[8..8 + fields.len()].copy_from_slice(fields);
    let mut out = Vec::new();
    build(&mut out, &mut hdr, data, flags_, Framing { digests: d, cpda: 0 });
    out
}

fn data_fields(cccid: u16, datao: u32, datal: u32) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f[0..2].copy_from_slice(&cccid.to_le_bytes());
    f[4..8].copy_from_slice(&datao.to_le_bytes());
    f[8..12].copy_from_slice(&datal.to_le_bytes());
    f
}

#[test]
fn controller_pdus_are_read_and_checked() {
    for d in [Digests::default(), BOTH] {
        let data = vec![0x5a; 4096];
        let p = c2h(pdu_type::C2H_DATA, &data_fields(9, 8192, 4096), &data, flags::LAST_PDU, d);
        let ch = CommonHeader::parse(p[..8].try_into().unwrap());
        assert_eq!(ch.pdu_len(1 << 20).unwrap(), p.len());
        assert_eq!(
            parse(&p, d).unwrap(),
            Pdu::C2HData { cccid: 9, datao: 8192, data: &data, last: true, success: false }
        );
        let cqe = Cqe { dw0: 5, dw1: 0, sqhd: 1, sqid: 0, cid: 9, status: 0 };
        let mut f = Vec::new();
        for w in [cqe.dw0, cqe.dw1, cqe.dw2(), cqe.dw3()] {
            f.extend_from_slice(&w.to_le_bytes());
        }
        assert_eq!(parse(&c2h(pdu_type::CAPSULE_RESP, &f, &[], 0, d), d).unwrap(), Pdu::CapsuleResp(cqe));
        let mut r = vec![0u8; 12];
        r[0..2].copy_from_slice(&3u16.to_le_bytes());
        r[2..4].copy_from_slice(&77u16.to_le_bytes());
        r[8..12].copy_from_slice(&65536u32.to_le_bytes());
        assert_eq!(
            parse(&c2h(pdu_type::R2T, &r, &[], 0, d), d).unwrap(),
            Pdu::R2T { cccid: 3, ttag: 77, r2to: 0, r2tl: 65536 }
        );
    }
}

#[test]
fn every_violation_is_an_error() {
    let data = vec![1u8; 512];
    let good = c2h(pdu_type::C2H_DATA, &data_fields(1, 0, 512), &data, flags::LAST_PDU, BOTH);
    // A flipped data byte, a flipped header byte.
    let mut bad = good.clone();
    bad[40] ^= 1;
    assert!(matches!(parse(&bad, BOTH), Err(PduError::DataDigest { .. })));
    let mut bad = good.clone();
    bad[9] ^= 1;
    assert!(matches!(parse(&bad, BOTH), Err(PduError::HeaderDigest { .. })));
    // DATAL that disagrees with PLEN; a truncated PDU; PLEN past the host's limit.
    let mut bad = c2h(pdu_type::C2H_DATA, &data_fields(1, 0, 600), &data, flags::LAST_PDU, Digests::default());
    assert!(matches!(parse(&bad, Digests::default()), Err(PduError::Length { .. })));
    bad.truncate(100);
    assert!(matches!(parse(&bad, Digests::default()), Err(PduError::Length { .. })));
    let ch = CommonHeader::parse(good[..8].try_into().unwrap());
    assert!(matches!(ch.pdu_len(256), Err(PduError::Length { .. })));
    // Types the controller never sends; a wrong header length.
    for ty in [pdu_type::IC_REQ, pdu_type::CAPSULE_CMD, pdu_type::H2C_DATA, 0x08, 0x0a, 0xff] {
        let ch = CommonHeader { pdu_type: ty, flags: 0, hlen: 24, pdo: 0, plen: 24 };
        assert_eq!(ch.pdu_len(1 << 20), Err(PduError::Type(ty)));
    }
    let ch = CommonHeader { pdu_type: pdu_type::CAPSULE_RESP, flags: 0, hlen: 20, pdo: 0, plen: 24 };
    assert!(matches!(ch.pdu_len(1 << 20), Err(PduError::HeaderLength { .. })));
    // Digests the connection uses, missing from a PDU; SUCCESS without LAST_PDU.
    let plain = c2h(pdu_type::C2H_DATA, &data_fields(1, 0, 512), &data, flags::LAST_PDU, Digests::default());
    assert!(matches!(parse(&plain, BOTH), Err(PduError::Field(_) | PduError::Length { .. })));
    let odd = c2h(pdu_type::C2H_DATA, &data_fields(1, 0, 512), &data, flags::SUCCESS, Digests::default());
    assert!(matches!(parse(&odd, Digests::default()), Err(PduError::Field(_))));
    // A response with data; a TermReq is read.
    let resp = c2h(pdu_type::CAPSULE_RESP, &[0; 16], &data, 0, Digests::default());
    assert!(matches!(parse(&resp, Digests::default()), Err(PduError::Length { .. })));
    let term = c2h(pdu_type::C2H_TERM_REQ, &[3, 0, 8, 0, 0, 0], &[], 0, Digests::default());
    assert_eq!(parse(&term, BOTH).unwrap(), Pdu::TermReq { fes: 3, fei: 8 });
}

#[test]
fn h2c_data_is_laid_out() {
    let mut out = Vec::new();
    h2c_data(&mut out, 4, 9, 4096, &[3u8; 100], true, Framing { digests: BOTH, cpda: 0 });
    let ch = CommonHeader::parse(out[..8].try_into().unwrap());
    assert_eq!((ch.pdu_type, ch.hlen, ch.pdo, ch.flags & flags::LAST_PDU), (pdu_type::H2C_DATA, 24, 28, 4));
    assert_eq!(u16::from_le_bytes([out[8], out[9]]), 4);
    assert_eq!(u16::from_le_bytes([out[10], out[11]]), 9);
    assert_eq!(u32::from_le_bytes(out[12..16].try_into().unwrap()), 4096);
    assert_eq!(u32::from_le_bytes(out[16..20].try_into().unwrap()), 100);
    assert_eq!(out.len(), 24 + 4 + 100 + 4);
}
