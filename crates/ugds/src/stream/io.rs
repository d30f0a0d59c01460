//! The late-bound parameters of a stream-ordered request and where its
//! outcome goes.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// Where one late-bound value comes from.
pub(crate) enum Src {
    Value(u64),
    Shared(Arc<AtomicU64>),
    Raw(*const i64),
    /// A value plus a constant (a buffer offset from a registration's
    /// base where the caller counts from an address inside it).
    Plus(Box<Src>, u64),
}

impl Src {
    pub(crate) fn get(&self) -> Result<u64> {
        match self {
            Src::Value(v) => Ok(*v),
            Src::Shared(a) => Ok(a.load(Ordering::Acquire)),
            Src::Raw(p) => {
                // SAFETY: `StreamIo::from_raw`'s caller keeps the pointer
                // valid until the operation has run.
                let v = unsafe { p.read_volatile() };
                u64::try_from(v).map_err(|_| Error::InvalidArgument(format!("negative offset or size {v}")))
            }
            Src::Plus(v, plus) => {
                v.get()?.checked_add(*plus).ok_or_else(|| Error::InvalidArgument("offset too large".into()))
            }
        }
    }
}

/// The outcome of a stream-ordered operation, for Rust callers.
#[derive(Debug, Default)]
pub struct StreamResult {
    bytes: AtomicI64,
    done: AtomicBool,
    error: Mutex<Option<Error>>,
}

impl StreamResult {
    /// Bytes moved, or `-errno`; meaningful once [`is_done`](Self::is_done).
    pub fn bytes(&self) -> i64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// Whether the operation has run (written before the stream moved on).
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// The error, if the operation failed (taken once).
    pub fn take_error(&self) -> Option<Error> {
        self.error.lock().recover().take()
    }
}

pub(crate) enum Sink {
    Shared(Arc<StreamResult>),
    Raw(*mut isize),
    /// One of several requests whose results add up to one.
    Sum(Arc<SumSink>),
}

/// The one result of a vectored operation sent as several requests (staged
/// pieces): each request's result is added in; the last writes the sum, or
/// the first error, to the operation's result.
pub(crate) struct SumSink {
    left: AtomicUsize,
    bytes: AtomicU64,
    error: Mutex<Option<Error>>,
    out: Mutex<Option<Sink>>,
}

impl SumSink {
    pub(crate) fn new(n: usize, out: Sink) -> SumSink {
        SumSink {
            left: AtomicUsize::new(n),
            bytes: AtomicU64::new(0),
            error: Mutex::new(None),
            out: Mutex::new(Some(out)),
        }
    }

    fn add(&self, r: Result<usize>) {
        match r {
            Ok(n) => {
                self.bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.error.lock().recover().get_or_insert(e);
            }
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let r = match self.error.lock().recover().take() {
                Some(e) => Err(e),
                None => Ok(self.bytes.load(Ordering::Relaxed) as usize),
            };
            if let Some(out) = self.out.lock().recover().take() {
                out.write(r);
            }
        }
    }
}

impl Sink {
    pub(crate) fn write(&self, r: Result<usize>) {
        match self {
            Sink::Shared(s) => {
                let v = match &r {
                    Ok(n) => *n as i64,
                    Err(e) => -(e.errno() as i64),
                };
                if let Err(e) = r {
                    *s.error.lock().recover() = Some(e);
                }
                s.bytes.store(v, Ordering::Release);
                s.done.store(true, Ordering::Release);
            }
            Sink::Sum(s) => s.add(r),
            Sink::Raw(p) => {
                let v = match r {
                    Ok(n) => n as isize,
                    Err(e) => -(e.errno() as isize),
                };
                // SAFETY: `StreamIo::from_raw`'s caller keeps the pointer
                // valid until the operation has run.
                unsafe { p.write_volatile(v) };
            }
        }
    }
}

/// The late-bound parameters of one stream-ordered request: size, namespace
/// offset and buffer offset are read when the stream reaches the operation;
/// the bytes moved (or `-errno`) are written before the stream goes on.
pub struct StreamIo {
    pub(crate) size: Src,
    pub(crate) file_offset: Src,
    pub(crate) buf_offset: Src,
    pub(crate) result: Sink,
}

impl std::fmt::Debug for StreamIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamIo").finish_non_exhaustive()
    }
}

