//! RDMA connections through rdma-core's librdmacm, loaded at run time: the
//! connection manager resolves an IP address to an RDMA device and route,
//! creates the reliable-connected queue pair, and connects it with private
//! data (NVMe/RDMA's connection request) to a listener (nvmet-rdma).
//!
//! Every wait on the connection manager's events is bounded: the event
//! channel's descriptor is polled with the caller's timeout before an event
//! is taken. Layouts read here (`struct rdma_cm_id`'s first four pointers,
//! `struct rdma_cm_event`, `struct rdma_conn_param`, `struct
//! rdma_event_channel`, `struct ibv_qp_init_attr`) are those of
//! `rdma_cma.h` and `verbs.h`, unchanged since librdmacm 1.0.

use super::dl::Library;
use super::verbs::{CompletionChannel, CompletionQueue, Device, Poster};
use crate::{Error, Result};
use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

type CreateEventChannel = unsafe extern "C" fn() -> *mut c_int;
type DestroyEventChannel = unsafe extern "C" fn(*mut c_int);
type CreateId = unsafe extern "C" fn(*mut c_int, *mut *mut RawId, *mut c_void, c_int) -> c_int;
type DestroyId = unsafe extern "C" fn(*mut RawId) -> c_int;
type ResolveAddr = unsafe extern "C" fn(*mut RawId, *mut libc::sockaddr, *mut libc::sockaddr, c_int) -> c_int;
type ResolveRoute = unsafe extern "C" fn(*mut RawId, c_int) -> c_int;
type GetCmEvent = unsafe extern "C" fn(*mut c_int, *mut *mut RawEvent) -> c_int;
type AckCmEvent = unsafe extern "C" fn(*mut RawEvent) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut RawId, *mut c_void, *mut QpInitAttr) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut RawId);
type Connect = unsafe extern "C" fn(*mut RawId, *mut ConnParam) -> c_int;
type Disconnect = unsafe extern "C" fn(*mut RawId) -> c_int;

/// `RDMA_PS_TCP`: reliable connections.
const PS_TCP: c_int = 0x0106;
/// `IBV_QPT_RC`.
const QPT_RC: c_int = 2;

/// `enum rdma_cm_event_type`, the events waited for.
mod event {
    pub const ADDR_RESOLVED: i32 = 0;
    pub const ROUTE_RESOLVED: i32 = 2;
    pub const REJECTED: i32 = 8;
    pub const ESTABLISHED: i32 = 9;
    pub const DISCONNECTED: i32 = 10;

    /// The event's name (`rdma_event_str`'s).
    pub fn name(e: i32) -> &'static str {
        const NAMES: [&str; 16] = [
            "RDMA_CM_EVENT_ADDR_RESOLVED",
            "RDMA_CM_EVENT_ADDR_ERROR",
            "RDMA_CM_EVENT_ROUTE_RESOLVED",
            "RDMA_CM_EVENT_ROUTE_ERROR",
            "RDMA_CM_EVENT_CONNECT_REQUEST",
            "RDMA_CM_EVENT_CONNECT_RESPONSE",
            "RDMA_CM_EVENT_CONNECT_ERROR",
            "RDMA_CM_EVENT_UNREACHABLE",
            "RDMA_CM_EVENT_REJECTED",
            "RDMA_CM_EVENT_ESTABLISHED",
            "RDMA_CM_EVENT_DISCONNECTED",
            "RDMA_CM_EVENT_DEVICE_REMOVAL",
            "RDMA_CM_EVENT_MULTICAST_JOIN",
            "RDMA_CM_EVENT_MULTICAST_ERROR",
            "RDMA_CM_EVENT_ADDR_CHANGE",
            "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        ];
        NAMES.get(e as usize).copied().unwrap_or("an unknown event")
    }
}

/// The first fields of `struct rdma_cm_id`.
#[repr(C)]
struct RawId {
    verbs: *mut c_void,
    channel: *mut c_void,
    context: *mut c_void,
    qp: *mut c_void,
}

/// `struct rdma_conn_param`.
#[repr(C)]
struct ConnParam {
    private_data: *const c_void,
    private_data_len: u8,
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: u8,
    qp_num: u32,
}

