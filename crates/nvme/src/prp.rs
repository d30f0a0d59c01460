//! Physical Region Page lists (section 4.3.1): the host side (planning PRPs
//! for a byte range of a buffer) and the controller side (walking them).
//!
//! Rules from the spec, quoted where the code relies on them:
//!
//! - "The first PRP entry ... may have a non-zero offset within the memory
//!   page"; it must be dword aligned ("bits 1:0 shall be 00b").
//! - PRP2 is "either a PRP entry ... or a PRP List pointer": a data page if
//!   the transfer ends within the second page, a list pointer otherwise.
//! - "PRP entries contained within a PRP List shall have a memory page offset
//!   of 0h." The last entry of a list page points to the next list page when
//!   more entries follow.
//!
//! The planner never chains list pages: the engine chunks transfers so that
//! one list page (page_size / 8 entries) suffices, which is what keeps one
//! pre-mapped list page per command enough. [`max_chunk_bytes`] is that rule.

/// Why a range cannot be described by PRPs as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PrpError {
    /// The transfer is empty.
    #[error("empty transfer")]
    Empty,
    /// The first data byte is not dword aligned.
    #[error("data address offset {offset:#x} is not dword aligned")]
    Misaligned {
        /// The byte offset that was asked for.
        offset: usize,
    },
    /// The range runs past the page table.
    #[error("range {offset:#x}+{len:#x} runs past the {pages} mapped pages")]
    OutOfRange {
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Pages in the table.
        pages: usize,
    },
    /// A page address in the table is not page aligned.
    #[error("page {index} at {addr:#x} is not aligned to the page size")]
    UnalignedPage {
        /// Index in the table.
        index: usize,
        /// The address found.
        addr: u64,
    },
    /// The range needs more entries than one list page holds.
    #[error("transfer needs {entries} list entries; one list page holds {max}")]
    TooLarge {
        /// Entries needed.
        entries: usize,
        /// Entries per list page.
        max: usize,
    },
}

/// The PRPs for one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrpPlan<'a> {
    /// The data lies in one page: PRP2 is unused (zero).
    One {
        /// PRP1.
        prp1: u64,
    },
    /// The data spans two pages: PRP2 is the second page.
    Two {
        /// PRP1.
        prp1: u64,
        /// PRP2.
        prp2: u64,
    },
    /// More than two pages: PRP2 must point to a list page holding `entries`.
    List {
        /// PRP1.
        prp1: u64,
        /// The entries to copy into the list page, in order.
        entries: &'a [u64],
    },
}

impl PrpPlan<'_> {
    /// PRP1.
    pub fn prp1(&self) -> u64 {
        match *self {
            PrpPlan::One { prp1 } | PrpPlan::Two { prp1, .. } | PrpPlan::List { prp1, .. } => prp1,
        }
    }
}

/// Plans the PRPs for `len` bytes starting `offset` bytes into the memory
/// described by `pages` (the controller address of each page, in order).
/// `page_size` is the controller memory page size (CC.MPS), a power of two.
#[inline(always)]
pub fn plan(pages: &[u64], page_size: usize, offset: usize, len: usize) -> Result<PrpPlan<'_>, PrpError> {
    debug_assert!(page_size.is_power_of_two() && page_size >= 4096);
    if len == 0 {
        return Err(PrpError::Empty);
    }
    if offset % 4 != 0 {
        return Err(PrpError::Misaligned { offset });
    }
    let end = offset.checked_add(len).filter(|&e| e <= pages.len() * page_size);
    let Some(end) = end else {
        return Err(PrpError::OutOfRange { offset, len, pages: pages.len() });
    };
    // Shifts and masks, not division: this runs for every command, and a
    // 64-bit divide costs tens of cycles (a helper call under emulation).
    let (shift, mask) = (page_size.trailing_zeros(), page_size - 1);
    let first = offset >> shift;
    let last = (end - 1) >> shift;
    let check = |i: usize| -> Result<u64, PrpError> {
        let a = pages[i];
        if a & mask as u64 != 0 {
            Err(PrpError::UnalignedPage { index: i, addr: a })
        } else {
            Ok(a)
        }
    };
    let prp1 = check(first)? + (offset & mask) as u64;
    // Fast paths: one or two pages need no list (and are small enough to
    // inline into every caller; the list is planned out of line).
    match last - first {
        0 => Ok(PrpPlan::One { prp1 }),
        1 => Ok(PrpPlan::Two { prp1, prp2: check(last)? }),
        _ => plan_list(pages, page_size, first, last, prp1),
    }
}

