//! Where a volume's bytes live: the mapping from a range of the volume to
//! ranges of its members, for striping (RAID 0) and concatenation. Pure
//! arithmetic, tested on its own.

use ugds_platform::{Error, Result};

/// How a volume spreads its bytes over its members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VolumeLayout {
    /// RAID 0: stripe `i` of the volume is stripe `i / n` of member
    /// `i % n`. `stripe` is a power of two of at least 4 KiB and a multiple
    /// of every member's block size. Each member gives as many whole
    /// stripes as the smallest holds.
    Striped {
        /// Bytes per stripe.
        stripe: u64,
    },
    /// The members one after another, in order, each whole.
    Concat,
}

/// The smallest stripe a striped volume takes.
pub const MIN_STRIPE: u64 = 4096;

/// A piece of a volume range on one member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Which member.
    pub member: usize,
    /// Byte offset on the member.
    pub member_offset: u64,
    /// Byte offset from the start of the volume range it belongs to.
    pub at: u64,
    /// Bytes.
    pub len: u64,
}

/// A layout over members of known capacities.
#[derive(Clone, Debug)]
pub struct Geometry {
    layout: VolumeLayout,
    /// Bytes of each member the volume uses.
    used: Vec<u64>,
    /// Concatenation: where each member starts in the volume.
    starts: Vec<u64>,
    capacity: u64,
}

impl Geometry {
    /// `layout` over members of `capacities` bytes with logical blocks of
    /// `block` bytes (the same on every member).
    pub fn new(layout: VolumeLayout, capacities: &[u64], block: u64) -> Result<Geometry> {
        if capacities.is_empty() {
            return Err(Error::InvalidArgument("a volume needs at least one member".into()));
        }
        let n = capacities.len() as u64;
        let used: Vec<u64> = match layout {
            VolumeLayout::Striped { stripe } => {
                if !stripe.is_power_of_two() || stripe < MIN_STRIPE || stripe % block != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "stripe of {stripe} bytes: a power of two of at least {MIN_STRIPE} bytes and a multiple \
                         of the {block}-byte block is needed"
                    )));
                }
                let rows = capacities.iter().map(|c| c / stripe).min().unwrap_or(0);
                if rows == 0 {
                    return Err(Error::InvalidArgument(format!(
                        "a member of {} bytes holds no whole {stripe}-byte stripe",
                        capacities.iter().min().unwrap_or(&0)
                    )));
                }
                vec![rows * stripe; capacities.len()]
            }
            VolumeLayout::Concat => {
                if let Some(c) = capacities.iter().find(|c| **c == 0 || **c % block != 0) {
                    return Err(Error::InvalidArgument(format!(
                        "a member of {c} bytes: not a positive multiple of the {block}-byte block"
                    )));
                }
                capacities.to_vec()
            }
        };
        let mut starts = Vec::with_capacity(used.len());
        let mut capacity = 0u64;
        for u in &used {
            starts.push(capacity);
            capacity = capacity
                .checked_add(*u)
                .ok_or_else(|| Error::InvalidArgument(format!("{n} members add up to more than 2^64 bytes")))?;
        }
        Ok(Geometry { layout, used, starts, capacity })
    }

    /// The layout.
    pub fn layout(&self) -> VolumeLayout {
        self.layout
    }

    /// The volume's size in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Members.
    pub fn members(&self) -> usize {
        self.used.len()
    }

    /// Bytes of member `i` the volume uses.
    pub fn used(&self, i: usize) -> u64 {
        self.used[i]
    }

    /// The pieces of `len` bytes at `offset` of the volume, in volume
    /// order. The caller has checked that the range lies in the volume.
    pub fn split(&self, offset: u64, len: u64, mut f: impl FnMut(Piece)) {
        debug_assert!(offset.checked_add(len).is_some_and(|e| e <= self.capacity));
        let mut at = 0;
        while at < len {
            let off = offset + at;
            let (member, member_offset, room) = match self.layout {
                VolumeLayout::Striped { stripe } => {
                    let n = self.used.len() as u64;
                    let s = off / stripe;
                    let within = off % stripe;
                    ((s % n) as usize, (s / n) * stripe + within, stripe - within)
                }
                VolumeLayout::Concat => {
                    // The last member starting at or before `off`.
                    let m = self.starts.partition_point(|&s| s <= off) - 1;
                    let within = off - self.starts[m];
                    (m, within, self.used[m] - within)
                }
            };
            let n = room.min(len - at);
            f(Piece { member, member_offset, at, len: n });
            at += n;
        }
    }

    /// Where `len` bytes at `offset` lie when they lie on one member in one
    /// piece (within a stripe, or within a concatenated member): (member,
    /// offset on it); `None` when they do not, or are empty or not within
    /// the volume. What [`split`](Self::split) would give as its one piece,
    /// with a mask and a shift for the stripe (a power of two): every
    /// request of a volume's queue asks.
    pub fn single_piece(&self, offset: u64, len: u64) -> Option<(usize, u64)> {
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > self.capacity) {
            return None;
        }
        if let VolumeLayout::Striped { stripe } = self.layout {
            let within = offset & (stripe - 1);
            if within + len > stripe {
                return None;
            }
            let (s, n) = (offset >> stripe.trailing_zeros(), self.used.len() as u64);
            return Some(((s % n) as usize, (s / n) * stripe + within));
        }
        let mut one = None;
        let mut pieces = 0;
        self.split(offset, len, |p| {
            pieces += 1;
            one = Some((p.member, p.member_offset));
        });
        one.filter(|_| pieces == 1)
    }

    /// The pieces of a range grouped by member: for each member that the
    /// range touches, runs of pieces that are contiguous on the member (in
    /// volume order within a member), each run as (member, member offset,
    /// its pieces). A striped range gives one run per member; a
    /// concatenated one, one per member it crosses.
    pub fn runs(&self, offset: u64, len: u64) -> Vec<Run> {
        let mut runs: Vec<Run> = Vec::new();
        // The open run of each member, by index into `runs`.
        let mut open: Vec<Option<usize>> = vec![None; self.used.len()];
        self.split(offset, len, |p| {
            if let Some(i) = open[p.member] {
                let r = &mut runs[i];
                if r.member_offset + r.len == p.member_offset {
                    r.len += p.len;
                    r.pieces.push(p);
                    return;
                }
            }
            open[p.member] = Some(runs.len());
            runs.push(Run { member: p.member, member_offset: p.member_offset, len: p.len, pieces: vec![p] });
        });
        runs
    }
}