/// `struct rdma_cm_event` (the `ud` member of its union is no larger).
#[repr(C)]
struct RawEvent {
    id: *mut RawId,
    listen_id: *mut RawId,
    event: c_int,
    status: c_int,
    conn: ConnParam,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
struct QpInitAttr {
    qp_context: *mut c_void,
    send_cq: *mut c_void,
    recv_cq: *mut c_void,
    srq: *mut c_void,
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
    qp_type: c_int,
    sq_sig_all: c_int,
}

struct Cm {
    _lib: Library,
    create_event_channel: CreateEventChannel,
    destroy_event_channel: DestroyEventChannel,
    create_id: CreateId,
    destroy_id: DestroyId,
    resolve_addr: ResolveAddr,
    resolve_route: ResolveRoute,
    get_cm_event: GetCmEvent,
    ack_cm_event: AckCmEvent,
    create_qp: CreateQp,
    destroy_qp: DestroyQp,
    connect: Connect,
    disconnect: Disconnect,
}

fn cm() -> Result<&'static Cm> {
    static C: OnceLock<std::result::Result<Cm, String>> = OnceLock::new();
    C.get_or_init(|| load().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Unsupported(format!("RDMA connection manager: {e}")))
}

fn load() -> Result<Cm> {
    let lib = Library::open(&["librdmacm.so.1"])
        .map_err(|e| Error::Unsupported(format!("{e} (install rdma-core's librdmacm1)")))?;
    // SAFETY: each type is the C prototype of the symbol named (rdma_cma.h).
    unsafe {
        Ok(Cm {
            create_event_channel: lib.sym(c"rdma_create_event_channel")?,
            destroy_event_channel: lib.sym(c"rdma_destroy_event_channel")?,
            create_id: lib.sym(c"rdma_create_id")?,
            destroy_id: lib.sym(c"rdma_destroy_id")?,
            resolve_addr: lib.sym(c"rdma_resolve_addr")?,
            resolve_route: lib.sym(c"rdma_resolve_route")?,
            get_cm_event: lib.sym(c"rdma_get_cm_event")?,
            ack_cm_event: lib.sym(c"rdma_ack_cm_event")?,
            create_qp: lib.sym(c"rdma_create_qp")?,
            destroy_qp: lib.sym(c"rdma_destroy_qp")?,
            connect: lib.sym(c"rdma_connect")?,
            disconnect: lib.sym(c"rdma_disconnect")?,
            _lib: lib,
        })
    }
}

fn errno(op: &str) -> Error {
    Error::Os { op: op.to_string().into(), errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) }
}

/// What a connection request came to.
#[derive(Debug)]
pub enum Answer {
    /// Established; the accept's private data.
    Established(Vec<u8>),
    /// Rejected; the reject's private data (empty when the RDMA layer
    /// itself refused: no listener, say).
    Rejected(Vec<u8>),
}

/// A reliable connection: its event channel, identifier, device (the
/// context the route found, with a protection domain), completion queue
/// and queue pair. Disconnected and torn down on drop, queue pair first.
pub struct Connection {
    channel: *mut c_int,
    id: *mut RawId,
    has_qp: bool,
    connected: bool,
    device: Option<Arc<Device>>,
    cq: Option<CompletionQueue>,
    peer: SocketAddr,
}

// SAFETY: librdmacm's identifiers may be used from any thread; this one is
// used through &mut self (connect, drop) or for posting, which libibverbs
// makes thread-safe.
unsafe impl Send for Connection {}
// SAFETY: as above.
unsafe impl Sync for Connection {}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("peer", &self.peer).field("connected", &self.connected).finish()
    }
}

