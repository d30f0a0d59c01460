//! Scatter Gather Lists (section 4.3.2): the host side (describing pieces of
//! buffers as Data Block descriptors) and the controller side (walking them).
//!
//! Rules from the spec that the code relies on:
//!
//! - A command uses SGLs when CDW0's PSDT field is 01b; its Data Pointer is
//!   then the first descriptor, SGL1 (16 bytes: address, length, and the
//!   descriptor type in the high nibble of byte 15, the subtype in the low).
//! - "If the entire transfer can be described by one Data Block
//!   descriptor", SGL1 may be that descriptor; otherwise SGL1 is a Segment or
//!   Last Segment descriptor pointing to a list of descriptors in memory. A
//!   Segment's last descriptor may point to the next segment; a Last
//!   Segment's descriptors are all data.
//! - Identify Controller's SGLS (bytes 539:536), bits 1:0: 00b no SGLs, 01b
//!   SGLs with no alignment requirement, 10b SGLs whose Data Block
//!   descriptors are dword aligned in address and length.
//!
//! The host side here builds SGL1 as one Data Block, or as a Last Segment of
//! at most one page of Data Block descriptors: never a chain.

/// Bytes of one descriptor.
pub const DESCRIPTOR_LEN: usize = 16;

/// Descriptor types (byte 15, bits 7:4).
pub mod kind {
    /// Data Block: `len` bytes at `addr`.
    pub const DATA_BLOCK: u8 = 0x0;
    /// Bit Bucket: `len` bytes of a read to discard (not used here).
    pub const BIT_BUCKET: u8 = 0x1;
    /// Segment: `len` bytes of descriptors at `addr`, the last of which may
    /// point to the next segment.
    pub const SEGMENT: u8 = 0x2;
    /// Last Segment: `len` bytes of descriptors at `addr`, all data.
    pub const LAST_SEGMENT: u8 = 0x3;
}

/// PSDT (CDW0 bits 15:14) for SGLs with a contiguous metadata buffer.
pub const PSDT_SGL: u32 = 0b01;

/// One SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// Address (subtype 0h: a memory address).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Byte 15: type << 4 | subtype.
    pub id: u8,
}

impl Descriptor {
    /// A Data Block descriptor of `len` bytes at `addr`.
    pub const fn data_block(addr: u64, len: u32) -> Descriptor {
        Descriptor { addr, len, id: kind::DATA_BLOCK << 4 }
    }

    /// A Last Segment descriptor: `count` descriptors at `addr`.
    pub const fn last_segment(addr: u64, count: usize) -> Descriptor {
        Descriptor { addr, len: (count * DESCRIPTOR_LEN) as u32, id: kind::LAST_SEGMENT << 4 }
    }

    /// Its type (byte 15, bits 7:4).
    pub const fn kind(&self) -> u8 {
        self.id >> 4
    }

    /// Its subtype (byte 15, bits 3:0).
    pub const fn subtype(&self) -> u8 {
        self.id & 0xf
    }

    /// The 16 bytes as they lie in memory.
    pub fn to_bytes(&self) -> [u8; DESCRIPTOR_LEN] {
        let mut b = [0u8; DESCRIPTOR_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[15] = self.id;
        b
    }

    /// Reads one from memory.
    pub fn from_bytes(b: &[u8; DESCRIPTOR_LEN]) -> Descriptor {
        Descriptor {
            addr: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            len: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            id: b[15],
        }
    }

    /// As the Data Pointer of an entry: its two 64-bit words (the fields
    /// that hold PRP1 and PRP2 when PSDT is 00b).
    pub const fn to_dptr(&self) -> (u64, u64) {
        (self.addr, self.len as u64 | (self.id as u64) << 56)
    }

    /// SGL1 of an entry's Data Pointer.
    pub const fn from_dptr(dptr0: u64, dptr1: u64) -> Descriptor {
        Descriptor { addr: dptr0, len: dptr1 as u32, id: (dptr1 >> 56) as u8 }
    }
}

/// Whether the controller takes SGLs for NVM commands, from Identify's SGLS.
pub const fn supported(sgls: u32) -> bool {
    matches!(sgls & 3, 0b01 | 0b10)
}

/// One piece of a transfer: `len` bytes from `offset` bytes into memory
/// whose pages (controller addresses, in order) are `pages`.
#[derive(Debug, Clone, Copy)]
pub struct Piece<'a> {
    /// The memory's pages.
    pub pages: &'a [u64],
    /// Where the piece starts in it.
    pub offset: usize,
    /// Its length.
    pub len: usize,
}

