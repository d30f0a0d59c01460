//! Completion channels and completion queues: polled, or armed to signal
//! a channel.

use super::*;

/// A completion channel: where a completion queue armed with
/// [`CompletionQueue::arm`] reports its next completion, as a readable
/// descriptor (non-blocking; watch it with epoll). Destroyed on drop, after
/// the completion queues that use it (each holds it).
pub struct CompletionChannel {
    ch: *mut RawChannel,
    _device: Arc<Device>,
}

// SAFETY: libibverbs' channels may be used from any thread; this one is
// read by the one owner of the completion queue that uses it.
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl std::fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionChannel").field("fd", &self.fd()).finish_non_exhaustive()
    }
}

impl CompletionChannel {
    /// A channel on `device`'s context, its descriptor non-blocking.
    pub fn new(device: &Arc<Device>) -> Result<Arc<CompletionChannel>> {
        let v = verbs()?;
        // SAFETY: a live context.
        let ch = unsafe { (v.create_comp_channel)(device.ctx) };
        if ch.is_null() {
            return Err(errno("ibv_create_comp_channel"));
        }
        let c = Arc::new(CompletionChannel { ch, _device: device.clone() });
        // Non-blocking, so that taking its events never waits (the
        // queue's sleep is on the descriptor, in the platform's poller).
        // SAFETY: the channel's open descriptor; fcntl reads or sets its
        // flags only.
        let set = unsafe {
            let fd = (*c.ch).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !set {
            return Err(errno("fcntl O_NONBLOCK on a completion channel"));
        }
        Ok(c)
    }

    /// The descriptor that turns readable when an armed queue completes.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the channel's descriptor, open until the channel is
        // destroyed in drop (after this borrow of self ends).
        unsafe { std::os::fd::BorrowedFd::borrow_raw((*self.ch).fd) }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        if let Ok(v) = verbs() {
            // SAFETY: created by `new`, destroyed once; every completion
            // queue on it holds it, so they are gone.
            unsafe { (v.destroy_comp_channel)(self.ch) };
        }
    }
}

/// A completion queue on a device. Destroyed on drop (after the queue
/// pairs that use it: theirs to go first).
pub struct CompletionQueue {
    cq: *mut c_void,
    poll: PollCq,
    /// The channel it reports to when armed, and the provider's arming.
    notify: Option<(Arc<CompletionChannel>, ReqNotifyCq)>,
    _device: Arc<Device>,
}

// SAFETY: libibverbs' completion queues may be polled from any thread; this
// one is polled through &self by one owner at a time (its connection's).
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue").field("channel", &self.notify.as_ref().map(|n| &n.0)).finish_non_exhaustive()
    }
}

impl CompletionQueue {
    /// A completion queue of at least `entries` on `device`'s context,
    /// reporting to `channel` when armed (none: polled only).
    pub fn new(device: &Arc<Device>, entries: u32, channel: Option<Arc<CompletionChannel>>) -> Result<CompletionQueue> {
        let v = verbs()?;
        let raw_channel = channel.as_ref().map_or(std::ptr::null_mut(), |c| c.ch);
        // SAFETY: a live context and channel (or none); vector 0.
        let cq = unsafe { (v.create_cq)(device.ctx, entries as c_int, std::ptr::null_mut(), raw_channel.cast(), 0) };
        if cq.is_null() {
            return Err(errno("ibv_create_cq"));
        }
        // SAFETY: a live context; the entries' prototypes.
        let (poll, arm) =
            unsafe { (op::<PollCq>(device.ctx, OPS_POLL_CQ), op::<ReqNotifyCq>(device.ctx, OPS_REQ_NOTIFY_CQ)) };
        let notify = match (channel, arm) {
            (Some(c), Some(arm)) => Some((c, arm)),
            (None, _) => None,
            (Some(_), None) => {
                // SAFETY: created above, destroyed once.
                unsafe { (v.destroy_cq)(cq) };
                return Err(Error::Unsupported("RDMA: the provider has no req_notify_cq".into()));
            }
        };
        let Some(poll) = poll else {
            // SAFETY: created above, destroyed once.
            unsafe { (v.destroy_cq)(cq) };
            return Err(Error::Unsupported("RDMA: the provider has no poll_cq".into()));
        };
        Ok(CompletionQueue { cq, poll, notify, _device: device.clone() })
    }

    /// The raw `struct ibv_cq`, for a queue pair to use.
    pub fn raw(&self) -> *mut c_void {
        self.cq
    }

    /// Takes up to `out.len()` completions; how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        // SAFETY: a live CQ; `out` holds as many entries as asked for.
        let n = unsafe { (self.poll)(self.cq, out.len().min(c_int::MAX as usize) as c_int, out.as_mut_ptr()) };
        if n < 0 {
            return Err(Error::Os { op: "ibv_poll_cq".into(), errno: libc::EIO });
        }
        Ok(n as usize)
    }

    /// The channel this queue reports to, if any.
    pub fn channel(&self) -> Option<&Arc<CompletionChannel>> {
        self.notify.as_ref().map(|n| &n.0)
    }

    /// Arms the queue: its next completion (one added after this call) is
    /// reported on the channel, once. Completions already in the queue are
    /// not: poll after arming.
    pub fn arm(&self) -> Result<()> {
        let Some((_, arm)) = &self.notify else {
            return Err(Error::InvalidArgument("a completion queue without a channel cannot be armed".into()));
        };
        // SAFETY: a live CQ with a channel; any completion, not only
        // solicited ones.
        match unsafe { arm(self.cq, 0) } {
            0 => Ok(()),
            e => Err(Error::Os { op: "ibv_req_notify_cq".into(), errno: e }),
        }
    }

    /// Takes and acknowledges the channel's events for this queue (none
    /// waited for); how many. Each is acknowledged at once, so the queue's
    /// destruction never waits on one.
    pub fn take_events(&self) -> Result<u32> {
        let (Some((c, _)), Ok(v)) = (&self.notify, verbs()) else { return Ok(0) };
        let mut n = 0u32;
        let r = loop {
            let (mut cq, mut ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
            // SAFETY: a live channel, non-blocking; the out pointers are
            // ours.
            if unsafe { (v.get_cq_event)(c.ch, &mut cq, &mut ctx) } != 0 {
                let e = std::io::Error::last_os_error();
                break match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(()),
                    _ => Err(Error::io("ibv_get_cq_event", e)),
                };
            }
            if cq != self.cq {
                // The channel is this queue's alone; acknowledged all the
                // same, so that its owner is never left waiting.
                // SAFETY: the event's own CQ, live while it has events.
                unsafe { (v.ack_cq_events)(cq, 1) };
                continue;
            }
            n += 1;
        };
        if n > 0 {
            // SAFETY: `n` events of this queue taken above.
            unsafe { (v.ack_cq_events)(self.cq, n) };
        }
        r.map(|()| n)
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if let Ok(v) = verbs() {
            // SAFETY: created by `new`, destroyed once, after its queue
            // pairs (their owners drop them first); every event taken was
            // acknowledged. The channel (held) goes after it.
            unsafe { (v.destroy_cq)(self.cq) };
        }
    }
}
