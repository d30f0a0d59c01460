//! Files and buffers: registration, and the synchronous calls.

use crate::abi::{op, CUfileDescr_t, CUfileError_t, CUfileIOVec_t, HANDLE_TYPE_OPAQUE_FD};
use crate::errors::{fail, from_error, guard, internal, io_error, ok, posix};
use crate::stats::{self, Io};
use crate::{config, driver, state, state_mut, Snapshot};
use libc::{off_t, size_t, ssize_t};
use std::ffi::{c_int, c_void};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;
use ugds::{BufferToken, Completion, Drain, Error, Handle, HandleOptions};
use ugds_emu::descriptor::{Refused, Served};

/// What a `CUfileHandle_t` points to: the registered fd first, as in
/// libugds. Never freed, so a deregistered handle's address never names
/// another file (its later use is `CU_FILE_HANDLE_NOT_REGISTERED`).
#[repr(C)]
struct HandleObj {
    fd: c_int,
}

/// A registered file.
pub(crate) struct File {
    pub handle: Arc<Handle>,
    /// The driver it was registered with (its registrations).
    pub driver: ugds::Driver,
    fd: c_int,
    /// The kernel path: the same file through the page cache, for the
    /// partial blocks at the ends of unaligned requests.
    buffered: Option<std::fs::File>,
}

impl File {
    pub(crate) fn close(&self) -> ugds::Result<()> {
        self.handle.close(Drain::Forever)
    }
}

/// The file registered as `fh` in the snapshot `s`, borrowed from it (the
/// I/O calls: the file's count is not touched).
pub(crate) fn file_in(s: &Snapshot, fh: *mut c_void) -> Result<&Arc<File>, c_int> {
    if fh.is_null() {
        return Err(op::INVALID_VALUE);
    }
    let s = s.as_ref().ok_or(op::HANDLE_NOT_REGISTERED)?;
    s.files.get(&(fh as usize)).ok_or(op::HANDLE_NOT_REGISTERED)
}

fn why(c: c_int) -> &'static str {
    match c {
        op::INVALID_VALUE => "null file handle",
        _ => "no such file handle (never registered, or deregistered)",
    }
}

/// Registers the file behind `descr`'s fd (`CU_FILE_HANDLE_TYPE_OPAQUE_FD`
/// only). Opens the driver if it is not open.
///
/// # Safety
/// Both pointers are null (refused) or valid: `fh` for one write, `descr`
/// for reading a `CUfileDescr_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileHandleRegister(fh: *mut *mut c_void, descr: *mut CUfileDescr_t) -> CUfileError_t {
    guard(internal(), || {
        if fh.is_null() || descr.is_null() {
            return fail(op::INVALID_VALUE, "null argument");
        }
        // SAFETY: non-null; the caller's descriptor.
        let d = unsafe { &*descr };
        if d.type_ != HANDLE_TYPE_OPAQUE_FD {
            // What NVIDIA's library answers (seen: 1.15.1).
            return fail(op::IO_NOT_SUPPORTED, format!("handle type {} (only CU_FILE_HANDLE_TYPE_OPAQUE_FD)", d.type_));
        }
        // SAFETY: OPAQUE_FD: the union holds an fd.
        let fd = unsafe { d.handle.fd };
        let driver = match driver() {
            Ok(d) => d,
            Err(e) => return e,
        };
        if state().as_ref().is_some_and(|s| s.files.values().any(|f| f.fd == fd)) {
            return fail(op::HANDLE_ALREADY_REGISTERED, format!("fd {fd} is registered already"));
        }
        if fd < 0 {
            return fail(op::INVALID_VALUE, format!("fd {fd}"));
        }
        // SAFETY: borrowed for the call; an fd that is not open is refused.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let served = match ugds_emu::descriptor::serve(borrowed) {
            Ok(s) => s,
            Err(Refused::NotOpen) => return fail(op::INVALID_VALUE, format!("fd {fd} is not open")),
            Err(Refused::FileType(why)) => return fail(op::INVALID_FILE_TYPE, why),
            Err(Refused::Dup(e)) => return fail(op::GETNEWFD_FAILED, format!("dup of fd {fd}: {e}")),
            Err(Refused::Platform(e)) => return from_error(e),
            Err(Refused::TooSmall) => return fail(op::INVALID_VALUE, "the file is smaller than one block"),
            Err(Refused::Setting(why)) => return fail(op::INVALID_VALUE, why),
        };
        let cfg = config::get();
        let mut opts = HandleOptions::from_env();
        if !cfg.bools[config::USE_POLL_MODE] {
            opts = opts.completion(Completion::Interrupt);
        }
        let (opened, buffered) = match served {
            Served::Controller(p) => (driver.open_handle(p, opts), None),
            Served::Kernel if !cfg.bools[config::ALLOW_COMPAT_MODE] => {
                return fail(
                    op::IO_NOT_SUPPORTED,
                    format!("fd {fd} is a file the kernel keeps, and compatibility mode is off (allow_compat_mode)"),
                )
            }
            Served::Kernel => (driver.open_fd(borrowed, opts), reopen_buffered(fd)),
        };
        let handle = match opened {
            Ok(h) => Arc::new(h),
            Err(e) => return from_error(e),
        };
        let f = Arc::new(File { handle, driver: driver.clone(), fd, buffered });
        let mut g = state_mut();
        let Some(s) = g.as_mut() else {
            drop(g);
            let _ = f.close();
            return fail(op::DRIVER_NOT_INITIALIZED, "the driver was closed meanwhile");
        };
        if s.files.values().any(|x| x.fd == fd) {
            drop(g);
            let _ = f.close();
            return fail(op::HANDLE_ALREADY_REGISTERED, format!("fd {fd} is registered already"));
        }
        let obj = Box::into_raw(Box::new(HandleObj { fd }));
        s.files.insert(obj as usize, f);
        // SAFETY: non-null, checked above.
        unsafe { *fh = obj.cast() };
        stats::count("hdl_register_ops", true);
        ok()
    })
}

