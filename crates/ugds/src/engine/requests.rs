//! The request table every queue user keeps: a synchronous queue's slots,
//! a batch context's requests, a lent queue's, a volume's.
//!
//! A request is one caller's read or write, which may be several commands
//! (the [`tracker`](super::tracker) keeps those, by CID, and names the
//! request's index as its [`Owner`](super::Owner)). Its entry lives from
//! submission until its last command ends; the index then goes back on a
//! free chain threaded through the entries themselves, most recently freed
//! first (warm in cache), so taking and freeing an entry touch that entry
//! and the chain's head, and nothing is allocated once the table has grown
//! to the deepest the user went.
//!
//! An entry is in one of three states: free (on the chain), in use (taken
//! and not yet released), or retired: its request was reported ended while
//! a command of it may still be on the device (a timeout), so its index is
//! never handed out again, where a late completion could credit a new
//! request, until [`reset`](RequestTable::reset) after the controller's
//! reset says no completion can come.

/// No entry: the end of the free chain.
const NO_ENTRY: u32 = u32::MAX;

struct Entry<T> {
    req: T,
    /// The next free entry while this one is free.
    next_free: u32,
}

/// Request entries indexed by `u32`; see the module docs.
pub(crate) struct RequestTable<T> {
    entries: Vec<Entry<T>>,
    /// The first free entry, or [`NO_ENTRY`].
    free: u32,
    /// Entries taken and neither released nor retired.
    in_use: u32,
    /// Entries retired (see the module docs).
    retired: u32,
}

impl<T> Default for RequestTable<T> {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl<T> RequestTable<T> {
    /// An empty table that grows as requests are started, with room for
    /// `n` before it allocates.
    pub(crate) fn with_capacity(n: usize) -> Self {
        RequestTable { entries: Vec::with_capacity(n), free: NO_ENTRY, in_use: 0, retired: 0 }
    }

    /// A table of `n` free entries made by `make`, taken in index order: for
    /// users whose depth is fixed and who must not allocate on submission
    /// (they take entries with [`take`](Self::take)).
    pub(crate) fn filled(n: u32, mut make: impl FnMut() -> T) -> Self {
        let entries = (0..n).map(|i| Entry { req: make(), next_free: if i + 1 < n { i + 1 } else { NO_ENTRY } });
        let free = if n > 0 { 0 } else { NO_ENTRY };
        RequestTable { entries: entries.collect(), free, in_use: 0, retired: 0 }
    }

    /// The index the next [`start`](Self::start) takes: the most recently
    /// freed entry, or a new one. Known before the request's commands are
    /// staged (they name it), and taken only once they are.
    #[inline(always)]
    pub(crate) fn next(&self) -> u32 {
        if self.free != NO_ENTRY {
            self.free
        } else {
            self.entries.len() as u32
        }
    }

    /// Takes entry `idx` ([`next`](Self::next)'s) for a request made of
    /// `arg`: a free entry is handed to `reuse` to overwrite in place (its
    /// old value is not dropped first unless `reuse` does), a new one is
    /// `new(arg)`.
    #[inline(always)]
    pub(crate) fn start<A>(&mut self, idx: u32, arg: A, reuse: impl FnOnce(&mut T, A), new: impl FnOnce(A) -> T) {
        debug_assert_eq!(idx, self.next(), "a request takes the entry next() named");
        match self.entries.get_mut(idx as usize) {
            Some(e) => {
                self.free = e.next_free;
                reuse(&mut e.req, arg);
            }
            None => self.entries.push(Entry { req: new(arg), next_free: NO_ENTRY }),
        }
        self.in_use += 1;
    }

    /// Takes the next entry for `req`; its index.
    pub(crate) fn insert(&mut self, req: T) -> u32 {
        let idx = self.next();
        self.start(idx, req, |e, req| *e = req, |req| req);
        idx
    }

