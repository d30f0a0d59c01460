//! cuFile's parameters and driver properties: their values here, which of
//! them take effect, and `cufile.json` (`CUFILE_ENV_PATH_JSON`).
//!
//! Taking effect: the stats level (`profile.cufile_stats`), poll mode
//! (`properties.use_poll_mode`: handles registered afterwards complete by
//! polling when true, by interrupts when false; ugds polls every size, so
//! the threshold is kept and reported only), the largest direct I/O
//! (`properties.max_direct_io_size_kb`: synchronous calls are cut into
//! requests of at most that), compatibility mode
//! (`properties.allow_compat_mode`: false refuses files the kernel keeps,
//! leaving the devices ugds owns), the batch size (`properties.io_batchsize`:
//! the most a batch may be set up for) and the logging level
//! (`logging.level`). Every other parameter reports a value and refuses a
//! change with `CU_FILE_INVALID_VALUE` (setting the value it has succeeds).

use crate::abi::CUfileError_t;
use crate::abi::{op, CUfileDrvProps_t};
use crate::errors::{fail, ok};
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use ugds::platform::Recover;

/// `CUFileSizeTConfigParameter_t`, in order, with cuFile's defaults.
const SIZE_PARAMS: &[(&str, usize)] = &[
    ("CUFILE_PARAM_PROFILE_STATS", 0),
    ("CUFILE_PARAM_EXECUTION_MAX_IO_QUEUE_DEPTH", 128),
    ("CUFILE_PARAM_EXECUTION_MAX_IO_THREADS", 4),
    ("CUFILE_PARAM_EXECUTION_MIN_IO_THRESHOLD_SIZE_KB", 8192),
    ("CUFILE_PARAM_EXECUTION_MAX_REQUEST_PARALLELISM", 4),
    ("CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB", 16384),
    ("CUFILE_PARAM_PROPERTIES_MAX_DEVICE_CACHE_SIZE_KB", 131072),
    ("CUFILE_PARAM_PROPERTIES_PER_BUFFER_CACHE_SIZE_KB", 1024),
    ("CUFILE_PARAM_PROPERTIES_MAX_DEVICE_PINNED_MEM_SIZE_KB", 33554432),
    ("CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE", 128),
    ("CUFILE_PARAM_POLLTHRESHOLD_SIZE_KB", 4),
    ("CUFILE_PARAM_PROPERTIES_BATCH_IO_TIMEOUT_MS", 5),
];
/// `CUFileBoolConfigParameter_t`, in order, with the values here.
const BOOL_PARAMS: &[(&str, bool)] = &[
    ("CUFILE_PARAM_PROPERTIES_USE_POLL_MODE", true),
    ("CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE", true),
    ("CUFILE_PARAM_FORCE_COMPAT_MODE", false),
    ("CUFILE_PARAM_FS_MISC_API_CHECK_AGGRESSIVE", false),
    ("CUFILE_PARAM_EXECUTION_PARALLEL_IO", true),
    ("CUFILE_PARAM_PROFILE_NVTX", false),
    ("CUFILE_PARAM_PROPERTIES_ALLOW_SYSTEM_MEMORY", true),
    ("CUFILE_PARAM_USE_PCIP2PDMA", false),
    ("CUFILE_PARAM_PREFER_IO_URING", true),
    ("CUFILE_PARAM_FORCE_ODIRECT_MODE", false),
    ("CUFILE_PARAM_SKIP_TOPOLOGY_DETECTION", false),
    ("CUFILE_PARAM_STREAM_MEMOPS_BYPASS", false),
    ("CUFILE_PARAM_PROPERTIES_POSIX_IO_MODE", false),
    ("CUFILE_PARAM_GDS_FALLBACK_IO", true),
];
/// `CUFileStringConfigParameter_t`, in order.
const STRING_PARAMS: &[(&str, &str)] = &[
    ("CUFILE_PARAM_LOGGING_LEVEL", "ERROR"),
    ("CUFILE_PARAM_ENV_LOGFILE_PATH", ""),
    ("CUFILE_PARAM_LOG_DIR", ""),
    ("CUFILE_PARAM_RDMA_TRANSPORT", ""),
];

