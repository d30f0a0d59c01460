//! GPU memory seen through host copies: platforms whose "controller" moves
//! data with the CPU (the kernel path, NVMe over TCP) cannot reach GPU
//! memory, so they give each registration a window of addresses above
//! [`DEVICE_IOVA_BASE`] and their queues copy through pinned host bounce
//! buffers with the GPU's runtime. This is that table of windows.

use crate::device::{DeviceMemory, DeviceRuntime};
use crate::sys::PAGE_SIZE;
use crate::{HostMapping, Recover};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Where registered GPU memory appears to such queues (above the 57-bit
/// user address space of any x86-64 or arm64 kernel, so that a host
/// address never falls in a window).
pub const DEVICE_IOVA_BASE: u64 = 1 << 62;

/// A window: its first page's device address and the runtime that copies
/// to and from it.
struct Window {
    len: usize,
    device: u64,
    runtime: Arc<dyn DeviceRuntime>,
}

/// The windows of one platform.
pub struct DeviceWindows {
    windows: RwLock<BTreeMap<u64, Window>>,
    next: AtomicU64,
}

impl Default for DeviceWindows {
    fn default() -> DeviceWindows {
        DeviceWindows { windows: RwLock::default(), next: AtomicU64::new(DEVICE_IOVA_BASE) }
    }
}

impl std::fmt::Debug for DeviceWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWindows").field("windows", &self.windows.read().recover().len()).finish()
    }
}

impl DeviceWindows {
    /// A window on `mem` (its whole pages), with a guard page to the next:
    /// no command spans two windows.
    pub fn map(&self, mem: &DeviceMemory) -> HostMapping {
        let (start, len) = crate::device::page_span(mem.ptr, mem.len);
        let iova = self.next.fetch_add(len as u64 + PAGE_SIZE as u64, Ordering::Relaxed);
        let w = Window { len, device: start, runtime: mem.runtime.clone() };
        self.windows.write().recover().insert(iova, w);
        // SAFETY: the window table translates `iova` to this memory until
        // `unmap` removes the window.
        unsafe { HostMapping::contiguous(mem.ptr as *const u8, (start as usize, len), iova) }
    }

    /// Ends the window of a mapping `map` made; false for any other.
    pub fn unmap(&self, mapping: &HostMapping) -> bool {
        mapping.cookie >= DEVICE_IOVA_BASE && self.windows.write().recover().remove(&mapping.cookie).is_some()
    }

    /// The GPU memory at window address `addr` for `len` bytes: its device
    /// address and runtime. `None` when `addr` is no window's, or the range
    /// runs past it.
    pub fn at(&self, addr: u64, len: usize) -> Option<(u64, Arc<dyn DeviceRuntime>)> {
        if addr < DEVICE_IOVA_BASE {
            return None;
        }
        let windows = self.windows.read().recover();
        let (&start, w) = windows.range(..=addr).next_back()?;
        let off = addr - start;
        (off.checked_add(len as u64)? <= w.len as u64).then(|| (w.device + off, w.runtime.clone()))
    }
}
