//! Modes (`HandleOptions::mode`): how each synchronous request is waited
//! for and paced, read back from the queues' statistics and traces.

mod common;
use common::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ugds::mode::{Adaptive, Latency, Mode, ModeRequest, Plan, Prioritized, Throughput};
use ugds::{Completion, Priority, QueueRole, QueueStats, TraceEvent};
use ugds_emu::LatencyModel;

const READ: u8 = 0x02;

fn sync_total(h: &ugds::Handle) -> QueueStats {
    let s = h.queue_stats();
    QueueStats::total(s.iter().filter(|s| s.role == QueueRole::Sync)).unwrap()
}

/// Throughput mode sleeps on interrupts (the queues got vectors although
/// the handle's completion is polling); a handle without a mode polls. The
/// data is right either way. (Commands take 5 ms: a caller preempted that
/// long between submitting and waiting finds its completion and does not
/// sleep, so at least 3 of the 5 are asked to sleep.)
#[test]
fn throughput_mode_sleeps_and_the_default_polls() {
    let model = LatencyModel::new(Duration::from_millis(5), 0);
    for mode in [Some(Arc::new(Throughput) as Arc<dyn Mode>), None] {
        let sleeps = mode.is_some();
        let (d, h, _emu) = open(small_emu().latency(Some(model)), opts().mode(mode));
        assert_eq!(h.queues().iter().filter(|q| q.role == QueueRole::Sync).all(|q| q.vector.is_some()), sleeps);
        let mut b = Buf::new(&d, 256 << 10);
        b.mem.copy_from_slice(&pattern(7, 0, 256 << 10));
        h.write(&b.token, 256 << 10, 0, 0).unwrap();
        b.mem.fill(0);
        for _ in 0..4 {
            h.read(&b.token, 256 << 10, 0, 0).unwrap();
        }
        assert!(b.mem[..] == pattern(7, 0, 256 << 10)[..]);
        let t = sync_total(&h);
        if sleeps {
            assert!(t.interrupts >= 3, "throughput mode: {} interrupt wake-ups for 5 requests", t.interrupts);
        } else {
            assert_eq!(t.interrupts, 0, "no mode: polled");
        }
        assert_eq!(h.interrupt_wakeups_lost(), 0);
    }
}

/// The adaptive mode fed given service times (by size, and whether the
/// request polled) in place of those measured, so that what it decides
/// does not depend on this machine's load (tests run beside others, and a
/// preempted thread's 40 us read takes milliseconds); what the engine does
/// with its plans is real. Keeps the measured times too.
#[derive(Debug)]
struct GivenTimes {
    adaptive: Adaptive,
    time: fn(usize, bool) -> Duration,
    measured: Mutex<Vec<(usize, Duration)>>,
}

impl GivenTimes {
    fn new(adaptive: Adaptive, time: fn(usize, bool) -> Duration) -> Arc<GivenTimes> {
        Arc::new(GivenTimes { adaptive, time, measured: Mutex::default() })
    }
}

impl Mode for GivenTimes {
    fn name(&self) -> &str {
        "given-times"
    }
    fn interrupts(&self) -> bool {
        true
    }
    fn plan(&self, req: &ModeRequest) -> Plan {
        self.adaptive.plan(req)
    }
    fn observe(&self, req: &ModeRequest, plan: &Plan, took: Duration) {
        self.measured.lock().unwrap().push((req.bytes, took));
        let polled = plan.completion == Completion::Poll;
        self.adaptive.observe(req, plan, (self.time)(req.bytes, polled));
    }
}