/// The file open again through the page cache (a new open file
/// description: the caller's may be O_DIRECT), read-write or read-only as
/// the caller's was.
fn reopen_buffered(fd: c_int) -> Option<std::fs::File> {
    // SAFETY: F_GETFL on the caller's open fd.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    let path = format!("/proc/self/fd/{fd}");
    let mut o = std::fs::OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => o.read(true),
        libc::O_WRONLY => o.write(true),
        _ => o.read(true).write(true),
    };
    o.open(path).map_err(|e| tracing::warn!("fd {fd}: no page-cache descriptor for unaligned I/O: {e}")).ok()
}

/// Deregisters a file: waits for its I/O, then closes its handle. A null
/// or unknown handle is ignored.
///
/// # Safety
/// `fh` is a handle from `cuFileHandleRegister`, or null.
#[no_mangle]
pub unsafe extern "C" fn cuFileHandleDeregister(fh: *mut c_void) {
    guard((), || {
        let f = state_mut().as_mut().and_then(|s| s.files.remove(&(fh as usize)));
        if let Some(f) = f {
            let r = f.close();
            if let Err(e) = &r {
                tracing::warn!("cuFileHandleDeregister: fd {}: {e}", f.fd);
            }
            stats::count("hdl_deregister_ops", r.is_ok());
        }
    })
}

/// Registers host or device memory for I/O (`flags` is cuFile's, and
/// unused).
///
/// # Safety
/// `base..base + length` is memory of the caller's that stays allocated
/// until it is deregistered.
#[no_mangle]
pub unsafe extern "C" fn cuFileBufRegister(base: *const c_void, length: size_t, _flags: c_int) -> CUfileError_t {
    guard(internal(), || {
        if base.is_null() || length == 0 {
            return fail(op::INVALID_VALUE, "null buffer or length 0");
        }
        let driver = match driver() {
            Ok(d) => d,
            Err(e) => return e,
        };
        if driver.token_at(base.cast()).is_some() {
            return fail(op::MEMORY_ALREADY_REGISTERED, format!("{base:p} is registered already"));
        }
        // SAFETY: the caller's contract above.
        let r = unsafe {
            match device(base as u64, length) {
                Ok(true) => driver.register_cuda(base as u64, length),
                Ok(false) => driver.register(base as *mut u8, length),
                Err(e) => Err(e),
            }
        };
        stats::count("buf_register_ops", r.is_ok());
        match r {
            Ok(_) => ok(),
            Err(e) => from_error(e),
        }
    })
}

/// Deregisters memory registered at `base`.
///
/// # Safety
/// `base` is any pointer (an unknown one is refused).
#[no_mangle]
pub unsafe extern "C" fn cuFileBufDeregister(base: *const c_void) -> CUfileError_t {
    guard(internal(), || {
        let Some(driver) = state().as_ref().map(|s| s.driver.clone()) else {
            return fail(op::MEMORY_NOT_REGISTERED, "nothing is registered: the driver is not open");
        };
        let Some(t) = driver.token_at(base.cast()) else {
            return fail(op::MEMORY_NOT_REGISTERED, format!("{base:p} is not the base of a registration"));
        };
        let r = driver.deregister(&t);
        if r.is_ok() {
            crate::implicit::forget(t.base());
        }
        stats::count("buf_deregister_ops", r.is_ok());
        match r {
            Ok(()) => ok(),
            Err(e) => from_error(e),
        }
    })
}