    /// Takes a free entry, leaving its value for the caller to overwrite;
    /// `None` when none is free (the table does not grow).
    pub(crate) fn take(&mut self) -> Option<u32> {
        let idx = self.free;
        let e = self.entries.get_mut(idx as usize)?;
        self.free = e.next_free;
        self.in_use += 1;
        Some(idx)
    }

    /// Gives entry `idx` back: its request ended and no command of it is
    /// on the device. Its value stays until the entry is taken again.
    #[inline(always)]
    pub(crate) fn release(&mut self, idx: u32) {
        self.entry(idx).release();
    }

    /// Entry `idx`, to read and update its request and perhaps release it,
    /// with one lookup.
    #[inline(always)]
    pub(crate) fn entry(&mut self, idx: u32) -> EntryMut<'_, T> {
        let RequestTable { entries, free, in_use, .. } = self;
        EntryMut { entry: &mut entries[idx as usize], idx, free, in_use }
    }

    /// Ends entry `idx`'s use without freeing it: its request was reported
    /// while a command of it may still complete (see the module docs).
    pub(crate) fn retire(&mut self, idx: u32) {
        debug_assert!(self.in_use > 0 && (idx as usize) < self.entries.len(), "a retirement matches a start");
        self.in_use -= 1;
        self.retired += 1;
    }

    /// Every entry free again, retired ones included: only once no
    /// completion can name any of them (after a controller reset, or the
    /// queue's deletion). Values stay until taken again.
    pub(crate) fn reset(&mut self) {
        let n = self.entries.len() as u32;
        for (i, e) in self.entries.iter_mut().enumerate() {
            let i = i as u32;
            e.next_free = if i + 1 < n { i + 1 } else { NO_ENTRY };
        }
        self.free = if n > 0 { 0 } else { NO_ENTRY };
        (self.in_use, self.retired) = (0, 0);
    }

    /// Requests started and neither released nor retired.
    #[inline]
    pub(crate) fn in_use(&self) -> usize {
        self.in_use as usize
    }

    /// Entries free now (a growable table adds one when none is).
    pub(crate) fn free_len(&self) -> usize {
        self.entries.len() - self.in_use as usize - self.retired as usize
    }

    /// Entries, whatever their state.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every entry with its index, whatever its state (free ones hold the
    /// value their last request left).
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> + '_ {
        self.entries.iter_mut().enumerate().map(|(i, e)| (i as u32, &mut e.req))
    }

    /// Every entry's value, whatever its state.
    pub(crate) fn into_values(self) -> impl Iterator<Item = T> {
        self.entries.into_iter().map(|e| e.req)
    }
}

/// One entry of a [`RequestTable`], borrowed with its chain
/// ([`RequestTable::entry`]).
pub(crate) struct EntryMut<'a, T> {
    entry: &'a mut Entry<T>,
    idx: u32,
    free: &'a mut u32,
    in_use: &'a mut u32,
}

impl<T> EntryMut<'_, T> {
    /// As [`RequestTable::release`].
    #[inline(always)]
    pub(crate) fn release(self) {
        debug_assert!(*self.in_use > 0, "a release matches a start");
        self.entry.next_free = *self.free;
        *self.free = self.idx;
        *self.in_use -= 1;
    }
}

impl<T> std::ops::Deref for EntryMut<'_, T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        &self.entry.req
    }
}

impl<T> std::ops::DerefMut for EntryMut<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        &mut self.entry.req
    }
}

impl<T> std::ops::Index<u32> for RequestTable<T> {
    type Output = T;

    #[inline(always)]
    fn index(&self, idx: u32) -> &T {
        &self.entries[idx as usize].req
    }
}

impl<T> std::ops::IndexMut<u32> for RequestTable<T> {
    #[inline(always)]
    fn index_mut(&mut self, idx: u32) -> &mut T {
        &mut self.entries[idx as usize].req
    }
}

