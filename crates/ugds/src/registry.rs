//! The buffer registry: registered memory keyed by base address.
//!
//! Each registration gets a generation number, unique for the life of the
//! process, so a token kept from an earlier registration of the same address
//! is told apart and refused. Each entry counts the I/O in flight on it; it
//! cannot be deregistered while that count is not zero. An entry holds one
//! controller mapping per open handle.
//!
//! A private registration (the just-in-time registration of one
//! synchronous call) is found only by its token, never by address: it does
//! not conflict with a registration of the same memory, and no other call
//! can pick it up or deregister it.
//!
//! Requests look their buffer up through a [`Recent`]: the last entry the
//! calling thread (or lent queue) used, kept with its pages. A request on
//! the same buffer takes its in-flight reference without the registry's
//! lock; deregistration and that lock-free claim meet at two sequentially
//! consistent flags (the entry's in-flight count and its `registered`
//! flag), so one of the two always sees the other.

use crate::engine::hold::{Hold, Inflight};
use crate::gpu::DeviceMemory;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, Weak};
use ugds_platform::sys::PAGE_SIZE;
use ugds_platform::Recover;
use ugds_platform::{Error, Result};
use ugds_platform::{HostMapping, Platform};

/// Names one registration: the base address, its length, and the
/// generation that tells it from earlier registrations of the same address.
/// Only registration makes one (its fields are private); every use is
/// checked against the registry, so a token of a registration that has
/// gone (or a later one at the same address) is refused.
///
/// ```compile_fail,E0451
/// let t = ugds::BufferToken { base: 0x1000, len: 4096, generation: 1 };
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferToken {
    pub(crate) base: usize,
    pub(crate) len: usize,
    pub(crate) generation: u64,
}

impl BufferToken {
    /// Base address.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Length in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Generation of this registration.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

pub(crate) struct Mapping {
    pub handle_id: u64,
    pub platform: Arc<dyn Platform>,
    pub map: HostMapping,
}

pub(crate) struct BufEntry {
    pub base: usize,
    pub len: usize,
    pub generation: u64,
    pub inflight: AtomicUsize,
    /// Cleared when the entry leaves the registry; a [`Recent`] claim
    /// checks it after raising `inflight`.
    registered: AtomicBool,
    pub mappings: RwLock<Vec<Mapping>>,
    /// GPU memory, or `None` for host memory.
    pub device: Option<DeviceMemory>,
}

impl BufEntry {
    pub fn mappings(&self) -> RwLockReadGuard<'_, Vec<Mapping>> {
        self.mappings.read().recover()
    }

    /// Maps this buffer for one more handle.
    pub fn map_for(&self, handle_id: u64, platform: &Arc<dyn Platform>) -> Result<()> {
        // SAFETY: the registrant promised (Driver::register) that the memory
        // stays valid until deregistration, which unmaps first.
        let map = unsafe {
            match &self.device {
                None => platform.map_host(self.base as *mut u8, self.len)?,
                Some(d) => platform.map_device(d)?,
            }
        };
        // Every page must start on a controller page: the request paths
        // name them in PRPs without checking each again.
        if let Some(i) = map.pages().iter().position(|&a| a % PAGE_SIZE as u64 != 0) {
            let addr = map.pages()[i];
            // SAFETY: the mapping just made, used by no command yet.
            if let Err(e) = unsafe { platform.unmap_host(&map) } {
                tracing::warn!("unmapping buffer {:#x}: {e}", self.base);
            }
            return Err(Error::Platform(format!(
                "the platform mapped page {i} of the buffer at {:#x} to {addr:#x}, not page aligned",
                self.base
            )));
        }
        self.mappings.write().recover().push(Mapping { handle_id, platform: platform.clone(), map });
        Ok(())
    }

    /// Removes the mapping of one handle.
    pub fn unmap_for(&self, handle_id: u64) {
        let mut m = self.mappings.write().recover();
        m.retain(|x| {
            if x.handle_id == handle_id {
                // SAFETY: this entry's mapping, made by that platform and
                // unmapped only here (the entry is dropped after); the
                // registry calls this only with no I/O on the buffer.
                if let Err(e) = unsafe { x.platform.unmap_host(&x.map) } {
                    tracing::warn!("unmapping buffer {:#x}: {e}", self.base);
                }
                false
            } else {
                true
            }
        });
    }
}

