//! How the kernel path's rings run and whether they read through the page
//! cache: chosen per handle (`HandleOptions`), applied by each ring.

use ugds_platform::{Error, Result};

/// How the kernel path's io_uring rings run (the kernel path only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelRing {
    /// Submissions by `io_uring_enter`, completions by interrupt (the
    /// default).
    #[default]
    Plain,
    /// A kernel thread polls each ring's submissions (`IORING_SETUP_SQPOLL`):
    /// no system call per submission while it is awake.
    SqPoll,
    /// Completions are polled from the device (`IORING_SETUP_IOPOLL`): for
    /// direct I/O on block devices (and files on them) with poll queues;
    /// needs polled completion. Refused at open where the file cannot.
    IoPoll,
}

/// Whether the kernel path reads through the page cache (the kernel path
/// only; a namespace passed through has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CachePolicy {
    /// Reads whose data the page cache holds come from it at memory speed
    /// (a buffered read that does not wait, `RWF_NOWAIT`), the rest from
    /// the disk with `O_DIRECT`, which leaves the cache as it was. A read
    /// asks the kernel what is cached (`cachestat`) before it tries, so
    /// that cold data goes direct at once and starts no readahead; after
    /// 16 hits in a row only one read in 8 asks. Where the kernel has no
    /// `cachestat` (before Linux 6.5) reads try the cache, and after 16
    /// misses in a row only every 16th does. Writes are direct. The
    /// default.
    #[default]
    Auto,
    /// Reads and writes with `O_DIRECT` where memory, offset and size are
    /// aligned as the file needs (through the page cache where not).
    Direct,
    /// Reads and writes through the page cache.
    Buffered,
}

impl CachePolicy {
    /// The policy `UGDS_CACHE_POLICY` names: `None` where it is unset or
    /// empty; an unknown name is an error that names the variable.
    pub fn from_env() -> std::result::Result<Option<CachePolicy>, String> {
        Self::from_var(std::env::var("UGDS_CACHE_POLICY").ok().as_deref())
    }

    /// As [`from_env`](Self::from_env), for the variable's value `v`.
    pub(crate) fn from_var(v: Option<&str>) -> std::result::Result<Option<CachePolicy>, String> {
        match v {
            None | Some("") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|e: Error| format!("UGDS_CACHE_POLICY: {e}")),
        }
    }
}

impl std::str::FromStr for CachePolicy {
    type Err = Error;

    /// `auto`, `direct` or `buffered`.
    fn from_str(s: &str) -> Result<CachePolicy> {
        match s {
            "auto" => Ok(CachePolicy::Auto),
            "direct" => Ok(CachePolicy::Direct),
            "buffered" => Ok(CachePolicy::Buffered),
            _ => Err(Error::InvalidArgument(format!("unknown cache policy {s:?}: expected auto, direct or buffered"))),
        }
    }
}
