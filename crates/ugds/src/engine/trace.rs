//! Command lifecycle tracing and latency histograms: opt-in, per queue pair
//! (`HandleOptions::trace`).
//!
//! A traced queue pair reads the clock when it stages a command and when
//! it consumes the command's completion. The latency goes into a histogram
//! of single-writer counters (see [`super::stats`]) that any thread may
//! read; the command (opcode, CID, LBA, blocks, both times, status) goes
//! into a ring of the last `depth` completed commands, which the queue's
//! owner reads (under the queue's lock, or the lent queue's borrower) along
//! with the commands still outstanding. A queue pair that is not traced
//! pays one branch per command.

use super::counter::Counter;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds_nvme::{Cid, Status};

/// Buckets: four per power of two of nanoseconds (the first four hold 0-3 ns).
const BUCKETS: usize = 252;

/// The bucket of `ns`: four per power of two, so a bucket's upper bound is
/// at most 25% above its lower bound.
#[inline]
fn bucket(ns: u64) -> usize {
    if ns < 4 {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros() as usize;
    (e - 1) * 4 + ((ns >> (e - 2)) & 3) as usize
}

/// The smallest latency in bucket `b`, in nanoseconds.
fn bucket_floor(b: usize) -> u64 {
    if b < 4 {
        return b as u64;
    }
    let (e, sub) = (b / 4 + 1, (b % 4) as u64);
    (4 + sub) << (e - 2)
}

/// A latency histogram written by one queue pair's user (see the module docs).
#[derive(Debug)]
pub struct Histogram {
    buckets: Box<[Counter]>,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram { buckets: (0..BUCKETS).map(|_| Counter::default()).collect() }
    }
}

impl Histogram {
    /// Counts one command of `ns` nanoseconds.
    #[inline]
    pub fn record(&self, ns: u64) {
        self.buckets[bucket(ns)].add(1);
    }

    /// The counts now.
    pub fn snapshot(&self) -> LatencyHistogram {
        LatencyHistogram { counts: self.buckets.iter().map(Counter::get).collect() }
    }
}

/// The latencies of a queue pair's commands, from staging to the
/// consumption of their completion: a copy of its histogram.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
}

impl LatencyHistogram {
    /// Commands counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The latency at or below which a fraction `q` (0 to 1) of the
    /// commands completed: the upper bound of its bucket (buckets are 25%
    /// wide). `None` when nothing was counted.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let upper = if b + 1 < BUCKETS { bucket_floor(b + 1) - 1 } else { u64::MAX };
                return Some(Duration::from_nanos(upper));
            }
        }
        None
    }

    /// The non-empty buckets: (lowest, highest latency in it, commands).
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, Duration, u64)> + '_ {
        self.counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(b, &c)| {
            let upper = if b + 1 < BUCKETS { bucket_floor(b + 1) - 1 } else { u64::MAX };
            (Duration::from_nanos(bucket_floor(b)), Duration::from_nanos(upper), c)
        })
    }

    /// Adds another histogram's counts (queues to a handle's total).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }
}

/// One command in a queue pair's trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Its command identifier.
    pub cid: u16,
    /// Its NVM opcode (0x02 Read, 0x01 Write, 0x00 Flush, ...).
    pub opcode: u8,
    /// Its first logical block.
    pub slba: u64,
    /// Its logical blocks (0 for commands that move none).
    pub blocks: u32,
    /// When it was staged, from the handle's opening.
    pub submitted: Duration,
    /// When its completion was consumed; `None` while outstanding.
    pub completed: Option<Duration>,
    /// Its completion's status; `None` while outstanding.
    pub status: Option<Status>,
}

impl std::fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = match self.opcode {
            0x00 => "Flush",
            0x01 => "Write",
            0x02 => "Read",
            0x08 => "WriteZeroes",
            0x09 => "DSM",
            _ => "opcode",
        };
        write!(
            f,
            "cid {:5} {op:<11} {:#04x} lba {} blocks {} at {:?}",
            self.cid, self.opcode, self.slba, self.blocks, self.submitted
        )?;
        match (self.completed, self.status) {
            (Some(c), Some(s)) => write!(f, " done after {:?}: {s}", c.saturating_sub(self.submitted)),
            _ => write!(f, " outstanding"),
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Staged {
    opcode: u8,
    slba: u64,
    blocks: u32,
    at: u64,
}

/// A queue pair's trace: kept by its tracker (see the module docs).
pub struct Trace {
    base: Instant,
    /// The commands in flight, by CID slot.
    staged: Box<[Staged]>,
    /// The last completed commands, oldest at `next` once the ring is full.
    ring: Box<[TraceEvent]>,
    next: usize,
    filled: bool,
    latency: Arc<Histogram>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace").field("depth", &self.ring.len()).finish_non_exhaustive()
    }
}

