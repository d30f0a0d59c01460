//! A handle's queue statistics: what each queue pair is for
//! ([`QueueInfo`]) and has done ([`QueueStats`], read from the counters the
//! queue pairs keep), published to a file for other processes (`ugds
//! stats`, `ugds top`), as SPDK's `spdk_top` reads a running application's.
//!
//! Opt-in ([`HandleOptions::stats_dir`](crate::HandleOptions::stats_dir)): a
//! thread of the handle rewrites `DIR/ugds-PID-HANDLE.stats` every
//! [`PERIOD`] from the queue pairs' counters (which it reads without a lock;
//! the I/O path does nothing for it), and removes the file when the handle
//! closes. Each rewrite goes to a temporary file renamed over the old one,
//! so a reader never sees half a file. The format is text, one record per
//! line, `key=value` fields:
//!
//! ```text
//! ugds-stats 1 pid=4242 handle=3 time_ms=1764600000000
//! queue qid=1 role=sync submitted=12 completed=12 in_flight=0 bytes_read=49152 ...
//! ```
//!
//! A traced handle's queue lines end with its latencies (`lat_n`,
//! `lat_p50_ns`, `lat_p99_ns`, `lat_max_ns`: upper bounds of buckets 25%
//! wide; see [`HandleOptions::trace`](crate::HandleOptions::trace)).

use crate::engine::stats::QueueCounters;
use crate::engine::trace::{LatencyHistogram, TraceEvent};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

/// What an I/O queue pair of a handle is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueRole {
    /// Shared by synchronous callers (and, on a controller that granted
    /// one queue pair, by batch contexts and stream-ordered I/O too).
    Sync,
    /// The deep queue pair of batch contexts and stream-ordered I/O.
    Batch,
    /// Lent whole to an [`IoQueue`](crate::IoQueue).
    Lendable,
}

/// One I/O queue pair of a handle and how it learns of completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueInfo {
    /// Queue id.
    pub qid: u16,
    /// What it is for.
    pub role: QueueRole,
    /// Its interrupt vector; `None`: its completion queue is polled.
    pub vector: Option<u16>,
    /// Entries the controller granted (its submission queue's size; at
    /// most MQES + 1, whatever was asked for).
    pub entries: u16,
    /// Other I/O queues on the same vector (vector 0 is also the admin
    /// queue's).
    pub vector_shared_with: u16,
}

/// What one I/O queue pair of a handle has done since the handle opened
/// ([`Handle::queue_stats`](crate::Handle::queue_stats)). Read while I/O
/// runs, each figure is current but the set is not one instant's: the
/// counters are read one after another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Queue id.
    pub qid: u16,
    /// What it is for.
    pub role: QueueRole,
    /// Commands submitted (a request of several commands counts each).
    pub submitted: u64,
    /// Commands completed.
    pub completed: u64,
    /// Commands on the device when read (`submitted - completed`).
    pub in_flight: u64,
    /// Bytes of the read commands submitted.
    pub bytes_read: u64,
    /// Bytes of the write commands submitted.
    pub bytes_written: u64,
    /// Commands completed with an error status.
    pub errors: u64,
    /// Commands still outstanding when the handle's timeout escalated them
    /// (whether they then completed, were aborted, or wedged the handle).
    pub timeouts: u64,
    /// Doorbell writes: a controller's submission-tail and completion-head
    /// registers (shadow-doorbell updates that needed none are not
    /// counted), or the kernel path's submissions to its ring.
    pub doorbell_writes: u64,
    /// Waits on the queue's interrupt that it woke (0 for a polled queue).
    pub interrupts: u64,
    /// Commands whose data the queue copied through memory of its own
    /// because the device could not be given the caller's: NVMe/RDMA, for
    /// memory not registered with the RDMA device (a buffer not registered
    /// with the driver, say). 0 where the device always reaches the
    /// caller's memory or never does (NVMe/TCP, the kernel path).
    pub copied: u64,
    /// The kernel path: reads served, in whole or in part, from the page
    /// cache without waiting for the disk (see [`CachePolicy`](crate::CachePolicy)).
    pub cache_hits: u64,
    /// The kernel path: reads that tried the page cache and found nothing
    /// there (then read from the disk).
    pub cache_misses: u64,
}