/// An in-flight reference on a registered buffer; dropping it ends the I/O's
/// claim. A request that timed out keeps its guard in the handle's
/// quarantine until a forced teardown.
pub(crate) struct BufGuard(Option<Arc<BufEntry>>);

impl BufGuard {
    /// A reference whose in-flight count the caller has raised.
    #[inline]
    fn counted(e: Arc<BufEntry>) -> BufGuard {
        BufGuard(Some(e))
    }

    /// The registration.
    #[inline]
    pub fn entry(&self) -> &Arc<BufEntry> {
        self.0.as_ref().expect("a guard holds its entry until dropped or handed on")
    }
}

impl Drop for BufGuard {
    #[inline]
    fn drop(&mut self) {
        if let Some(e) = self.0.take() {
            e.inflight.fetch_sub(1, Ordering::Release);
        }
    }
}

impl Inflight for BufEntry {
    fn release(&self) {
        self.inflight.fetch_sub(1, Ordering::Release);
    }
}

impl From<BufGuard> for Hold {
    /// Hands the in-flight reference to the engine as it is (the count is
    /// neither raised nor lowered).
    fn from(mut g: BufGuard) -> Hold {
        Hold::new(g.0.take().expect("a guard holds its entry until handed on"))
    }
}

/// Registration generations, unique in the process (not per registry), so
/// that a token names one registration of one driver.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The calling thread's last [`Registry::containing`] find, with the
    /// version of the map it was found in.
    static LAST_FOUND: std::cell::Cell<Option<(u64, BufferToken)>> = const { std::cell::Cell::new(None) };
}

#[derive(Default)]
pub(crate) struct Registry {
    map: RwLock<BTreeMap<usize, Arc<BufEntry>>>,
    /// The public map's version: a number from `NEXT_GENERATION` taken at
    /// each change (0 while it never changed), so that two equal versions
    /// mean the same map of the same registry. Written under the map's
    /// write lock; [`containing`](Self::containing) checks its thread's
    /// last find against it without the lock.
    version: AtomicU64,
    /// Private registrations, by generation.
    private: RwLock<HashMap<u64, Arc<BufEntry>>>,
}

/// Where a registration is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Visibility {
    /// Found by address; no overlap with another public registration.
    Public,
    /// Found only by its token.
    Private,
}

impl Registry {
    /// Adds an entry for `base..base+len`, mapped on every handle in
    /// `handles`. Refuses a base already registered or an overlap.
    pub fn insert(
        &self,
        base: usize,
        len: usize,
        device: Option<DeviceMemory>,
        handles: &[(u64, Arc<dyn Platform>)],
        visibility: Visibility,
    ) -> Result<BufferToken> {
        if base == 0 {
            return Err(Error::InvalidArgument("null buffer".into()));
        }
        if len == 0 {
            return Err(Error::ZeroSize);
        }
        let end =
            base.checked_add(len).ok_or_else(|| Error::InvalidArgument("buffer wraps the address space".into()))?;
        let mut map = self.map.write().recover();
        if visibility == Visibility::Public {
            if map.contains_key(&base) {
                return Err(Error::AlreadyRegistered { base });
            }
            let before = map.range(..base).next_back().filter(|(_, e)| e.base + e.len > base);
            let after = map.range(base..end).next();
            if let Some((&existing, _)) = before.or(after) {
                return Err(Error::Overlap { base, len, existing });
            }
        }
        let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(BufEntry {
            base,
            len,
            generation,
            inflight: AtomicUsize::new(0),
            registered: AtomicBool::new(true),
            mappings: RwLock::new(Vec::new()),
            device,
        });
        for (id, p) in handles {
            if let Err(e) = entry.map_for(*id, p) {
                for (id, _) in handles {
                    entry.unmap_for(*id);
                }
                return Err(e);
            }
        }
        match visibility {
            Visibility::Public => {
                map.insert(base, entry);
                self.version.store(generation, Ordering::Release);
            }
            Visibility::Private => {
                self.private.write().recover().insert(generation, entry);
            }
        }
        Ok(BufferToken { base, len, generation })
    }