/// Indexes of the parameters that take effect.
pub(crate) const STATS: usize = 0;
pub(crate) const MAX_DIRECT_IO_KB: usize = 5;
pub(crate) const IO_BATCHSIZE: usize = 9;
pub(crate) const POLL_THRESHOLD_KB: usize = 10;
pub(crate) const USE_POLL_MODE: usize = 0;
pub(crate) const ALLOW_COMPAT_MODE: usize = 1;
pub(crate) const LOGGING_LEVEL: usize = 0;

/// The enumerator's value of a parameter called `name`.
pub(crate) fn param_index(name: &str) -> Option<usize> {
    [
        SIZE_PARAMS.iter().map(|p| p.0).collect::<Vec<_>>(),
        BOOL_PARAMS.iter().map(|p| p.0).collect(),
        STRING_PARAMS.iter().map(|p| p.0).collect(),
    ]
    .iter()
    .find_map(|names| names.iter().position(|n| *n == name))
}

/// Parameter values now.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub sizes: Vec<usize>,
    pub bools: Vec<bool>,
    pub strings: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            sizes: SIZE_PARAMS.iter().map(|p| p.1).collect(),
            bools: BOOL_PARAMS.iter().map(|p| p.1).collect(),
            strings: STRING_PARAMS.iter().map(|p| p.1.to_string()).collect(),
        }
    }
}

static CONFIG: Mutex<Option<Config>> = Mutex::new(None);

/// The parameters now (defaults, then `cufile.json`, then what was set).
pub(crate) fn get() -> Config {
    CONFIG.lock().recover().get_or_insert_with(Config::default).clone()
}

fn update(f: impl FnOnce(&mut Config) -> CUfileError_t) -> CUfileError_t {
    let mut g = CONFIG.lock().recover();
    let c = g.get_or_insert_with(Config::default);
    let r = f(c);
    published(c);
    r
}

/// The largest batch a batch context may be set up for.
pub(crate) fn batch_size() -> usize {
    get().sizes[IO_BATCHSIZE]
}

/// `max_direct_io_size_kb` in bytes, kept apart: read by every call.
static MAX_DIRECT_IO: AtomicUsize = AtomicUsize::new(16384 << 10);

/// The largest request a synchronous call is cut into, in bytes.
pub(crate) fn max_direct_io() -> usize {
    MAX_DIRECT_IO.load(Ordering::Relaxed)
}

/// Publishes the values read on the I/O path.
fn published(c: &Config) {
    MAX_DIRECT_IO.store(c.sizes[MAX_DIRECT_IO_KB].saturating_mul(1024).max(4096), Ordering::Relaxed);
}

fn effective_size(i: usize) -> bool {
    matches!(i, STATS | MAX_DIRECT_IO_KB | IO_BATCHSIZE | POLL_THRESHOLD_KB)
}

fn effective_bool(i: usize) -> bool {
    matches!(i, USE_POLL_MODE | ALLOW_COMPAT_MODE)
}

/// Parameters are set before the driver is opened.
fn settable() -> Result<(), CUfileError_t> {
    if crate::is_open() {
        return Err(fail(op::DRIVER_ALREADY_OPEN, "parameters are set before cuFileDriverOpen"));
    }
    Ok(())
}

pub(crate) fn get_size(i: c_int) -> Option<usize> {
    get().sizes.get(usize::try_from(i).ok()?).copied()
}

pub(crate) fn get_bool(i: c_int) -> Option<bool> {
    get().bools.get(usize::try_from(i).ok()?).copied()
}

pub(crate) fn get_string(i: c_int) -> Option<String> {
    get().strings.get(usize::try_from(i).ok()?).cloned()
}