/// Why pieces cannot be described as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SglError {
    /// A piece is empty, or not dword aligned in address or length.
    #[error("piece {index} is empty or not dword aligned")]
    Misaligned {
        /// Which piece.
        index: usize,
    },
    /// A piece runs past its page table.
    #[error("piece {index} runs past its pages")]
    OutOfRange {
        /// Which piece.
        index: usize,
    },
    /// More descriptors than the list holds.
    #[error("{needed} descriptors needed, at most {max}")]
    TooMany {
        /// Descriptors needed (at least).
        needed: usize,
        /// The list's capacity.
        max: usize,
    },
}

/// Describes `pieces` in order as Data Block descriptors, one per run of
/// contiguous pages, handing each to `emit` with its index; at most `max`.
/// Returns how many there are.
pub fn describe(
    pieces: &[Piece<'_>],
    page_size: usize,
    max: usize,
    mut emit: impl FnMut(usize, Descriptor),
) -> Result<usize, SglError> {
    debug_assert!(page_size.is_power_of_two());
    let mask = page_size - 1;
    let mut n = 0usize;
    // The run being built: (address, length).
    let mut run: Option<(u64, u64)> = None;
    let mut flush = |run: (u64, u64), n: &mut usize| -> Result<(), SglError> {
        if *n == max {
            return Err(SglError::TooMany { needed: *n + 1, max });
        }
        emit(*n, Descriptor::data_block(run.0, run.1 as u32));
        *n += 1;
        Ok(())
    };
    for (index, p) in pieces.iter().enumerate() {
        if p.len == 0 || p.len % 4 != 0 || p.offset % 4 != 0 {
            return Err(SglError::Misaligned { index });
        }
        let end = p.offset.checked_add(p.len).filter(|&e| e <= p.pages.len() * page_size);
        let Some(end) = end else { return Err(SglError::OutOfRange { index }) };
        let mut at = p.offset;
        while at < end {
            let page_end = (at | mask) + 1;
            let take = (page_end.min(end) - at) as u64;
            let addr = p.pages[at / page_size] + (at & mask) as u64;
            run = match run {
                // Contiguous with the run, and it stays within a length field.
                Some((a, l)) if a + l == addr && l + take <= u32::MAX as u64 => Some((a, l + take)),
                Some(r) => {
                    flush(r, &mut n)?;
                    Some((addr, take))
                }
                None => Some((addr, take)),
            };
            at += take as usize;
        }
    }
    if let Some(r) = run {
        flush(r, &mut n)?;
    }
    Ok(n)
}

/// Why a controller refuses an SGL: the generic status code to complete
/// the command with, or the reader's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkError<E> {
    /// A descriptor type (or subtype) the controller does not take (SGL
    /// Descriptor Type Invalid, 11h).
    TypeInvalid,
    /// A segment descriptor of a bad length, or where it may not be
    /// (Invalid SGL Segment Descriptor, 0Dh).
    SegmentInvalid,
    /// More descriptors than a controller walks for one command (Invalid
    /// Number of SGL Descriptors, 0Eh).
    TooMany,
    /// The data blocks do not add up to the transfer (Data SGL Length
    /// Invalid, 0Fh).
    LengthInvalid,
    /// Reading a segment from memory failed.
    Read(E),
}

impl<E> WalkError<E> {
    /// The generic status code for the command; `None` for a read error.
    pub fn status_code(&self) -> Option<u8> {
        match self {
            WalkError::TypeInvalid => Some(0x11),
            WalkError::SegmentInvalid => Some(0x0d),
            WalkError::TooMany => Some(0x0e),
            WalkError::LengthInvalid => Some(0x0f),
            WalkError::Read(_) => None,
        }
    }
}

/// The most descriptors [`walk`] reads for one command (a chain that loops
/// ends here).
pub const MAX_WALK: usize = 1 << 16;