    /// The private entry `token` names, if any.
    fn private_entry(&self, token: &BufferToken) -> Option<Arc<BufEntry>> {
        let p = self.private.read().recover();
        p.get(&token.generation).filter(|e| e.base == token.base).cloned()
    }

    /// Clears `e`'s `registered` flag unless I/O is in flight on it.
    fn retire(e: &BufEntry) -> Result<()> {
        // Against `Recent::claim`, which raises `inflight` and then reads
        // `registered` (both SeqCst): after this store, either our load
        // below sees its claim, or its load sees `false` and it backs off
        // to `acquire`, which waits for the registry's write lock.
        e.registered.store(false, Ordering::SeqCst);
        let inflight = e.inflight.load(Ordering::SeqCst);
        if inflight != 0 {
            e.registered.store(true, Ordering::SeqCst);
            return Err(Error::Busy { what: "buffer", inflight });
        }
        Ok(())
    }

    fn unmap_all(e: &BufEntry) {
        let ids: Vec<u64> = e.mappings().iter().map(|m| m.handle_id).collect();
        for id in ids {
            e.unmap_for(id);
        }
    }

    /// Removes a registration; refuses a stale token or one with I/O in flight.
    pub fn remove(&self, token: &BufferToken) -> Result<()> {
        let mut map = self.map.write().recover();
        match map.get(&token.base) {
            Some(e) if e.generation == token.generation => {
                Self::retire(e)?;
                let e = map.remove(&token.base).expect("looked up above");
                self.version.store(NEXT_GENERATION.fetch_add(1, Ordering::Relaxed), Ordering::Release);
                Self::unmap_all(&e);
                Ok(())
            }
            public => {
                let mut p = self.private.write().recover();
                if let Some(e) = p.get(&token.generation).filter(|e| e.base == token.base) {
                    Self::retire(e)?;
                    let e = p.remove(&token.generation).expect("looked up above");
                    Self::unmap_all(&e);
                    return Ok(());
                }
                Err(match public {
                    Some(e) => Error::StaleToken { base: token.base, got: token.generation, current: e.generation },
                    None => Error::NotRegistered { base: token.base },
                })
            }
        }
    }

    /// The current registration at `base`.
    pub fn token_at(&self, base: usize) -> Option<BufferToken> {
        let map = self.map.read().recover();
        map.get(&base).map(|e| BufferToken { base, len: e.len, generation: e.generation })
    }

    /// The registration whose range holds `addr`. A thread that asks again
    /// within the registration it found last, with the map unchanged since,
    /// gets it without the map's lock (a read lock is a write to a cache
    /// line every thread shares; the version is only read).
    pub fn containing(&self, addr: usize) -> Option<BufferToken> {
        // Acquire: pairs with the Release store of a change; an unchanged
        // version means the map this thread found `t` in is the map now
        // (a change racing with this call is ordered after it; what the
        // token names is checked again when a request claims it).
        let version = self.version.load(Ordering::Acquire);
        if let Some((v, t)) = LAST_FOUND.get() {
            if v == version && addr.wrapping_sub(t.base) < t.len {
                return Some(t);
            }
        }
        let map = self.map.read().recover();
        let (&base, e) = map.range(..=addr).next_back()?;
        let t = (addr < base + e.len).then_some(BufferToken { base, len: e.len, generation: e.generation })?;
        // Under the read lock the version is that of the map `t` is from.
        LAST_FOUND.set(Some((self.version.load(Ordering::Relaxed), t)));
        Some(t)
    }

