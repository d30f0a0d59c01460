//! A lent queue's requests: what each entry of its request table keeps,
//! what each request holds of its buffer, and the checks a small request
//! passes.

use crate::engine::requests::RequestTable;
use crate::engine::Owner;
use crate::handle::HandleInner;
use crate::registry::{BufGuard, BufferToken, Recent};
use ugds_nvme::{Cqe, NvmOpcode, Status};
use ugds_platform::sys::PAGE_SIZE;
use ugds_platform::{Error, Result};

pub(super) struct Request {
    pub(super) tag: u64,
    pub(super) pending: u32,
    pub(super) len: usize,
    /// First error, as the CQE status field.
    pub(super) status: Option<u16>,
    /// Bytes not moved (a read that met the end of a kernel-path file).
    pub(super) short: usize,
    pub(super) op: NvmOpcode,
    pub(super) claim: Claim,
}

/// A lent queue's request entries.
pub(super) type Requests = RequestTable<Request>;

/// Takes entry `idx` ([`RequestTable::next`]'s) for a request of
/// `pending` commands.
#[inline(always)]
pub(super) fn start(reqs: &mut Requests, idx: u32, tag: u64, pending: u32, len: usize, op: NvmOpcode, claim: Claim) {
    reqs.start(
        idx,
        claim,
        |r, claim| {
            (r.tag, r.pending, r.len, r.status, r.short, r.op) = (tag, pending, len, None, 0, op);
            // A free entry's claim ended with its completion (`complete` and
            // `check_timeouts` leave `Claim::None`): nothing to drop, and no
            // test of the old value on every submission.
            let stale = std::mem::replace(&mut r.claim, claim);
            debug_assert!(matches!(stale, Claim::None), "a free request entry holds no claim");
            std::mem::forget(stale);
        },
        |claim| Request { tag, pending, len, status: None, short: 0, op, claim },
    );
}

/// What a request holds of its buffer while its commands are on the device.
pub(super) enum Claim {
    /// Nothing: a free entry, or a request whose hold went to the handle's
    /// quarantine.
    None,
    /// A share in the queue's one reference on its recent buffer
    /// ([`Buffers`]).
    Shared,
    /// A reference of its own, on a buffer other than the recent one, with
    /// the buffer's page addresses (boxed: the common claims stay a word).
    Own(Box<(BufGuard, std::sync::Arc<[u64]>)>),
}

/// The buffer a lent queue used last, and one in-flight reference on it
/// shared by every request on it: taken by the first request, released by
/// the last to complete, so that an idle queue holds nothing and the buffer
/// can be deregistered, while a deep queue on one buffer pays for the
/// reference once and not per request. A request on another buffer
/// meanwhile takes a reference of its own.
#[derive(Default)]
pub(super) struct Buffers {
    pub(super) recent: Option<Recent>,
    pub(super) held: Option<BufGuard>,
    /// Requests sharing `held`.
    pub(super) users: u32,
}

impl Buffers {
    /// Takes a claim on `offset..offset+len` of `token`'s buffer.
    #[inline(always)]
    pub(super) fn claim(&mut self, h: &HandleInner, token: &BufferToken, offset: u64, len: u64) -> Result<Claim> {
        match &self.recent {
            // Held: the reference keeps the registration in place
            // (deregistration refuses a buffer with I/O in flight), so
            // checking the range is all.
            Some(r) if self.users > 0 && r.covers(token, offset, len) => {}
            _ if self.users > 0 => return Self::claim_other(h, token, offset, len),
            // Idle: claim through `recent` (or the registry) and share it.
            _ => self.held = Some(h.registry().acquire_recent(&mut self.recent, h.id, token, offset, len)?),
        }
        self.users += 1;
        Ok(Claim::Shared)
    }

    /// A claim of its own, through the registry.
    #[cold]
    pub(super) fn claim_other(h: &HandleInner, token: &BufferToken, offset: u64, len: u64) -> Result<Claim> {
        let g = h.registry().acquire(token, offset, len)?;
        let pages = Recent::of(&g, h.id, token)?.shared_pages();
        Ok(Claim::Own(Box::new((g, pages))))
    }