impl Connection {
    /// Resolves `peer` to a device and a route (each within `timeout`),
    /// then makes a completion queue of `cq_entries` (with a completion
    /// channel when `notify`: see [`CompletionQueue::arm`]) and a queue
    /// pair of `send` and `recv` work requests on that device, in the
    /// protection domain of `shared` when the route runs through its
    /// context (so that memory registered there is this connection's too;
    /// see [`shares`](Self::shares)), else in one of its own.
    pub fn new(
        peer: SocketAddr,
        timeout: Duration,
        cq_entries: u32,
        send: u32,
        recv: u32,
        notify: bool,
        shared: Option<&Arc<Device>>,
    ) -> Result<Connection> {
        let c = cm()?;
        // SAFETY: no arguments; null on failure.
        let channel = unsafe { (c.create_event_channel)() };
        if channel.is_null() {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENODEV) || e.raw_os_error() == Some(libc::ENOENT) {
                return Err(Error::Unsupported(
                    "RDMA: no connection manager for user space (rdma_ucm not loaded, or no RDMA device)".into(),
                ));
            }
            return Err(errno("rdma_create_event_channel"));
        }
        let mut conn = Connection {
            channel,
            id: std::ptr::null_mut(),
            has_qp: false,
            connected: false,
            device: None,
            cq: None,
            peer,
        };
        // SAFETY: a live channel; `id` receives the identifier.
        if unsafe { (c.create_id)(channel, &mut conn.id, std::ptr::null_mut(), PS_TCP) } != 0 {
            return Err(errno("rdma_create_id"));
        }
        let mut dst = sockaddr(peer);
        let ms = timeout.as_millis().clamp(1, c_int::MAX as u128) as c_int;
        // SAFETY: a live identifier; `dst` lives across the call (copied).
        if unsafe { (c.resolve_addr)(conn.id, std::ptr::null_mut(), dst.as_mut_ptr().cast(), ms) } != 0 {
            return Err(errno(&format!("rdma_resolve_addr {peer}")));
        }
        conn.expect(event::ADDR_RESOLVED, timeout)?;
        // SAFETY: a live identifier with a resolved address.
        if unsafe { (c.resolve_route)(conn.id, ms) } != 0 {
            return Err(errno(&format!("rdma_resolve_route {peer}")));
        }
        conn.expect(event::ROUTE_RESOLVED, timeout)?;
        // SAFETY: resolved: `verbs` is the device context the route uses,
        // the connection manager's for the identifier's life (longer than
        // the device's: the device goes first in drop). A shared device is
        // on that context (checked), which librdmacm keeps open while the
        // device is present, past this identifier's life.
        let ctx = unsafe { (*conn.id).verbs };
        let device = match shared {
            Some(d) if d.context() == ctx => d.clone(),
            // SAFETY: as above.
            _ => unsafe { Device::on_context(ctx)? },
        };
        let channel = if notify { Some(CompletionChannel::new(&device)?) } else { None };
        let cq = CompletionQueue::new(&device, cq_entries, channel)?;
        let mut attr = QpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.raw(),
            recv_cq: cq.raw(),
            srq: std::ptr::null_mut(),
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
            qp_type: QPT_RC,
            sq_sig_all: 0,
        };
        conn.device = Some(device.clone());
        conn.cq = Some(cq);
        // SAFETY: a live identifier, PD and CQ; `attr` lives across the call.
        if unsafe { (c.create_qp)(conn.id, device.pd(), &mut attr) } != 0 {
            return Err(errno("rdma_create_qp"));
        }
        conn.has_qp = true;
        Ok(conn)
    }

    /// The device the route runs through (register memory on it).
    pub fn device(&self) -> &Arc<Device> {
        self.device.as_ref().expect("made in new")
    }

    /// Whether the connection's queue pair is in `device`'s protection
    /// domain (memory registered there may be named in its requests).
    pub fn shares(&self, device: &Arc<Device>) -> bool {
        Arc::ptr_eq(self.device(), device)
    }

    /// The completion queue of both directions.
    pub fn cq(&self) -> &CompletionQueue {
        self.cq.as_ref().expect("made in new")
    }

    /// Posting on the queue pair.
    pub fn poster(&self) -> Result<Poster> {
        // SAFETY: the queue pair made in `new`, alive until drop (a Poster
        // is used only while its connection is).
        unsafe { Poster::new((*self.id).qp) }
    }

    /// Connects with `private_data` (receives should be posted first),
    /// waiting up to `timeout` for the answer.
    pub fn connect(&mut self, private_data: &[u8], timeout: Duration) -> Result<Answer> {
        let c = cm()?;
        let mut p = ConnParam {
            private_data: private_data.as_ptr().cast(),
            private_data_len: private_data.len().min(255) as u8,
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        // SAFETY: a live identifier with a queue pair; `p` and the private
        // data live across the call (copied).
        if unsafe { (c.connect)(self.id, &mut p) } != 0 {
            return Err(errno(&format!("rdma_connect {}", self.peer)));
        }
        let (e, data) = self.next_event(timeout)?;
        match e {
            event::ESTABLISHED => {
                self.connected = true;
                Ok(Answer::Established(data))
            }
            event::REJECTED => Ok(Answer::Rejected(data)),
            other => Err(Error::Platform(format!(
                "RDMA: connecting to {} ended in {} instead of RDMA_CM_EVENT_ESTABLISHED",
                self.peer,
                event::name(other)
            ))),
        }
    }

    /// Whether the peer has disconnected (an event waiting says so; does
    /// not wait).
    pub fn disconnected(&mut self) -> bool {
        matches!(self.next_event(Duration::ZERO), Ok((event::DISCONNECTED, _)))
    }

    fn expect(&mut self, want: i32, timeout: Duration) -> Result<()> {
        let (e, _) = self.next_event(timeout)?;
        if e != want {
            return Err(Error::Platform(format!(
                "RDMA: {} for {} instead of {}",
                event::name(e),
                self.peer,
                event::name(want)
            )));
        }
        Ok(())
    }

    /// The next event and its private data, waited for up to `timeout`.
    fn next_event(&mut self, timeout: Duration) -> Result<(i32, Vec<u8>)> {
        let c = cm()?;
        let deadline = Instant::now() + timeout;
        loop {
            // SAFETY: `struct rdma_event_channel`'s first field is its fd.
            let mut pfd = libc::pollfd { fd: unsafe { *self.channel }, events: libc::POLLIN, revents: 0 };
            let left = deadline.saturating_duration_since(Instant::now()).as_millis().min(c_int::MAX as u128);
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, left as c_int) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(errno("poll on the RDMA event channel"));
            }
            if n == 0 {
                return Err(Error::Platform(format!(
                    "RDMA: no answer from {} within {timeout:?} (connection manager)",
                    self.peer
                )));
            }
            let mut ev = std::ptr::null_mut();
            // SAFETY: a live channel with an event ready (does not block).
            if unsafe { (c.get_cm_event)(self.channel, &mut ev) } != 0 {
                return Err(errno("rdma_get_cm_event"));
            }
            // SAFETY: a live event until acknowledged below; its private
            // data (when any) is valid until then too.
            let (kind, status, data) = unsafe {
                let e = &*ev;
                let data = if e.conn.private_data.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(e.conn.private_data.cast::<u8>(), e.conn.private_data_len as usize)
                        .to_vec()
                };
                (e.event, e.status, data)
            };
            // SAFETY: taken above, acknowledged once.
            unsafe { (c.ack_cm_event)(ev) };
            if status != 0 && kind != event::REJECTED {
                return Err(Error::Platform(format!(
                    "RDMA: {} for {} with status {status} ({})",
                    event::name(kind),
                    self.peer,
                    std::io::Error::from_raw_os_error(status.abs())
                )));
            }
            return Ok((kind, data));
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let Ok(c) = cm() else { return };
        // SAFETY: each made by `new`, each released once, in the order the
        // connection manager asks: disconnect, queue pair, then (below)
        // the completion queue and the protection domain, then the
        // identifier and the channel.
        unsafe {
            if self.connected {
                (c.disconnect)(self.id);
            }
            if self.has_qp {
                (c.destroy_qp)(self.id);
            }
        }
        self.cq = None;
        self.device = None;
        // SAFETY: as above.
        unsafe {
            if !self.id.is_null() {
                (c.destroy_id)(self.id);
            }
            (c.destroy_event_channel)(self.channel);
        }
    }
}

