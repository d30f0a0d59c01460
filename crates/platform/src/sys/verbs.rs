//! RDMA verbs through rdma-core's libibverbs, loaded at run time (nothing
//! RDMA is needed to build or to run without it): the devices and their
//! ports, a protection domain, memory regions on host memory or on a
//! dma-buf (GPU memory, as NVMe over RDMA would register it), completion
//! queues, and the posting of sends and receives on a queue pair (the
//! connection itself is [`rdma_cm`](super::rdma_cm)'s).
//!
//! Only exported functions and stable layouts are used: `ibv_mr`'s first
//! fields (context, pd, addr, length, handle, lkey, rkey) have not changed
//! since libibverbs 1.0; `ibv_device_attr` and `ibv_port_attr` are read
//! from buffers larger than any version's structure, for their first
//! fields only. Posting and polling are inline functions in `verbs.h` that
//! call through the context's `ibv_context_ops`, whose layout rdma-core
//! keeps frozen for binary compatibility (`post_send`, `post_recv` and
//! `poll_cq` at the same places since libibverbs 1.1); so do the work
//! request and completion structures (`ibv_send_wr`, `ibv_recv_wr`,
//! `ibv_sge`, `ibv_wc`).

use super::dl::Library;
use crate::{Error, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Arc, OnceLock};

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
type QueryDevice = unsafe extern "C" fn(*mut c_void, *mut u8) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut c_void, u8, *mut u8) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type DeallocPd = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut RawMr;
type RegDmabufMr = unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut RawMr;
type DeregMr = unsafe extern "C" fn(*mut RawMr) -> c_int;
type CreateCq = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
type DestroyCq = unsafe extern "C" fn(*mut c_void) -> c_int;
type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut WorkCompletion) -> c_int;
type PostSend = unsafe extern "C" fn(*mut c_void, *mut SendWr, *mut *mut SendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut c_void, *mut RecvWr, *mut *mut RecvWr) -> c_int;
type ReqNotifyCq = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type CreateCompChannel = unsafe extern "C" fn(*mut c_void) -> *mut RawChannel;
type DestroyCompChannel = unsafe extern "C" fn(*mut RawChannel) -> c_int;
type GetCqEvent = unsafe extern "C" fn(*mut RawChannel, *mut *mut c_void, *mut *mut c_void) -> c_int;
type AckCqEvents = unsafe extern "C" fn(*mut c_void, c_uint);
type ModifyQp = unsafe extern "C" fn(*mut c_void, *mut QpAttr, c_int) -> c_int;

/// Where `ibv_context_ops` starts in `struct ibv_context` (after the
/// device pointer), and the places of the entries used in it.
const OPS: usize = 8;
const OPS_POLL_CQ: usize = 11;
const OPS_REQ_NOTIFY_CQ: usize = 12;
const OPS_POST_SEND: usize = 25;
const OPS_POST_RECV: usize = 26;

/// `IBV_QPS_ERR`, and `IBV_QP_STATE` of `ibv_qp_attr_mask`.
const QPS_ERR: u32 = 6;
const QP_STATE: c_int = 1;

/// `struct ibv_qp_attr`, of which only `qp_state` (its first field) is
/// set; the rest is room (the structure is 144 bytes in rdma-core 44).
#[repr(C)]
struct QpAttr {
    qp_state: u32,
    rest: [u32; 63],
}

/// `IBV_WR_SEND`.
const WR_SEND: c_int = 2;
/// `IBV_SEND_SIGNALED`: the send gets a completion entry.
const SEND_SIGNALED: c_uint = 1 << 1;
/// `IBV_SEND_INLINE`: the data is copied into the work request.
const SEND_INLINE: c_uint = 1 << 3;

/// `struct ibv_sge`: one piece of registered memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Its address.
    pub addr: u64,
    /// Its length.
    pub length: u32,
    /// The local key of the region it lies in.
    pub lkey: u32,
}

/// SENDs chained in one `ibv_post_send` call by [`Poster::send_all`].
pub const SEND_CHAIN: usize = 16;

