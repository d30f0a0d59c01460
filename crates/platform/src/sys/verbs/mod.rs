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

mod completion;
mod device;
mod post;
#[cfg(test)]
mod tests;

pub use completion::{CompletionChannel, CompletionQueue};
pub use device::{device_names, Device, DeviceInfo, MemoryRegion, PortInfo};
pub use post::Poster;

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
