//! GPU memory as the platforms see it: which runtime owns it and what that
//! runtime can do for a controller that reaches it (dma-buf export, or
//! copies for the emulated controller). The runtimes themselves (CUDA,
//! HIP) are the library's.

pub mod dmabuf;

use crate::Result;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// What the library needs from a GPU runtime, for memory of one context.
///
/// The copies write or read device addresses they are given, so they are
/// `unsafe`: safe code cannot aim one anywhere.
///
/// ```compile_fail
/// fn poke(rt: &dyn ugds_platform::device::DeviceRuntime) {
///     // error[E0133]: call to unsafe function
///     let _ = rt.copy_to_device(0xdead_0000, &[1, 2, 3]);
/// }
/// ```
pub trait DeviceRuntime: Send + Sync {
    /// "CUDA" or "HIP", for messages.
    fn name(&self) -> &'static str;

    /// The runtime context the memory belongs to (0: none or unknown), to
    /// match it with a stream's.
    fn context(&self) -> usize {
        0
    }

    /// Copies `src` to device memory at `dst` with the copy engine, and
    /// waits for it. The emulated controller's stand-in for a P2P write.
    ///
    /// # Safety
    /// `dst..dst + src.len()` must lie in device memory of this runtime (and
    /// context) that stays allocated for the call: the runtime writes there.
    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()>;

    /// Copies device memory at `src` into `dst` and waits for it.
    ///
    /// # Safety
    /// `src..src + dst.len()` must lie in device memory of this runtime (and
    /// context) that stays allocated for the call.
    unsafe fn copy_from_device(&self, dst: &mut [u8], src: u64) -> Result<()>;

    /// Starts copying `len` bytes at host `src` to device memory at `dst`
    /// and returns without waiting; [`copy_finished`](Self::copy_finished)
    /// says when it is done. The default copies and waits.
    ///
    /// # Safety
    /// As for [`copy_to_device`](Self::copy_to_device), and `src..src+len`
    /// must stay readable and unchanged until `copy_finished` has said
    /// `Ok(true)` or `Err` for the returned ticket.
    unsafe fn copy_to_device_start(&self, dst: u64, src: *const u8, len: usize) -> Result<CopyTicket> {
        // SAFETY: the caller's contract covers this call's.
        unsafe { self.copy_to_device(dst, std::slice::from_raw_parts(src, len)) }.map(|()| CopyTicket::DONE)
    }

    /// Starts copying `len` bytes of device memory at `src` into host
    /// memory at `dst`; as [`copy_to_device_start`](Self::copy_to_device_start).
    ///
    /// # Safety
    /// As for [`copy_from_device`](Self::copy_from_device), and nothing may
    /// touch `dst..dst+len` until `copy_finished` has answered for the ticket.
    unsafe fn copy_from_device_start(&self, dst: *mut u8, src: u64, len: usize) -> Result<CopyTicket> {
        // SAFETY: the caller's contract covers this call's.
        unsafe { self.copy_from_device(std::slice::from_raw_parts_mut(dst, len), src) }.map(|()| CopyTicket::DONE)
    }

    /// Whether a started copy is done: `Ok(true)` (the ticket is spent),
    /// `Ok(false)` (still running: ask again), or the error that ended it
    /// (the ticket is spent).
    fn copy_finished(&self, ticket: CopyTicket) -> Result<bool> {
        debug_assert_eq!(ticket, CopyTicket::DONE, "a runtime that starts copies answers for them");
        Ok(true)
    }

    /// Does now what the runtime would otherwise do at its first copies
    /// (CUDA: each of the copy engine's streams' first copy, each way, and
    /// the events copies in flight take), copying through `staging`; once
    /// per runtime object, later calls return at once. The default has
    /// nothing to prepare.
    ///
    /// # Safety
    /// `staging..staging + len` must be mapped host memory (pinned, for
    /// the copies to be the ones later transfers make) that nothing else
    /// reads or writes during the call. On `Err` a copy may still be
    /// running into it: the caller must not use or free it again.
    unsafe fn prepare_copies(&self, staging: *mut u8, len: usize) -> Result<()> {
        let _ = (staging, len);
        Ok(())
    }

