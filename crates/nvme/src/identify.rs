//! Identify data structures (section 5.17.2): the fields the driver needs.

use crate::IDENTIFY_LEN;

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}
fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end_matches([' ', '\0']).to_string()
}

/// Identify Controller data structure (CNS 01h, figure 275), parsed.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct IdentifyController {
    /// PCI Vendor ID.
    pub vid: u16,
    /// PCI Subsystem Vendor ID.
    pub ssvid: u16,
    /// Serial Number.
    pub sn: String,
    /// Model Number.
    pub mn: String,
    /// Firmware Revision.
    pub fr: String,
    /// Maximum Data Transfer Size: `2^mdts` minimum pages; 0 means no limit.
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version.
    pub ver: u32,
    /// Optional Admin Command Support.
    pub oacs: u16,
    /// Abort Command Limit (zero-based).
    pub acl: u8,
    /// Submission Queue Entry Size (required 3:0, maximum 7:4, log2).
    pub sqes: u8,
    /// Completion Queue Entry Size.
    pub cqes: u8,
    /// Number of Namespaces (highest valid NSID).
    pub nn: u32,
    /// Optional NVM Command Support.
    pub oncs: u16,
    /// Volatile Write Cache.
    pub vwc: u8,
    /// SGL Support (see [`sgl::supported`](crate::sgl::supported)).
    pub sgls: u32,
    /// NVMe over Fabrics: I/O Queue Command Capsule Supported Size, in 16
    /// bytes (the 64-byte entry and the in-capsule data it takes).
    pub ioccsz: u32,
}

impl IdentifyController {
    /// OACS bit 8: Doorbell Buffer Config supported.
    pub const OACS_DBBUF: u16 = 1 << 8;
    /// ONCS bit 2: Dataset Management supported.
    pub const ONCS_DSM: u16 = 1 << 2;
    /// ONCS bit 3: Write Zeroes supported.
    pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;

    /// Parses the 4096-byte structure.
    pub fn parse(b: &[u8; IDENTIFY_LEN]) -> IdentifyController {
        IdentifyController {
            vid: le16(b, 0),
            ssvid: le16(b, 2),
            sn: ascii(&b[4..24]),
            mn: ascii(&b[24..64]),
            fr: ascii(&b[64..72]),
            mdts: b[77],
            cntlid: le16(b, 78),
            ver: le32(b, 80),
            oacs: le16(b, 256),
            acl: b[258],
            sqes: b[512],
            cqes: b[513],
            nn: le32(b, 516),
            oncs: le16(b, 520),
            vwc: b[525],
            sgls: le32(b, 536),
            ioccsz: le32(b, 1792),
        }
    }

    /// Writes the fields this struct knows into a zeroed structure.
    pub fn to_bytes(&self) -> [u8; IDENTIFY_LEN] {
        let mut b = [0u8; IDENTIFY_LEN];
        b[0..2].copy_from_slice(&self.vid.to_le_bytes());
        b[2..4].copy_from_slice(&self.ssvid.to_le_bytes());
        put_ascii(&mut b[4..24], &self.sn);
        put_ascii(&mut b[24..64], &self.mn);
        put_ascii(&mut b[64..72], &self.fr);
        b[77] = self.mdts;
        b[78..80].copy_from_slice(&self.cntlid.to_le_bytes());
        b[80..84].copy_from_slice(&self.ver.to_le_bytes());
        b[256..258].copy_from_slice(&self.oacs.to_le_bytes());
        b[258] = self.acl;
        b[512] = self.sqes;
        b[513] = self.cqes;
        b[516..520].copy_from_slice(&self.nn.to_le_bytes());
        b[520..522].copy_from_slice(&self.oncs.to_le_bytes());
        b[525] = self.vwc;
        b[536..540].copy_from_slice(&self.sgls.to_le_bytes());
        b[1792..1796].copy_from_slice(&self.ioccsz.to_le_bytes());
        b
    }

    /// NVMe over Fabrics: the bytes of data an I/O command may carry in its
    /// capsule (0 where IOCCSZ gives none).
    pub fn in_capsule_data(&self) -> usize {
        (self.ioccsz as usize * 16).saturating_sub(crate::Sqe::SIZE)
    }

    /// The largest transfer in bytes, given the controller's minimum page
    /// size (CAP.MPSMIN) in bytes, or `None` when MDTS is 0 (no limit).
    pub fn max_transfer_bytes(&self, min_page_size: usize) -> Option<usize> {
        if self.mdts == 0 {
            None
        } else {
            Some(min_page_size << self.mdts.min(20))
        }
    }
}

fn put_ascii(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// One LBA Format entry (figure 280).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LbaFormat {
    /// Metadata Size in bytes.
    pub ms: u16,
    /// LBA Data Size, log2 bytes.
    pub lbads: u8,
    /// Relative Performance.
    pub rp: u8,
}

impl LbaFormat {
    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        1u32 << self.lbads
    }
}