/// PRP1 and PRP2 of a transfer of one page or less: PRP2 is the second
/// page when the data crosses into it, 0 (unused) when not. The fast path
/// of [`plan`] for the commonest command, with fewer checks: `len` in
/// `1..=page_size` and `offset` dword aligned are the caller's to check, and
/// so is every entry of `pages` being page aligned (checked once, when the
/// buffer was mapped). `None` when the range runs past `pages`.
#[inline(always)]
pub fn pair(pages: &[u64], page_size: usize, offset: usize, len: usize) -> Option<(u64, u64)> {
    debug_assert!(page_size.is_power_of_two() && (1..=page_size).contains(&len) && offset % 4 == 0);
    let (first, within) = (offset >> page_size.trailing_zeros(), offset & (page_size - 1));
    let prp1 = *pages.get(first)? + within as u64;
    let prp2 = if within + len > page_size { *pages.get(first + 1)? } else { 0 };
    Some((prp1, prp2))
}

#[inline(never)]
fn plan_list(pages: &[u64], page_size: usize, first: usize, last: usize, prp1: u64) -> Result<PrpPlan<'_>, PrpError> {
    let (n, max) = (last - first, page_size / 8);
    if n > max {
        return Err(PrpError::TooLarge { entries: n, max });
    }
    let mask = page_size as u64 - 1;
    if let Some(i) = (first + 1..=last).find(|&i| pages[i] & mask != 0) {
        return Err(PrpError::UnalignedPage { index: i, addr: pages[i] });
    }
    Ok(PrpPlan::List { prp1, entries: &pages[first + 1..=last] })
}

/// The largest transfer one command may carry when its data starts
/// `offset_in_page` bytes into a page: bounded by what PRP1 plus one list
/// page can address (`(page_size/8 + 1)` pages, less the first page's offset),
/// by `mdts_bytes` when the controller sets one, and rounded down to whole
/// blocks of `block` bytes (a power of two, as every NVMe LBA size is).
#[inline]
pub fn max_chunk_bytes(page_size: usize, offset_in_page: usize, mdts_bytes: Option<usize>, block: usize) -> usize {
    debug_assert!(block.is_power_of_two(), "logical blocks are 2^LBADS bytes");
    let by_list = (page_size / 8 + 1) * page_size - offset_in_page;
    let cap = mdts_bytes.map_or(by_list, |m| m.min(by_list));
    cap & !(block - 1)
}

/// Why a controller cannot walk a command's PRPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WalkError<E> {
    /// An entry has an offset the spec forbids (PRP Offset Invalid).
    #[error("PRP entry {addr:#x} has an invalid offset")]
    InvalidOffset {
        /// The entry.
        addr: u64,
    },
    /// Reading a list page failed (a DMA fault on the controller's side).
    #[error("reading PRP list at {addr:#x} failed")]
    ListRead {
        /// The list page address.
        addr: u64,
        /// What the reader said.
        cause: E,
    },
}

