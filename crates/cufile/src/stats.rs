//! cuFile's statistics (`cuFileGetStatsL1/L2/L3`), kept by this library
//! when the stats level (`cuFileSetStatsLevel`, the parameter
//! `CUFILE_PARAM_PROFILE_STATS`, or `profile.cufile_stats` in cufile.json)
//! is 1 or more; at 0 (the default, as cuFile's) nothing is counted. Level
//! 2 adds size histograms; level 3's per-GPU records are not kept
//! (`num_gpus` is 0).

use crate::abi::{L1_WORDS, L2_WORDS, L3_BYTES, L3_NUM_GPUS};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;
use ugds::platform::Recover;

/// The level-1 words filled here, by field name (counters are `{ok, err}`:
/// `.err` is the next word).
const L1: &[(&str, usize)] = &[
    ("read_ops", 0),
    ("write_ops", 2),
    ("hdl_register_ops", 4),
    ("hdl_deregister_ops", 6),
    ("buf_register_ops", 8),
    ("buf_deregister_ops", 10),
    ("read_bytes", 12),
    ("write_bytes", 13),
    ("read_bw_bytes_per_sec", 14),
    ("write_bw_bytes_per_sec", 15),
    ("read_lat_avg_us", 16),
    ("write_lat_avg_us", 17),
    ("read_ops_per_sec", 18),
    ("write_ops_per_sec", 19),
    ("read_lat_sum_us", 20),
    ("write_lat_sum_us", 21),
    ("batch_submit_ops", 22),
    ("batch_complete_ops", 24),
    ("batch_setup_ops", 26),
    ("batch_cancel_ops", 28),
    ("batch_destroy_ops", 30),
    ("batch_iouring_submit_ops", 46),
    ("batch_total_submit_ops", 50),
    ("batch_read_bytes", 52),
    ("batch_write_bytes", 53),
    ("readv_ops", 64),
    ("writev_ops", 66),
    ("readv_bytes", 68),
    ("writev_bytes", 69),
    ("readv_lat_sum_us", 76),
    ("writev_lat_sum_us", 77),
];

/// The word of a level-1 field (for the ABI check).
pub(crate) fn l1_index(field: &str) -> Option<usize> {
    L1.iter().find(|(n, _)| *n == field).map(|(_, i)| *i)
}

fn at(field: &str) -> usize {
    l1_index(field).expect("a field of the table")
}

static LEVEL: AtomicI32 = AtomicI32::new(0);
static RUNNING: AtomicBool = AtomicBool::new(true);
static WORDS: [AtomicU64; L2_WORDS] = [const { AtomicU64::new(0) }; L2_WORDS];
static SINCE: Mutex<Option<Instant>> = Mutex::new(None);
/// `SINCE` is set: the I/O calls read this, not the lock.
static STARTED: AtomicBool = AtomicBool::new(false);

pub(crate) fn set_level(level: c_int) {
    LEVEL.store(level.clamp(0, 3), Ordering::Relaxed);
}

pub(crate) fn level() -> c_int {
    LEVEL.load(Ordering::Relaxed)
}

/// Counting now (level 1 or more, not stopped).
pub(crate) fn on() -> bool {
    level() > 0 && RUNNING.load(Ordering::Relaxed)
}

pub(crate) fn start() {
    RUNNING.store(true, Ordering::Relaxed);
}

pub(crate) fn stop() {
    RUNNING.store(false, Ordering::Relaxed);
}

pub(crate) fn reset() {
    for w in &WORDS {
        w.store(0, Ordering::Relaxed);
    }
    *SINCE.lock().recover() = Some(Instant::now());
    STARTED.store(true, Ordering::Release);
}

fn add(i: usize, n: u64) {
    WORDS[i].fetch_add(n, Ordering::Relaxed);
}

/// A counter `{ok, err}` of `field` gets one.
pub(crate) fn count(field: &str, ok: bool) {
    if on() {
        add(at(field) + !ok as usize, 1);
    }
}

/// What an I/O call moved and how long it took.
#[derive(Clone, Copy)]
pub(crate) enum Io {
    Read,
    Write,
    Readv,
    Writev,
}

/// Records one I/O call: its outcome (bytes, or failed) and its start
/// (taken when statistics were on as it began).
pub(crate) fn io(kind: Io, result: Option<usize>, started: Option<Instant>) {
    let Some(started) = started.filter(|_| on()) else {
        return;
    };
    if !STARTED.load(Ordering::Acquire) {
        SINCE.lock().recover().get_or_insert(started);
        STARTED.store(true, Ordering::Release);
    }
    let (ops, bytes, lat) = match kind {
        Io::Read => ("read_ops", "read_bytes", "read_lat_sum_us"),
        Io::Write => ("write_ops", "write_bytes", "write_lat_sum_us"),
        Io::Readv => ("readv_ops", "readv_bytes", "readv_lat_sum_us"),
        Io::Writev => ("writev_ops", "writev_bytes", "writev_lat_sum_us"),
    };
    add(at(ops) + result.is_none() as usize, 1);
    if let Some(n) = result {
        add(at(bytes), n as u64);
        add(at(lat), started.elapsed().as_micros() as u64);
        if level() >= 2 && matches!(kind, Io::Read | Io::Write) {
            let kb = (n as u64 / 1024).max(1);
            let bucket = (63 - kb.leading_zeros() as usize).min(31);
            let base = L1_WORDS + if matches!(kind, Io::Read) { 0 } else { 32 };
            add(base + bucket, 1);
        }
    }
}

/// Batch bytes, by direction.
pub(crate) fn batch_bytes(write: bool, n: u64) {
    if on() {
        add(at(if write { "batch_write_bytes" } else { "batch_read_bytes" }), n);
    }
}

/// The statistics as `CUfileStatsLevel{1,2,3}_t`: `words` 64-bit words of
/// levels 1 and 2 (the derived figures computed now), then, for level 3,
/// `num_gpus` (0) and empty per-GPU records.
pub(crate) fn snapshot(out: &mut [u8]) {
    let mut w: Vec<u64> = WORDS.iter().map(|x| x.load(Ordering::Relaxed)).collect();
    let secs = SINCE.lock().recover().map_or(0.0, |t| t.elapsed().as_secs_f64());
    for (ops, bytes, lat, bw, avg, per_sec) in [
        ("read_ops", "read_bytes", "read_lat_sum_us", "read_bw_bytes_per_sec", "read_lat_avg_us", "read_ops_per_sec"),
        (
            "write_ops",
            "write_bytes",
            "write_lat_sum_us",
            "write_bw_bytes_per_sec",
            "write_lat_avg_us",
            "write_ops_per_sec",
        ),
    ] {
        let n = w[at(ops)];
        w[at(avg)] = w[at(lat)].checked_div(n).unwrap_or(0);
        if secs > 0.0 {
            w[at(bw)] = (w[at(bytes)] as f64 / secs) as u64;
            w[at(per_sec)] = (n as f64 / secs) as u64;
        }
    }
    let words = (out.len() / 8).min(L2_WORDS);
    for (i, v) in w.iter().take(words).enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
    }
    if out.len() == L3_BYTES {
        out[L3_NUM_GPUS..].fill(0);
    }
}