/// Walks the SGL of a command that moves `len` bytes and whose SGL1 is
/// `sgl1`, calling `data` for each data range in order. `read(addr, n)`
/// reads `n` descriptors from memory. The data blocks must add up to `len`
/// exactly (this walker does not take excess length or bit buckets).
pub fn walk<E>(
    sgl1: Descriptor,
    len: usize,
    mut read: impl FnMut(u64, usize) -> Result<Vec<Descriptor>, E>,
    mut data: impl FnMut(u64, usize),
) -> Result<(), WalkError<E>> {
    let mut left = len as u64;
    let mut take = |d: &Descriptor, left: &mut u64| -> Result<(), WalkError<E>> {
        if d.subtype() != 0 {
            return Err(WalkError::TypeInvalid);
        }
        if d.len as u64 > *left {
            return Err(WalkError::LengthInvalid);
        }
        if d.len > 0 {
            data(d.addr, d.len as usize);
        }
        *left -= d.len as u64;
        Ok(())
    };
    let mut next = match sgl1.kind() {
        kind::DATA_BLOCK => {
            take(&sgl1, &mut left)?;
            None
        }
        kind::SEGMENT | kind::LAST_SEGMENT => Some(sgl1),
        _ => return Err(WalkError::TypeInvalid),
    };
    let mut walked = 0usize;
    while let Some(seg) = next.take() {
        if seg.subtype() != 0 {
            return Err(WalkError::TypeInvalid);
        }
        if seg.len == 0 || seg.len as usize % DESCRIPTOR_LEN != 0 {
            return Err(WalkError::SegmentInvalid);
        }
        let n = seg.len as usize / DESCRIPTOR_LEN;
        walked += n;
        if walked > MAX_WALK {
            return Err(WalkError::TooMany);
        }
        let list = read(seg.addr, n).map_err(WalkError::Read)?;
        let last = seg.kind() == kind::LAST_SEGMENT;
        for (i, d) in list.iter().enumerate() {
            match d.kind() {
                kind::DATA_BLOCK => take(d, &mut left)?,
                // Only a Segment's last descriptor may lead on.
                kind::SEGMENT | kind::LAST_SEGMENT if !last && i == n - 1 => next = Some(*d),
                kind::SEGMENT | kind::LAST_SEGMENT => return Err(WalkError::SegmentInvalid),
                _ => return Err(WalkError::TypeInvalid),
            }
        }
    }
    if left != 0 {
        return Err(WalkError::LengthInvalid);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    #[test]
    fn descriptors_round_trip() {
        let d = Descriptor::data_block(0x1234_5000, 8192);
        assert_eq!(Descriptor::from_bytes(&d.to_bytes()), d);
        let (a, b) = d.to_dptr();
        assert_eq!(Descriptor::from_dptr(a, b), d);
        let l = Descriptor::last_segment(0x9000, 3);
        assert_eq!((l.kind(), l.len), (kind::LAST_SEGMENT, 48));
        assert_eq!(l.to_bytes()[15], 0x30);
        assert!(supported(1) && supported(2) && !supported(0) && !supported(3));
    }

    fn described(pieces: &[Piece<'_>], max: usize) -> Result<Vec<Descriptor>, SglError> {
        let mut out = Vec::new();
        describe(pieces, PAGE, max, |i, d| {
            assert_eq!(i, out.len());
            out.push(d)
        })?;
        Ok(out)
    }

    #[test]
    fn contiguous_pages_make_one_block() {
        let pages = [0x10000, 0x11000, 0x12000, 0x40000];
        let p = [Piece { pages: &pages, offset: 512, len: 3 * PAGE }];
        let d = described(&p, 256).unwrap();
        assert_eq!(d, [Descriptor::data_block(0x10200, (3 * PAGE - 512) as u32), Descriptor::data_block(0x40000, 512)]);
        // Two pieces that happen to be contiguous merge; others do not.
        let q = [Piece { pages: &pages, offset: 0, len: PAGE }, Piece { pages: &pages, offset: PAGE, len: 8 }];
        assert_eq!(described(&q, 256).unwrap(), [Descriptor::data_block(0x10000, PAGE as u32 + 8)]);
        let r = [Piece { pages: &pages, offset: 3 * PAGE, len: 8 }, Piece { pages: &pages, offset: 0, len: 8 }];
        assert_eq!(described(&r, 256).unwrap().len(), 2);
    }

    #[test]
    fn bad_pieces_are_refused() {
        let pages = [0x10000, 0x20000];
        assert_eq!(described(&[Piece { pages: &pages, offset: 2, len: 8 }], 8), Err(SglError::Misaligned { index: 0 }));
        assert_eq!(described(&[Piece { pages: &pages, offset: 0, len: 0 }], 8), Err(SglError::Misaligned { index: 0 }));
        assert_eq!(
            described(&[Piece { pages: &pages, offset: PAGE, len: PAGE + 4 }], 8),
            Err(SglError::OutOfRange { index: 0 })
        );
        assert!(matches!(
            described(&[Piece { pages: &pages, offset: 0, len: 2 * PAGE }], 1),
            Err(SglError::TooMany { .. })
        ));
    }

    /// Memory of descriptor lists for the walker, by address.
    fn reader(lists: &[(u64, Vec<Descriptor>)]) -> impl FnMut(u64, usize) -> Result<Vec<Descriptor>, ()> + '_ {
        move |addr, n| lists.iter().find(|(a, _)| *a == addr).map(|(_, l)| l[..n.min(l.len())].to_vec()).ok_or(())
    }

    #[test]
    fn the_walker_reads_what_describe_wrote() {
        let pages = [0x10000, 0x30000, 0x31000];
        let p = [Piece { pages: &pages, offset: 256, len: PAGE + 512 }, Piece { pages: &pages, offset: 0, len: 64 }];
        let list = described(&p, 256).unwrap();
        let sgl1 = Descriptor::last_segment(0x8000, list.len());
        let mut got = Vec::new();
        walk(sgl1, PAGE + 512 + 64, reader(&[(0x8000, list)]), |a, l| got.push((a, l))).unwrap();
        assert_eq!(got, [(0x10100, PAGE - 256), (0x30000, 768), (0x10000, 64)]);
        // One data block as SGL1.
        let mut got = Vec::new();
        walk(Descriptor::data_block(0x5000, 512), 512, reader(&[]), |a, l| got.push((a, l))).unwrap();
        assert_eq!(got, [(0x5000, 512)]);
    }

    #[test]
    fn the_walker_refuses_bad_lists() {
        let data = |n| Descriptor::data_block(0x1000, n);
        let run = |sgl1, len, lists: &[(u64, Vec<Descriptor>)]| walk(sgl1, len, reader(lists), |_, _| {});
        assert_eq!(run(data(512), 1024, &[]), Err(WalkError::LengthInvalid), "too short");
        assert_eq!(run(data(2048), 1024, &[]), Err(WalkError::LengthInvalid), "too long");
        let bucket = Descriptor { addr: 0, len: 512, id: kind::BIT_BUCKET << 4 };
        assert_eq!(run(bucket, 512, &[]), Err(WalkError::TypeInvalid));
        let offset_subtype = Descriptor { addr: 0, len: 512, id: 1 };
        assert_eq!(run(offset_subtype, 512, &[]), Err(WalkError::TypeInvalid));
        let odd = Descriptor { addr: 0x8000, len: 20, id: kind::LAST_SEGMENT << 4 };
        assert_eq!(run(odd, 512, &[]), Err(WalkError::SegmentInvalid));
        // A Last Segment that leads on.
        let leads = vec![data(256), Descriptor::last_segment(0x9000, 1)];
        let sgl1 = Descriptor::last_segment(0x8000, 2);
        assert_eq!(run(sgl1, 512, &[(0x8000, leads), (0x9000, vec![data(256)])]), Err(WalkError::SegmentInvalid));
        // A Segment that points to itself ends at the walk's limit.
        let seg = Descriptor { addr: 0x8000, len: 32, id: kind::SEGMENT << 4 };
        let lst = vec![Descriptor::data_block(0x1000, 0), seg];
        assert_eq!(run(seg, 512, &[(0x8000, lst)]), Err(WalkError::TooMany));
        assert_eq!(run(sgl1, 512, &[]), Err(WalkError::Read(())));
        assert_eq!(WalkError::<()>::LengthInvalid.status_code(), Some(0x0f));
    }
}