impl Trace {
    /// A trace of the last `depth` commands (at least one) of a queue with
    /// `slots` CID slots, timed from `base`, counting latencies into `latency`.
    pub fn new(depth: usize, slots: usize, base: Instant, latency: Arc<Histogram>) -> Trace {
        let blank = TraceEvent {
            cid: 0,
            opcode: 0,
            slba: 0,
            blocks: 0,
            submitted: Duration::ZERO,
            completed: None,
            status: None,
        };
        Trace {
            base,
            staged: vec![Staged::default(); slots].into_boxed_slice(),
            ring: vec![blank; depth.max(1)].into_boxed_slice(),
            next: 0,
            filled: false,
            latency,
        }
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// Notes the command in CID slot `slot` as staged now (out of line:
    /// an untraced queue's request path keeps only the branch to it).
    #[cold]
    #[inline(never)]
    pub fn staged(&mut self, slot: usize, op: u8, slba: u64, blocks: u32) {
        let at = self.now();
        // Read, Write, Compare, Write Zeroes name blocks; others do not.
        let (slba, blocks) = if matches!(op, 0x01 | 0x02 | 0x05 | 0x08) { (slba, blocks) } else { (0, 0) };
        self.staged[slot] = Staged { opcode: op, slba, blocks, at };
    }

    /// Notes the command in CID slot `slot` (CID `cid`) as completed now
    /// with status field `status` (out of line, as `staged`).
    #[cold]
    #[inline(never)]
    pub fn completed(&mut self, slot: usize, cid: Cid, status: u16) {
        let now = self.now();
        let s = self.staged[slot];
        self.latency.record(now.saturating_sub(s.at));
        self.ring[self.next] = TraceEvent {
            cid: cid.0,
            opcode: s.opcode,
            slba: s.slba,
            blocks: s.blocks,
            submitted: Duration::from_nanos(s.at),
            completed: Some(Duration::from_nanos(now)),
            status: Some(Status::from_field(status)),
        };
        self.next += 1;
        if self.next == self.ring.len() {
            self.next = 0;
            self.filled = true;
        }
    }

    /// The completed commands, oldest first, then `outstanding` (CID and
    /// slot of each command in flight) by staging time.
    pub fn events(&self, outstanding: impl Iterator<Item = (Cid, usize)>) -> Vec<TraceEvent> {
        let mut v: Vec<TraceEvent> = if self.filled {
            self.ring[self.next..].iter().chain(&self.ring[..self.next]).copied().collect()
        } else {
            self.ring[..self.next].to_vec()
        };
        let mut open: Vec<TraceEvent> = outstanding
            .map(|(cid, slot)| {
                let s = self.staged[slot];
                TraceEvent {
                    cid: cid.0,
                    opcode: s.opcode,
                    slba: s.slba,
                    blocks: s.blocks,
                    submitted: Duration::from_nanos(s.at),
                    completed: None,
                    status: None,
                }
            })
            .collect();
        open.sort_by_key(|e| e.submitted);
        v.extend(open);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_a_quarter_wide() {
        assert_eq!((0..4).map(bucket).collect::<Vec<_>>(), [0, 1, 2, 3]);
        for b in 0..BUCKETS - 1 {
            let (lo, hi) = (bucket_floor(b), bucket_floor(b + 1) - 1);
            assert_eq!((bucket(lo), bucket(hi)), (b, b), "bucket {b}: {lo}..={hi}");
            assert!(b < 8 || (hi - lo + 1) * 4 <= lo, "bucket {b} wider than a quarter of {lo}");
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_come_from_the_bucket_that_holds_them() {
        let h = Histogram::default();
        assert_eq!(h.snapshot().quantile(0.5), None);
        for _ in 0..90 {
            h.record(10_000);
        }
        for _ in 0..10 {
            h.record(1_000_000);
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 100);
        let p50 = s.quantile(0.5).unwrap().as_nanos() as u64;
        assert!((10_000..12_500).contains(&p50), "{p50}");
        let p90 = s.quantile(0.9).unwrap().as_nanos() as u64;
        assert!((10_000..12_500).contains(&p90), "{p90}");
        let p99 = s.quantile(0.99).unwrap().as_nanos() as u64;
        assert!((1_000_000..1_250_000).contains(&p99), "{p99}");
        let mut m = s.clone();
        m.merge(&s);
        assert_eq!(m.count(), 200);
        assert_eq!(m.buckets().map(|(_, _, c)| c).collect::<Vec<_>>(), [180, 20]);
    }

    #[test]
    fn the_ring_keeps_the_last_commands_oldest_first() {
        let mut t = Trace::new(3, 4, Instant::now(), Arc::default());
        for i in 0..5u16 {
            t.staged(i as usize % 4, 0x02, 100, 8);
            let status = if i == 4 { Status::generic(0x81) } else { Status::SUCCESS };
            t.completed(i as usize % 4, Cid(i), status.to_field(true));
        }
        t.staged(1, 0x01, 7, 1);
        t.staged(2, 0x00, 5, 3);
        let ev = t.events([(Cid(9), 1), (Cid(10), 2)].into_iter());
        assert_eq!(ev.iter().map(|e| e.cid).collect::<Vec<_>>(), [2, 3, 4, 9, 10]);
        assert_eq!((ev[4].opcode, ev[4].slba, ev[4].blocks), (0x00, 0, 0), "a Flush names no blocks");
        assert_eq!((ev[2].status, ev[2].slba, ev[2].blocks, ev[2].opcode), (Some(Status::generic(0x81)), 100, 8, 0x02));
        assert_eq!((ev[3].status, ev[3].completed, ev[3].slba, ev[3].opcode), (None, None, 7, 0x01));
        assert!(ev.windows(2).all(|w| w[0].submitted <= w[1].submitted));
        assert_eq!(t.latency.snapshot().count(), 5);
    }
}
