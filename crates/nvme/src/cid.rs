//! Command identifiers, allocated apart from SQ slots.
//!
//! A submission queue slot is free again once the controller has fetched the
//! entry (CQE.SQHD moved past it), which may be long before the command
//! completes; a CID stays taken until its completion is consumed. Keeping the
//! two apart lets a queue have more commands in flight than it has free slots
//! at any moment, and catches a completion that names a CID nobody holds.
//!
//! A CID is a slot index (the low bits, enough for the capacity) and a
//! generation (the high bits, up to four), bumped each time the slot is
//! handed out, as Linux does since 5.15: a completion repeated by a broken
//! controller after its slot went to a new command names the old
//! generation and is refused, instead of completing the new owner while its
//! transfer may still be in flight.

use crate::Cid;

/// Hands out slots `0..capacity` in LIFO order (the most recently freed one
/// first, which keeps the entries it indexes warm in cache), each as a CID
/// carrying the slot's generation, and keeps a value of the caller's per
/// allocated CID in the same slot: one table per command, so that taking a
/// CID and recording what it is for touch one entry.
#[derive(Debug)]
pub struct CidTable<T> {
    free: Vec<u16>,
    slots: Box<[Slot<T>]>,
    capacity: u16,
    /// `(1 << shift) - 1`, where `shift` is the bits of the slot index.
    index_mask: u16,
    /// One generation step: `1 << shift` (0 when no bit is left).
    gen_step: u32,
    /// The generation bits of a CID, in place; 0 when no bit is left.
    gen_bits: u32,
}

/// One command identifier's slot.
#[derive(Debug)]
struct Slot<T> {
    /// The CID the slot was last handed out as (its generation is the next
    /// one's base), with [`BUSY`] set while allocated: a completion is
    /// checked with one comparison.
    word: u32,
    /// The caller's value for the command; what the last one left while
    /// free (never read through the table then).
    value: T,
}

/// Command identifiers alone, with no value per command.
pub type CidAllocator = CidTable<()>;

/// Set in a slot's entry while it is allocated.
const BUSY: u32 = 1 << 16;

/// Freeing a CID that is not allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("command id {0:#06x} is not allocated (or names an earlier command of its slot)")]
pub struct NotAllocated(pub u16);

impl<T: Default> CidTable<T> {
    /// A table of `capacity` identifiers (1..=65535; 0xffff is kept out
    /// because some controllers treat it as "no command").
    pub fn new(capacity: u16) -> CidTable<T> {
        assert!((1..u16::MAX).contains(&capacity));
        // Index bits for `capacity` itself, not `capacity - 1`: the index
        // field is then never all ones, so no CID is 0xffff, with no check
        // per allocation (a power-of-two capacity gives up one generation
        // bit for it when the four do not fit besides).
        let shift = u16::BITS - capacity.leading_zeros();
        let gens = (u16::BITS - shift).min(4);
        let gen_step = if gens == 0 { 0 } else { 1u32 << shift };
        CidTable {
            free: (0..capacity).rev().collect(),
            // Generation 0 as the last one: the first hand-out is 1.
            slots: (0..capacity as u32).map(|i| Slot { word: i, value: T::default() }).collect(),
            capacity,
            index_mask: ((1u32 << shift) - 1) as u16,
            gen_step,
            gen_bits: ((1u32 << gens) - 1) * gen_step,
        }
    }

    /// Frees every identifier at once (after a reset, when no completion
    /// can come); values are reset too.
    pub fn clear(&mut self) {
        *self = CidTable::new(self.capacity);
    }
}

impl<T> CidTable<T> {
    /// The slot a CID names (whatever its generation).
    #[inline]
    pub fn index(&self, cid: Cid) -> usize {
        (cid.0 & self.index_mask) as usize
    }

    /// The CID slot `index` is allocated as now.
    #[inline]
    pub fn current(&self, index: usize) -> Option<Cid> {
        self.slots.get(index).filter(|s| s.word & BUSY != 0).map(|s| Cid(s.word as u16))
    }

    /// Number of identifiers.
    #[inline]
    pub fn capacity(&self) -> u16 {
        self.capacity
    }