/// Identify Namespace data structure (CNS 00h, NVM spec figure 97), parsed.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct IdentifyNamespace {
    /// Namespace Size in logical blocks.
    pub nsze: u64,
    /// Namespace Capacity.
    pub ncap: u64,
    /// Namespace Utilization.
    pub nuse: u64,
    /// Number of LBA Formats (zero-based).
    pub nlbaf: u8,
    /// Formatted LBA Size: bits 3:0 (and 6:5) select the format in use.
    pub flbas: u8,
    /// The LBA formats.
    pub lbaf: Vec<LbaFormat>,
}

impl IdentifyNamespace {
    /// Parses the 4096-byte structure.
    pub fn parse(b: &[u8; IDENTIFY_LEN]) -> IdentifyNamespace {
        let nlbaf = b[25];
        let n = (nlbaf as usize + 1).min(64);
        let lbaf = (0..n)
            .map(|i| {
                let v = le32(b, 128 + 4 * i);
                LbaFormat { ms: v as u16, lbads: (v >> 16) as u8, rp: ((v >> 24) & 3) as u8 }
            })
            .collect();
        IdentifyNamespace { nsze: le64(b, 0), ncap: le64(b, 8), nuse: le64(b, 16), nlbaf, flbas: b[26], lbaf }
    }