/// The latencies of one I/O queue pair's commands since the handle opened,
/// when it is traced ([`Handle::queue_latency`](crate::Handle::queue_latency)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueLatency {
    /// Queue id.
    pub qid: u16,
    /// What it is for.
    pub role: QueueRole,
    /// From staging each command to consuming its completion.
    pub latency: LatencyHistogram,
}

/// One I/O queue pair's trace ([`Handle::trace`](crate::Handle::trace)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueTrace {
    /// Queue id.
    pub qid: u16,
    /// What it is for.
    pub role: QueueRole,
    /// Its last completed commands, oldest first, then those outstanding.
    pub events: Vec<TraceEvent>,
}

impl QueueStats {
    /// The sum of several queues' figures (`qid` 0 and `role` of the first).
    pub fn total<'a>(stats: impl IntoIterator<Item = &'a QueueStats>) -> Option<QueueStats> {
        stats.into_iter().copied().reduce(|a, b| QueueStats {
            qid: 0,
            role: a.role,
            submitted: a.submitted + b.submitted,
            completed: a.completed + b.completed,
            in_flight: a.in_flight + b.in_flight,
            bytes_read: a.bytes_read + b.bytes_read,
            bytes_written: a.bytes_written + b.bytes_written,
            errors: a.errors + b.errors,
            timeouts: a.timeouts + b.timeouts,
            doorbell_writes: a.doorbell_writes + b.doorbell_writes,
            interrupts: a.interrupts + b.interrupts,
            copied: a.copied + b.copied,
            cache_hits: a.cache_hits + b.cache_hits,
            cache_misses: a.cache_misses + b.cache_misses,
        })
    }
}

/// How often the file is rewritten.
pub const PERIOD: Duration = Duration::from_millis(200);

/// The first line's tag and the format's version.
pub const MAGIC: &str = "ugds-stats 1";

/// What the handle's queues have done, from their counters.
pub(crate) fn queue_stats(queues: &[QueueInfo], counters: &[Arc<QueueCounters>], block_size: u64) -> Vec<QueueStats> {
    queues
        .iter()
        .zip(counters)
        .map(|(q, c)| {
            let (submitted, completed) = (c.submitted.get(), c.completed.get());
            QueueStats {
                qid: q.qid,
                role: q.role,
                submitted,
                completed,
                in_flight: submitted.saturating_sub(completed),
                bytes_read: c.blocks_read.get() * block_size,
                bytes_written: c.blocks_written.get() * block_size,
                errors: c.errors.get(),
                timeouts: c.timeouts.get(),
                doorbell_writes: c.doorbell_writes.get(),
                interrupts: c.interrupts.get(),
                copied: c.copied.get(),
                cache_hits: c.cache_hits.get(),
                cache_misses: c.cache_misses.get(),
            }
        })
        .collect()
}

/// The name a role has in the file.
pub fn role_name(r: QueueRole) -> &'static str {
    match r {
        QueueRole::Sync => "sync",
        QueueRole::Batch => "batch",
        QueueRole::Lendable => "lendable",
    }
}

/// A queue's latencies as published (a traced handle's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishedLatency {
    /// Commands counted.
    pub commands: u64,
    /// Median, in nanoseconds (a bucket's upper bound).
    pub p50_ns: u64,
    /// 99th percentile, in nanoseconds.
    pub p99_ns: u64,
    /// The largest, in nanoseconds.
    pub max_ns: u64,
}