/// `peer` as a `sockaddr_in` or `sockaddr_in6`, in a buffer large enough
/// for either.
fn sockaddr(peer: SocketAddr) -> Box<[u8; 128]> {
    let mut b = Box::new([0u8; 128]);
    match peer {
        SocketAddr::V4(a) => {
            let s = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: plain data copied into a larger buffer.
            unsafe { std::ptr::write_unaligned(b.as_mut_ptr().cast(), s) };
        }
        SocketAddr::V6(a) => {
            let s = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write_unaligned(b.as_mut_ptr().cast(), s) };
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structures_have_the_c_layout() {
        assert_eq!(std::mem::size_of::<ConnParam>(), 24);
        assert_eq!(std::mem::offset_of!(RawEvent, event), 16);
        assert_eq!(std::mem::offset_of!(RawEvent, conn), 24);
        assert_eq!(std::mem::size_of::<QpInitAttr>(), 64);
        assert_eq!(std::mem::offset_of!(QpInitAttr, qp_type), 52);
        let a = sockaddr("10.9.0.1:4420".parse().unwrap());
        assert_eq!(&a[..8], &[2, 0, 0x11, 0x44, 10, 9, 0, 1]);
    }

    /// Without librdmacm or RDMA (this machine and CI's), a connection is a
    /// clear error, never a crash or a hang.
    #[test]
    fn no_rdma_here_is_a_clear_error() {
        let started = Instant::now();
        match Connection::new("127.0.0.1:4420".parse().unwrap(), Duration::from_millis(500), 8, 8, 8, false, None) {
            Ok(_) => {} // a machine with RDMA on loopback: nothing to judge
            Err(e) => assert!(matches!(e, Error::Unsupported(_) | Error::Os { .. } | Error::Platform(_)), "{e}"),
        }
        assert!(started.elapsed() < Duration::from_secs(3), "bounded");
    }
}
