//! NVMe over Fabrics commands (the Fabrics command set, opcode 0x7F):
//! Connect, Property Get and Property Set, as entries of the same 64-byte
//! layout as any command, and their data and responses.
//!
//! A fabrics controller has no registers to map: the host reads and writes
//! them with Property Get and Set, and opens each queue with Connect.
//! Data goes in SGLs (PSDT 01b): in the capsule (a Data Block at an offset
//! into it) or through the transport's own transfers (a Transport Data
//! Block).

use crate::{Cid, Cqe, Sqe};

/// The Fabrics command opcode.
pub const OPCODE: u8 = 0x7f;

/// Fabrics command types (byte 4 of the command).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Disconnect.
    pub const DISCONNECT: u8 = 0x08;
}

/// Command-specific status codes of the Fabrics commands (status code type
/// 1).
pub mod status {
    /// Connect: incompatible format.
    pub const INCOMPATIBLE_FORMAT: u8 = 0x80;
    /// Connect: controller busy.
    pub const CONTROLLER_BUSY: u8 = 0x81;
    /// Connect: invalid parameters (the response's DW0 says which).
    pub const INVALID_PARAMETERS: u8 = 0x82;
    /// Connect: restart discovery.
    pub const RESTART_DISCOVERY: u8 = 0x83;
    /// Connect: invalid host.
    pub const INVALID_HOST: u8 = 0x84;
    /// Connect: invalid queue type.
    pub const INVALID_QUEUE_TYPE: u8 = 0x85;
}

/// The SGL identifier of a Data Block at an offset into the capsule
/// (descriptor type 0, subtype 1).
pub const SGL_IN_CAPSULE: u8 = 0x01;
/// The SGL identifier of a Transport SGL Data Block (type 5, subtype 0xA):
/// data moved by the transport's own transfers (NVMe/TCP's C2HData,
/// H2CData and R2T).
pub const SGL_TRANSPORT: u8 = 0x5a;
/// The SGL identifier of a Keyed SGL Data Block (type 4, subtype 0): data
/// the target moves with RDMA READ or WRITE at a host address under a
/// remote key (NVMe/RDMA's only descriptor for data outside the capsule,
/// and, with length 0, for none).
pub const SGL_KEYED: u8 = 0x40;
/// The most bytes a Keyed SGL Data Block describes (a 24-bit length).
pub const KEYED_MAX_LEN: u32 = (1 << 24) - 1;

/// Bytes of Connect's data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// Bytes of an NQN field.
pub const NQN_LEN: usize = 256;
/// Controller ID asking the target to pick one (the dynamic controller
/// model).
pub const CNTLID_DYNAMIC: u16 = 0xffff;

/// A Fabrics command of type `fctype`: PSDT 01b (SGLs), SGL1 as given.
fn fabrics(fctype: u8, cid: Cid, sgl: u8, addr: u64, len: u32) -> Sqe {
    let mut s = Sqe::new(OPCODE, cid);
    s.cdw0 |= 1 << 14; // PSDT 01b: an SGL for the data
    s.nsid = fctype as u32; // FCTYPE is byte 4, where other commands have NSID
    s.prp1 = addr;
    s.prp2 = len as u64 | (sgl as u64) << 56;
    s
}

impl Sqe {
    /// Property Get of the 4- or 8-byte (`wide`) register at `offset`
    /// (CAP 0x0 and wide; VS 0x8; CC 0x14; CSTS 0x1C). The value comes
    /// back in the response's first two dwords ([`property_value`]).
    pub fn property_get(cid: Cid, offset: u32, wide: bool) -> Sqe {
        let mut s = fabrics(fctype::PROPERTY_GET, cid, SGL_TRANSPORT, 0, 0);
        s.cdw10 = wide as u32; // ATTRIB.SIZE: 0 four bytes, 1 eight
        s.cdw11 = offset;
        s
    }

    /// Property Set of the 4- or 8-byte register at `offset` to `value`.
    pub fn property_set(cid: Cid, offset: u32, wide: bool, value: u64) -> Sqe {
        let mut s = fabrics(fctype::PROPERTY_SET, cid, SGL_TRANSPORT, 0, 0);
        s.cdw10 = wide as u32;
        s.cdw11 = offset;
        s.cdw12 = value as u32;
        s.cdw13 = (value >> 32) as u32;
        s
    }

    /// Connect for queue `qid` (0: the admin queue) of `sqsize` entries
    /// (stored zero-based), keep-alive timeout `kato_ms` (the admin queue's;
    /// 0 on I/O queues), its [`ConnectData`] in the capsule.
    pub fn connect(cid: Cid, qid: u16, sqsize: u16, kato_ms: u32) -> Sqe {
        debug_assert!(sqsize >= 2);
        let mut s = fabrics(fctype::CONNECT, cid, SGL_IN_CAPSULE, 0, CONNECT_DATA_LEN as u32);
        s.cdw10 = (qid as u32) << 16; // RECFMT 0, QID
        s.cdw11 = (sqsize - 1) as u32; // SQSIZE (zero-based), CATTR 0
        s.cdw12 = kato_ms;
        s
    }