/// The latencies of the queues whose counters have a histogram, in order.
pub(crate) fn latencies(counters: &[Arc<QueueCounters>]) -> Vec<Option<PublishedLatency>> {
    counters
        .iter()
        .map(|c| {
            let h = c.latency.get()?.snapshot();
            let q = |x| h.quantile(x).map_or(0, |d| d.as_nanos() as u64);
            Some(PublishedLatency { commands: h.count(), p50_ns: q(0.5), p99_ns: q(0.99), max_ns: q(1.0) })
        })
        .collect()
}

/// The file's text for `stats` (and `latency`, by queue, where traced).
pub(crate) fn render(pid: u32, handle: u64, stats: &[QueueStats], latency: &[Option<PublishedLatency>]) -> String {
    let ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let mut s = format!("{MAGIC} pid={pid} handle={handle} time_ms={ms}\n");
    for (i, q) in stats.iter().enumerate() {
        s += &format!(
            "queue qid={} role={} submitted={} completed={} in_flight={} bytes_read={} bytes_written={} errors={} \
             timeouts={} doorbell_writes={} interrupts={} copied={} cache_hits={} cache_misses={}",
            q.qid,
            role_name(q.role),
            q.submitted,
            q.completed,
            q.in_flight,
            q.bytes_read,
            q.bytes_written,
            q.errors,
            q.timeouts,
            q.doorbell_writes,
            q.interrupts,
            q.copied,
            q.cache_hits,
            q.cache_misses
        );
        if let Some(Some(l)) = latency.get(i) {
            s += &format!(
                " lat_n={} lat_p50_ns={} lat_p99_ns={} lat_max_ns={}",
                l.commands, l.p50_ns, l.p99_ns, l.max_ns
            );
        }
        s += "\n";
    }
    s
}

/// One published file, read back (by `ugds stats` and `ugds top`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Published {
    /// The publishing process.
    pub pid: u32,
    /// The handle's id in it.
    pub handle: u64,
    /// When it was written, in milliseconds since the Unix epoch.
    pub time_ms: u128,
    /// Its queues.
    pub queues: Vec<QueueStats>,
    /// Their latencies, in the same order, where the handle traces.
    pub latency: Vec<Option<PublishedLatency>>,
}

/// Reads a published file's text; `None` when it is not one.
pub fn parse(text: &str) -> Option<Published> {
    let mut lines = text.lines();
    let head = lines.next()?.strip_prefix(MAGIC)?;
    let field = |line: &str, k: &str| -> Option<String> {
        line.split(' ').find_map(|w| w.strip_prefix(k)?.strip_prefix('=')).map(str::to_string)
    };
    let mut p = Published {
        pid: field(head, "pid")?.parse().ok()?,
        handle: field(head, "handle")?.parse().ok()?,
        time_ms: field(head, "time_ms")?.parse().ok()?,
        queues: Vec::new(),
        latency: Vec::new(),
    };
    for l in lines.filter(|l| l.starts_with("queue ")) {
        let n = |k: &str| field(l, k)?.parse::<u64>().ok();
        p.queues.push(QueueStats {
            qid: field(l, "qid")?.parse().ok()?,
            role: match field(l, "role")?.as_str() {
                "sync" => QueueRole::Sync,
                "batch" => QueueRole::Batch,
                "lendable" => QueueRole::Lendable,
                _ => return None,
            },
            submitted: n("submitted")?,
            completed: n("completed")?,
            in_flight: n("in_flight")?,
            bytes_read: n("bytes_read")?,
            bytes_written: n("bytes_written")?,
            errors: n("errors")?,
            timeouts: n("timeouts")?,
            doorbell_writes: n("doorbell_writes")?,
            interrupts: n("interrupts")?,
            // Not in files written before it was counted.
            copied: n("copied").unwrap_or(0),
            cache_hits: n("cache_hits").unwrap_or(0),
            cache_misses: n("cache_misses").unwrap_or(0),
        });
        p.latency.push(n("lat_n").map(|commands| PublishedLatency {
            commands,
            p50_ns: n("lat_p50_ns").unwrap_or(0),
            p99_ns: n("lat_p99_ns").unwrap_or(0),
            max_ns: n("lat_max_ns").unwrap_or(0),
        }));
    }
    Some(p)
}