/// Whether `ptr..+len` is CUDA device memory (false: host memory, or no
/// CUDA here).
fn device(ptr: u64, len: usize) -> ugds::Result<bool> {
    match ugds::gpu::cuda::Cuda::get() {
        Ok(c) => c.classify(ptr, len).map(|m| matches!(m, ugds::gpu::cuda::Memory::Device(_))),
        Err(_) => Ok(false),
    }
}

/// The registration to move `start..start + size` through, and where in
/// it; `jit` when it was made for this call alone.
pub(crate) struct Memory {
    pub token: BufferToken,
    pub offset: usize,
    pub jit: bool,
}

impl Memory {
    pub(crate) fn find(driver: &ugds::Driver, start: usize, size: usize) -> ugds::Result<Memory> {
        if let Some(t) = driver.token_containing(start as *const u8) {
            // One made for a stream-ordered call is checked against the
            // allocation there now (see `implicit`).
            let t = match crate::implicit::made(t.base()) {
                true => crate::implicit::registration(driver, start as u64)
                    .map_err(|e| Error::Platform(format!("cuFile error {}: {}", e.err, crate::errors::last())))?,
                false => t,
            };
            if start >= t.base() && start + size <= t.base() + t.len() {
                return Ok(Memory { token: t, offset: start - t.base(), jit: false });
            }
        }
        // SAFETY: the C contract: the caller's buffer is valid for the
        // call; this registration is private to it and deregistered before
        // the call returns (or kept if the device may still reach it).
        let token = unsafe {
            if device(start as u64, size)? {
                driver.register_cuda_private(start as u64, size)?
            } else {
                driver.register_private(start as *mut u8, size)?
            }
        };
        Ok(Memory { token, offset: 0, jit: true })
    }

    pub(crate) fn release(self, driver: &ugds::Driver) {
        if self.jit {
            if let Err(e) = driver.deregister(&self.token) {
                tracing::warn!("a buffer registered for one call stays registered: the device may still reach it: {e}");
            }
        }
    }
}

/// One synchronous call: `size` bytes at `file_offset` to or from
/// `base + buf_offset`.
pub(crate) fn sync(
    fh: *mut c_void,
    base: *const c_void,
    size: size_t,
    file_offset: off_t,
    buf_offset: off_t,
    write: bool,
) -> ssize_t {
    // The clock is read only while statistics are kept.
    let started = stats::on().then(Instant::now);
    let r = sync_inner(fh, base, size, file_offset, buf_offset, write);
    stats::io(if write { Io::Write } else { Io::Read }, usize::try_from(r).ok(), started);
    r
}