    /// Number of identifiers currently allocated.
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.capacity as usize - self.free.len()
    }

    /// Takes a free identifier for a command described by `value`, or
    /// `None` (and `value` is dropped) when all are in use.
    #[inline(always)]
    pub fn alloc(&mut self, value: T) -> Option<Cid> {
        let i = self.free.pop()?;
        let (gen_step, gen_bits) = (self.gen_step, self.gen_bits);
        let slot = &mut self.slots[i as usize];
        // The next generation, in place (wrapping within its bits). Never
        // 0xffff: the index field is never all ones (see `new`).
        let cid = (slot.word + gen_step) & gen_bits | i as u32;
        slot.word = cid | BUSY;
        slot.value = value;
        Some(Cid(cid as u16))
    }

    /// Whether `cid` is currently allocated, generation included.
    #[inline]
    pub fn is_allocated(&self, cid: Cid) -> bool {
        self.slots.get(self.index(cid)).is_some_and(|s| s.word == cid.0 as u32 | BUSY)
    }

    /// The value of an allocated `cid`.
    #[inline]
    pub fn get_mut(&mut self, cid: Cid) -> Option<&mut T> {
        let i = self.index(cid);
        // Bits above the generation make the CID differ from the slot's.
        self.slots.get_mut(i).filter(|s| s.word == cid.0 as u32 | BUSY).map(|s| &mut s.value)
    }

    /// Returns `cid`, with its value (left in the slot, to be read before
    /// the next allocation); refuses one that is not allocated (a double
    /// free, a completion for a command that was never submitted, or one
    /// naming an earlier command of a slot in use again).
    #[inline(always)]
    pub fn free(&mut self, cid: Cid) -> Result<&mut T, NotAllocated> {
        let i = self.index(cid) as u16;
        let Some(slot) = self.slots.get_mut(i as usize).filter(|s| s.word == cid.0 as u32 | BUSY) else {
            return Err(NotAllocated(cid.0));
        };
        slot.word &= !BUSY;
        self.free.push(i);
        Ok(&mut slot.value)
    }

    /// Every allocated identifier, with its slot index and value.
    pub fn outstanding_iter(&self) -> impl Iterator<Item = (Cid, usize, &T)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.word & BUSY != 0)
            .map(|(i, s)| (Cid(s.word as u16), i, &s.value))
    }

    /// As [`outstanding_iter`](Self::outstanding_iter), the values mutable.
    pub fn outstanding_iter_mut(&mut self) -> impl Iterator<Item = (Cid, &mut T)> + '_ {
        self.slots.iter_mut().filter(|s| s.word & BUSY != 0).map(|s| (Cid(s.word as u16), &mut s.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn exhausts_and_refuses_double_free() {
        let mut a = CidAllocator::new(3);
        let ids: Vec<_> = (0..3).map(|_| a.alloc(()).unwrap()).collect();
        assert!(a.alloc(()).is_none());
        assert_eq!(a.outstanding(), 3);
        a.free(ids[1]).unwrap();
        assert_eq!(a.free(ids[1]), Err(NotAllocated(ids[1].0)));
        assert_eq!(a.free(Cid(200)), Err(NotAllocated(200)));
        let again = a.alloc(()).unwrap();
        assert_eq!(a.index(again), a.index(ids[1]), "the slot freed last is reused");
        assert_ne!(again, ids[1], "with a new generation");
    }

    #[test]
    fn a_value_lives_with_its_cid() {
        let mut t: CidTable<u64> = CidTable::new(2);
        let a = t.alloc(7).unwrap();
        let b = t.alloc(9).unwrap();
        *t.get_mut(a).unwrap() += 1;
        assert_eq!(t.free(a).copied(), Ok(8));
        assert_eq!(t.get_mut(a), None, "freed");
        assert_eq!(t.free(a).copied(), Err(NotAllocated(a.0)));
        let c = t.alloc(11).unwrap();
        assert_eq!(t.index(c), t.index(a), "the slot freed last is reused");
        assert_eq!(t.get_mut(a), None, "the old generation names nothing");
        let mut left: Vec<_> = t.outstanding_iter().map(|(cid, _, v)| (cid, *v)).collect();
        left.sort();
        let mut want = vec![(b, 9), (c, 11)];
        want.sort();
        assert_eq!(left, want);
        t.clear();
        assert_eq!((t.outstanding(), t.get_mut(b)), (0, None));
    }

    #[test]
    fn a_repeated_completion_of_a_reused_slot_is_refused() {
        let mut a = CidAllocator::new(64);
        let old = a.alloc(()).unwrap();
        a.free(old).unwrap();
        let new = a.alloc(()).unwrap();
        assert_eq!(a.index(new), a.index(old));
        assert!(!a.is_allocated(old), "the old generation is not the slot's owner");
        assert_eq!(a.free(old), Err(NotAllocated(old.0)));
        assert_eq!(a.current(a.index(new)), Some(new));
        a.free(new).unwrap();
        assert_eq!(a.current(a.index(new)), None);
    }

    #[test]
    fn generations_wrap_and_never_make_ffff() {
        // 4096 slots: 13 index bits (the field is never all ones), 3 generation bits.
        let mut a = CidAllocator::new(4096);
        let all: Vec<_> = (0..4096).map(|_| a.alloc(()).unwrap()).collect();
        let last = *all.iter().find(|c| a.index(**c) == 4095).unwrap();
        for c in &all {
            if *c != last {
                a.free(*c).unwrap();
            }
        }
        let mut c = last;
        for _ in 0..40 {
            a.free(c).unwrap();
            // Take every other slot first, so that 4095 comes back.
            let mut taken = Vec::new();
            loop {
                let n = a.alloc(()).unwrap();
                if a.index(n) == 4095 {
                    c = n;
                    break;
                }
                taken.push(n);
            }
            assert_ne!(c.0, u16::MAX);
            for t in taken {
                a.free(t).unwrap();
            }
        }
        // A capacity that leaves no bit for a generation works without.
        let mut b = CidAllocator::new(65534);
        let x = b.alloc(()).unwrap();
        b.free(x).unwrap();
        assert_eq!(b.alloc(()), Some(x));
    }

    #[test]
    fn no_capacity_hands_out_ffff() {
        // Under Miri (CI runs this crate's tests there) the small
        // capacities only: the large ones take it hours.
        let caps: &[u16] =
            if cfg!(miri) { &[1, 2, 3, 15, 16, 17] } else { &[1, 2, 3, 63, 64, 65, 4095, 4096, 32767, 32768, 65534] };
        for &cap in caps {
            let mut a = CidAllocator::new(cap);
            // Every slot through more generations than it has (16 at most).
            for _ in 0..20 {
                let all: Vec<_> = (0..cap).map(|_| a.alloc(()).unwrap()).collect();
                assert!(a.alloc(()).is_none());
                for c in all {
                    assert_ne!(c.0, u16::MAX, "capacity {cap}");
                    assert!(a.index(c) < cap as usize);
                    a.free(c).unwrap();
                }
            }
        }
    }

    proptest! {
        #[test]
        fn never_hands_out_a_cid_twice(cap in 1u16..200, ops in proptest::collection::vec(any::<(bool, u8)>(), 0..500)) {
            let mut a = CidAllocator::new(cap);
            let mut held: Vec<Cid> = Vec::new();
            for (take, pick) in ops {
                if take {
                    match a.alloc(()) {
                        Some(c) => {
                            prop_assert!(!held.iter().any(|h| a.index(*h) == a.index(c)));
                            prop_assert!(a.index(c) < cap as usize);
                            held.push(c);
                        }
                        None => prop_assert_eq!(held.len(), cap as usize),
                    }
                } else if !held.is_empty() {
                    let c = held.swap_remove(pick as usize % held.len());
                    prop_assert!(a.free(c).is_ok());
                }
                prop_assert_eq!(a.outstanding(), held.len());
                let set: HashSet<_> = held.iter().collect();
                prop_assert_eq!(set.len(), held.len());
            }
        }
    }
}