/// Pieces of a range on one member, contiguous there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Which member.
    pub member: usize,
    /// Where the run starts on the member.
    pub member_offset: u64,
    /// Its bytes on the member.
    pub len: u64,
    /// Its pieces, in volume order.
    pub pieces: Vec<Piece>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn striping_deals_stripes_round_robin() {
        let g =
            Geometry::new(VolumeLayout::Striped { stripe: 4096 }, &[3 * 4096 + 512, 5 * 4096, 4 * 4096], 512).unwrap();
        assert_eq!(g.capacity(), 9 * 4096, "three whole stripes of each member");
        let mut got = Vec::new();
        g.split(2048, 4 * 4096, |p| got.push(p));
        let p = |member, member_offset, at, len| Piece { member, member_offset, at, len };
        assert_eq!(
            got,
            vec![
                p(0, 2048, 0, 2048),
                p(1, 0, 2048, 4096),
                p(2, 0, 6144, 4096),
                p(0, 4096, 10240, 4096),
                p(1, 4096, 14336, 2048),
            ]
        );
        let runs = g.runs(2048, 4 * 4096);
        assert_eq!(runs.len(), 3, "one run per member");
        assert_eq!((runs[0].member, runs[0].member_offset, runs[0].len), (0, 2048, 6144));
    }

    #[test]
    fn concatenation_crosses_members_in_order() {
        let g = Geometry::new(VolumeLayout::Concat, &[8192, 4096, 16384], 512).unwrap();
        assert_eq!(g.capacity(), 28672);
        let mut got = Vec::new();
        g.split(6144, 8192, |p| got.push(p));
        let p = |member, member_offset, at, len| Piece { member, member_offset, at, len };
        assert_eq!(got, vec![p(0, 6144, 0, 2048), p(1, 0, 2048, 4096), p(2, 0, 6144, 2048)]);
    }

    #[test]
    fn bad_geometry_is_refused() {
        let bad = |l, caps: &[u64], b| Geometry::new(l, caps, b).unwrap_err().to_string();
        assert!(bad(VolumeLayout::Striped { stripe: 6144 }, &[1 << 20], 512).contains("power of two"));
        assert!(bad(VolumeLayout::Striped { stripe: 2048 }, &[1 << 20], 512).contains("at least 4096"));
        assert!(bad(VolumeLayout::Striped { stripe: 4096 }, &[1 << 20], 8192).contains("multiple"));
        assert!(bad(VolumeLayout::Striped { stripe: 1 << 20 }, &[1 << 30, 4096], 512).contains("no whole"));
        assert!(bad(VolumeLayout::Concat, &[], 512).contains("at least one member"));
        assert!(bad(VolumeLayout::Concat, &[4096, 1000], 512).contains("multiple"));
    }

    proptest! {
        /// Every byte of a range lands on exactly one member byte, the
        /// mapping is one to one over the whole volume, and runs cover the
        /// same pieces.
        #[test]
        fn pieces_tile_the_range(
            striped in any::<bool>(),
            stripe_shift in 12u32..16,
            caps in proptest::collection::vec(1u64..64, 1..5),
            a in 0u64..4096, b in 0u64..4096,
        ) {
            let block = 512u64;
            let caps: Vec<u64> = caps.iter().map(|c| c * 4096).collect();
            let layout = if striped { VolumeLayout::Striped { stripe: 1 << stripe_shift } } else { VolumeLayout::Concat };
            let Ok(g) = Geometry::new(layout, &caps, block) else { return Ok(()) };
            let blocks = g.capacity() / block;
            let (x, y) = ((a % blocks) * block, (b % blocks) * block);
            let (off, len) = (x.min(y), x.max(y) - x.min(y) + block);
            let len = len.min(g.capacity() - off);
            let mut next = 0;
            let mut seen = Vec::new();
            g.split(off, len, |p| {
                assert_eq!(p.at, next, "pieces in volume order, no gaps");
                assert!(p.len > 0 && p.member_offset + p.len <= g.used(p.member));
                next += p.len;
                seen.push(p);
            });
            prop_assert_eq!(next, len);
            // The one-piece answer is split's when split gives one piece.
            let one = (seen.len() == 1).then(|| (seen[0].member, seen[0].member_offset));
            prop_assert_eq!(g.single_piece(off, len), one);
            // No two pieces share a member byte.
            let mut spans: Vec<(usize, u64, u64)> = seen.iter().map(|p| (p.member, p.member_offset, p.len)).collect();
            spans.sort();
            for w in spans.windows(2) {
                prop_assert!(w[0].0 != w[1].0 || w[0].1 + w[0].2 <= w[1].1);
            }
            let from_runs: usize = g.runs(off, len).iter().map(|r| {
                assert_eq!(r.len, r.pieces.iter().map(|p| p.len).sum::<u64>());
                r.pieces.len()
            }).sum();
            prop_assert_eq!(from_runs, seen.len());
        }
    }
}