/// `struct ibv_send_wr` (128 bytes; the fields past `imm` are the unions
/// of other operations, left zero).
#[repr(C)]
struct SendWr {
    wr_id: u64,
    next: *mut SendWr,
    sg_list: *mut Sge,
    num_sge: c_int,
    opcode: c_int,
    send_flags: c_uint,
    imm: u32,
    rest: [u64; 11],
}

/// `struct ibv_recv_wr`.
#[repr(C)]
struct RecvWr {
    wr_id: u64,
    next: *mut RecvWr,
    sg_list: *mut Sge,
    num_sge: c_int,
}

/// `struct ibv_wc`: one completion of a send or a receive.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkCompletion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// `IBV_WC_*`: 0 is success.
    pub status: u32,
    /// `IBV_WC_SEND` 0, ..., `IBV_WC_RECV` 128.
    pub opcode: u32,
    /// The provider's own code.
    pub vendor_err: u32,
    /// Bytes received.
    pub byte_len: u32,
    imm: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

/// `IBV_WC_RECV`: a receive completed.
pub const WC_RECV: u32 = 128;
/// `IBV_WC_WR_FLUSH_ERR`: a request flushed from a queue pair in the error
/// state.
pub const WC_WR_FLUSH_ERR: u32 = 5;

/// The name of a completion status (`ibv_wc_status_str`'s words).
pub fn wc_status_str(status: u32) -> &'static str {
    const NAMES: [&str; 23] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "Work Request Flushed Error",
        "memory management operation error",
        "bad response error",
        "local access error",
        "remote invalid request error",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation error",
        "remote invalid RD request",
        "aborted error",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout error",
        "general error",
        "TM error",
    ];
    NAMES.get(status as usize).copied().unwrap_or("unknown")
}

/// The entry of `ibv_context_ops` at `index`, for the context `ctx`.
///
/// # Safety
/// `ctx` is a live `struct ibv_context`, and `F` the entry's prototype.
unsafe fn op<F: Copy>(ctx: *mut c_void, index: usize) -> Option<F> {
    // SAFETY: the caller's; the ops table is an array of function
    // pointers (nullable: Option<F> has their layout).
    unsafe { *ctx.cast::<u8>().add(OPS + index * 8).cast::<Option<F>>() }
}

/// `IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ`: what a target
/// needs to move an NVMe command's data with RDMA READ and WRITE.
pub const ACCESS_NVME: c_int = 1 | 2 | 4;

/// The leading fields of `struct ibv_mr`.
#[repr(C)]
struct RawMr {
    context: *mut c_void,
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    handle: u32,
    lkey: u32,
    rkey: u32,
}

/// `struct ibv_comp_channel` (its layout unchanged since libibverbs 1.0).
#[repr(C)]
struct RawChannel {
    context: *mut c_void,
    fd: c_int,
    refcnt: c_int,
}

/// libibverbs' entry points.
struct Verbs {
    _lib: Library,
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    close_device: CloseDevice,
    query_device: QueryDevice,
    query_port: QueryPort,
    alloc_pd: AllocPd,
    dealloc_pd: DeallocPd,
    reg_mr: RegMr,
    reg_dmabuf_mr: Option<RegDmabufMr>,
    dereg_mr: DeregMr,
    create_cq: CreateCq,
    destroy_cq: DestroyCq,
    create_comp_channel: CreateCompChannel,
    destroy_comp_channel: DestroyCompChannel,
    get_cq_event: GetCqEvent,
    ack_cq_events: AckCqEvents,
    modify_qp: ModifyQp,
}

fn verbs() -> Result<&'static Verbs> {
    static V: OnceLock<std::result::Result<Verbs, String>> = OnceLock::new();
    V.get_or_init(|| load().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Unsupported(format!("RDMA verbs: {e}")))
}

