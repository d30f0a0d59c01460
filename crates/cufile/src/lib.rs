//! libcufile.so.0 served by ugds: NVIDIA cuFile's C API, as `cufile.h`
//! declares it, for programs written against cuFile (PyTorch's `GdsFile`,
//! KvikIO, NIXL, DALI, cuDF) to run unchanged on ugds.
//!
//! A file on any filesystem, or a block device the kernel keeps, goes
//! through ugds's kernel path (io_uring; O_DIRECT where aligned); a device
//! ugds owns (`/dev/ugds_drvN`, or a regular file with `UGDS_EMULATE=1`
//! behind an emulated controller) through the user-space engine. What
//! cuFile allows that ugds's own API does not is done here: unaligned
//! offsets and sizes (the aligned middle through ugds, the partial blocks
//! at the ends through the page cache), unregistered buffers (registered
//! for the call), writes past a file's end (the file grows), and batches
//! that name a handle per request.
//!
//! Thin by design, as libugds: each entry point checks its arguments,
//! finds its objects in one table and calls the Rust library; no lock is
//! held while a device works, and no panic crosses into C. The driver
//! opens at the first call that needs it (as cuFile's does);
//! `cuFileDriverOpen`/`Close` count its users.
//!
//! Entry points that take a caller's pointers are `unsafe extern "C"`.
//!
//! ```compile_fail
//! // error[E0133]: call to unsafe function
//! cufile::cuFileRead(std::ptr::null_mut(), std::ptr::null_mut(), 4096, 0, 0);
//! ```

#![allow(non_snake_case)]

pub mod abi;
mod batch;
mod config;
mod errors;
mod implicit;
mod io;
mod params;
mod probes;
mod stats;
mod stream;

pub use batch::*;
pub use io::*;
pub use params::*;
pub use probes::*;
pub use stream::*;

use abi::{op, CUfileError_t};
use errors::{fail, guard, internal, ok};
use std::ffi::{c_int, c_long};
use std::sync::Arc;
use ugds::shared_state::{AddrMap, Change, SharedState};

/// The library's objects while the driver is open.
#[derive(Clone)]
struct State {
    driver: ugds::Driver,
    /// `cuFileDriverOpen` calls not yet closed (the use count).
    opens: c_long,
    /// Registered files, by the address of their handle object.
    files: AddrMap<Arc<io::File>>,
    /// Batch contexts, by id.
    batches: AddrMap<Arc<batch::BatchObj>>,
    next_batch: usize,
    /// Streams, by their CUDA handle.
    streams: AddrMap<stream::StreamObj>,
}

/// Read by every call as a snapshot, with no lock and no shared count;
/// changed only to add or remove objects, by publishing a changed copy
/// (see `ugds::shared_state`).
static STATE: SharedState<State> = SharedState::new();

/// The state a call works on.
pub(crate) type Snapshot = ugds::shared_state::Snapshot<State>;

fn state() -> Snapshot {
    STATE.load()
}

fn state_mut() -> Change<'static, State> {
    STATE.change()
}

pub(crate) fn is_open() -> bool {
    state().is_some()
}

/// Opens the driver's state if it is not open (cuFile opens at the first
/// call that needs it); `counted` adds a user (`cuFileDriverOpen`).
fn open(counted: bool) -> CUfileError_t {
    let mut s = state_mut();
    if let Some(st) = s.as_mut() {
        st.opens += counted as c_long;
        return ok();
    }
    let loaded = config::load_json();
    if loaded.err != op::SUCCESS {
        return loaded;
    }
    let level = config::get().strings[config::LOGGING_LEVEL].clone();
    let level = ugds::log::parse_level(&level).ok().flatten().unwrap_or(ugds::log::Level::ERROR);
    ugds::log::install_from_env(level);
    *s = Some(State {
        driver: ugds::Driver::open(),
        opens: counted as c_long,
        files: AddrMap::default(),
        batches: AddrMap::default(),
        next_batch: 0x1000,
        streams: AddrMap::default(),
    });
    ok()
}

/// Opens the driver if it is not open, not counted as a user (what
/// NVIDIA's library does at cuFileDriverGetProperties: parameters are then
/// refused as set after the open; seen: 1.15.1).
pub(crate) fn open_implicitly() -> CUfileError_t {
    if is_open() {
        return ok();
    }
    open(false)
}

/// The driver, opening it if needed.
fn driver() -> Result<ugds::Driver, CUfileError_t> {
    if let Some(s) = state().as_ref() {
        return Ok(s.driver.clone());
    }
    let e = open(false);
    if e.err != op::SUCCESS {
        return Err(e);
    }
    state().as_ref().map(|s| s.driver.clone()).ok_or_else(|| fail(op::DRIVER_NOT_INITIALIZED, "closed meanwhile"))
}

/// Opens the driver (or counts one more user of it).
#[no_mangle]
pub extern "C" fn cuFileDriverOpen() -> CUfileError_t {
    guard(internal(), || open(true))
}

/// Closes the driver when its last user closes it: batches, then files
/// (each waits for its I/O). `CU_FILE_DRIVER_NOT_INITIALIZED` when not open.
#[no_mangle]
pub extern "C" fn cuFileDriverClose_v2() -> CUfileError_t {
    guard(internal(), || {
        let mut g = state_mut();
        let Some(st) = g.as_mut() else {
            return fail(op::DRIVER_NOT_INITIALIZED, "the driver is not open");
        };
        st.opens = st.opens.saturating_sub(1);
        if st.opens > 0 {
            return ok();
        }
        let st = g.take().expect("checked");
        drop(g);
        implicit::clear();
        drop(st.streams);
        drop(st.batches);
        let mut stuck = Vec::new();
        for (_, f) in st.files {
            if let Err(e) = f.close() {
                stuck.push(e.to_string());
            }
        }
        if !stuck.is_empty() {
            return fail(op::IO_DISABLED, format!("closed, leaving behind: {}", stuck.join("; ")));
        }
        ok()
    })
}

/// The same as `cuFileDriverClose_v2` (programs built with `cufile.h` call
/// that one).
#[no_mangle]
pub extern "C" fn cuFileDriverClose() -> CUfileError_t {
    cuFileDriverClose_v2()
}

/// `cuFileDriverOpen` calls not yet closed.
#[no_mangle]
pub extern "C" fn cuFileUseCount() -> c_long {
    guard(0, || state().as_ref().map_or(0, |s| s.opens))
}

/// The cuFile API version served: that of the `cufile.h` this library is
/// checked against (1.20: 1000 major + 10 minor).
///
/// # Safety
/// `version` is null (refused) or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetVersion(version: *mut c_int) -> CUfileError_t {
    if version.is_null() {
        return fail(op::INVALID_VALUE, "null version");
    }
    // SAFETY: non-null; the caller's int.
    unsafe { *version = CUFILE_VERSION };
    ok()
}

/// The `cufile.h` version whose API this library serves.
pub const CUFILE_VERSION: c_int = 1200;

/// The calling thread's last error, in words, into `buf` (NUL-terminated,
/// cut to `len`); returns its whole length (an extension: cuFile has none;
/// errors are also logged at debug level, `UGDS_LOG=debug`).
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ugds_cufile_last_error(buf: *mut std::ffi::c_char, len: usize) -> usize {
    let msg = errors::last();
    if !buf.is_null() && len > 0 {
        let n = msg.len().min(len - 1);
        // SAFETY: the caller's buffer of `len` bytes; n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
    }
    msg.len()
}
