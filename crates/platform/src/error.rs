//! The library's error type: one enum whose variants carry the numbers.

use std::time::Duration;
use ugds_nvme::Status;

/// What went wrong. Every variant that comes from bad input is returned
/// before any command is issued and leaves all state as it was. Callers
/// that need a category rather than the detail use [`Error::kind`].
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A size of zero was asked for.
    #[error("size is zero")]
    ZeroSize,
    /// An offset or size is not a multiple of what the device needs.
    #[error("{what} {value:#x} is not a multiple of {alignment}")]
    Misaligned {
        /// Which argument.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The required alignment in bytes.
        alignment: u64,
    },
    /// The range runs past the end of the namespace.
    #[error("range {offset:#x}+{len:#x} runs past the namespace's {capacity:#x} bytes")]
    OutOfRange {
        /// Byte offset asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// Namespace capacity in bytes.
        capacity: u64,
    },
    /// No buffer is registered at this base address.
    #[error("no buffer is registered at {base:#x}")]
    NotRegistered {
        /// The base address.
        base: usize,
    },
    /// The range lies outside the registered buffer.
    #[error("range {offset:#x}+{len:#x} lies outside the {buffer_len:#x}-byte buffer at {base:#x}")]
    BufferRange {
        /// Buffer base.
        base: usize,
        /// Offset into the buffer.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The buffer's registered length.
        buffer_len: usize,
    },
    /// The base address is registered already.
    #[error("a buffer is registered at {base:#x} already")]
    AlreadyRegistered {
        /// The base address.
        base: usize,
    },
    /// The range overlaps a registered buffer.
    #[error("{base:#x}+{len:#x} overlaps the registered buffer at {existing:#x}")]
    Overlap {
        /// Base asked for.
        base: usize,
        /// Length asked for.
        len: usize,
        /// Base of the buffer it overlaps.
        existing: usize,
    },
    /// The token names an earlier registration of this address.
    #[error("stale token for {base:#x}: generation {got}, registered generation {current}")]
    StaleToken {
        /// The base address.
        base: usize,
        /// Generation in the token.
        got: u64,
        /// Generation registered now.
        current: u64,
    },
    /// The object still has I/O in flight (or dependants) and was left as it was.
    #[error("{what} is busy: {inflight} in-flight references")]
    Busy {
        /// What was asked to be released.
        what: &'static str,
        /// How many references remain: one per operation, except that a
        /// lent queue holds one for all its requests on a buffer.
        inflight: usize,
    },
    /// The handle was closed.
    #[error("handle is closed")]
    Closed,
    /// A command timed out earlier; the handle refuses all work until a
    /// forced teardown after a controller reset.
    #[error("handle is wedged after a command timeout; only a forced teardown releases it")]
    Wedged,
    /// A command did not complete in time. The handle is now wedged.
    #[error("{} on queue {qid} did not complete within {after:?}", command(cid))]
    Timeout {
        /// Queue.
        qid: u16,
        /// The command's identifier, when one was on the device.
        cid: Option<ugds_nvme::Cid>,
        /// The timeout that expired.
        after: Duration,
    },
    /// The controller reports Controller Fatal Status.
    #[error("controller fatal status (CSTS.CFS) is set")]
    ControllerFatal,
    /// Register reads return all ones: the device is gone.
    #[error("the controller does not answer register reads (device gone?)")]
    DeviceGone,
    /// The controller did not become ready (or not ready to be disabled).
    #[error("controller did not reach CSTS.RDY={ready} within {after:?}")]
    NotReady {
        /// The state waited for.
        ready: bool,
        /// How long was waited.
        after: Duration,
    },
    /// The controller completed a command with an error status.
    #[error("{op} failed: {status}")]
    Nvme {
        /// Which command.
        op: &'static str,
        /// The status the controller returned.
        status: Status,
    },
    /// No submission slot or command identifier is free on this queue.
    #[error("queue is full")]
    QueueFull,
    /// More requests than a batch context was set up for.
    #[error("batch of {requested} requests exceeds the context's capacity of {capacity} ({outstanding} outstanding)")]
    CapacityExceeded {
        /// The context's capacity.
        capacity: usize,
        /// Requests in this submission.
        requested: usize,
        /// Requests already outstanding.
        outstanding: usize,
    },
    /// The request was canceled before it was sent to the device.
    #[error("canceled")]
    Canceled,
    /// The controller or platform cannot do what was asked.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An argument is invalid in a way the other variants do not name.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The platform failed (mapping memory, opening the device, ...).
    #[error("platform: {0}")]
    Platform(String),
    /// No GPU runtime could be loaded (no driver library, no device).
    #[error("GPU runtime unavailable: {0}")]
    GpuUnavailable(String),
    /// A GPU runtime call failed.
    #[error("{call} failed: {name} ({code})")]
    GpuDriver {
        /// The runtime function.
        call: &'static str,
        /// Its error code.
        code: i32,
        /// The runtime's name for the code.
        name: String,
    },
    /// The address is not memory the GPU runtime knows.
    #[error("{ptr:#x} is not a GPU allocation: {why}")]
    GpuPointerInvalid {
        /// The address.
        ptr: u64,
        /// What the runtime said.
        why: String,
    },
    /// The memory is of a kind that cannot be used for I/O (managed memory, arrays).
    #[error("{ptr:#x} is {kind} memory, which cannot be registered for I/O")]
    GpuMemoryType {
        /// The address.
        ptr: u64,
        /// What kind it is.
        kind: &'static str,
    },
    /// The range runs past the end of the GPU allocation it starts in.
    #[error("{ptr:#x}+{len:#x} runs past its allocation {alloc_base:#x}+{alloc_len:#x}")]
    GpuPointerRange {
        /// Start of the range.
        ptr: u64,
        /// Its length.
        len: usize,
        /// The allocation's base.
        alloc_base: u64,
        /// The allocation's length.
        alloc_len: usize,
    },
    /// The memory belongs to another GPU context than the calling thread's.
    #[error("{ptr:#x} belongs to another GPU context than the current one")]
    GpuContextMismatch {
        /// The address.
        ptr: u64,
    },
    /// A member of a volume failed its part of a request; the request as a
    /// whole failed (never reported as a partial success).
    #[error("volume member {member} ({name}): {source}")]
    Member {
        /// The member's index in the volume.
        member: usize,
        /// What the member is (its controller and namespace).
        name: String,
        /// What the member reported.
        source: Box<Error>,
    },
    /// An operating system call failed.
    #[error("{op}: {}", std::io::Error::from_raw_os_error(*errno))]
    Os {
        /// What was being done (and on what, where it says).
        op: std::borrow::Cow<'static, str>,
        /// The `errno` it failed with.
        errno: i32,
    },
}

