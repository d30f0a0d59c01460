//! Run-time loading of a GPU runtime's shared library (`dlopen`), so that
//! nothing GPU is needed to build or to run without a GPU.

use crate::{Error, Result};
use std::ffi::{c_void, CStr, CString};

/// An opened shared library; never closed (runtimes do not support it).
pub struct Library {
    handle: *mut c_void,
    name: String,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library").field("name", &self.name).finish_non_exhaustive()
    }
}

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for Library {}
// SAFETY: dlsym on a handle is thread-safe.
unsafe impl Sync for Library {}

impl Library {
    /// Opens the first of `names` that loads.
    pub fn open(names: &[&str]) -> Result<Library> {
        let mut last = String::new();
        for name in names {
            let c = CString::new(*name).expect("library names have no NUL");
            // SAFETY: a valid C string; RTLD_NOW resolves everything up front.
            let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !handle.is_null() {
                return Ok(Library { handle, name: (*name).to_string() });
            }
            last = dlerror();
        }
        Err(Error::GpuUnavailable(format!("cannot load {}: {last}", names.join(" or "))))
    }

    /// Runs `f` on the first of `names` already loaded in this process,
    /// if one is (asking loads nothing). The handle is given back after
    /// `f`: what `f` looks up is for `f` to use, not to keep.
    pub fn with_loaded<T>(names: &[&str], f: impl FnOnce(&Library) -> T) -> Option<T> {
        let (handle, name) = names.iter().find_map(|name| {
            let c = CString::new(*name).expect("library names have no NUL");
            // SAFETY: a valid C string; RTLD_NOLOAD returns a handle only
            // to a library already loaded, and loads nothing.
            let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            (!handle.is_null()).then(|| (handle, (*name).to_string()))
        })?;
        let r = f(&Library { handle, name });
        // SAFETY: gives back the reference RTLD_NOLOAD took above.
        unsafe { libc::dlclose(handle) };
        Some(r)
    }

    /// The address of `symbol` as a function pointer of type `T`.
    ///
    /// # Safety
    /// `T` must be the symbol's true C function-pointer type.
    pub unsafe fn sym<T: Copy>(&self, symbol: &CStr) -> Result<T> {
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: a live handle and a valid C string.
        let p = unsafe { libc::dlsym(self.handle, symbol.as_ptr()) };
        if p.is_null() {
            return Err(Error::GpuUnavailable(format!("{} lacks {}", self.name, symbol.to_string_lossy())));
        }
        // SAFETY: the caller names the function's type; sizes checked above.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }

    /// The first of `symbols` the library has.
    ///
    /// # Safety
    /// As for [`Library::sym`], for every name.
    pub unsafe fn sym_any<T: Copy>(&self, symbols: &[&CStr]) -> Result<T> {
        let mut err = None;
        for s in symbols {
            // SAFETY: per this fn's contract.
            match unsafe { self.sym(s) } {
                Ok(f) => return Ok(f),
                Err(e) => err = Some(e),
            }
        }
        Err(err.expect("at least one symbol"))
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns a thread-local string or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let e = Library::open(&["libugds-no-such-runtime.so.1"]).expect_err("must fail");
        assert!(matches!(e, Error::GpuUnavailable(ref m) if m.contains("libugds-no-such-runtime")), "{e}");
    }

    #[test]
    fn loaded_libraries_are_told_apart_without_loading_any() {
        let loaded = |names: &[&str]| Library::with_loaded(names, |l| l.name.clone());
        assert_eq!(loaded(&["libugds-no-such-runtime.so.1", "libc.so.6"]).as_deref(), Some("libc.so.6"));
        assert_eq!(loaded(&["libugds-no-such-runtime.so.1"]), None);
        let pid = Library::with_loaded(&["libc.so.6"], |l| {
            // SAFETY: getpid's C type, called while the handle is held.
            unsafe { l.sym::<extern "C" fn() -> i32>(c"getpid") }.map(|f| f())
        });
        assert_eq!(pid.map(|r| r.unwrap()), Some(std::process::id() as i32));
        // libz is on every machine that builds this, and nothing here links it.
        if loaded(&["libz.so.1"]).is_none() {
            let z = Library::open(&["libz.so.1"]);
            assert_eq!(loaded(&["libz.so.1"]).is_some(), z.is_ok());
        }
    }

    #[test]
    fn symbols_resolve_and_missing_ones_are_named() {
        let libc = Library::open(&["libc.so.6"]).unwrap();
        // SAFETY: getpid's C type.
        let getpid: extern "C" fn() -> i32 = unsafe { libc.sym(c"getpid").unwrap() };
        assert_eq!(getpid(), std::process::id() as i32);
        // SAFETY: never called.
        let e = unsafe { libc.sym::<extern "C" fn()>(c"ugds_no_such_symbol") }.err().unwrap();
        assert!(e.to_string().contains("ugds_no_such_symbol"), "{e}");
    }
}