/// Adaptive mode on a device that moves 100 MB/s: 4 KiB reads (about 40 us)
/// keep polling, 1 MiB reads (about 10 ms) go to sleep on interrupts (after
/// four in a row), and only they wake from interrupts.
#[test]
fn adaptive_mode_sleeps_for_the_slow_size_only() {
    let model = LatencyModel::new(Duration::ZERO, 100_000_000);
    let mode = GivenTimes::new(Adaptive::new(Duration::from_millis(1), Duration::from_millis(2)), |bytes, _| {
        Duration::from_micros(bytes as u64 / 100)
    });
    let (d, h, _emu) = open(small_emu().latency(Some(model)), opts().mode(Some(mode.clone())));
    let adaptive = &mode.adaptive;
    let b = Buf::new(&d, 1 << 20);
    for i in 0..40 {
        h.read(&b.token, 4096, i * 4096, 0).unwrap();
    }
    assert!(!adaptive.sleeps(4096), "4 KiB reads: {:?} on average", adaptive.average(4096));
    assert_eq!(sync_total(&h).interrupts, 0, "polled so far");
    for _ in 0..24 {
        h.read(&b.token, 1 << 20, 0, 0).unwrap();
    }
    assert!(adaptive.sleeps(1 << 20), "1 MiB reads: {:?} on average", adaptive.average(1 << 20));
    let measured = mode.measured.lock().unwrap().clone();
    let slowest = measured.iter().filter(|m| m.0 == 1 << 20).map(|m| m.1).min().unwrap();
    assert!(slowest >= Duration::from_millis(9), "{slowest:?} measured for 1 MiB at 100 MB/s");
    let woken = sync_total(&h).interrupts;
    assert!(woken >= 12, "the 1 MiB reads after the switch sleep: {woken} woken");
    for i in 0..20 {
        h.read(&b.token, 4096, i * 4096, 0).unwrap();
    }
    assert_eq!(sync_total(&h).interrupts, woken, "4 KiB reads still poll");
    assert_eq!(h.interrupt_wakeups_lost(), 0);
}

/// The most commands of `trace`'s reads of `blocks` blocks on the device at once.
fn most_at_once(trace: &[TraceEvent], blocks: u32) -> usize {
    let reads: Vec<&TraceEvent> = trace.iter().filter(|e| e.opcode == READ && e.blocks == blocks).collect();
    let on = |e: &TraceEvent, t: Duration| e.submitted <= t && e.completed.is_none_or(|c| c > t);
    reads.iter().map(|a| reads.iter().filter(|x| on(x, a.submitted)).count()).max().unwrap_or(0)
}

/// Latency mode keeps a lone large read's commands two at a time (its
/// `chunk_bytes`, 256 KiB of 128 KiB commands) where the scheduler alone,
/// with nothing else on the handle, puts all of them on the device.
#[test]
fn latency_mode_keeps_queues_shallow() {
    let model = LatencyModel::new(Duration::from_micros(200), 0);
    for (mode, most) in [(Some(Arc::new(Latency) as Arc<dyn Mode>), 2), (None, 8)] {
        let o = opts().trace(64).mode(mode.clone());
        let (d, h, _emu) = open(small_emu().mdts(5).latency(Some(model)), o);
        let b = Buf::new(&d, 1 << 20);
        h.read(&b.token, 1 << 20, 0, 0).unwrap();
        let trace: Vec<TraceEvent> = h.trace().into_iter().flat_map(|t| t.events).collect();
        let name = mode.map_or("none".to_string(), |m| m.name().to_string());
        assert_eq!(most_at_once(&trace, 256), most, "mode {name}: 128 KiB commands on the device at once");
    }
}

/// Commands submitted on the synchronous queues with an interrupt vector
/// (`true`) or without.
fn submitted_on(h: &ugds::Handle, vector: bool) -> u64 {
    let with: Vec<u16> = h
        .queues()
        .iter()
        .filter(|q| q.role == QueueRole::Sync && q.vector.is_some() == vector)
        .map(|q| q.qid)
        .collect();
    h.queue_stats().iter().filter(|s| with.contains(&s.qid)).map(|s| s.submitted).sum()
}