fn load() -> Result<Verbs> {
    let lib = Library::open(&["libibverbs.so.1"])
        .map_err(|e| Error::Unsupported(format!("{e} (install rdma-core's libibverbs1 and a provider)")))?;
    // SAFETY: each type is the C prototype of the symbol named (verbs.h).
    unsafe {
        Ok(Verbs {
            get_device_list: lib.sym(c"ibv_get_device_list")?,
            free_device_list: lib.sym(c"ibv_free_device_list")?,
            get_device_name: lib.sym(c"ibv_get_device_name")?,
            open_device: lib.sym(c"ibv_open_device")?,
            close_device: lib.sym(c"ibv_close_device")?,
            query_device: lib.sym(c"ibv_query_device")?,
            query_port: lib.sym(c"ibv_query_port")?,
            alloc_pd: lib.sym(c"ibv_alloc_pd")?,
            dealloc_pd: lib.sym(c"ibv_dealloc_pd")?,
            reg_mr: lib.sym(c"ibv_reg_mr")?,
            // libibverbs 1.12 (rdma-core 34) and later.
            reg_dmabuf_mr: lib.sym(c"ibv_reg_dmabuf_mr").ok(),
            dereg_mr: lib.sym(c"ibv_dereg_mr")?,
            create_cq: lib.sym(c"ibv_create_cq")?,
            destroy_cq: lib.sym(c"ibv_destroy_cq")?,
            create_comp_channel: lib.sym(c"ibv_create_comp_channel")?,
            destroy_comp_channel: lib.sym(c"ibv_destroy_comp_channel")?,
            get_cq_event: lib.sym(c"ibv_get_cq_event")?,
            ack_cq_events: lib.sym(c"ibv_ack_cq_events")?,
            modify_qp: lib.sym(c"ibv_modify_qp")?,
            _lib: lib,
        })
    }
}

fn errno(op: &str) -> Error {
    Error::Os { op: op.to_string().into(), errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) }
}

/// The device list, or why there is none: ENOSYS means a kernel without
/// verbs for user space (no ib_uverbs, or no RDMA at all).
fn device_list(v: &Verbs, n: &mut c_int) -> Result<*mut *mut c_void> {
    // SAFETY: `n` receives the count; the caller frees the list.
    let list = unsafe { (v.get_device_list)(n) };
    if list.is_null() {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            return Err(Error::Unsupported(
                "RDMA: the kernel offers no verbs to user space (ib_uverbs not loaded, or no RDMA support)".into(),
            ));
        }
        return Err(errno("ibv_get_device_list"));
    }
    Ok(list)
}

/// A port of a device, as `ibv_query_port` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    /// `IBV_PORT_*`: 4 is ACTIVE.
    pub state: u32,
    /// Active MTU in bytes.
    pub active_mtu: u32,
}

/// An RDMA device, as `ibv_query_device` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its name (`rxe0`, `mlx5_0`).
    pub name: String,
    /// Firmware version.
    pub fw_ver: String,
    /// Vendor ID.
    pub vendor_id: u32,
    /// Ports.
    pub ports: Vec<PortInfo>,
}

/// An opened device with a protection domain: where memory regions are
/// registered. Closed on drop.
pub struct Device {
    ctx: *mut c_void,
    pd: *mut c_void,
    info: DeviceInfo,
    /// Whether the context is this device's to close (else the connection
    /// manager's).
    owns_context: bool,
}

// SAFETY: verbs objects may be used from any thread (libibverbs is
// thread-safe); this one is used through &self/&mut self only.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", &self.info).finish_non_exhaustive()
    }
}

/// The names of the RDMA devices here (empty when there are none, an error
/// when libibverbs cannot be loaded).
pub fn device_names() -> Result<Vec<String>> {
    let v = verbs()?;
    let mut n: c_int = 0;
    let list = device_list(v, &mut n)?;
    let names = (0..n.max(0) as usize)
        .map(|i| {
            // SAFETY: `i` < n entries of a live list; names are C strings.
            unsafe { CStr::from_ptr((v.get_device_name)(*list.add(i))) }.to_string_lossy().into_owned()
        })
        .collect();
    // SAFETY: the list from ibv_get_device_list, freed once.
    unsafe { (v.free_device_list)(list) };
    Ok(names)
}