// SAFETY: the raw pointers are only used under `StreamIo::from_raw`'s
// contract: valid until the operation has run, from whichever thread runs it.
unsafe impl Send for Src {}
// SAFETY: as for `Src`.
unsafe impl Send for Sink {}

impl StreamIo {
    /// Fixed parameters.
    pub fn new(size: usize, file_offset: u64, buf_offset: usize) -> (StreamIo, Arc<StreamResult>) {
        let r = Arc::new(StreamResult::default());
        let io = StreamIo {
            size: Src::Value(size as u64),
            file_offset: Src::Value(file_offset),
            buf_offset: Src::Value(buf_offset as u64),
            result: Sink::Shared(r.clone()),
        };
        (io, r)
    }

    /// Parameters read from shared cells when the stream reaches the operation.
    pub fn late(
        size: Arc<AtomicU64>,
        file_offset: Arc<AtomicU64>,
        buf_offset: Arc<AtomicU64>,
    ) -> (StreamIo, Arc<StreamResult>) {
        let r = Arc::new(StreamResult::default());
        let io = StreamIo {
            size: Src::Shared(size),
            file_offset: Src::Shared(file_offset),
            buf_offset: Src::Shared(buf_offset),
            result: Sink::Shared(r.clone()),
        };
        (io, r)
    }

    /// A vectored operation's parameters ([`Handle::readv_async`](crate::Handle::readv_async)): the
    /// segments' total size, the namespace offset behind a raw pointer (read
    /// when the stream reaches the operation) and where the bytes moved go.
    ///
    /// # Safety
    /// Both pointers must be valid, aligned, and not written by anyone else
    /// (the result) until the stream has moved past the operation.
    pub unsafe fn from_raw_vectored(total: usize, file_offset: *const i64, bytes: *mut isize) -> StreamIo {
        StreamIo {
            size: Src::Value(total as u64),
            file_offset: Src::Raw(file_offset),
            buf_offset: Src::Value(0),
            result: Sink::Raw(bytes),
        }
    }

    /// The values, read now (when the stream has reached the operation):
    /// size, namespace offset, buffer offset.
    pub(crate) fn values(&self) -> Result<(usize, u64, usize)> {
        let size = usize::try_from(self.size.get()?).map_err(|_| Error::InvalidArgument("size too large".into()))?;
        let buf_offset =
            usize::try_from(self.buf_offset.get()?).map_err(|_| Error::InvalidArgument("offset too large".into()))?;
        Ok((size, self.file_offset.get()?, buf_offset))
    }

    /// Writes the operation's outcome where the caller reads it.
    pub(crate) fn finish(self, r: Result<usize>) {
        self.result.write(r)
    }

    /// The buffer offset counted from `plus` bytes into the buffer (the
    /// caller's base lies inside a registration that starts earlier).
    pub fn buffer_offset_from(mut self, plus: u64) -> StreamIo {
        self.buf_offset = match self.buf_offset {
            Src::Value(v) => Src::Value(v.saturating_add(plus)),
            _ if plus == 0 => self.buf_offset,
            other => Src::Plus(Box::new(other), plus),
        };
        self
    }

    /// Parameters read now (fixed at enqueue: the caller promised they do
    /// not change), the result written behind a raw pointer.
    ///
    /// # Safety
    /// `bytes` must be valid, aligned, and not written by anyone else
    /// until the stream has moved past the operation.
    pub unsafe fn fixed_raw(size: usize, file_offset: u64, buf_offset: u64, bytes: *mut isize) -> StreamIo {
        StreamIo {
            size: Src::Value(size as u64),
            file_offset: Src::Value(file_offset),
            buf_offset: Src::Value(buf_offset),
            result: Sink::Raw(bytes),
        }
    }

    /// Parameters behind raw pointers, as the C API passes them.
    ///
    /// # Safety
    /// All four pointers must be valid, aligned, and not written by anyone
    /// else (the result) until the stream has moved past the operation.
    pub unsafe fn from_raw(
        size: *const usize,
        file_offset: *const i64,
        buf_offset: *const i64,
        bytes: *mut isize,
    ) -> StreamIo {
        StreamIo {
            size: Src::Raw(size as *const i64),
            file_offset: Src::Raw(file_offset),
            buf_offset: Src::Raw(buf_offset),
            result: Sink::Raw(bytes),
        }
    }
}
