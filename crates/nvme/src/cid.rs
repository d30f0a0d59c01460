//! Command identifiers, allocated apart from SQ slots.
//!
//! A submission queue slot is free again once the controller has fetched the
//! entry (CQE.SQHD moved past it), which may be long before the command
//! completes; a CID stays taken until its completion is consumed. Keeping the
//! two apart lets a queue have more commands in flight than it has free slots
//! at any moment, and catches a completion that names a CID nobody holds.

use crate::Cid;

/// Hands out CIDs `0..capacity` in LIFO order (the most recently freed one
/// first, which keeps the trackers it indexes warm in cache).
#[derive(Debug)]
pub struct CidAllocator {
    free: Vec<u16>,
    in_use: Vec<u64>,
    capacity: u16,
}

/// Freeing a CID that is not allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("command id {0} is not allocated")]
pub struct NotAllocated(pub u16);

impl CidAllocator {
    /// An allocator for `capacity` identifiers (1..=65535; 0xffff is kept
    /// out because some controllers treat it as "no command").
    pub fn new(capacity: u16) -> CidAllocator {
        assert!((1..u16::MAX).contains(&capacity));
        CidAllocator {
            free: (0..capacity).rev().collect(),
            in_use: vec![0; (capacity as usize).div_ceil(64)],
            capacity,
        }
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

    /// Takes a free identifier, or `None` when all are in use.
    #[inline]
    pub fn alloc(&mut self) -> Option<Cid> {
        let c = self.free.pop()?;
        self.in_use[c as usize / 64] |= 1 << (c % 64);
        Some(Cid(c))
    }

    /// Whether `cid` is currently allocated.
    #[inline]
    pub fn is_allocated(&self, cid: Cid) -> bool {
        cid.0 < self.capacity && self.in_use[cid.0 as usize / 64] & (1 << (cid.0 % 64)) != 0
    }

    /// Returns `cid`; refuses one that is not allocated (a double free, or a
    /// completion for a command that was never submitted).
    #[inline]
    pub fn free(&mut self, cid: Cid) -> Result<(), NotAllocated> {
        if !self.is_allocated(cid) {
            return Err(NotAllocated(cid.0));
        }
        self.in_use[cid.0 as usize / 64] &= !(1 << (cid.0 % 64));
        self.free.push(cid.0);
        Ok(())
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
        let ids: Vec<_> = (0..3).map(|_| a.alloc().unwrap()).collect();
        assert!(a.alloc().is_none());
        assert_eq!(a.outstanding(), 3);
        a.free(ids[1]).unwrap();
        assert_eq!(a.free(ids[1]), Err(NotAllocated(ids[1].0)));
        assert_eq!(a.free(Cid(200)), Err(NotAllocated(200)));
        assert_eq!(a.alloc(), Some(ids[1]));
    }

    proptest! {
        #[test]
        fn never_hands_out_a_cid_twice(cap in 1u16..200, ops in proptest::collection::vec(any::<(bool, u8)>(), 0..500)) {
            let mut a = CidAllocator::new(cap);
            let mut held: Vec<Cid> = Vec::new();
            for (take, pick) in ops {
                if take {
                    match a.alloc() {
                        Some(c) => {
                            prop_assert!(!held.contains(&c));
                            prop_assert!(c.0 < cap);
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