    /// Looks a token up and takes an in-flight reference, after checking
    /// `offset..offset+len` lies in the buffer. (Kept out of line: it is
    /// the slow path of [`acquire_recent`](Self::acquire_recent).)
    #[inline(never)]
    pub fn acquire(&self, token: &BufferToken, offset: u64, len: u64) -> Result<BufGuard> {
        let map = self.map.read().recover();
        let e = match map.get(&token.base) {
            Some(e) if e.generation == token.generation => e.clone(),
            public => match self.private_entry(token) {
                Some(e) => e,
                None => {
                    return Err(match public {
                        Some(e) => Error::StaleToken { base: token.base, got: token.generation, current: e.generation },
                        None => Error::NotRegistered { base: token.base },
                    })
                }
            },
        };
        if offset.checked_add(len).is_none_or(|end| end > e.len as u64) {
            return Err(Error::BufferRange { base: e.base, offset, len, buffer_len: e.len });
        }
        // Taken under the registry's read lock: `remove` (write lock, which
        // a private entry's removal also takes first) sees it.
        e.inflight.fetch_add(1, Ordering::Acquire);
        Ok(BufGuard::counted(e))
    }

    /// Like [`acquire`](Self::acquire), through `recent`: on the buffer
    /// `recent` holds, without the registry's lock; otherwise through the
    /// registry, after which `recent` holds this buffer and the controller
    /// addresses of its pages for `handle_id` ([`Recent::pages`]).
    #[inline(always)]
    pub fn acquire_recent(
        &self,
        recent: &mut Option<Recent>,
        handle_id: u64,
        token: &BufferToken,
        offset: u64,
        len: u64,
    ) -> Result<BufGuard> {
        if let Some(g) = recent.as_ref().and_then(|r| r.claim(handle_id, token, offset, len)) {
            return Ok(g);
        }
        let guard = self.acquire(token, offset, len)?;
        *recent = Some(Recent::of(&guard, handle_id, token)?);
        Ok(guard)
    }

    /// The device memory registered at `token`, checked.
    pub fn device_memory(&self, token: &BufferToken) -> Result<Option<DeviceMemory>> {
        let map = self.map.read().recover();
        match map.get(&token.base) {
            Some(e) if e.generation == token.generation => Ok(e.device.clone()),
            public => match (self.private_entry(token), public) {
                (Some(e), _) => Ok(e.device.clone()),
                (None, Some(e)) => {
                    Err(Error::StaleToken { base: token.base, got: token.generation, current: e.generation })
                }
                (None, None) => Err(Error::NotRegistered { base: token.base }),
            },
        }
    }

    /// Every entry, public and private, for mapping them on a new handle or
    /// unmapping on close.
    pub fn for_each(&self, mut f: impl FnMut(&Arc<BufEntry>) -> Result<()>) -> Result<()> {
        let map = self.map.read().recover();
        map.values().try_for_each(&mut f)?;
        let p = self.private.read().recover();
        p.values().try_for_each(&mut f)
    }

    /// Private registrations, and how many of them have I/O in flight.
    pub fn private_count(&self) -> (usize, usize) {
        let p = self.private.read().recover();
        (p.len(), p.values().filter(|e| e.inflight.load(Ordering::Acquire) != 0).count())
    }
}

/// The registration a thread or lent queue used last, with the controller
/// addresses of its pages on one handle. Holding it keeps neither the
/// registration, nor its entry (a weak reference: what the entry owns, such
/// as a GPU runtime, goes when the registry and the last I/O let go), nor
/// its mapping: a claim through it succeeds only while the entry is still
/// registered, and the pages stay mapped as long as the claim holds the
/// entry busy and the handle open.
pub(crate) struct Recent {
    handle_id: u64,
    token: BufferToken,
    /// The registration's length (the caller's token may say otherwise).
    len: usize,
    entry: Weak<BufEntry>,
    pages: Arc<[u64]>,
}

impl Recent {
    /// Controller addresses of the buffer's pages on the handle.
    #[inline]
    pub fn pages(&self) -> &[u64] {
        &self.pages
    }

    /// The same, shared (for a request that outlives this call).
    pub fn shared_pages(&self) -> Arc<[u64]> {
        self.pages.clone()
    }