impl Device {
    /// Opens the device named `name` and allocates a protection domain.
    pub fn open(name: &str) -> Result<Arc<Device>> {
        let v = verbs()?;
        let mut n: c_int = 0;
        let list = device_list(v, &mut n)?;
        let mut ctx = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: as in `device_names`.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a live device's name.
            if unsafe { CStr::from_ptr((v.get_device_name)(dev)) }.to_bytes() == name.as_bytes() {
                // SAFETY: a device of the live list (the context outlives
                // the list, as verbs.h allows).
                ctx = unsafe { (v.open_device)(dev) };
                if ctx.is_null() {
                    let e = errno(&format!("ibv_open_device {name}"));
                    // SAFETY: freed once.
                    unsafe { (v.free_device_list)(list) };
                    return Err(e);
                }
                break;
            }
        }
        // SAFETY: freed once.
        unsafe { (v.free_device_list)(list) };
        if ctx.is_null() {
            return Err(Error::InvalidArgument(format!("no RDMA device {name}")));
        }
        let info = match query(v, ctx, name) {
            Ok(i) => i,
            Err(e) => {
                // SAFETY: opened above, closed once.
                unsafe { (v.close_device)(ctx) };
                return Err(e);
            }
        };
        // SAFETY: a live context.
        let pd = unsafe { (v.alloc_pd)(ctx) };
        if pd.is_null() {
            let e = errno("ibv_alloc_pd");
            // SAFETY: opened above, closed once.
            unsafe { (v.close_device)(ctx) };
            return Err(e);
        }
        Ok(Arc::new(Device { ctx, pd, info, owns_context: true }))
    }

    /// A protection domain on a context the connection manager opened (a
    /// connection's, after its route is resolved); the context stays the
    /// connection manager's.
    ///
    /// # Safety
    /// `ctx` is a live `struct ibv_context` that outlives the device.
    pub unsafe fn on_context(ctx: *mut c_void) -> Result<Arc<Device>> {
        let v = verbs()?;
        // SAFETY: the caller's; `device` is the context's first field.
        let name = unsafe { CStr::from_ptr((v.get_device_name)(*ctx.cast::<*mut c_void>())) };
        let info = query(v, ctx, &name.to_string_lossy())?;
        // SAFETY: a live context.
        let pd = unsafe { (v.alloc_pd)(ctx) };
        if pd.is_null() {
            return Err(errno("ibv_alloc_pd"));
        }
        Ok(Arc::new(Device { ctx, pd, info, owns_context: false }))
    }

    /// The protection domain (for a queue pair on it).
    pub fn pd(&self) -> *mut c_void {
        self.pd
    }

    /// The device context the protection domain is on (`struct
    /// ibv_context`), to tell whether a queue pair may use it.
    pub fn context(&self) -> *mut c_void {
        self.ctx
    }

    /// What the device reports.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Registers `len` bytes of host memory at `addr` for local and remote
    /// access.
    ///
    /// # Safety
    /// The memory must stay mapped until the region is dropped.
    pub unsafe fn register_host(self: &Arc<Self>, addr: *mut u8, len: usize) -> Result<MemoryRegion> {
        let v = verbs()?;
        // SAFETY: a live PD; the caller keeps the memory mapped.
        let mr = unsafe { (v.reg_mr)(self.pd, addr.cast(), len, ACCESS_NVME) };
        MemoryRegion::new(self, mr, "ibv_reg_mr")
    }

    /// Registers `len` bytes at `offset` of the dma-buf `fd` (GPU memory
    /// exported as a dma-buf), addressed from `iova`.
    pub fn register_dmabuf(self: &Arc<Self>, fd: c_int, offset: u64, len: usize, iova: u64) -> Result<MemoryRegion> {
        let v = verbs()?;
        let Some(reg) = v.reg_dmabuf_mr else {
            return Err(Error::Unsupported("RDMA: this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34+)".into()));
        };
        // SAFETY: a live PD; the kernel takes its own reference on the
        // dma-buf for the region's life.
        let mr = unsafe { reg(self.pd, offset, len, iova, fd, ACCESS_NVME) };
        MemoryRegion::new(self, mr, "ibv_reg_dmabuf_mr")
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Ok(v) = verbs() {
            // SAFETY: allocated and opened by `open`, released once; every
            // region borrowed the device and is gone.
            unsafe {
                (v.dealloc_pd)(self.pd);
                if self.owns_context {
                    (v.close_device)(self.ctx);
                }
            }
        }
    }
}