fn sync_inner(
    fh: *mut c_void,
    base: *const c_void,
    size: size_t,
    file_offset: off_t,
    buf_offset: off_t,
    write: bool,
) -> ssize_t {
    if base.is_null() || file_offset < 0 || buf_offset < 0 || size > ssize_t::MAX as usize {
        return posix(libc::EINVAL, "null buffer, negative offset or a size over SSIZE_MAX");
    }
    let snap = state();
    let f = match file_in(&snap, fh) {
        // A null handle: -1 and EINVAL; a deregistered one: -1 with errno
        // CU_FILE_HANDLE_NOT_REGISTERED. NVIDIA's library answers so (seen:
        // 1.15.1, test_cufile's reference run and bench/cufile/probe_reference.c).
        Err(op::INVALID_VALUE) => return posix(libc::EINVAL, why(op::INVALID_VALUE)),
        Err(c) => return posix(c, why(c)),
        Ok(f) => f,
    };
    if size == 0 {
        return 0;
    }
    let Some(start) = (base as usize).checked_add(buf_offset as usize).filter(|s| s.checked_add(size).is_some()) else {
        return posix(libc::EINVAL, "buffer offset and size wrap the address space");
    };
    let driver = &f.driver;
    let mem = match Memory::find(driver, start, size) {
        Ok(m) => m,
        Err(e) => return io_error(e),
    };
    let piece = config::max_direct_io();
    let mut done = 0usize;
    let mut failed = None;
    while done < size {
        let len = piece.min(size - done);
        match f.move_range(&mem, start + done, mem.offset + done, len, file_offset as u64 + done as u64, write) {
            Ok(n) => {
                done += n;
                if n < len {
                    break;
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    mem.release(driver);
    match (failed, done) {
        (Some(e), 0) => io_error(e),
        _ => done as ssize_t,
    }
}

impl File {
    /// Moves `len` bytes at file position `pos` to or from the caller's
    /// memory at `addr` (`mem`'s registration at `off`): the aligned
    /// middle through ugds, the partial blocks at the ends through the
    /// page cache. Returns the bytes moved (fewer at the end of a file).
    fn move_range(
        &self,
        mem: &Memory,
        addr: usize,
        off: usize,
        len: usize,
        pos: u64,
        write: bool,
    ) -> ugds::Result<usize> {
        let h = &self.handle;
        let end = pos + len as u64;
        if write && end > h.capacity() {
            h.grow(end)?;
        }
        let mut len = len;
        if !write && end > h.capacity() {
            // The file may have grown since: its size now, then what is left.
            let cap = h.grow(0).unwrap_or(h.capacity());
            len = cap.saturating_sub(pos).min(len as u64) as usize;
            if len == 0 {
                return Ok(0);
            }
        }
        let bs = h.namespace().block_size as u64;
        let end = pos + len as u64;
        let head_end = pos.next_multiple_of(bs).min(end);
        let tail_start = (end / bs * bs).max(head_end);
        // Memory the controller cannot address for the middle (its PRPs
        // take dword-aligned addresses): all of it through the page cache,
        // where the file takes that.
        if (addr + (head_end - pos) as usize) % 4 != 0 && tail_start > head_end && self.buffered.is_some() {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(EDGE_CHUNK);
                let got = self.edge(addr + done, n, pos + done as u64, write)?;
                done += got;
                if got < n {
                    break;
                }
            }
            return Ok(done);
        }
        let mut done = 0usize;
        if pos % bs != 0 {
            let n = self.edge(addr, (head_end - pos) as usize, pos, write)?;
            done += n;
            if n < (head_end - pos) as usize {
                return Ok(done);
            }
        }
        if tail_start > head_end {
            let mid = (tail_start - head_end) as usize;
            let n = if write {
                h.write(&mem.token, mid, head_end, off + done)?
            } else {
                h.read(&mem.token, mid, head_end, off + done)?
            };
            done += n;
            if n < mid {
                return Ok(done);
            }
        }
        if end > tail_start {
            done += self.edge(addr + done, (end - tail_start) as usize, tail_start, write)?;
        }
        Ok(done)
    }

    /// Bytes at file position `pos` through the page cache (part of a
    /// block, or up to [`EDGE_CHUNK`] of memory the controller cannot
    /// address), to or from the caller's memory at `addr`.
    fn edge(&self, addr: usize, len: usize, pos: u64, write: bool) -> ugds::Result<usize> {
        let Some(file) = &self.buffered else {
            return Err(Error::InvalidArgument(format!(
                "offset {pos} or length {len} is not a multiple of the {}-byte block, which this device needs",
                self.handle.namespace().block_size
            )));
        };
        let mut tmp = vec![0u8; len];
        if write {
            copy_out(addr, &mut tmp)?;
            file.write_all_at(&tmp, pos).map_err(|e| Error::io("pwrite", e))?;
            Ok(len)
        } else {
            let mut got = 0;
            while got < len {
                match file.read_at(&mut tmp[got..], pos + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::io("pread", e)),
                }
            }
            copy_in(addr, &tmp[..got])?;
            Ok(got)
        }
    }
}

/// The most one page-cache transfer moves at once (through a buffer of
/// this size).
const EDGE_CHUNK: usize = 1 << 20;

/// Copies `src` to the caller's memory at `addr` (host or device).
fn copy_in(addr: usize, src: &[u8]) -> ugds::Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    match ugds::gpu::cuda::Cuda::get().and_then(|c| c.classify(addr as u64, src.len())) {
        // SAFETY: device memory of the caller's, valid for the call.
        Ok(ugds::gpu::cuda::Memory::Device(d)) => unsafe { d.runtime.copy_to_device(addr as u64, src) },
        Err(e @ (Error::GpuPointerRange { .. } | Error::GpuMemoryType { .. })) => Err(e),
        _ => {
            // SAFETY: host memory of the caller's, valid for writes of
            // `src.len()` bytes for the call.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
            Ok(())
        }
    }
}

/// Copies the caller's memory at `addr` (host or device) into `dst`.
fn copy_out(addr: usize, dst: &mut [u8]) -> ugds::Result<()> {
    match ugds::gpu::cuda::Cuda::get().and_then(|c| c.classify(addr as u64, dst.len())) {
        // SAFETY: device memory of the caller's, valid for the call.
        Ok(ugds::gpu::cuda::Memory::Device(d)) => unsafe { d.runtime.copy_from_device(dst, addr as u64) },
        Err(e @ (Error::GpuPointerRange { .. } | Error::GpuMemoryType { .. })) => Err(e),
        _ => {
            // SAFETY: host memory of the caller's, valid for reads of
            // `dst.len()` bytes for the call.
            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len()) };
            Ok(())
        }
    }
}

