//! A value every thread reads and few change: the object tables of the C
//! bindings (libugds.so's handles and batches, libcufile.so.0's files).
//!
//! A reader takes the current snapshot with no lock and no count shared
//! between threads (an `arc_swap` load marks a slot of the calling thread)
//! and keeps it for as long as it uses what it found there, borrowing it.
//! A change copies the value, edits the copy and publishes it when it is
//! dropped; one change runs at a time. Readers already running finish on
//! the snapshot they took, as they would on objects found in a locked table
//! and cloned out of it; what a change removed goes with the last of them.

use arc_swap::ArcSwapOption;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use ugds_platform::Recover;

/// A value (or none) read by snapshot and replaced whole. See the module.
#[derive(Debug)]
pub struct SharedState<T> {
    current: ArcSwapOption<T>,
    writer: Mutex<()>,
}

/// What a reader holds: the value as it was when it looked.
pub type Snapshot<T> = arc_swap::Guard<Option<Arc<T>>>;

impl<T: Clone> SharedState<T> {
    /// No value.
    pub const fn new() -> Self {
        SharedState { current: ArcSwapOption::const_empty(), writer: Mutex::new(()) }
    }

    /// The current value.
    pub fn load(&self) -> Snapshot<T> {
        self.current.load()
    }

    /// A copy of the current value to edit, published when the change is
    /// dropped; other changes wait until then.
    pub fn change(&self) -> Change<'_, T> {
        let one = self.writer.lock().recover();
        let next = self.current.load_full().map(|v| T::clone(&v));
        Change { state: self, next, one: Some(one) }
    }
}

impl<T: Clone> Default for SharedState<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A change in progress: derefs to the copy being edited.
#[derive(Debug)]
pub struct Change<'a, T> {
    state: &'a SharedState<T>,
    next: Option<T>,
    one: Option<MutexGuard<'a, ()>>,
}

impl<T> Deref for Change<'_, T> {
    type Target = Option<T>;
    fn deref(&self) -> &Option<T> {
        &self.next
    }
}

impl<T> DerefMut for Change<'_, T> {
    fn deref_mut(&mut self) -> &mut Option<T> {
        &mut self.next
    }
}

impl<T> Drop for Change<'_, T> {
    /// Publishes the copy. The value it replaces is let go after the
    /// writers' lock: an object it was the last to hold (a batch with
    /// commands in flight waits for them) is not dropped under the lock.
    fn drop(&mut self) {
        let old = self.state.current.swap(self.next.take().map(Arc::new));
        self.one = None;
        drop(old);
    }
}

/// A table keyed by the addresses of the objects a binding hands out (or
/// the ids it makes): hashed by one multiplication, not SipHash. The keys
/// are the library's own, so no caller can choose them to collide.
pub type AddrMap<V> = HashMap<usize, V, BuildHasherDefault<AddrHasher>>;

/// The hasher of [`AddrMap`]: Fibonacci hashing of one word, rotated so
/// that the bits the table uses (a bucket from the low bits, a tag from the
/// top seven) come from the product's upper half: a product's bit k depends
/// only on the address's bits 0 to k, and alignment leaves the low ones
/// zero.
#[derive(Debug, Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Clone)]
    struct Table {
        entries: Vec<Arc<AtomicUsize>>,
    }

    #[test]
    fn readers_keep_their_snapshot_and_changes_publish_on_drop() {
        let s: SharedState<Table> = SharedState::new();
        assert!(s.load().is_none());
        let entry = Arc::new(AtomicUsize::new(7));
        *s.change() = Some(Table { entries: vec![entry.clone()] });
        let before = s.load();
        {
            let mut c = s.change();
            c.as_mut().unwrap().entries.clear();
            assert_eq!(s.load().as_ref().unwrap().entries.len(), 1, "not published before the change drops");
        }
        assert!(s.load().as_ref().unwrap().entries.is_empty());
        // The reader that looked before still finds the entry, and holds it.
        assert_eq!(before.as_ref().unwrap().entries[0].load(Ordering::Relaxed), 7);
        assert_eq!(Arc::strong_count(&entry), 2);
        drop(before);
        assert_eq!(Arc::strong_count(&entry), 1, "gone with the last snapshot that held it");
        s.change().take();
        assert!(s.load().is_none());
    }

    #[test]
    fn addresses_16_bytes_apart_spread_over_the_table() {
        // Handle objects are small allocations a few words apart; batch ids
        // step by 16: neither may pile into a few of the table's groups.
        let mut m: AddrMap<usize> = AddrMap::default();
        for i in 0..4096 {
            m.insert(0x5555_0000_1000 + i * 16, i);
        }
        assert!((0..4096).all(|i| m[&(0x5555_0000_1000 + i * 16)] == i));
        let top: std::collections::HashSet<u64> = (0..4096usize)
            .map(|i| {
                let mut h = AddrHasher::default();
                h.write_usize(0x5555_0000_1000 + i * 16);
                h.finish() >> 57
            })
            .collect();
        assert_eq!(top.len(), 128, "the seven tag bits take every value");
        let low: std::collections::HashSet<u64> = (0..4096usize)
            .map(|i| {
                let mut h = AddrHasher::default();
                h.write_usize(0x5555_0000_1000 + i * 16);
                h.finish() & 4095
            })
            .collect();
        // 4096 keys into 4096 buckets at random fill about 63% of them.
        assert!(low.len() > 2400, "the bucket bits spread: {} of 4096 buckets", low.len());
    }

    #[test]
    fn changes_from_many_threads_are_all_kept() {
        let s: SharedState<Table> = SharedState::new();
        *s.change() = Some(Table { entries: Vec::new() });
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    for i in 0..200 {
                        s.change().as_mut().unwrap().entries.push(Arc::new(AtomicUsize::new(i)));
                        assert!(!s.load().as_ref().unwrap().entries.is_empty(), "this thread's change seen");
                    }
                });
            }
        });
        assert_eq!(s.load().as_ref().unwrap().entries.len(), 800, "no change lost to another");
    }
}