pub(crate) fn set_size(i: c_int, v: usize) -> CUfileError_t {
    if let Err(e) = settable() {
        return e;
    }
    let Some(i) = usize::try_from(i).ok().filter(|&i| i < SIZE_PARAMS.len()) else {
        return fail(op::INVALID_VALUE, format!("no size_t parameter {i}"));
    };
    update(|c| {
        if c.sizes[i] == v {
            return ok();
        }
        if !effective_size(i) {
            return fail(
                op::INVALID_VALUE,
                format!("{} has no effect in ugds: it stays {}", SIZE_PARAMS[i].0, c.sizes[i]),
            );
        }
        if i == STATS && v > 3 || i != STATS && v == 0 {
            return fail(op::INVALID_VALUE, format!("{} = {v}", SIZE_PARAMS[i].0));
        }
        if i == IO_BATCHSIZE && v > ugds::Batch::MAX_CAPACITY {
            return fail(
                op::INVALID_VALUE,
                format!("a batch holds at most {} requests here", ugds::Batch::MAX_CAPACITY),
            );
        }
        c.sizes[i] = v;
        if i == STATS {
            crate::stats::set_level(v as c_int);
        }
        ok()
    })
}

pub(crate) fn set_bool(i: c_int, v: bool) -> CUfileError_t {
    if let Err(e) = settable() {
        return e;
    }
    let Some(i) = usize::try_from(i).ok().filter(|&i| i < BOOL_PARAMS.len()) else {
        return fail(op::INVALID_VALUE, format!("no bool parameter {i}"));
    };
    update(|c| {
        if c.bools[i] == v {
            return ok();
        }
        if !effective_bool(i) {
            return fail(
                op::INVALID_VALUE,
                format!("{} has no effect in ugds: it stays {}", BOOL_PARAMS[i].0, c.bools[i]),
            );
        }
        c.bools[i] = v;
        ok()
    })
}

pub(crate) fn set_string(i: c_int, v: &str) -> CUfileError_t {
    if let Err(e) = settable() {
        return e;
    }
    let Some(i) = usize::try_from(i).ok().filter(|&i| i < STRING_PARAMS.len()) else {
        return fail(op::INVALID_VALUE, format!("no string parameter {i}"));
    };
    update(|c| {
        if c.strings[i] == v {
            return ok();
        }
        if i != LOGGING_LEVEL {
            return fail(op::INVALID_VALUE, format!("{} has no effect in ugds", STRING_PARAMS[i].0));
        }
        if ugds::log::parse_level(v).is_err() {
            return fail(op::INVALID_VALUE, format!("logging level {v:?}"));
        }
        c.strings[i] = v.to_string();
        ok()
    })
}

/// The bounds of a size_t parameter.
pub(crate) fn min_max(i: c_int) -> Option<(usize, usize)> {
    let i = usize::try_from(i).ok().filter(|&i| i < SIZE_PARAMS.len())?;
    Some(match i {
        STATS => (0, 3),
        IO_BATCHSIZE => (1, ugds::Batch::MAX_CAPACITY),
        _ if effective_size(i) => (1, usize::MAX >> 10),
        _ => (SIZE_PARAMS[i].1, SIZE_PARAMS[i].1),
    })
}

/// The driver's properties, as `cuFileDriverGetProperties` reports them.
pub(crate) fn properties() -> CUfileDrvProps_t {
    use crate::abi::*;
    let c = get();
    let kb = |i: usize| c.sizes[i].min(c_uint::MAX as usize) as c_uint;
    CUfileDrvProps_t {
        nvfs: NvfsProps {
            major_version: 0,
            minor_version: 0,
            poll_thresh_size: c.sizes[POLL_THRESHOLD_KB],
            max_direct_io_size: c.sizes[MAX_DIRECT_IO_KB],
            dstatusflags: 1 << STATUS_NVME_SUPPORTED,
            dcontrolflags: (c.bools[USE_POLL_MODE] as c_uint) << CONTROL_USE_POLL_MODE
                | (c.bools[ALLOW_COMPAT_MODE] as c_uint) << CONTROL_ALLOW_COMPAT_MODE,
        },
        fflags: 1 << FEATURE_BATCH_IO | 1 << FEATURE_STREAMS,
        max_device_cache_size: kb(6),
        per_buffer_cache_size: kb(7),
        max_device_pinned_mem_size: kb(8),
        max_batch_io_size: kb(IO_BATCHSIZE),
        max_batch_io_timeout_msecs: kb(11),
    }
}

