//! Devices and their ports, the protection domain, memory regions.

use super::*;

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
    pub(super) ctx: *mut c_void,
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
