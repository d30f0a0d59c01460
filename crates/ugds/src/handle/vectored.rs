//! Vectored synchronous I/O: one contiguous range of the namespace to or
//! from several buffer segments in one call (KV-cache blocks scattered in
//! GPU memory, read from one extent of the SSD).
//!
//! The range is split at the segments' boundaries; each piece becomes the
//! commands its segment needs (PRPs, as for any request: at most MDTS, at
//! most what one PRP-list page addresses), and all of them run as one
//! request on one queue pair, completed as one. Every segment is checked,
//! and every buffer claimed, before any command is built.

use super::*;
use crate::registry::Recent;
use ugds_nvme::sgl;

/// The most segments one vectored call takes.
pub const MAX_SEGMENTS: usize = 256;

/// A piece of a registered buffer: `len` bytes at `offset` into `buf`.
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    /// The registration.
    pub buf: &'a BufferToken,
    /// Where the piece starts in it.
    pub offset: usize,
    /// Its length: a non-zero multiple of the block size.
    pub len: usize,
}

impl<'a> Segment<'a> {
    /// `len` bytes at `offset` into `buf`.
    pub fn new(buf: &'a BufferToken, offset: usize, len: usize) -> Segment<'a> {
        Segment { buf, offset, len }
    }
}

impl Handle {
    /// Reads the `sum of lengths` bytes at `file_offset` into `segments`,
    /// in order: the first segment's length from `file_offset`, the next
    /// from where it ends, and so on. Returns the bytes read. Refused, with
    /// nothing submitted: no segments or more than [`MAX_SEGMENTS`], a
    /// segment that is empty, not a multiple of the block size, outside its
    /// registration or not dword-aligned, two segments that overlap (a
    /// read would write the same bytes twice), or a range outside the
    /// namespace.
    pub fn readv(&self, segments: &[Segment<'_>], file_offset: u64) -> Result<usize> {
        self.rwv(NvmOpcode::Read, segments, file_offset, Priority::Normal)
    }

    /// Writes `segments`, in order, to the range at `file_offset` (see
    /// [`readv`](Self::readv); segments of a write may overlap).
    pub fn writev(&self, segments: &[Segment<'_>], file_offset: u64) -> Result<usize> {
        self.rwv(NvmOpcode::Write, segments, file_offset, Priority::Normal)
    }

    /// As [`readv`](Self::readv), of class `priority` (see
    /// [`read_with_priority`](Self::read_with_priority)).
    pub fn readv_with_priority(&self, segments: &[Segment<'_>], file_offset: u64, priority: Priority) -> Result<usize> {
        self.rwv(NvmOpcode::Read, segments, file_offset, priority)
    }

    fn rwv(&self, op: NvmOpcode, segments: &[Segment<'_>], file_offset: u64, prio: Priority) -> Result<usize> {
        let h = &*self.inner;
        let _in = h.enter()?;
        let total = check_segments(segments, h.ns.block_size as usize, op == NvmOpcode::Read)?;
        h.check_range(total, file_offset)?;
        // Claim every buffer (and look up its pages) before building a command.
        let mut claimed: Vec<(BufGuard, Recent, usize, u64, usize)> = Vec::with_capacity(segments.len());
        let mut at = file_offset;
        for s in segments {
            let mut recent = None;
            let (guard, data_off) = h.prepare_recent(&mut recent, s.buf, s.len, at, s.offset)?;
            claimed.push((guard, recent.expect("filled by prepare_recent"), data_off, at, s.len));
            at += s.len as u64;
        }
        let nsid = Nsid(h.ns.nsid);
        let (name, write) = if op == NvmOpcode::Read { ("Read", false) } else { ("Write", true) };
        // One command with an SGL where the controller takes them and it fits.
        let pieces: Vec<sgl::Piece> = match h.sgl {
            true => claimed
                .iter()
                .map(|(_, recent, data_off, _, len)| sgl::Piece { pages: recent.pages(), offset: *data_off, len: *len })
                .collect(),
            false => Vec::new(),
        };
        let one_sgl = h.one_sgl(total, &pieces);
        let (q, r) = if one_sgl {
            let bs = h.ns.block_size as u64;
            let cmd = Cmd {
                sqe: Sqe::rw(op, Cid(0), nsid, Lba(file_offset / bs), (total as u64 / bs) as u32, 0, 0),
                prp: None,
                sgl: Some(&pieces),
                bytes: total as u32,
            };
            h.run_scheduled(std::iter::once(cmd), name, write, prio, total)
        } else {
            let cmds = claimed.iter().flat_map(|(_, recent, data_off, at, len)| {
                let pages = recent.pages();
                h.chunker(*at, *data_off, *len).map(move |c| Cmd {
                    sqe: Sqe::rw(op, Cid(0), nsid, Lba(c.slba), c.nlb, 0, 0),
                    // Cannot fail: each segment was checked against its registration.
                    prp: Some(prp::plan(pages, PAGE_SIZE, c.data_off, c.len).expect("validated range plans")),
                    sgl: None,
                    bytes: c.len as u32,
                })
            });
            h.run_scheduled(cmds, name, write, prio, total)
        };
        drop(pieces);
        match r {
            Ok(0) => Ok(total),
            r => {
                let guards = claimed.into_iter().map(|(g, ..)| g);
                h.finish(q, r, name, guards).map(|short| total.saturating_sub(short as usize))
            }
        }
    }
}

/// Checks a segment list on its own (count, lengths, and for a read that
/// no two segments share a byte); the total length.
pub(crate) fn check_segments(segments: &[Segment<'_>], block: usize, read: bool) -> Result<usize> {
    if segments.is_empty() || segments.len() > MAX_SEGMENTS {
        return Err(Error::InvalidArgument(format!(
            "{} segments: a vectored call takes 1 to {MAX_SEGMENTS}",
            segments.len()
        )));
    }
    let mut total = 0usize;
    for (i, s) in segments.iter().enumerate() {
        if s.len == 0 {
            return Err(Error::InvalidArgument(format!("segment {i} is empty")));
        }
        if s.len % block != 0 {
            return Err(Error::Misaligned { what: "segment length", value: s.len as u64, alignment: block as u64 });
        }
        total =
            total.checked_add(s.len).ok_or_else(|| Error::InvalidArgument("the segments' lengths overflow".into()))?;
    }
    if read && segments.len() > 1 {
        // By buffer address: overlapping pieces of one registration (or of
        // two registrations of the same memory) would be written twice.
        let mut by_addr: Vec<(usize, usize, usize)> =
            segments.iter().enumerate().map(|(i, s)| (s.buf.base.saturating_add(s.offset), s.len, i)).collect();
        by_addr.sort_unstable();
        for w in by_addr.windows(2) {
            let ((a, alen, i), (b, _, j)) = (w[0], w[1]);
            if a.saturating_add(alen) > b {
                let (i, j) = (i.min(j), i.max(j));
                return Err(Error::InvalidArgument(format!(
                    "segments {i} and {j} overlap: a read would write the same bytes twice"
                )));
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(base: usize, len: usize) -> BufferToken {
        BufferToken { base, len, generation: 1 }
    }

    #[test]
    fn segment_lists_are_checked_on_their_own() {
        let (a, b) = (token(0x10000, 65536), token(0x40000, 65536));
        let ok = [Segment::new(&a, 0, 4096), Segment::new(&b, 8192, 512), Segment::new(&a, 4096, 4096)];
        assert_eq!(check_segments(&ok, 512, true).unwrap(), 8704);
        let e = check_segments(&[], 512, true).unwrap_err();
        assert!(e.to_string().contains("0 segments"), "{e}");
        let many = vec![Segment::new(&a, 0, 512); MAX_SEGMENTS + 1];
        assert!(check_segments(&many, 512, false).unwrap_err().to_string().contains("257 segments"));
        let e = check_segments(&[Segment::new(&a, 0, 4096), Segment::new(&a, 4096, 0)], 512, false).unwrap_err();
        assert!(e.to_string().contains("segment 1 is empty"), "{e}");
        let e = check_segments(&[Segment::new(&a, 0, 1000)], 512, false).unwrap_err();
        assert!(matches!(e, Error::Misaligned { what: "segment length", value: 1000, .. }), "{e}");
        // Overlaps: refused on a read, taken on a write.
        let over = [Segment::new(&a, 0, 8192), Segment::new(&b, 0, 512), Segment::new(&a, 4096, 4096)];
        let e = check_segments(&over, 512, true).unwrap_err();
        assert!(e.to_string().contains("segments 0 and 2 overlap"), "{e}");
        assert_eq!(check_segments(&over, 512, false).unwrap(), 12800);
    }
}
