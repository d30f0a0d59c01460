//! The library's error type: one enum whose variants carry the numbers.

use std::time::Duration;
use ugds_nvme::Status;

/// What went wrong. Every variant that comes from bad input is returned
/// before any command is issued and leaves all state as it was.
#[derive(Debug, thiserror::Error)]
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
    #[error("{what} is busy: {inflight} operations in flight")]
    Busy {
        /// What was asked to be released.
        what: &'static str,
        /// How many references remain.
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
    #[error("command {cid} on queue {qid} did not complete within {after:?}")]
    Timeout {
        /// Queue.
        qid: u16,
        /// Command identifier.
        cid: u16,
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
    /// An operating system call failed.
    #[error("{op}: {source}")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A positive errno for callers that report through an `ssize_t`, as
    /// stream-ordered I/O does (it writes `-errno`).
    pub fn errno(&self) -> i32 {
        match self {
            Error::ZeroSize
            | Error::Misaligned { .. }
            | Error::OutOfRange { .. }
            | Error::NotRegistered { .. }
            | Error::BufferRange { .. }
            | Error::AlreadyRegistered { .. }
            | Error::Overlap { .. }
            | Error::StaleToken { .. }
            | Error::InvalidArgument(_)
            | Error::GpuPointerInvalid { .. }
            | Error::GpuMemoryType { .. }
            | Error::GpuPointerRange { .. }
            | Error::GpuContextMismatch { .. }
            | Error::CapacityExceeded { .. } => libc::EINVAL,
            Error::GpuUnavailable(_) => libc::ENODEV,
            Error::Busy { .. } => libc::EBUSY,
            Error::Closed => libc::EBADF,
            Error::Timeout { .. } => libc::ETIMEDOUT,
            Error::QueueFull => libc::EAGAIN,
            Error::Canceled => libc::ECANCELED,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::DeviceGone => libc::ENODEV,
            Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Wedged
            | Error::ControllerFatal
            | Error::NotReady { .. }
            | Error::Nvme { .. }
            | Error::GpuDriver { .. }
            | Error::Platform(_) => libc::EIO,
        }
    }

    /// The calling thread's last OS error (`errno`), from `op`.
    pub fn os(op: &'static str) -> Error {
        Error::Os { op, source: std::io::Error::last_os_error() }
    }
}