/// The publishing thread of one handle; stopping it removes the file.
pub(crate) struct Publisher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl Publisher {
    /// Starts publishing to `dir` (which must exist); the first file is in
    /// place when this returns.
    pub(crate) fn start(
        dir: &Path,
        handle: u64,
        queues: Vec<QueueInfo>,
        counters: Vec<Arc<QueueCounters>>,
        block_size: u64,
    ) -> std::io::Result<Publisher> {
        let pid = std::process::id();
        let path = dir.join(format!("ugds-{pid}-{handle}.stats"));
        let tmp = dir.join(format!(".ugds-{pid}-{handle}.stats.tmp"));
        let write = move || -> std::io::Result<()> {
            let stats = queue_stats(&queues, &counters, block_size);
            std::fs::write(&tmp, render(pid, handle, &stats, &latencies(&counters)))?;
            std::fs::rename(&tmp, dir_file(&tmp))
        };
        write()?;
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::Builder::new().name(format!("ugds-stats-{handle}")).spawn(move || {
            while !halt.load(Ordering::Acquire) {
                std::thread::park_timeout(PERIOD);
                if let Err(e) = write() {
                    tracing::warn!("publishing statistics: {e}; stopped");
                    return;
                }
            }
        })?;
        Ok(Publisher { stop, thread: Some(thread), path })
    }
}

/// `DIR/.ugds-P-H.stats.tmp` -> `DIR/ugds-P-H.stats`.
fn dir_file(tmp: &Path) -> PathBuf {
    let name = tmp.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    tmp.with_file_name(name.trim_start_matches('.').trim_end_matches(".tmp"))
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_names_each_queue_and_its_counts() {
        let q = QueueInfo { qid: 2, role: QueueRole::Lendable, vector: None, entries: 64, vector_shared_with: 0 };
        let c = Arc::new(QueueCounters::default());
        c.completed.add(3);
        c.doorbell_writes.add(1);
        let text =
            render(7, 9, &queue_stats(&[q], std::slice::from_ref(&c), 512), &latencies(std::slice::from_ref(&c)));
        let mut lines = text.lines();
        assert!(lines.next().unwrap().starts_with("ugds-stats 1 pid=7 handle=9 time_ms="));
        let l = lines.next().unwrap();
        for f in ["qid=2", "role=lendable", "completed=3", "doorbell_writes=1", "in_flight=0"] {
            assert!(l.split(' ').any(|w| w == f), "{f} in {l}");
        }
        assert_eq!(dir_file(Path::new("/d/.ugds-7-9.stats.tmp")), Path::new("/d/ugds-7-9.stats"));
        let back = parse(&text).unwrap();
        assert_eq!((back.pid, back.handle, back.queues.len()), (7, 9, 1));
        assert_eq!((back.queues[0].qid, back.queues[0].role, back.queues[0].completed), (2, QueueRole::Lendable, 3));
        assert_eq!(back.latency, [None], "not traced");
        // Traced: the latencies ride on the queue's line.
        let h = Arc::new(crate::engine::trace::Histogram::default());
        for ns in [1_000, 2_000, 400_000] {
            h.record(ns);
        }
        let _ = c.latency.set(h);
        let text =
            render(7, 9, &queue_stats(&[q], std::slice::from_ref(&c), 512), &latencies(std::slice::from_ref(&c)));
        let l = parse(&text).unwrap().latency[0].expect("published");
        assert_eq!(l.commands, 3);
        assert!((2_000..2_500).contains(&l.p50_ns) && (400_000..500_000).contains(&l.max_ns), "{l:?}");
        assert!(parse("something else\n").is_none());
        assert!(parse("ugds-stats 1 pid=x handle=1 time_ms=0\n").is_none());
    }
}