    /// The Fabrics command type, when this is a Fabrics command.
    pub fn fctype(&self) -> Option<u8> {
        (self.opcode() == OPCODE).then_some(self.nsid as u8)
    }

    /// As `self`, its data described by a Transport SGL Data Block of
    /// `len` bytes (NVMe/TCP moves it with C2HData or R2T and H2CData).
    pub fn with_transport_data(mut self, len: u32) -> Sqe {
        self.cdw0 = (self.cdw0 & !(3 << 14)) | 1 << 14;
        self.prp1 = 0;
        self.prp2 = len as u64 | (SGL_TRANSPORT as u64) << 56;
        self
    }

    /// As `self`, its `len` bytes of data at host address `addr` under the
    /// remote key `key` (a Keyed SGL Data Block: NVMe/RDMA); `len` 0 for a
    /// command without data. `len` is cut to its 24 bits: at most
    /// [`KEYED_MAX_LEN`].
    pub fn with_keyed_data(mut self, addr: u64, len: u32, key: u32) -> Sqe {
        debug_assert!(len <= KEYED_MAX_LEN);
        self.cdw0 = (self.cdw0 & !(3 << 14)) | 1 << 14;
        self.prp1 = addr;
        self.prp2 = (len & KEYED_MAX_LEN) as u64 | (key as u64) << 24 | (SGL_KEYED as u64) << 56;
        self
    }

    /// As `self`, its `len` bytes of data in the capsule (a Data Block at
    /// offset 0 of the in-capsule data).
    pub fn with_in_capsule_data(mut self, len: u32) -> Sqe {
        self.cdw0 = (self.cdw0 & !(3 << 14)) | 1 << 14;
        self.prp1 = 0;
        self.prp2 = len as u64 | (SGL_IN_CAPSULE as u64) << 56;
        self
    }
}

/// The value a Property Get returned: the response's first two dwords.
pub fn property_value(cqe: &Cqe) -> u64 {
    cqe.dw0 as u64 | (cqe.dw1 as u64) << 32
}

/// What a Connect response says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connected {
    /// The controller's ID (the admin queue's Connect picks it; the I/O
    /// queues' name it).
    Controller(u16),
    /// Refused with Invalid Parameters: which parameter (`in_data`: of the
    /// data, else of the command) at which byte offset.
    InvalidParameter {
        /// In the Connect data (true) or the command (false).
        in_data: bool,
        /// The byte offset of the parameter.
        offset: u16,
    },
    /// Refused with another status (`sct`, `sc`).
    Refused {
        /// Status code type.
        sct: u8,
        /// Status code.
        sc: u8,
    },
}

impl Connected {
    /// Reads a Connect response.
    pub fn from_cqe(cqe: &Cqe) -> Connected {
        let st = cqe.status();
        if st.is_success() {
            return Connected::Controller(cqe.dw0 as u16);
        }
        if st.sct == 1 && st.sc == status::INVALID_PARAMETERS {
            // DW0: IPO (15:0), IATTR (23:16, bit 0: in the data).
            return Connected::InvalidParameter { in_data: (cqe.dw0 >> 16) & 1 == 1, offset: cqe.dw0 as u16 };
        }
        Connected::Refused { sct: st.sct, sc: st.sc }
    }
}

/// Connect's 1024 bytes of data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectData {
    /// The host's identifier (16 bytes, a UUID).
    pub hostid: [u8; 16],
    /// The controller to connect to ([`CNTLID_DYNAMIC`] for the admin
    /// queue under the dynamic model; the admin queue's answer for I/O
    /// queues).
    pub cntlid: u16,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// The host's NQN.
    pub hostnqn: String,
}

/// An NQN that does not fit its field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("NQN of {0} bytes: at most 223 fit (the field is 256 bytes, NUL-terminated)")]
pub struct NqnTooLong(pub usize);