    /// The controller addresses of the pages of a claim's buffer.
    #[inline(always)]
    pub(super) fn pages<'a>(&'a self, claim: &'a Claim) -> &'a [u64] {
        match claim {
            Claim::Own(own) => &own.1,
            _ => self.recent.as_ref().expect("a shared claim is on the recent buffer").pages(),
        }
    }

    /// Ends a request's claim.
    #[inline(always)]
    pub(super) fn release(&mut self, claim: Claim) {
        match claim {
            Claim::Shared => {
                self.users -= 1;
                if self.users == 0 {
                    self.held = None;
                }
            }
            Claim::Own(own) => drop(own),
            Claim::None => {}
        }
    }
}

/// What a request of a page or less is checked against, taken from the
/// handle once: the checks of [`HandleInner::check_range`] and
/// [`HandleInner::data_offset`] in a few instructions, which on failure
/// leave the error to those.
#[derive(Clone, Copy)]
pub(super) struct Small {
    /// Requests of `1..=max` bytes take the one-command path: a page, or 0
    /// on a shared queue (which has none).
    pub(super) max: usize,
    /// The block size less one.
    pub(super) block_mask: u64,
    /// log2 of the block size.
    pub(super) block_shift: u32,
    pub(super) nsid: u32,
    /// The namespace's size in bytes.
    pub(super) capacity: u64,
}

impl Small {
    pub(super) fn of(h: &HandleInner, shared: bool) -> Small {
        let bs = h.block_size() as u64;
        Small {
            // A share that starts past 0 takes the full checks.
            max: if shared || h.floor() > 0 { 0 } else { PAGE_SIZE },
            block_mask: bs - 1,
            block_shift: bs.trailing_zeros(),
            nsid: h.ns_nsid(),
            capacity: h.capacity(),
        }
    }

    /// Whether a request of `size` bytes (`1..=max`) at `file_offset`, its
    /// data `data_off` bytes into its first page, passes every check.
    #[inline(always)]
    pub(super) fn valid(&self, size: usize, file_offset: u64, data_off: usize) -> bool {
        let end = file_offset.wrapping_add(size as u64);
        (file_offset | size as u64) & self.block_mask == 0
            && data_off % 4 == 0
            && end <= self.capacity
            && end >= file_offset
    }
}

/// A completion of a request reported timed out already (the queue is
/// dead): not reported again.
#[cold]
#[inline(never)]
fn late_completion(cid: u16) {
    tracing::warn!(cid, "completion of a request reported timed out; ignored");
}