/// Priority mode: background requests sleep, latency-critical ones poll,
/// each on synchronous queues of their own kind (a mode that does both gets
/// queues without a vector for polling: they raise no interrupt).
#[test]
fn priority_mode_sleeps_for_background_requests_only() {
    let model = LatencyModel::new(Duration::from_millis(5), 0);
    let (d, h, _emu) = open(small_emu().latency(Some(model)), opts().mode(Some(Arc::new(Prioritized))));
    let sync: Vec<_> = h.queues().iter().filter(|q| q.role == QueueRole::Sync).map(|q| q.vector.is_some()).collect();
    assert_eq!(sync, [true, true, false, false], "two queues of each kind");
    assert_eq!(h.queue_counts(), (4, 2), "asked of the controller: the lendable queues stay");
    // One synchronous queue, nothing else (as `ugds bench --modes` asks):
    // still one of each kind (a controller grants what is asked).
    let one = opts().sync_queues(1).async_queues(0).batch_queue(false).mode(Some(Arc::new(Prioritized)));
    let (_d2, h2, _e2) = open(small_emu(), one);
    let kinds: Vec<_> = h2.queues().iter().map(|q| (q.role, q.vector.is_some())).collect();
    assert_eq!(kinds, [(QueueRole::Sync, true), (QueueRole::Sync, false)]);
    let b = Buf::new(&d, 65536);
    for _ in 0..5 {
        h.read_with_priority(&b.token, 65536, 0, 0, Priority::Critical).unwrap();
    }
    assert_eq!(sync_total(&h).interrupts, 0);
    assert_eq!((submitted_on(&h, false), submitted_on(&h, true)), (5, 0), "polled requests on the polled queues");
    for _ in 0..5 {
        h.read_with_priority(&b.token, 65536, 0, 0, Priority::Background).unwrap();
    }
    assert!(sync_total(&h).interrupts >= 3);
    assert_eq!((submitted_on(&h, false), submitted_on(&h, true)), (5, 5), "sleeping requests on the others");
}

/// A mode of the caller's own: it sees each request's size, direction and
/// class, and its plan is followed (it asks for measurement of writes only,
/// and gets exactly those).
#[derive(Debug, Default)]
struct Recorder {
    seen: Mutex<Vec<(usize, bool, Priority)>>,
    observed: Mutex<Vec<(usize, Duration)>>,
}

impl Mode for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    fn interrupts(&self) -> bool {
        true
    }
    fn plan(&self, req: &ModeRequest) -> Plan {
        self.seen.lock().unwrap().push((req.bytes, req.write, req.priority));
        let c = if req.write { Completion::Interrupt } else { Completion::Poll };
        Plan::new(req).completion(c).measure(req.write)
    }
    fn observe(&self, req: &ModeRequest, _plan: &Plan, took: Duration) {
        self.observed.lock().unwrap().push((req.bytes, took));
    }
}

#[test]
fn a_user_mode_plans_every_synchronous_request() {
    let model = LatencyModel::new(Duration::from_millis(5), 0);
    let rec = Arc::new(Recorder::default());
    let (d, h, _emu) = open(small_emu().latency(Some(model)), opts().mode(Some(rec.clone())));
    let b = Buf::new(&d, 65536);
    h.write(&b.token, 8192, 0, 0).unwrap();
    h.read_with_priority(&b.token, 4096, 0, 0, Priority::Background).unwrap();
    let segs = [ugds::Segment::new(&b.token, 0, 4096), ugds::Segment::new(&b.token, 8192, 4096)];
    h.readv(&segs, 0).unwrap();
    assert_eq!(
        *rec.seen.lock().unwrap(),
        [(8192, true, Priority::Normal), (4096, false, Priority::Background), (8192, false, Priority::Normal)]
    );
    let observed = rec.observed.lock().unwrap().clone();
    assert_eq!(observed.len(), 1, "only the write asked to be measured");
    assert!(observed[0].1 >= Duration::from_millis(5), "{:?} for a 5 ms command", observed[0].1);
    assert!(sync_total(&h).interrupts >= 1, "the write slept");
}

/// A fast class put to sleep (by a cold start, say: here by hand) comes
/// back to polling through its probes, although a sleeping request takes
/// longer than `to_polling` (given: 20 us polled, 120 us with a VM's
/// wake-up); most requests after that poll.
#[test]
fn adaptive_mode_wakes_a_fast_class_that_fell_asleep() {
    let mode = GivenTimes::new(Adaptive::default(), |_, polled| Duration::from_micros(if polled { 20 } else { 120 }));
    let (d, h, _emu) = open(small_emu(), opts().mode(Some(mode.clone())));
    let b = Buf::new(&d, 65536);
    let adaptive = &mode.adaptive;
    for _ in 0..4 {
        adaptive.record(4096, Duration::from_millis(1), true);
    }
    assert!(adaptive.sleeps(4096));
    let mut slept_reads = 0;
    for i in 0..400 {
        let before = sync_total(&h).interrupts;
        h.read(&b.token, 4096, (i % 16) * 4096, 0).unwrap();
        slept_reads += (sync_total(&h).interrupts > before) as u32;
    }
    assert!(!adaptive.sleeps(4096), "back to polling: average {:?}", adaptive.average(4096));
    assert!(slept_reads < 200, "{slept_reads} of 400 reads slept");
}