/// Walks PRP1/PRP2 for a transfer of `len` bytes, as a controller does, and
/// calls `segment(addr, len)` for each contiguous piece in order. `read_list`
/// fills `out` with `out.len()` little-endian entries read from `addr`.
pub fn walk<E>(
    prp1: u64,
    prp2: u64,
    len: usize,
    page_size: usize,
    mut read_list: impl FnMut(u64, &mut [u64]) -> Result<(), E>,
    mut segment: impl FnMut(u64, usize),
) -> Result<(), WalkError<E>> {
    let ps = page_size as u64;
    if prp1 % 4 != 0 {
        return Err(WalkError::InvalidOffset { addr: prp1 });
    }
    let first = len.min((ps - prp1 % ps) as usize);
    segment(prp1, first);
    let mut remaining = len - first;
    if remaining == 0 {
        return Ok(());
    }
    if remaining <= page_size {
        if prp2 % ps != 0 {
            return Err(WalkError::InvalidOffset { addr: prp2 });
        }
        segment(prp2, remaining);
        return Ok(());
    }
    // PRP2 is a list pointer; it may carry a (qword aligned) offset.
    if prp2 % 8 != 0 {
        return Err(WalkError::InvalidOffset { addr: prp2 });
    }
    let mut list = prp2;
    let mut buf = [0u64; 512];
    loop {
        let room = ((ps - list % ps) / 8) as usize;
        let pages_left = remaining.div_ceil(page_size);
        // All remaining pages fit in this list page, or the last slot chains.
        let n = if pages_left <= room { pages_left } else { room };
        let chunk = &mut buf[..n.min(512)];
        read_list(list, chunk).map_err(|cause| WalkError::ListRead { addr: list, cause })?;
        let data = if pages_left <= room { n } else { n - 1 };
        for &e in &chunk[..data] {
            if e % ps != 0 {
                return Err(WalkError::InvalidOffset { addr: e });
            }
            let l = remaining.min(page_size);
            segment(e, l);
            remaining -= l;
        }
        if remaining == 0 {
            return Ok(());
        }
        list = chunk[n - 1];
        if list % ps != 0 {
            return Err(WalkError::InvalidOffset { addr: list });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PS: usize = 4096;

    #[test]
    fn one_two_and_list() {
        let pages = [0x10000u64, 0x30000, 0x20000, 0x50000];
        assert_eq!(plan(&pages, PS, 0, 4096), Ok(PrpPlan::One { prp1: 0x10000 }));
        assert_eq!(plan(&pages, PS, 512, 512), Ok(PrpPlan::One { prp1: 0x10200 }));
        assert_eq!(plan(&pages, PS, 512, 4096), Ok(PrpPlan::Two { prp1: 0x10200, prp2: 0x30000 }));
        assert_eq!(plan(&pages, PS, 0, 8192), Ok(PrpPlan::Two { prp1: 0x10000, prp2: 0x30000 }));
        assert_eq!(plan(&pages, PS, 4096, 8193), Ok(PrpPlan::List { prp1: 0x30000, entries: &pages[2..4] }));
    }

    #[test]
    fn refusals() {
        let pages = [0x10000u64, 0x20001];
        assert_eq!(plan(&pages, PS, 0, 0), Err(PrpError::Empty));
        assert_eq!(plan(&pages, PS, 2, 4), Err(PrpError::Misaligned { offset: 2 }));
        assert_eq!(plan(&pages, PS, 4096, 4097), Err(PrpError::OutOfRange { offset: 4096, len: 4097, pages: 2 }));
        assert_eq!(plan(&pages, PS, 0, 8192), Err(PrpError::UnalignedPage { index: 1, addr: 0x20001 }));
        let many: Vec<u64> = (0..600).map(|i| i * PS as u64).collect();
        assert_eq!(plan(&many, PS, 0, 514 * PS), Err(PrpError::TooLarge { entries: 513, max: 512 }));
        assert!(plan(&many, PS, 0, 513 * PS).is_ok());
    }

    #[test]
    fn chunk_limits() {
        assert_eq!(max_chunk_bytes(PS, 0, None, 512), 513 * PS);
        assert_eq!(max_chunk_bytes(PS, 512, None, 512), 513 * PS - 512);
        assert_eq!(max_chunk_bytes(PS, 512, None, 4096), 512 * PS);
        assert_eq!(max_chunk_bytes(PS, 0, Some(128 * 1024), 512), 128 * 1024);
    }

    #[test]
    fn walk_follows_a_chained_list() {
        // 4 pages of data with the list pointer 16 bytes before the end of a
        // page: two entries fit, the second chains to a new page.
        let list1 = 0x9000u64 + 4096 - 16;
        let lists = |addr: u64, out: &mut [u64]| -> Result<(), ()> {
            let src: &[u64] = match addr {
                a if a == list1 => &[0x2000, 0xa000],
                0xa000 => &[0x3000, 0x4000],
                _ => return Err(()),
            };
            out.copy_from_slice(&src[..out.len()]);
            Ok(())
        };
        let mut segs = vec![];
        walk(0x1000, list1, 4 * PS, PS, lists, |a, l| segs.push((a, l))).unwrap();
        assert_eq!(segs, vec![(0x1000, PS), (0x2000, PS), (0x3000, PS), (0x4000, PS)]);
    }

    #[test]
    fn walk_rejects_offsets() {
        let no_list = |_: u64, _: &mut [u64]| -> Result<(), ()> { Err(()) };
        assert_eq!(walk(0x1002, 0, 8, PS, no_list, |_, _| {}), Err(WalkError::InvalidOffset { addr: 0x1002 }));
        assert_eq!(walk(0x1000, 0x2200, 8192, PS, no_list, |_, _| {}), Err(WalkError::InvalidOffset { addr: 0x2200 }));
        assert_eq!(
            walk(0x1000, 0x2000, 3 * PS, PS, no_list, |_, _| {}),
            Err(WalkError::ListRead { addr: 0x2000, cause: () })
        );
    }

    proptest! {
        /// Whatever the planner produces, a controller walking it reaches
        /// exactly the bytes of the range, page by page.
        #[test]
        fn planned_prps_cover_exactly_the_range(
            npages in 1usize..600,
            seed in any::<u64>(),
            start in 0usize..(600 * PS),
            len in 1usize..(520 * PS),
        ) {
            let pages: Vec<u64> = (0..npages as u64)
                .map(|i| ((i.wrapping_mul(seed | 1) ^ seed) % 0x10_0000 + 1) * PS as u64)
                .collect();
            let start = (start % (npages * PS)) & !3;
            let len = len.min(npages * PS - start).max(1);
            match plan(&pages, PS, start, len) {
                Ok(p) => {
                    let (prp1, prp2, entries): (u64, u64, Vec<u64>) = match p {
                        PrpPlan::One { prp1 } => (prp1, 0, vec![]),
                        PrpPlan::Two { prp1, prp2 } => (prp1, prp2, vec![]),
                        PrpPlan::List { prp1, entries } => (prp1, 0xdead_0000, entries.to_vec()),
                    };
                    let read = |addr: u64, out: &mut [u64]| -> Result<(), ()> {
                        if addr != 0xdead_0000 {
                            return Err(());
                        }
                        out.copy_from_slice(&entries[..out.len()]);
                        Ok(())
                    };
                    let mut got = vec![];
                    walk(prp1, prp2, len, PS, read, |a, l| got.push((a, l))).unwrap();
                    let mut expect = vec![];
                    let mut off = start;
                    while off < start + len {
                        let l = (PS - off % PS).min(start + len - off);
                        expect.push((pages[off / PS] + (off % PS) as u64, l));
                        off += l;
                    }
                    prop_assert_eq!(got, expect);
                }
                Err(PrpError::TooLarge { entries, max }) => {
                    prop_assert!(entries > max);
                    prop_assert!(len > max_chunk_bytes(PS, start % PS, None, 4));
                }
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }

        /// The one-page fast path names the same PRPs as the planner, and
        /// refuses exactly the ranges past the pages.
        #[test]
        fn pair_agrees_with_plan(npages in 1usize..4, start in 0usize..(4 * PS), len in 1usize..=PS) {
            let pages: Vec<u64> = (0..npages as u64).map(|i| (7 - i) * PS as u64).collect();
            let start = start & !3;
            let expect = match plan(&pages, PS, start, len) {
                Ok(PrpPlan::One { prp1 }) => Some((prp1, 0)),
                Ok(PrpPlan::Two { prp1, prp2 }) => Some((prp1, prp2)),
                Ok(p) => return Err(TestCaseError::fail(format!("a page or less planned as {p:?}"))),
                Err(PrpError::OutOfRange { .. }) => None,
                Err(e) => return Err(TestCaseError::fail(format!("unexpected {e}"))),
            };
            prop_assert_eq!(pair(&pages, PS, start, len), expect);
        }

        /// A chunk of the size the engine uses always plans without a chain.
        #[test]
        fn max_chunk_always_plans(off in 0usize..PS, block_log in 9u32..13) {
            let off = off & !3;
            let block = 1usize << block_log;
            let pages: Vec<u64> = (0..600u64).map(|i| i * PS as u64).collect();
            let n = max_chunk_bytes(PS, off, None, block);
            prop_assert!(n > 0 && n % block == 0);
            prop_assert!(plan(&pages, PS, off, n).is_ok());
        }
    }
}