impl<T> std::fmt::Debug for RequestTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTable")
            .field("entries", &self.entries.len())
            .field("in_use", &self.in_use)
            .field("retired", &self.retired)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_freed_entry_is_the_next_one_taken_and_the_table_grows_only_when_none_is_free() {
        let mut t = RequestTable::with_capacity(4);
        let (a, b) = (t.insert(10), t.insert(11));
        assert_eq!((a, b, t.len(), t.in_use()), (0, 1, 2, 2));
        t.release(b);
        assert_eq!(t.next(), b, "the most recently freed entry, warm");
        t.release(a);
        assert_eq!((t.next(), t.in_use(), t.free_len()), (a, 0, 2));
        let (x, y) = (t.insert(12), t.insert(13));
        assert_eq!((x, y), (a, b), "the chain in order, most recent first");
        assert_eq!((t[x], t[y]), (12, 13));
        assert_eq!(t.next(), 2, "none free: a new entry");
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn start_hands_a_reused_entry_to_reuse_and_makes_a_new_one_with_new() {
        let mut t: RequestTable<Vec<u8>> = RequestTable::with_capacity(1);
        let i = t.next();
        t.start(i, 1, |_, _| panic!("no entry to reuse yet"), |x| vec![x]);
        t.release(i);
        t.start(i, 2, |v, x| v.push(x), |_| panic!("a free entry is reused"));
        assert_eq!(t[i], vec![1, 2], "the old value is the caller's to overwrite");
    }

    #[test]
    fn a_filled_table_hands_out_its_entries_in_order_and_then_none() {
        let mut t = RequestTable::filled(3, || 0u8);
        assert_eq!((t.take(), t.take(), t.take(), t.take()), (Some(0), Some(1), Some(2), None));
        assert_eq!((t.len(), t.free_len()), (3, 0), "take never grows the table");
        t.release(1);
        assert_eq!(t.take(), Some(1));
        assert_eq!(RequestTable::filled(0, || 0u8).take(), None);
    }

    #[test]
    fn a_retired_entry_is_never_handed_out_until_the_reset() {
        let mut t = RequestTable::filled(2, || 0u8);
        let (a, b) = (t.take().unwrap(), t.take().unwrap());
        t.retire(a);
        t.release(b);
        assert_eq!((t.in_use(), t.free_len()), (0, 1));
        assert_eq!(t.take(), Some(b));
        assert_eq!(t.take(), None, "the retired entry stays out");
        t.reset();
        assert_eq!((t.in_use(), t.free_len()), (0, 2));
        assert_eq!((t.take(), t.take(), t.take()), (Some(0), Some(1), None));
    }

    proptest! {
        /// Any sequence of starts, releases and retirements: no index is in
        /// use twice at once, a retired one never comes back, the counts
        /// add up, and the table holds no more entries than were ever in
        /// use or retired at once.
        #[test]
        fn any_sequence_hands_out_each_index_once(ops in proptest::collection::vec((0u8..3, any::<u16>()), 1..300)) {
            let mut t = RequestTable::with_capacity(4);
            let (mut live, mut retired): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
            let mut peak = 0;
            for (op, pick) in ops {
                match op {
                    0 => {
                        let i = t.insert(0u64);
                        prop_assert!(!live.contains(&i) && !retired.contains(&i), "entry {i} handed out twice");
                        live.push(i);
                    }
                    _ if live.is_empty() => {}
                    1 => t.release(live.swap_remove(pick as usize % live.len())),
                    _ => {
                        let i = live.swap_remove(pick as usize % live.len());
                        t.retire(i);
                        retired.push(i);
                    }
                }
                peak = peak.max(live.len() + retired.len());
                prop_assert_eq!(t.in_use(), live.len());
                prop_assert_eq!(t.free_len(), t.len() - live.len() - retired.len());
                prop_assert!(t.len() <= peak);
            }
        }
    }
}