/// What kind of failure an [`Error`] is: the one classification that the
/// errno, the C interface's uGDS codes and the Python exceptions are each
/// mapped from. Every mapping is an exhaustive match over these kinds (and
/// [`Error::kind`] one over the variants), so nothing can go unmapped.
/// Deliberately not `#[non_exhaustive]`: a new kind must break every
/// mapping's build until it is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Bad input (alignment, range, size, an argument): nothing was done.
    InvalidArgument,
    /// The buffer is not, or no longer, registered.
    NotRegistered,
    /// The memory is, or overlaps, a registered buffer.
    AlreadyRegistered,
    /// I/O is in flight on it (or something depends on it): nothing was released.
    Busy,
    /// More requests than a batch context was set up for.
    CapacityExceeded,
    /// No room on the queue now.
    QueueFull,
    /// Canceled before it reached the device, or aborted by it.
    Canceled,
    /// The handle is closed.
    Closed,
    /// A command did not complete in time; the handle is wedged.
    Timeout,
    /// The handle is wedged after a timeout: only a forced teardown releases it.
    Wedged,
    /// The platform or the device cannot do this.
    Unsupported,
    /// The controller failed the command, or cannot work (fatal status,
    /// gone, not ready).
    Device,
    /// No GPU runtime could be loaded.
    GpuUnavailable,
    /// A GPU runtime call failed.
    GpuDriver,
    /// The address is not memory the GPU runtime knows.
    GpuPointerInvalid,
    /// GPU memory of a kind that cannot be used for I/O.
    GpuMemoryType,
    /// The range runs past its GPU allocation.
    GpuPointerRange,
    /// The memory belongs to another GPU context.
    GpuContextMismatch,
    /// The operating system refused: no permission.
    PermissionDenied,
    /// The operating system has no such device or file.
    NotFound,
    /// The operating system is out of memory.
    OutOfMemory,
    /// Another failure of the operating system or the platform.
    Platform,
}

