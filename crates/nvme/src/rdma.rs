//! NVMe over RDMA's own wire formats (NVMe/RDMA transport specification):
//! the private data the host and the target exchange when the RDMA
//! connection of a queue is set up. Everything else travels as the
//! capsules of [`fabrics`](crate::fabrics): a command (64 bytes) by RDMA
//! SEND, its completion (16 bytes) by SEND back, its data by the target's
//! RDMA READ or WRITE of host memory named in a Keyed SGL Data Block.

/// Bytes of the connection request's private data.
pub const CM_REQ_LEN: usize = 32;

/// The RDMA connection request's private data for queue `qid` (0: admin):
/// `hrqsize` completions the host can receive at once, `hsqsize` the
/// submission queue's size (zero-based), `cntlid` the controller the queue
/// joins (0xffff for the admin queue).
pub fn cm_request(qid: u16, hrqsize: u16, hsqsize: u16, cntlid: u16) -> [u8; CM_REQ_LEN] {
    let mut b = [0u8; CM_REQ_LEN];
    // RECFMT 0 (bytes 0-1).
    b[2..4].copy_from_slice(&qid.to_le_bytes());
    b[4..6].copy_from_slice(&hrqsize.to_le_bytes());
    b[6..8].copy_from_slice(&hsqsize.to_le_bytes());
    b[8..10].copy_from_slice(&cntlid.to_le_bytes());
    b
}

/// The target's answer to a connection request, read from its private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmAnswer {
    /// Accepted: the target can receive `crqsize` commands at once.
    Accepted {
        /// The controller's receive queue size.
        crqsize: u16,
    },
    /// Rejected with an NVMe/RDMA status (see [`reject_reason`]).
    Rejected {
        /// The status.
        status: u16,
    },
}

/// The accept's private data (RECFMT, CRQSIZE), or `None` when too short.
pub fn parse_accept(b: &[u8]) -> Option<CmAnswer> {
    let crqsize = u16::from_le_bytes(b.get(2..4)?.try_into().ok()?);
    Some(CmAnswer::Accepted { crqsize })
}

/// The reject's private data (RECFMT, STS), or `None` when too short (a
/// reject by the RDMA layer itself carries none).
pub fn parse_reject(b: &[u8]) -> Option<CmAnswer> {
    let status = u16::from_le_bytes(b.get(2..4)?.try_into().ok()?);
    Some(CmAnswer::Rejected { status })
}

/// What a reject's status means.
pub fn reject_reason(status: u16) -> &'static str {
    match status {
        1 => "invalid private data length",
        2 => "invalid record format",
        3 => "invalid queue ID",
        4 => "invalid host submission queue size",
        5 => "invalid host receive queue size",
        6 => "no resources",
        7 => "invalid IRD",
        8 => "invalid ORD",
        9 => "invalid controller ID",
        _ => "unknown status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_request_lays_out_as_nvmet_reads_it() {
        let b = cm_request(3, 128, 127, 0x0012);
        assert_eq!(&b[..10], &[0, 0, 3, 0, 128, 0, 127, 0, 0x12, 0]);
        assert!(b[10..].iter().all(|&x| x == 0), "reserved");
    }

    #[test]
    fn answers_are_read_and_named() {
        assert_eq!(parse_accept(&[0, 0, 32, 0]), Some(CmAnswer::Accepted { crqsize: 32 }));
        assert_eq!(parse_reject(&[0, 0, 4, 0, 9]), Some(CmAnswer::Rejected { status: 4 }));
        assert_eq!(parse_reject(&[0, 0]), None);
        assert_eq!(reject_reason(4), "invalid host submission queue size");
        assert_eq!(reject_reason(77), "unknown status");
    }
}