    /// Page-locks host memory for faster copies; false if the runtime
    /// refused (copies from it then still work, staged by the runtime).
    fn host_register(&self, ptr: *mut u8, len: usize) -> bool;

    /// Undoes [`host_register`](Self::host_register). (The emulator keeps
    /// what it pinned instead: in CUDA this waits for the device.)
    fn host_unregister(&self, ptr: *mut u8);

    /// Exports the pages spanning `ptr..ptr+len` as a dma-buf.
    fn export_dmabuf(&self, ptr: u64, len: usize) -> Result<DmabufExport>;

    /// Names the allocation holding `ptr..ptr+len` for another process of
    /// the same runtime (CUDA's IPC handle): how an owner whose controller
    /// is emulated reaches an attached process's GPU memory. The default
    /// refuses.
    fn export_ipc(&self, ptr: u64, len: usize) -> Result<IpcExport> {
        let _ = (ptr, len);
        Err(crate::Error::Unsupported(format!("{} memory cannot be named for another process", self.name())))
    }
}

/// Device memory named for another process: the runtime's handle of the
/// whole allocation, the device it lives on, and where the range lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcExport {
    /// The runtime's opaque handle (`CUipcMemHandle`: 64 bytes).
    pub handle: [u8; 64],
    /// The device's UUID, so that the other process opens it on the same one.
    pub device: [u8; 16],
    /// The range's offset from the allocation's start.
    pub offset: u64,
    /// Bytes of the range.
    pub len: usize,
    /// The range's address in the exporting process (an owner in that same
    /// process uses it as it is: a runtime does not open its own handles).
    pub ptr: u64,
}

/// A copy a runtime started and has not yet answered for (see
/// [`DeviceRuntime::copy_finished`]). What the number means is the
/// runtime's (CUDA: an event recorded after the copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a started copy must be asked about until it is done"]
pub struct CopyTicket(usize);

impl CopyTicket {
    /// A copy that was done before its start returned.
    pub const DONE: CopyTicket = CopyTicket(0);

    /// A runtime's own ticket (not 0).
    pub fn new(raw: usize) -> CopyTicket {
        debug_assert_ne!(raw, 0, "0 is DONE");
        CopyTicket(raw)
    }

    /// The runtime's number.
    pub fn raw(self) -> usize {
        self.0
    }
}

/// Registered device memory: where it is and which runtime owns it.
#[derive(Clone)]
pub struct DeviceMemory {
    /// Device address of the first byte.
    pub ptr: u64,
    /// Length in bytes.
    pub len: usize,
    /// The runtime (and context) that owns it.
    pub runtime: Arc<dyn DeviceRuntime>,
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} memory {:#x}+{:#x}", self.runtime.name(), self.ptr, self.len)
    }
}

/// A dma-buf holding registered memory: the memory starts `offset` bytes
/// into the dma-buf and runs `len` bytes. Closing `fd` is the owner's job.
#[derive(Debug)]
pub struct DmabufExport {
    /// The dma-buf file descriptor.
    pub fd: OwnedFd,
    /// Offset of the registered memory's first byte in the dma-buf.
    pub offset: u64,
    /// Bytes of registered memory.
    pub len: usize,
}

/// The page-aligned span runtimes export: `(start, len)` covering `ptr..ptr+len`.
pub fn page_span(ptr: u64, len: usize) -> (u64, usize) {
    let page = crate::sys::PAGE_SIZE as u64;
    let start = ptr & !(page - 1);
    let end = (ptr + len as u64).next_multiple_of(page);
    (start, (end - start) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_span_covers_the_range() {
        assert_eq!(page_span(0x10000, 4096), (0x10000, 4096));
        assert_eq!(page_span(0x10010, 4096), (0x10000, 8192));
        assert_eq!(page_span(0x10fff, 1), (0x10000, 4096));
        assert_eq!(page_span(0x10fff, 2), (0x10000, 8192));
    }
}