fn command(cid: &Option<ugds_nvme::Cid>) -> String {
    match cid {
        Some(c) => format!("command {:#06x}", c.0),
        None => "a request".to_string(),
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The kind of failure (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        match self {
            Error::ZeroSize
            | Error::Misaligned { .. }
            | Error::OutOfRange { .. }
            | Error::BufferRange { .. }
            | Error::InvalidArgument(_) => K::InvalidArgument,
            Error::NotRegistered { .. } | Error::StaleToken { .. } => K::NotRegistered,
            Error::AlreadyRegistered { .. } | Error::Overlap { .. } => K::AlreadyRegistered,
            Error::Busy { .. } => K::Busy,
            Error::CapacityExceeded { .. } => K::CapacityExceeded,
            Error::QueueFull => K::QueueFull,
            Error::Canceled => K::Canceled,
            Error::Closed => K::Closed,
            Error::Timeout { .. } => K::Timeout,
            Error::Wedged => K::Wedged,
            Error::Unsupported(_) => K::Unsupported,
            Error::ControllerFatal | Error::DeviceGone | Error::NotReady { .. } | Error::Nvme { .. } => K::Device,
            Error::GpuUnavailable(_) => K::GpuUnavailable,
            Error::GpuDriver { .. } => K::GpuDriver,
            Error::GpuPointerInvalid { .. } => K::GpuPointerInvalid,
            Error::GpuMemoryType { .. } => K::GpuMemoryType,
            Error::GpuPointerRange { .. } => K::GpuPointerRange,
            Error::GpuContextMismatch { .. } => K::GpuContextMismatch,
            Error::Os { errno, .. } => match *errno {
                libc::EACCES | libc::EPERM => K::PermissionDenied,
                libc::ENOENT | libc::ENODEV | libc::ENXIO => K::NotFound,
                libc::ENOMEM => K::OutOfMemory,
                _ => K::Platform,
            },
            Error::Platform(_) => K::Platform,
            Error::Member { source, .. } => source.kind(),
        }
    }

    /// A positive errno for callers that report through an `ssize_t`, as
    /// stream-ordered I/O does (it writes `-errno`): an OS error's own;
    /// ENOSPC for Capacity Exceeded and EROFS for Namespace is Write
    /// Protected; else one per [`ErrorKind`].
    pub fn errno(&self) -> i32 {
        use ErrorKind as K;
        if let Error::Member { source, .. } = self {
            return source.errno();
        }
        if let Error::Os { errno, .. } = self {
            return *errno;
        }
        if let Error::Nvme { status, .. } = self {
            // What the kernel path reports for a full filesystem and a file
            // opened read-only; on a controller the same conditions.
            use ugds_nvme::status::generic;
            match (status.sct, status.sc) {
                (0, generic::CAPACITY_EXCEEDED) => return libc::ENOSPC,
                (0, generic::NAMESPACE_WRITE_PROTECTED) => return libc::EROFS,
                _ => {}
            }
        }
        match self.kind() {
            K::InvalidArgument
            | K::NotRegistered
            | K::AlreadyRegistered
            | K::CapacityExceeded
            | K::GpuPointerInvalid
            | K::GpuMemoryType
            | K::GpuPointerRange
            | K::GpuContextMismatch => libc::EINVAL,
            K::Busy => libc::EBUSY,
            K::QueueFull => libc::EAGAIN,
            K::Canceled => libc::ECANCELED,
            K::Closed => libc::EBADF,
            K::Timeout => libc::ETIMEDOUT,
            K::Unsupported => libc::EOPNOTSUPP,
            K::GpuUnavailable | K::NotFound => libc::ENODEV,
            K::PermissionDenied => libc::EACCES,
            K::OutOfMemory => libc::ENOMEM,
            K::Wedged | K::Device | K::GpuDriver | K::Platform => libc::EIO,
        }
    }

    /// An I/O error from `op`, by its errno (EIO when it has none).
    pub fn io(op: impl Into<std::borrow::Cow<'static, str>>, e: std::io::Error) -> Error {
        Error::Os { op: op.into(), errno: e.raw_os_error().unwrap_or(libc::EIO) }
    }

    /// The calling thread's last OS error (`errno`), from `op`.
    pub fn os(op: impl Into<std::borrow::Cow<'static, str>>) -> Error {
        Error::io(op, std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_clone_and_keep_their_errno() {
        let e = Error::io("open", std::io::Error::from_raw_os_error(libc::EACCES));
        let c = e.clone();
        assert_eq!((c.errno(), c.kind()), (libc::EACCES, ErrorKind::PermissionDenied));
        assert!(c.to_string().starts_with("open: "), "{c}");
        // An I/O error without an errno is an EIO.
        let e = Error::io("read", std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "short"));
        assert_eq!((e.errno(), e.kind()), (libc::EIO, ErrorKind::Platform));
    }

    #[test]
    fn kinds_and_errnos_agree() {
        let cases = [
            (Error::ZeroSize, ErrorKind::InvalidArgument, libc::EINVAL),
            (Error::StaleToken { base: 0, got: 1, current: 2 }, ErrorKind::NotRegistered, libc::EINVAL),
            (Error::Busy { what: "x", inflight: 1 }, ErrorKind::Busy, libc::EBUSY),
            (Error::QueueFull, ErrorKind::QueueFull, libc::EAGAIN),
            (
                Error::Timeout { qid: 1, cid: Some(ugds_nvme::Cid(2)), after: Duration::ZERO },
                ErrorKind::Timeout,
                libc::ETIMEDOUT,
            ),
            (Error::Wedged, ErrorKind::Wedged, libc::EIO),
            (Error::DeviceGone, ErrorKind::Device, libc::EIO),
            (Error::GpuUnavailable("x".into()), ErrorKind::GpuUnavailable, libc::ENODEV),
            (Error::Unsupported("x".into()), ErrorKind::Unsupported, libc::EOPNOTSUPP),
            (Error::Nvme { op: "Write", status: ugds_nvme::Status::generic(0x81) }, ErrorKind::Device, libc::ENOSPC),
            (Error::Nvme { op: "Write", status: ugds_nvme::Status::generic(0x20) }, ErrorKind::Device, libc::EROFS),
            (Error::Nvme { op: "Read", status: ugds_nvme::Status::generic(0x80) }, ErrorKind::Device, libc::EIO),
        ];
        for (e, kind, errno) in cases {
            assert_eq!((e.kind(), e.errno()), (kind, errno), "{e}");
        }
    }
}