/// The device's attributes and ports.
fn query(v: &Verbs, ctx: *mut c_void, name: &str) -> Result<DeviceInfo> {
    // Larger than any version's ibv_device_attr (232 bytes in rdma-core 44).
    let mut attr = [0u8; 1024];
    // SAFETY: a live context and a buffer larger than the structure.
    if unsafe { (v.query_device)(ctx, attr.as_mut_ptr()) } != 0 {
        return Err(errno("ibv_query_device"));
    }
    let fw_ver = CStr::from_bytes_until_nul(&attr[..64]).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    // fw_ver[64], node_guid, sys_image_guid, max_mr_size, page_size_cap
    // (8 bytes each), then vendor_id.
    let vendor_id = u32::from_ne_bytes(attr[96..100].try_into().expect("four bytes"));
    // phys_port_cnt: a u8 after 30 more 4-byte fields and atomic_cap (an
    // enum) and 8 more; read through the port queries instead (1.. until
    // one fails, at most 8).
    let mut ports = Vec::new();
    for port in 1..=8u8 {
        let mut p = [0u8; 256];
        // SAFETY: a live context and a buffer larger than ibv_port_attr.
        if unsafe { (v.query_port)(ctx, port, p.as_mut_ptr()) } != 0 {
            break;
        }
        let word = |i: usize| u32::from_ne_bytes(p[i * 4..i * 4 + 4].try_into().expect("four bytes"));
        // state, max_mtu, active_mtu (IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5).
        let mtu = match word(2) {
            m @ 1..=5 => 128u32 << m,
            _ => 0,
        };
        ports.push(PortInfo { port, state: word(0), active_mtu: mtu });
    }
    Ok(DeviceInfo { name: name.to_string(), fw_ver, vendor_id, ports })
}

/// A registered memory region: its keys, for a target to read and write it
/// with RDMA. Deregistered on drop.
pub struct MemoryRegion {
    mr: *mut RawMr,
    _device: Arc<Device>,
}

// SAFETY: a region's keys are plain values; deregistration is thread-safe.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion").field("len", &self.len()).field("rkey", &self.rkey()).finish()
    }
}

impl MemoryRegion {
    fn new(device: &Arc<Device>, mr: *mut RawMr, op: &str) -> Result<MemoryRegion> {
        if mr.is_null() {
            return Err(errno(op));
        }
        Ok(MemoryRegion { mr, _device: device.clone() })
    }

    /// The address the region starts at.
    pub fn addr(&self) -> u64 {
        // SAFETY: a live region from libibverbs.
        unsafe { (*self.mr).addr as u64 }
    }

    /// The key the target uses to reach it (in an NVMe keyed SGL).
    pub fn rkey(&self) -> u32 {
        // SAFETY: a live region from libibverbs.
        unsafe { (*self.mr).rkey }
    }

    /// The key local work requests use.
    pub fn lkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).lkey }
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        // SAFETY: as above.
        unsafe { (*self.mr).length }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if let Ok(v) = verbs() {
            // SAFETY: registered by this device, deregistered once.
            unsafe { (v.dereg_mr)(self.mr) };
        }
    }
}

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

/// Posting on a queue pair (`struct ibv_qp`) that its connection owns.
#[derive(Clone, Copy)]
pub struct Poster {
    qp: *mut c_void,
    send: PostSend,
    recv: PostRecv,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What the fake provider below was posted (wr_id, address), after how
    /// many requests it refuses the rest, and how many calls it took.
    #[derive(Default)]
    struct Fake(Vec<(u64, u64)>, usize, usize);

    thread_local! {
        static POSTED: std::cell::RefCell<Fake> = Default::default();
    }