    /// Writes the fields this struct knows into a zeroed structure.
    pub fn to_bytes(&self) -> [u8; IDENTIFY_LEN] {
        let mut b = [0u8; IDENTIFY_LEN];
        b[0..8].copy_from_slice(&self.nsze.to_le_bytes());
        b[8..16].copy_from_slice(&self.ncap.to_le_bytes());
        b[16..24].copy_from_slice(&self.nuse.to_le_bytes());
        b[25] = self.nlbaf;
        b[26] = self.flbas;
        for (i, f) in self.lbaf.iter().enumerate().take(64) {
            let v = f.ms as u32 | (f.lbads as u32) << 16 | ((f.rp & 3) as u32) << 24;
            b[128 + 4 * i..132 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Index of the LBA format in use (FLBAS bits 3:0, plus 6:5 above 16 formats).
    pub fn format_index(&self) -> usize {
        let lo = (self.flbas & 0xf) as usize;
        let hi = if self.nlbaf >= 16 { ((self.flbas >> 5) & 3) as usize } else { 0 };
        hi << 4 | lo
    }

    /// The LBA format in use, if the structure names a valid one.
    pub fn lba_format(&self) -> Option<LbaFormat> {
        self.lbaf.get(self.format_index()).copied()
    }

    /// Logical block size in bytes, if known.
    pub fn block_size(&self) -> Option<u32> {
        self.lba_format().filter(|f| (9..=16).contains(&f.lbads)).map(|f| f.block_size())
    }

    /// (blocks, block size) of a namespace data can be moved on as plain
    /// blocks, or why not: an LBA format that names no valid format, one
    /// with metadata, no blocks, or a size in bytes beyond a u64.
    pub fn usable(&self) -> Result<(u64, u32), String> {
        let (Some(f), Some(bs)) = (self.lba_format(), self.block_size()) else {
            return Err(format!("FLBAS {:#x} names no usable LBA format", self.flbas));
        };
        if f.ms != 0 {
            return Err(format!("its format has {} bytes of metadata per block", f.ms));
        }
        match self.nsze.checked_mul(bs as u64) {
            Some(bytes) if bytes > 0 => Ok((self.nsze, bs)),
            Some(_) => Err("NSZE is 0".into()),
            None => Err(format!("NSZE {} blocks of {bs} bytes overflows 64 bits", self.nsze)),
        }
    }
}

/// Command Set Identifiers (CSI) a namespace may report.
pub mod csi {
    /// The NVM command set: plain blocks.
    pub const NVM: u8 = 0x00;
    /// Key Value.
    pub const KEY_VALUE: u8 = 0x01;
    /// Zoned Namespace: writes only at each zone's write pointer.
    pub const ZONED: u8 = 0x02;
}

/// The command set a Namespace Identification Descriptor list (CNS 03h)
/// names (its CSI descriptor, NIDT 04h), `None` when it names none (a
/// controller older than command sets: NVM); an error for a list whose
/// descriptors do not fit the page or whose CSI descriptor has the wrong
/// length.
pub fn parse_ns_descriptors_csi(b: &[u8; IDENTIFY_LEN]) -> Result<Option<u8>, String> {
    let mut at = 0;
    while at + 4 <= IDENTIFY_LEN {
        let (nidt, nidl) = (b[at], b[at + 1] as usize);
        if nidt == 0 {
            return Ok(None);
        }
        if at + 4 + nidl > IDENTIFY_LEN {
            return Err(format!("descriptor type {nidt:#x} of {nidl} bytes at {at} runs past the page"));
        }
        if nidt == 0x04 {
            if nidl != 1 {
                return Err(format!("a CSI descriptor of {nidl} bytes (1 expected)"));
            }
            return Ok(Some(b[at + 4]));
        }
        at += 4 + nidl;
    }
    Ok(None)
}

/// The name of command set `csi`, for messages.
pub fn csi_name(csi: u8) -> &'static str {
    match csi {
        csi::NVM => "NVM",
        csi::KEY_VALUE => "Key Value",
        csi::ZONED => "Zoned Namespace",
        _ => "an unknown command set",
    }
}

/// Parses the active namespace ID list (CNS 02h): ascending NSIDs, ended by 0.
pub fn parse_active_ns_list(b: &[u8; IDENTIFY_LEN]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).take_while(|&n| n != 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_round_trips() {
        let c = IdentifyController {
            vid: 0x1b36,
            ssvid: 0x1af4,
            sn: "UGDS0001".into(),
            mn: "ugds emulated".into(),
            fr: "1.0".into(),
            mdts: 5,
            cntlid: 1,
            ver: 0x10400,
            oacs: 0,
            acl: 3,
            sqes: 0x66,
            cqes: 0x44,
            nn: 2,
            oncs: IdentifyController::ONCS_DSM | IdentifyController::ONCS_WRITE_ZEROES,
            vwc: 0,
            sgls: 1,
            ioccsz: 260,
        };
        let b = c.to_bytes();
        assert_eq!(b[77], 5);
        assert_eq!(c.in_capsule_data(), 4096);
        assert_eq!(IdentifyController::parse(&b), c);
        assert_eq!(c.max_transfer_bytes(4096), Some(128 * 1024));
        let unlimited = IdentifyController { mdts: 0, ..c };
        assert_eq!(unlimited.max_transfer_bytes(4096), None);
    }

    #[test]
    fn the_descriptor_list_names_the_command_set() {
        let mut b = [0u8; IDENTIFY_LEN];
        assert_eq!(parse_ns_descriptors_csi(&b), Ok(None));
        // An EUI-64 (8 bytes), then the CSI descriptor: Zoned.
        b[0] = 1;
        b[1] = 8;
        b[12] = 4;
        b[13] = 1;
        b[16] = csi::ZONED;
        assert_eq!(parse_ns_descriptors_csi(&b), Ok(Some(csi::ZONED)));
        b[13] = 2;
        assert!(parse_ns_descriptors_csi(&b).is_err());
        // A descriptor that runs past the page.
        let mut c = [0u8; IDENTIFY_LEN];
        for at in (0..IDENTIFY_LEN - 4).step_by(254) {
            (c[at], c[at + 1]) = (3, 250);
        }
        assert!(parse_ns_descriptors_csi(&c).is_err());
    }

    #[test]
    fn a_namespace_whose_size_overflows_is_not_usable() {
        let ns = |nsze, ms| IdentifyNamespace {
            nsze,
            ncap: nsze,
            nlbaf: 0,
            flbas: 0,
            lbaf: vec![LbaFormat { ms, lbads: 9, rp: 0 }],
            ..Default::default()
        };
        assert_eq!(ns(2048, 0).usable(), Ok((2048, 512)));
        // 2^55 + 1 blocks of 512 bytes is 2^64 + 512 bytes: not 512.
        let e = ns((1 << 55) + 1, 0).usable().unwrap_err();
        assert!(e.contains("overflows"), "{e}");
        assert!(ns(0, 0).usable().unwrap_err().contains("NSZE is 0"));
        assert!(ns(2048, 8).usable().unwrap_err().contains("metadata"));
        let bad_flbas = IdentifyNamespace { flbas: 3, ..ns(2048, 0) };
        assert!(bad_flbas.usable().is_err());
    }

    #[test]
    fn namespace_block_size() {
        let ns = IdentifyNamespace {
            nsze: 1000,
            ncap: 1000,
            nuse: 0,
            nlbaf: 1,
            flbas: 1,
            lbaf: vec![LbaFormat { ms: 0, lbads: 9, rp: 0 }, LbaFormat { ms: 0, lbads: 12, rp: 0 }],
        };
        let parsed = IdentifyNamespace::parse(&ns.to_bytes());
        assert_eq!(parsed, ns);
        assert_eq!(parsed.block_size(), Some(4096));
        assert_eq!(u64::from_le_bytes(ns.to_bytes()[0..8].try_into().unwrap()), 1000);
    }

    #[test]
    fn bad_format_index_has_no_block_size() {
        let ns = IdentifyNamespace { nlbaf: 0, flbas: 3, lbaf: vec![LbaFormat::default()], ..Default::default() };
        assert_eq!(ns.block_size(), None);
    }

    #[test]
    fn active_list_stops_at_zero() {
        let mut b = [0u8; IDENTIFY_LEN];
        b[0..4].copy_from_slice(&1u32.to_le_bytes());
        b[4..8].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(parse_active_ns_list(&b), vec![1, 3]);
    }
}
