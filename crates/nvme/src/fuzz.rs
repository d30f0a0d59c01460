//! Bounded fuzzing of every parser of bytes that cross a trust line: what
//! a controller or a network target sends (NVMe/TCP PDUs and the ICResp,
//! Identify pages and the namespace descriptor list, completion entries,
//! SGLs a controller walks, NVMe/RDMA's private data). Each takes any
//! bytes and returns a value or an error, never panics, and what it
//! accepts keeps the bounds its callers rely on. proptest's cases (256 by
//! default; `PROPTEST_CASES` sets more) run in `scripts/test`.

use crate::identify::{parse_active_ns_list, parse_ns_descriptors_csi, IdentifyController, IdentifyNamespace};
use crate::sgl::{self, Descriptor, DESCRIPTOR_LEN};
use crate::tcp::{self, CommonHeader, Digests, Head, Pdu};
use crate::{rdma, Cqe, IDENTIFY_LEN};
use proptest::prelude::*;

/// Bytes that look like a PDU often enough to reach past the first checks:
/// a valid-looking common header (any type, lengths near the bytes' own)
/// over random contents, or random bytes.
fn pdu_bytes() -> impl Strategy<Value = Vec<u8>> {
    let shaped = (0u8..12, any::<u8>(), 0u8..80, 0u8..100, prop::collection::vec(any::<u8>(), 0..300)).prop_map(
        |(ty, flags, hlen, pdo, mut rest)| {
            let plen = (8 + rest.len()) as u32;
            let ch = CommonHeader { pdu_type: ty, flags, hlen, pdo, plen };
            let mut b = ch.to_bytes().to_vec();
            b.append(&mut rest);
            b
        },
    );
    prop_oneof![shaped, prop::collection::vec(any::<u8>(), 0..300)]
}

fn digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

fn page() -> impl Strategy<Value = Box<[u8; IDENTIFY_LEN]>> {
    // Sparse pages: mostly zero, some fields set, as real pages are.
    prop::collection::vec((0..IDENTIFY_LEN, any::<u8>()), 0..64).prop_map(|sets| {
        let mut b = Box::new([0u8; IDENTIFY_LEN]);
        for (i, v) in sets {
            b[i] = v;
        }
        b
    })
}

proptest! {
    #[test]
    fn tcp_pdus_parse_or_are_refused(b in pdu_bytes(), d in digests()) {
        if let Ok(Pdu::C2HData { data, .. }) = tcp::parse(&b, d) {
            prop_assert!(!data.is_empty() && data.len() <= b.len());
        }
        // The header alone, as the I/O queue parses it: what it accepts
        // says how many bytes its data has, within the PDU's length.
        if b.len() >= tcp::CH_LEN {
            let ch = CommonHeader::parse(b[..tcp::CH_LEN].try_into().unwrap());
            let hl = tcp::head_len(&ch);
            if hl <= b.len() {
                if let Ok(Head::C2HData { datal, .. }) = tcp::parse_head(&b[..hl], d) {
                    prop_assert!(datal > 0 && datal as u64 <= ch.plen as u64);
                }
            }
        }
    }

    #[test]
    fn ic_responses_parse_or_are_refused(b in prop::collection::vec(any::<u8>(), 0..200), d in digests()) {
        if let Ok(ic) = tcp::parse_ic_resp(&b, d) {
            prop_assert!(ic.maxh2cdata >= 4096 && ic.cpda <= 31);
            prop_assert!(!ic.digests.header || d.header);
            prop_assert!(!ic.digests.data || d.data);
        }
    }

    #[test]
    fn identify_pages_parse_into_bounded_values(p in page()) {
        let c = IdentifyController::parse(&p);
        let _ = c.max_transfer_bytes(4096 << 15);
        let _ = c.in_capsule_data();
        let ns = IdentifyNamespace::parse(&p);
        if let Ok((blocks, bs)) = ns.usable() {
            prop_assert!(blocks.checked_mul(bs as u64).is_some_and(|n| n > 0));
            prop_assert!((512..=65536).contains(&bs));
        }
        let list = parse_active_ns_list(&p);
        prop_assert!(list.len() <= IDENTIFY_LEN / 4 && !list.contains(&0));
        let _ = parse_ns_descriptors_csi(&p);
    }

    #[test]
    fn completion_entries_read_as_any_status(d in any::<[u32; 4]>()) {
        let c = Cqe::from_dwords(d);
        let _ = (c.status(), c.is_success(), crate::fabrics::property_value(&c));
        let _ = crate::fabrics::Connected::from_cqe(&c);
    }

    #[test]
    fn rdma_private_data_parses_or_is_none(b in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Some(rdma::CmAnswer::Rejected { status }) = rdma::parse_reject(&b) {
            let _ = rdma::reject_reason(status);
        }
        prop_assert_eq!(rdma::parse_accept(&b).is_some(), b.len() >= 4);
    }

    /// An SGL a controller walks from memory the host wrote: any chain of
    /// descriptors ends, within the walk's bound, in data ranges that add
    /// up to the command's length, or in an error.
    #[test]
    fn sgls_walk_to_their_length_or_fail(
        first in any::<[u8; DESCRIPTOR_LEN]>(),
        segments in prop::collection::vec(prop::collection::vec(any::<[u8; DESCRIPTOR_LEN]>(), 0..6), 0..6),
        len in 0usize..1 << 20,
    ) {
        let mut moved = 0u64;
        let r = sgl::walk::<()>(
            Descriptor::from_bytes(&first),
            len,
            |addr, n| {
                let seg = segments.get(addr as usize % (segments.len() + 1)).ok_or(())?;
                Ok(seg.iter().take(n).map(Descriptor::from_bytes).collect())
            },
            |_, n| moved += n as u64,
        );
        if r.is_ok() {
            prop_assert_eq!(moved, len as u64);
        }
    }
}