/// Credits one completion to its request; reports the request (`f`) and
/// frees its entry when it was the last command.
/// `short`: DW0 says how many bytes a read did not move (the kernel path's
/// completions).
#[inline(always)]
pub(super) fn complete(
    reqs: &mut Requests,
    bufs: &mut Buffers,
    f: &mut impl FnMut(u64, Result<usize>),
    owner: Owner,
    cqe: &Cqe,
    short: bool,
) {
    let Owner::Own(idx) = owner else { unreachable!("a lent queue pair's commands are its own") };
    let mut r = reqs.entry(idx);
    if r.pending == 0 {
        // By value: a reference would keep the entry in memory on every
        // completion's path.
        late_completion(cqe.cid);
        return;
    }
    if !cqe.is_success() && r.status.is_none() {
        r.status = Some(cqe.status);
    }
    if short {
        r.short += cqe.dw0 as usize;
    }
    r.pending -= 1;
    if r.pending != 0 {
        return;
    }
    bufs.release(std::mem::replace(&mut r.claim, Claim::None));
    let res = match r.status {
        None => Ok(r.len.saturating_sub(r.short)),
        Some(s) => Err(Error::Nvme {
            op: if r.op == NvmOpcode::Read { "Read" } else { "Write" },
            status: Status::from_field(s),
        }),
    };
    f(r.tag, res);
    r.release();
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cqe(status: u16, dw0: u32) -> Cqe {
        Cqe { dw0, status, ..Cqe::default() }
    }

    /// Starts a request of `pending` commands on the next entry; its index.
    fn begin(r: &mut Requests, tag: u64, pending: u32, len: usize) -> u32 {
        let idx = r.next();
        start(r, idx, tag, pending, len, NvmOpcode::Read, Claim::None);
        idx
    }

    /// [`complete`]; whether the request ended (its entry freed).
    fn ends(
        r: &mut Requests,
        b: &mut Buffers,
        f: &mut impl FnMut(u64, Result<usize>),
        owner: Owner,
        cqe: &Cqe,
        short: bool,
    ) -> bool {
        let before = r.in_use();
        complete(r, b, f, owner, cqe, short);
        r.in_use() < before
    }

    #[test]
    fn a_request_ends_with_its_last_command_and_keeps_its_first_error() {
        let (mut r, mut b) = (RequestTable::with_capacity(4), Buffers::default());
        let mut done = Vec::new();
        let mut f = |tag, res: Result<usize>| done.push((tag, res));
        let i = begin(&mut r, 7, 3, 3 * 4096);
        let bad = Status::generic(0x04).to_field(false);
        let worse = Status::generic(0x06).to_field(false);
        assert!(!ends(&mut r, &mut b, &mut f, Owner::Own(i), &cqe(0, 0), false));
        assert!(!ends(&mut r, &mut b, &mut f, Owner::Own(i), &cqe(bad, 0), false));
        assert!(ends(&mut r, &mut b, &mut f, Owner::Own(i), &cqe(worse, 0), false));
        // A completion for it after the end: counted as late, nothing reported.
        assert!(!ends(&mut r, &mut b, &mut f, Owner::Own(i), &cqe(0, 0), false));
        // A read that met the end of a file: the bytes not moved come off.
        let j = begin(&mut r, 8, 2, 8192);
        assert!(!ends(&mut r, &mut b, &mut f, Owner::Own(j), &cqe(0, 0), true));
        assert!(ends(&mut r, &mut b, &mut f, Owner::Own(j), &cqe(0, 1000), true));
        assert_eq!(done.len(), 2);
        match &done[0] {
            (7, Err(Error::Nvme { status, .. })) => assert_eq!(*status, Status::from_field(bad), "the first error"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(done[1], (8, Ok(7192))));
    }

    proptest! {
        /// Requests of 1 to 4 commands started and completed in any order:
        /// each reported once, with its own tag, when its last command
        /// completes; the table never holds more entries than were ever in
        /// flight at once.
        #[test]
        fn any_order_reports_each_request_once(ops in proptest::collection::vec((any::<bool>(), 1u32..5, any::<u16>()), 1..200)) {
            let (mut r, mut b) = (RequestTable::with_capacity(8), Buffers::default());
            let mut inflight: Vec<(u32, u64, u32)> = Vec::new(); // (entry, tag, commands left)
            let (mut next_tag, mut peak) = (0u64, 0usize);
            let mut reported: Vec<u64> = Vec::new();
            for (submit, commands, pick) in ops {
                if submit || inflight.is_empty() {
                    let idx = begin(&mut r, next_tag, commands, 4096);
                    prop_assert!(inflight.iter().all(|&(e, _, _)| e != idx), "entry {idx} handed out twice");
                    inflight.push((idx, next_tag, commands));
                    next_tag += 1;
                    peak = peak.max(inflight.len());
                } else {
                    let k = pick as usize % inflight.len();
                    let (idx, tag, left) = inflight[k];
                    let mut got = None;
                    let ended = ends(&mut r, &mut b, &mut |t, res: Result<usize>| got = Some((t, res.is_ok())), Owner::Own(idx), &cqe(0, 0), false);
                    prop_assert_eq!(ended, left == 1);
                    if left == 1 {
                        prop_assert_eq!(got, Some((tag, true)));
                        reported.push(tag);
                        inflight.swap_remove(k);
                    } else {
                        prop_assert_eq!(got, None);
                        inflight[k].2 -= 1;
                    }
                }
                prop_assert!(r.len() <= peak);
            }
            let mut sorted = reported.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), reported.len(), "a request reported twice");
        }
    }
}