/// Reads `CUFILE_ENV_PATH_JSON` (if set) into the parameters: the keys
/// that take effect here; others are ignored. A file that cannot be read
/// or parsed is `CU_FILE_DRIVER_INVALID_PROPS`.
pub(crate) fn load_json() -> CUfileError_t {
    let Some(path) = std::env::var_os("CUFILE_ENV_PATH_JSON") else { return ok() };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            return fail(op::DRIVER_INVALID_PROPS, format!("CUFILE_ENV_PATH_JSON={}: {e}", path.to_string_lossy()))
        }
    };
    let v: serde_json::Value = match serde_json::from_str(&strip_comments(&text)) {
        Ok(v) => v,
        Err(e) => return fail(op::DRIVER_INVALID_PROPS, format!("{}: {e}", path.to_string_lossy())),
    };
    update(|c| {
        let num = |p: &str| v.pointer(p).and_then(|x| x.as_u64()).map(|x| x as usize);
        let flag = |p: &str| v.pointer(p).and_then(|x| x.as_bool());
        if let Some(n) = num("/profile/cufile_stats") {
            c.sizes[STATS] = n.min(3);
        }
        if let Some(n) = num("/properties/max_direct_io_size_kb").filter(|&n| n > 0) {
            c.sizes[MAX_DIRECT_IO_KB] = n;
        }
        if let Some(n) = num("/properties/poll_mode_max_size_kb").filter(|&n| n > 0) {
            c.sizes[POLL_THRESHOLD_KB] = n;
        }
        if let Some(n) = num("/properties/io_batchsize").filter(|&n| n > 0) {
            c.sizes[IO_BATCHSIZE] = n.min(ugds::Batch::MAX_CAPACITY);
        }
        if let Some(b) = flag("/properties/use_poll_mode") {
            c.bools[USE_POLL_MODE] = b;
        }
        if let Some(b) = flag("/properties/allow_compat_mode") {
            c.bools[ALLOW_COMPAT_MODE] = b;
        }
        if let Some(s) = v.pointer("/logging/level").and_then(|x| x.as_str()) {
            c.strings[LOGGING_LEVEL] = s.to_string();
        }
        crate::stats::set_level(c.sizes[STATS] as c_int);
        ok()
    })
}

/// `cufile.json` allows `//` comments: removed outside strings.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let (mut in_str, mut escaped) = (false, false);
        let mut cut = line.len();
        let b = line.as_bytes();
        for i in 0..b.len() {
            match b[i] {
                _ if escaped => escaped = false,
                b'\\' if in_str => escaped = true,
                b'"' => in_str = !in_str,
                b'/' if !in_str && b.get(i + 1) == Some(&b'/') => {
                    cut = i;
                    break;
                }
                b'#' if !in_str => {
                    cut = i;
                    break;
                }
                _ => {}
            }
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_go_and_strings_stay() {
        let j = "{\n  // a comment\n  \"logging\": { \"dir\": \"/a//b\", \"level\": \"INFO\" }, # another\n  \"x\": 1 // end\n}";
        let v: serde_json::Value = serde_json::from_str(&strip_comments(j)).unwrap();
        assert_eq!(v.pointer("/logging/dir").unwrap(), "/a//b");
        assert_eq!(v.pointer("/x").unwrap(), 1);
    }

    #[test]
    fn parameters_are_numbered_as_the_header_lists_them() {
        assert_eq!(param_index("CUFILE_PARAM_PROPERTIES_BATCH_IO_TIMEOUT_MS"), Some(11));
        assert_eq!(param_index("CUFILE_PARAM_GDS_FALLBACK_IO"), Some(13));
        assert_eq!(param_index("CUFILE_PARAM_RDMA_TRANSPORT"), Some(3));
        assert_eq!(SIZE_PARAMS[IO_BATCHSIZE].0, "CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE");
        assert_eq!(SIZE_PARAMS[MAX_DIRECT_IO_KB].0, "CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB");
        assert_eq!(SIZE_PARAMS[POLL_THRESHOLD_KB].0, "CUFILE_PARAM_POLLTHRESHOLD_SIZE_KB");
        assert_eq!(BOOL_PARAMS[ALLOW_COMPAT_MODE].0, "CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE");
    }
}
