//! Posting sends and receives on a queue pair its connection owns.

use super::*;

/// Posting on a queue pair (`struct ibv_qp`) that its connection owns.
#[derive(Clone, Copy)]
pub struct Poster {
    pub(super) qp: *mut c_void,
    pub(super) send: PostSend,
    pub(super) recv: PostRecv,
}

// SAFETY: posting is thread-safe in libibverbs; the queue pair's owner
// keeps it alive while a Poster is used.
unsafe impl Send for Poster {}

impl std::fmt::Debug for Poster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poster").finish_non_exhaustive()
    }
}

impl Poster {
    /// The posting functions of the queue pair `qp`.
    ///
    /// # Safety
    /// `qp` is a live `struct ibv_qp` that outlives the Poster.
    pub unsafe fn new(qp: *mut c_void) -> Result<Poster> {
        // SAFETY: the caller's; `context` is the queue pair's first field.
        let ctx = unsafe { *qp.cast::<*mut c_void>() };
        // SAFETY: a live context; the entries' prototypes.
        let (send, recv) = unsafe { (op::<PostSend>(ctx, OPS_POST_SEND), op::<PostRecv>(ctx, OPS_POST_RECV)) };
        match (send, recv) {
            (Some(send), Some(recv)) => Ok(Poster { qp, send, recv }),
            _ => Err(Error::Unsupported("RDMA: the provider has no post_send or post_recv".into())),
        }
    }

    /// Posts a SEND of `sge` (registered memory, or any memory when
    /// `inline`: copied into the request), identified by `wr_id`; signaled,
    /// so that it completes on the send CQ.
    pub fn send(&self, wr_id: u64, mut sge: Sge, inline: bool) -> Result<()> {
        let mut wr = SendWr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: WR_SEND,
            send_flags: SEND_SIGNALED | if inline { SEND_INLINE } else { 0 },
            imm: 0,
            rest: [0; 11],
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP; the request and its SGE live across the call
        // (the provider copies them).
        let rc = unsafe { (self.send)(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::Os { op: "ibv_post_send".into(), errno: rc });
        }
        Ok(())
    }

    /// Posts a signaled SEND of each `(wr_id, sge)` (registered memory),
    /// in order, chained [`SEND_CHAIN`] to a call (a provider that tells
    /// the device by a system call, soft RoCE's, makes one per call, not
    /// one per SEND). Returns how many were posted, and why the rest were
    /// not.
    pub fn send_all(&self, sends: &[(u64, Sge)]) -> (usize, Result<()>) {
        let mut posted = 0;
        for chunk in sends.chunks(SEND_CHAIN) {
            let mut sges: [Sge; SEND_CHAIN] = [Sge::default(); SEND_CHAIN];
            let blank = || SendWr {
                wr_id: 0,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 1,
                opcode: WR_SEND,
                send_flags: SEND_SIGNALED,
                imm: 0,
                rest: [0; 11],
            };
            let mut wrs: [SendWr; SEND_CHAIN] = std::array::from_fn(|_| blank());
            for (i, &(wr_id, sge)) in chunk.iter().enumerate() {
                sges[i] = sge;
                wrs[i].wr_id = wr_id;
            }
            let (base, sge_base) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
            for i in 0..chunk.len() {
                let next = if i + 1 < chunk.len() { base.wrapping_add(i + 1) } else { std::ptr::null_mut() };
                // SAFETY: `i` is within both arrays (at most SEND_CHAIN
                // long), which outlive the call below that reads the chain.
                unsafe {
                    (*base.add(i)).sg_list = sge_base.add(i);
                    (*base.add(i)).next = next;
                }
            }
            let mut bad: *mut SendWr = std::ptr::null_mut();
            // SAFETY: a live QP; the chain and its SGEs live across the call
            // (the provider copies them).
            let rc = unsafe { (self.send)(self.qp, base, &mut bad) };
            if rc != 0 {
                // `bad` is the first request not posted (all of the chunk
                // when the provider does not say).
                let done =
                    if bad.is_null() { 0 } else { (bad as usize - base as usize) / std::mem::size_of::<SendWr>() };
                return (posted + done.min(chunk.len()), Err(Error::Os { op: "ibv_post_send".into(), errno: rc }));
            }
            posted += chunk.len();
        }
        (posted, Ok(()))
    }

    /// Moves the queue pair to the error state: it takes no more requests
    /// from its peer (no RDMA READ or WRITE of this side's memory is served
    /// after it) and flushes what is posted, each request completing with
    /// [`WC_WR_FLUSH_ERR`] in the order it was posted. The device flushes
    /// receives once it has stopped serving the peer: a flushed receive
    /// says so (how Linux's `ib_drain_rq` knows). A receive posted after
    /// this call may not be flushed at all by a provider that posts in user
    /// space (soft RoCE's kernel is not told): post it before.
    pub fn to_error(&self) -> Result<()> {
        let v = verbs()?;
        let mut attr = QpAttr { qp_state: QPS_ERR, rest: [0; 63] };
        // SAFETY: a live QP; `attr` outlives the call and is larger than
        // `struct ibv_qp_attr`; only its state is read (the mask).
        let rc = unsafe { (v.modify_qp)(self.qp, &mut attr, QP_STATE) };
        if rc != 0 {
            return Err(Error::Os { op: "ibv_modify_qp (to the error state)".into(), errno: rc });
        }
        Ok(())
    }

    /// Posts a receive into `sge` (registered memory), identified by
    /// `wr_id`.
    pub fn recv(&self, wr_id: u64, mut sge: Sge) -> Result<()> {
        let mut wr = RecvWr { wr_id, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in `send`.
        let rc = unsafe { (self.recv)(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::Os { op: "ibv_post_recv".into(), errno: rc });
        }
        Ok(())
    }
}