    /// A provider's post_send that walks the chain as a provider does,
    /// records each request, and refuses the one past its limit (`bad`
    /// pointing at it, as libibverbs says).
    unsafe extern "C" fn fake_send(_qp: *mut c_void, mut wr: *mut SendWr, bad: *mut *mut SendWr) -> c_int {
        POSTED.with(|p| {
            let mut p = p.borrow_mut();
            p.2 += 1;
            while !wr.is_null() {
                if p.0.len() == p.1 {
                    // SAFETY: `bad` is the caller's out pointer.
                    unsafe { *bad = wr };
                    return libc::ENOMEM;
                }
                // SAFETY: the chain send_all built, alive across the call.
                let (id, addr, next) = unsafe { ((*wr).wr_id, (*(*wr).sg_list).addr, (*wr).next) };
                p.0.push((id, addr));
                wr = next;
            }
            0
        })
    }

    unsafe extern "C" fn fake_recv(_qp: *mut c_void, _wr: *mut RecvWr, _bad: *mut *mut RecvWr) -> c_int {
        0
    }

    /// `send_all` chains every request in order, 16 to a call, and says
    /// how many were posted when the provider refuses one.
    #[test]
    fn send_all_chains_the_sends_and_counts_a_refusal() {
        let p = Poster { qp: std::ptr::null_mut(), send: fake_send, recv: fake_recv };
        let sends: Vec<(u64, Sge)> =
            (0..40u64).map(|i| (i | 1 << 63, Sge { addr: 0x1000 + i * 64, length: 64, lkey: 7 })).collect();
        POSTED.with(|x| *x.borrow_mut() = Fake(Vec::new(), usize::MAX, 0));
        let (n, r) = p.send_all(&sends);
        assert!(r.is_ok());
        assert_eq!(n, 40);
        POSTED.with(|x| {
            let x = x.borrow();
            assert_eq!(x.0, sends.iter().map(|(id, s)| (*id, s.addr)).collect::<Vec<_>>(), "each once, in order");
            assert_eq!(x.2, 3, "16, 16 and 8 to a call");
        });
        // Refused at the 21st: the first 20 were posted.
        POSTED.with(|x| *x.borrow_mut() = Fake(Vec::new(), 20, 0));
        let (n, r) = p.send_all(&sends);
        assert_eq!(n, 20);
        assert!(r.is_err());
        assert_eq!(p.send_all(&[]).0, 0);
    }

    /// Without libibverbs or an RDMA device (this machine and CI's), every
    /// call is a clear error or an empty list, never a crash.
    /// The structures the provider reads and writes have the C sizes (and
    /// the completion channel's descriptor its place).
    #[test]
    fn work_requests_and_completions_have_the_c_layout() {
        assert_eq!(std::mem::size_of::<SendWr>(), 128);
        assert_eq!(std::mem::size_of::<RecvWr>(), 32);
        assert_eq!(std::mem::size_of::<Sge>(), 16);
        assert_eq!(std::mem::size_of::<WorkCompletion>(), 48);
        assert_eq!(std::mem::offset_of!(WorkCompletion, byte_len), 20);
        assert_eq!(std::mem::size_of::<RawChannel>(), 16);
        assert!(std::mem::size_of::<QpAttr>() >= 144, "room for ibv_qp_attr");
        assert_eq!(std::mem::offset_of!(RawChannel, fd), 8);
        assert_eq!(wc_status_str(10), "remote access error");
        assert_eq!(wc_status_str(99), "unknown");
    }

    #[test]
    fn no_rdma_here_is_a_clear_answer() {
        match device_names() {
            Ok(names) => {
                for n in &names {
                    let d = Device::open(n).expect("a listed device opens");
                    assert_eq!(&d.info().name, n);
                }
                let e = Device::open("ugds-no-such-device").unwrap_err();
                assert!(e.to_string().contains("no RDMA device ugds-no-such-device"), "{e}");
            }
            Err(e) => assert!(
                matches!(e, Error::Unsupported(ref m) if m.contains("libibverbs") || m.contains("no verbs")),
                "{e}"
            ),
        }
    }
}
