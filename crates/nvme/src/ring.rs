//! Ring index and phase-tag arithmetic (section 4.1).
//!
//! A queue of `size` entries holds at most `size - 1` commands: the
//! submission queue is full when advancing the tail would make it equal to
//! the head, and empty when they are equal. Completion entries are told apart
//! from stale ones by the phase tag, which the controller inverts each time it
//! wraps; the host tracks the phase it expects next.

/// The geometry of one ring: its number of entries (2..=65536).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring {
    size: u32,
}

impl Ring {
    /// A ring of `size` entries. Panics when `size` is outside 2..=65536,
    /// which the spec forbids (a queue has at least two entries).
    pub fn new(size: u32) -> Ring {
        assert!((2..=65536).contains(&size), "queue size {size} outside 2..=65536");
        Ring { size }
    }

    /// Number of entries.
    pub const fn size(self) -> u32 {
        self.size
    }

    /// The index after `i`, wrapping.
    #[inline]
    pub const fn next(self, i: u32) -> u32 {
        let n = i + 1;
        if n == self.size {
            0
        } else {
            n
        }
    }

    /// `i` advanced by `n`, wrapping.
    #[inline]
    pub const fn advance(self, i: u32, n: u32) -> u32 {
        (i + n) % self.size
    }

    /// Entries between `head` (inclusive) and `tail` (exclusive).
    #[inline]
    pub const fn used(self, head: u32, tail: u32) -> u32 {
        if tail >= head {
            tail - head
        } else {
            self.size - head + tail
        }
    }

    /// Entries that may still be submitted: one slot always stays empty.
    #[inline]
    pub const fn free(self, head: u32, tail: u32) -> u32 {
        self.size - 1 - self.used(head, tail)
    }

    /// Whether one more submission would overrun the head.
    #[inline]
    pub const fn is_full(self, head: u32, tail: u32) -> bool {
        self.next(tail) == head
    }

    /// Whether head and tail meet.
    #[inline]
    pub const fn is_empty(self, head: u32, tail: u32) -> bool {
        head == tail
    }
}

/// The host's position in a completion queue: the next entry to read and the
/// phase tag that marks it as new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqCursor {
    /// Index of the next entry to examine.
    pub head: u32,
    /// Phase tag a new entry carries. Starts at `true`: the queue memory is
    /// zeroed and the controller writes phase 1 on its first pass.
    pub phase: bool,
}

impl Default for CqCursor {
    fn default() -> Self {
        CqCursor { head: 0, phase: true }
    }
}

impl CqCursor {
    /// Steps past one consumed entry, flipping the expected phase on wrap.
    #[inline]
    pub fn advance(&mut self, ring: Ring) {
        self.head += 1;
        if self.head == ring.size() {
            self.head = 0;
            self.phase = !self.phase;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn full_counts_the_reserved_slot() {
        let r = Ring::new(4);
        assert!(r.is_empty(0, 0));
        assert_eq!(r.free(0, 0), 3);
        assert!(r.is_full(0, 3));
        assert!(r.is_full(2, 1), "full across the wrap");
        assert!(!r.is_full(3, 1));
    }

    #[test]
    fn cursor_flips_on_wrap() {
        let r = Ring::new(2);
        let mut c = CqCursor::default();
        c.advance(r);
        assert_eq!((c.head, c.phase), (1, true));
        c.advance(r);
        assert_eq!((c.head, c.phase), (0, false));
    }

    proptest! {
        /// A model queue (a counter of occupied slots) agrees with the ring
        /// arithmetic across any sequence of pushes and pops, wraps included.
        #[test]
        fn ring_matches_a_counter(size in 2u32..70, ops in proptest::collection::vec(any::<bool>(), 0..400)) {
            let r = Ring::new(size);
            let (mut head, mut tail, mut count) = (0u32, 0u32, 0u32);
            for push in ops {
                prop_assert_eq!(r.used(head, tail), count);
                prop_assert_eq!(r.free(head, tail), size - 1 - count);
                prop_assert_eq!(r.is_full(head, tail), count == size - 1);
                prop_assert_eq!(r.is_empty(head, tail), count == 0);
                if push && !r.is_full(head, tail) {
                    tail = r.next(tail);
                    count += 1;
                } else if !push && !r.is_empty(head, tail) {
                    head = r.next(head);
                    count -= 1;
                }
                prop_assert!(head < size && tail < size);
            }
        }

        /// The host cursor and a model controller, writing phase-tagged
        /// entries, agree on which entries are new over many wraps.
        #[test]
        fn phase_tags_track_wraps(size in 2u32..40, bursts in proptest::collection::vec(0u32..50, 1..40)) {
            let r = Ring::new(size);
            let mut mem = vec![false; size as usize]; // phase bit per slot, zeroed memory
            let mut dev_tail = 0u32;
            let mut dev_phase = true;
            let mut host = CqCursor::default();
            for burst in bursts {
                let n = burst.min(size - 1);
                for _ in 0..n {
                    mem[dev_tail as usize] = dev_phase;
                    dev_tail += 1;
                    if dev_tail == size { dev_tail = 0; dev_phase = !dev_phase; }
                }
                let mut seen = 0;
                while mem[host.head as usize] == host.phase {
                    host.advance(r);
                    seen += 1;
                    prop_assert!(seen <= n);
                }
                prop_assert_eq!(seen, n);
                prop_assert_eq!(host.head, dev_tail);
            }
        }
    }
}