/// Reads `size` bytes at `file_offset` into `base + buf_offset` (host or
/// device memory, registered or not; any offsets and size): the bytes
/// read (fewer at the end of the file), or -1 with `errno` for an error of
/// the file or device, or a negated `CUfileOpError`.
///
/// # Safety
/// `base + buf_offset` is valid for writes of `size` bytes for the call.
#[no_mangle]
pub unsafe extern "C" fn cuFileRead(
    fh: *mut c_void,
    base: *mut c_void,
    size: size_t,
    file_offset: off_t,
    buf_offset: off_t,
) -> ssize_t {
    guard(-(op::INTERNAL_ERROR as ssize_t), || sync(fh, base, size, file_offset, buf_offset, false))
}

/// Writes `size` bytes from `base + buf_offset` at `file_offset` (a file
/// grows to take a write past its end); returns as `cuFileRead`.
///
/// # Safety
/// `base + buf_offset` is valid for reads of `size` bytes for the call.
#[no_mangle]
pub unsafe extern "C" fn cuFileWrite(
    fh: *mut c_void,
    base: *const c_void,
    size: size_t,
    file_offset: off_t,
    buf_offset: off_t,
) -> ssize_t {
    guard(-(op::INTERNAL_ERROR as ssize_t), || sync(fh, base, size, file_offset, buf_offset, true))
}

fn vectored(fh: *mut c_void, iov: *const CUfileIOVec_t, iovcnt: size_t, file_offset: off_t, write: bool) -> ssize_t {
    let started = stats::on().then(Instant::now);
    if iov.is_null() && iovcnt > 0 || file_offset < 0 {
        return posix(libc::EINVAL, "null vector or negative offset");
    }
    // SAFETY: the caller's `iovcnt` entries (checked non-null when any).
    let v = if iovcnt == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(iov, iovcnt) } };
    let mut done = 0usize;
    for s in v {
        let n = sync_inner(fh, s.base, s.len, file_offset + done as off_t, 0, write);
        if n < 0 {
            if done == 0 {
                return n;
            }
            break;
        }
        done += n as usize;
        if (n as usize) < s.len {
            break;
        }
    }
    stats::io(if write { Io::Writev } else { Io::Readv }, Some(done), started);
    done as ssize_t
}

/// Reads the range at `file_offset` into the `iovcnt` buffers of `iov` in
/// order: the bytes read (fewer at the end of the file). `flags` is
/// cuFile's, unused.
///
/// # Safety
/// `iov` is null (with `iovcnt` 0) or valid for reads of `iovcnt` entries,
/// each valid for writes of its length for the call.
#[no_mangle]
pub unsafe extern "C" fn cuFileReadv(
    fh: *mut c_void,
    iov: *const CUfileIOVec_t,
    iovcnt: size_t,
    file_offset: off_t,
    _flags: std::ffi::c_uint,
) -> ssize_t {
    guard(-(op::INTERNAL_ERROR as ssize_t), || vectored(fh, iov, iovcnt, file_offset, false))
}

/// Writes the `iovcnt` buffers of `iov` in order at `file_offset`.
///
/// # Safety
/// `iov` is null (with `iovcnt` 0) or valid for reads of `iovcnt` entries,
/// each valid for reads of its length for the call.
#[no_mangle]
pub unsafe extern "C" fn cuFileWritev(
    fh: *mut c_void,
    iov: *const CUfileIOVec_t,
    iovcnt: size_t,
    file_offset: off_t,
    _flags: std::ffi::c_uint,
) -> ssize_t {
    guard(-(op::INTERNAL_ERROR as ssize_t), || vectored(fh, iov, iovcnt, file_offset, true))
}

/// PCIe topology export: ugds finds paths from sysfs when it needs them
/// and writes no topology file; refused.
///
/// # Safety
/// `filename` is any pointer (unused).
#[no_mangle]
pub unsafe extern "C" fn cuFileExportPCIeTopology(_filename: *const std::ffi::c_char) -> CUfileError_t {
    fail(op::PLATFORM_NOT_SUPPORTED, "ugds writes no PCIe topology file")
}