impl ConnectData {
    /// The bytes as the controller reads them.
    pub fn to_bytes(&self) -> Result<[u8; CONNECT_DATA_LEN], NqnTooLong> {
        let mut b = [0u8; CONNECT_DATA_LEN];
        b[..16].copy_from_slice(&self.hostid);
        b[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        for (at, nqn) in [(256, &self.subnqn), (512, &self.hostnqn)] {
            if nqn.len() > 223 {
                return Err(NqnTooLong(nqn.len()));
            }
            b[at..at + nqn.len()].copy_from_slice(nqn.as_bytes());
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Status;

    #[test]
    fn property_commands_lay_out_as_the_spec_says() {
        let get = Sqe::property_get(Cid(7), 0x1c, false);
        let b = get.to_bytes();
        assert_eq!(b[0], 0x7f);
        assert_eq!(b[1] >> 6, 1, "PSDT 01b");
        assert_eq!(u16::from_le_bytes([b[2], b[3]]), 7);
        assert_eq!(b[4], fctype::PROPERTY_GET);
        assert_eq!(b[40], 0, "four bytes");
        assert_eq!(u32::from_le_bytes(b[44..48].try_into().unwrap()), 0x1c);
        assert_eq!(b[39], SGL_TRANSPORT);
        assert_eq!(get.fctype(), Some(fctype::PROPERTY_GET));
        let set = Sqe::property_set(Cid(8), 0x14, false, 0x0046_0001);
        let b = set.to_bytes();
        assert_eq!(b[4], fctype::PROPERTY_SET);
        assert_eq!(u32::from_le_bytes(b[44..48].try_into().unwrap()), 0x14);
        assert_eq!(u64::from_le_bytes(b[48..56].try_into().unwrap()), 0x0046_0001);
        let cap = Sqe::property_get(Cid(9), 0, true);
        assert_eq!(cap.to_bytes()[40], 1, "eight bytes");
        assert_eq!(Sqe::read_like().fctype(), None);
    }

    /// The Keyed SGL Data Block as nvmet-rdma reads it: address in bytes
    /// 24..32, a 3-byte length, a 4-byte key, the identifier 0x40 last.
    #[test]
    fn a_keyed_data_block_lays_out_as_the_spec_says() {
        let s = Sqe::new(0x02, Cid(3)).with_keyed_data(0x1122_3344_5566_7788, 0x01_2345, 0xdead_beef);
        let b = s.to_bytes();
        assert_eq!(b[1] >> 6, 1, "PSDT 01b");
        assert_eq!(u64::from_le_bytes(b[24..32].try_into().unwrap()), 0x1122_3344_5566_7788);
        assert_eq!(&b[32..35], &[0x45, 0x23, 0x01], "length, 24 bits little-endian");
        assert_eq!(u32::from_le_bytes(b[35..39].try_into().unwrap()), 0xdead_beef);
        assert_eq!(b[39], SGL_KEYED);
        // None: address, length and key zero, still keyed.
        let b = Sqe::property_get(Cid(1), 0, true).with_keyed_data(0, 0, 0).to_bytes();
        assert_eq!(&b[24..39], &[0u8; 15]);
        assert_eq!(b[39], SGL_KEYED);
        assert_eq!(b[40], 1, "the command's own fields kept");
    }

    impl Sqe {
        fn read_like() -> Sqe {
            Sqe::new(0x02, Cid(1))
        }
    }

    #[test]
    fn connect_and_its_data() {
        let c = Sqe::connect(Cid(1), 3, 128, 0);
        let b = c.to_bytes();
        assert_eq!((b[0], b[4]), (0x7f, fctype::CONNECT));
        assert_eq!(u16::from_le_bytes([b[40], b[41]]), 0, "RECFMT 0");
        assert_eq!(u16::from_le_bytes([b[42], b[43]]), 3, "QID");
        assert_eq!(u16::from_le_bytes([b[44], b[45]]), 127, "SQSIZE is zero-based");
        assert_eq!(b[39], SGL_IN_CAPSULE);
        assert_eq!(u32::from_le_bytes(b[32..36].try_into().unwrap()), 1024, "the data's length");
        let admin = Sqe::connect(Cid(1), 0, 32, 15_000);
        assert_eq!(u32::from_le_bytes(admin.to_bytes()[48..52].try_into().unwrap()), 15_000, "KATO");
        let d = ConnectData {
            hostid: [0xab; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: "nqn.2026-12.io.ugds:test".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001".into(),
        };
        let b = d.to_bytes().unwrap();
        assert_eq!(b[..16], [0xab; 16]);
        assert_eq!(u16::from_le_bytes([b[16], b[17]]), 0xffff);
        assert_eq!(&b[256..280], b"nqn.2026-12.io.ugds:test");
        assert_eq!(b[280], 0, "NUL-terminated");
        assert_eq!(&b[512..516], b"nqn.");
        let long = ConnectData { subnqn: "n".repeat(224), ..d };
        assert_eq!(long.to_bytes(), Err(NqnTooLong(224)));
    }

    fn cqe(dw0: u32, dw1: u32, status: Status) -> Cqe {
        Cqe { dw0, dw1, sqhd: 0, sqid: 0, cid: 1, status: status.to_field(false) }
    }

    #[test]
    fn responses_are_read() {
        let ok = Status { sct: 0, sc: 0, crd: 0, more: false, dnr: false };
        assert_eq!(property_value(&cqe(0x2003_ffff, 0x0000_0030, ok)), 0x0000_0030_2003_ffff);
        assert_eq!(Connected::from_cqe(&cqe(5, 0, ok)), Connected::Controller(5));
        let invalid = Status { sct: 1, sc: status::INVALID_PARAMETERS, crd: 0, more: false, dnr: true };
        assert_eq!(
            Connected::from_cqe(&cqe(1 << 16 | 256, 0, invalid)),
            Connected::InvalidParameter { in_data: true, offset: 256 }
        );
        let host = Status { sct: 1, sc: status::INVALID_HOST, crd: 0, more: false, dnr: true };
        assert_eq!(Connected::from_cqe(&cqe(0, 0, host)), Connected::Refused { sct: 1, sc: 0x84 });
    }
}