    /// Whether `token` names this registration and `offset..offset+len`
    /// lies in it: what a holder of an in-flight reference on it (which
    /// keeps it registered) checks instead of claiming again.
    #[inline(always)]
    pub fn covers(&self, token: &BufferToken, offset: u64, len: u64) -> bool {
        // The generation alone names a registration (unique in the
        // process); the base as the registry checks it; the token's length
        // is the caller's and not looked at, as by the registry.
        self.token.generation == token.generation
            && self.token.base == token.base
            && offset.checked_add(len).is_some_and(|end| end <= self.len as u64)
    }

    /// What a request on `token` through `handle_id` remembers of the
    /// registration `guard` holds.
    #[cold]
    pub fn of(guard: &BufGuard, handle_id: u64, token: &BufferToken) -> Result<Recent> {
        let pages = guard
            .entry()
            .mappings()
            .iter()
            .find(|m| m.handle_id == handle_id)
            .map(|m| m.map.pages().clone())
            .ok_or_else(|| Error::Platform("buffer is not mapped for this handle".into()))?;
        let e = guard.entry();
        Ok(Recent { handle_id, token: *token, len: e.len, entry: Arc::downgrade(e), pages })
    }

    /// Takes an in-flight reference without the registry's lock; `None`
    /// when this is another buffer or handle, the entry has left the
    /// registry, or the range does not fit (the caller then asks the
    /// registry, which says why).
    #[inline]
    fn claim(&self, handle_id: u64, token: &BufferToken, offset: u64, len: u64) -> Option<BufGuard> {
        if self.token != *token || self.handle_id != handle_id {
            return None;
        }
        let e = self.entry.upgrade()?;
        if offset.checked_add(len).is_none_or(|end| end > e.len as u64) {
            return None;
        }
        // Raise, then look (both SeqCst; see `Registry::remove`).
        e.inflight.fetch_add(1, Ordering::SeqCst);
        if e.registered.load(Ordering::SeqCst) {
            return Some(BufGuard::counted(e));
        }
        e.inflight.fetch_sub(1, Ordering::Release);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// `containing` answers from the thread's last find only while the map
    /// is the one it was found in: after a change, or in another registry
    /// holding the same addresses, it looks again.
    #[test]
    fn containing_sees_every_change_and_registry() {
        let platform: Arc<dyn Platform> = Arc::new(TestPlatform { unaligned: false });
        let mut mem = crate::buffer::HostBuffer::new(16384).unwrap();
        let base = mem.as_mut_ptr() as usize;
        let handles = [(1u64, platform)];
        let (a, b) = (Registry::default(), Registry::default());
        let small = a.insert(base, 4096, None, &handles, Visibility::Public).unwrap();
        assert_eq!(a.containing(base + 100), Some(small));
        assert_eq!(a.containing(base + 100), Some(small), "asked again: the same find");
        assert_eq!(a.containing(base + 8192), None, "past its end");
        assert_eq!(b.containing(base + 100), None, "another registry, empty");
        let other = b.insert(base, 16384, None, &handles, Visibility::Public).unwrap();
        assert_eq!(b.containing(base + 100), Some(other));
        assert_eq!(a.containing(base + 100), Some(small), "each registry its own");
        a.remove(&small).unwrap();
        assert_eq!(a.containing(base + 100), None, "removed");
        let large = a.insert(base, 16384, None, &handles, Visibility::Public).unwrap();
        assert_eq!(a.containing(base + 8192), Some(large), "registered again, longer");
        a.remove(&large).unwrap();
        b.remove(&other).unwrap();
    }

    /// One thread claims through its `Recent` while another deregisters
    /// and registers again: a claim that succeeds must find its entry
    /// still in the registry for as long as it holds it, and a
    /// deregistration that succeeds must leave no claim behind.
    #[test]
    fn recent_claims_and_deregistration_never_overlap() {
        let platform: Arc<dyn Platform> = Arc::new(TestPlatform { unaligned: false });
        let mut mem = crate::buffer::HostBuffer::new(8192).unwrap();
        let base = mem.as_mut_ptr() as usize;
        let reg = Registry::default();
        let handles = [(1u64, platform)];
        let first = reg.insert(base, 8192, None, &handles, Visibility::Public).unwrap();
        let stop = AtomicBool::new(false);
        let claims = AtomicU64::new(0);
        let removals = std::thread::scope(|s| {
            s.spawn(|| {
                let mut recent = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(t) = reg.token_at(base) else { continue };
                    if let Ok(g) = reg.acquire_recent(&mut recent, 1, &t, 0, 4096) {
                        // Held: the registration cannot be removed under us.
                        for _ in 0..8 {
                            assert_eq!(reg.token_at(base), Some(t), "registration removed under a claim");
                        }
                        assert_eq!(recent.as_ref().map(|r: &Recent| r.pages().len()), Some(2));
                        drop(g);
                        claims.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            let mut removals = 0u64;
            let mut t = first;
            let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
            for i in 0.. {
                if i >= 20_000 && claims.load(Ordering::Relaxed) > 0 || std::time::Instant::now() > give_up {
                    break;
                }
                match reg.remove(&t) {
                    Ok(()) => {
                        removals += 1;
                        t = reg.insert(base, 8192, None, &handles, Visibility::Public).unwrap();
                    }
                    Err(Error::Busy { .. }) => std::thread::yield_now(),
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            stop.store(true, Ordering::Relaxed);
            removals
        });
        let claims = claims.into_inner();
        assert!(claims > 0 && removals > 0, "claims {claims}, removals {removals}");
        let t = reg.token_at(base).unwrap();
        reg.remove(&t).unwrap();
        drop(mem);
    }

    /// A platform that maps memory at made-up addresses no device reaches
    /// (the registry's tests issue no command; the emulator's memfd is
    /// beyond Miri). `unaligned`: every page but the first off its page
    /// boundary (what a broken IOMMU driver might hand back).
    struct TestPlatform {
        unaligned: bool,
    }

    impl Platform for TestPlatform {
        fn describe(&self) -> String {
            "a test platform".into()
        }
        fn read32(&self, _off: usize) -> u32 {
            u32::MAX
        }
        unsafe fn write32(&self, _off: usize, _val: u32) {}
        fn alloc_dma(&self, len: usize) -> ugds_platform::Result<ugds_platform::dma::DmaBuffer> {
            ugds_platform::dma::DmaBuffer::anonymous(len)
        }
        unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> ugds_platform::Result<HostMapping> {
            let span = HostMapping::span(vaddr, len)?;
            // SAFETY: no device reaches these addresses: the registry must
            // refuse them before any command names them.
            let m = unsafe { HostMapping::contiguous(vaddr, span, 0x1_0000_0000) };
            let off = if self.unaligned { 512 } else { 0 };
            let pages = m.pages().iter().enumerate().map(|(i, &a)| if i > 0 { a + off } else { a }).collect();
            // SAFETY: a broken platform on purpose, as above.
            Ok(unsafe { HostMapping::from_parts(pages, m.first_offset(), m.cookie()) })
        }
        unsafe fn unmap_host(&self, _mapping: &HostMapping) -> ugds_platform::Result<()> {
            Ok(())
        }
        fn interrupt(&self, _vector: u16) -> ugds_platform::Result<Option<&ugds_platform::sys::EventFd>> {
            Ok(None)
        }
        fn interrupt_vectors(&self) -> u16 {
            0
        }
    }

    /// PRPs name the pages of a mapping as they are, so a mapping with a
    /// page off its boundary is refused at registration and nothing stays
    /// registered.
    #[test]
    fn a_mapping_with_an_unaligned_page_is_refused() {
        let platform: Arc<dyn Platform> = Arc::new(TestPlatform { unaligned: true });
        let mut mem = crate::buffer::HostBuffer::new(8192).unwrap();
        let base = mem.as_mut_ptr() as usize;
        let reg = Registry::default();
        let r = reg.insert(base, 8192, None, &[(1, platform)], Visibility::Public);
        match r {
            Err(Error::Platform(m)) => assert!(m.contains("page 1") && m.contains("not page aligned"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(reg.token_at(base), None);
        drop(mem);
    }
}
