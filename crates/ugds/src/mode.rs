//! Modes: how a handle serves each synchronous request.
//!
//! A [`Mode`] is asked once per request, before it is placed, for a
//! [`Plan`]: whether its caller spins on the completion queue or sleeps on
//! the queue's interrupt, how many of its commands may be on the device at
//! once, and its class for the scheduler. It may ask to be told how long the
//! request took ([`Mode::observe`]), which is how [`Adaptive`] learns. Four
//! come with the library, by name ([`mode_by_name`]):
//!
//! - `latency` ([`Latency`]): polling, shallow queues (a request keeps at
//!   most the handle's `chunk_bytes` on the device, always), so that no
//!   request waits behind much.
//! - `throughput` ([`Throughput`]): deep queues (every command of a request
//!   on the device at once, one doorbell write for all) and interrupt
//!   completion: the caller sleeps, its CPU free for other work.
//! - `priority` ([`Prioritized`]): each request served as its
//!   [`Priority`] says: latency-critical ones poll and are never held back,
//!   normal ones poll and interleave, background ones sleep on interrupts
//!   and keep one command on the device while other work is on the handle.
//! - `adaptive` ([`Adaptive`]): polls or sleeps by what it measures: per
//!   request size (powers of two), the service time of the handle's
//!   requests under the load they meet, with hysteresis.
//!
//! A handle without a mode (the default) serves every request as
//! [`HandleOptions::completion`](crate::HandleOptions::completion) says,
//! with the scheduler's interleaving, and asks nothing per request. A
//! handle with a mode gives its synchronous queues interrupt vectors when
//! [`Mode::interrupts`] says so (a queue without a vector polls whatever
//! the plan says). Batch contexts, stream-ordered I/O and lent
//! [`IoQueue`](crate::IoQueue)s are not served through the mode.

use crate::engine::Completion;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use ugds_platform::{Error, Result};

/// A request's class: what its large transfers yield to (see `handle::scheduler`'s docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Priority {
    /// Never held back; large normal and background requests make room for it.
    Critical,
    /// Held back, when large, while a latency-critical synchronous request,
    /// or a normal one of at most the handle's `chunk_bytes`, is on the handle.
    #[default]
    Normal,
    /// Held back, when large, while any synchronous request that is not
    /// background is on the handle.
    Background,
}

/// What a mode is told of a request before it is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModeRequest {
    /// Bytes it moves.
    pub bytes: usize,
    /// A write (else a read).
    pub write: bool,
    /// The class its caller gave it.
    pub priority: Priority,
}

/// How many of a request's commands may be on the device at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Depth {
    /// As the scheduler says: a large request keeps at most the handle's
    /// `chunk_bytes` on the device while other work waits.
    #[default]
    Scheduler,
    /// At most `chunk_bytes` (whole commands, at least one), always.
    Shallow,
    /// Every command at once, whatever waits.
    Deep,
}

/// What a mode decides for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Plan {
    /// Spin on the completion queue, or sleep on its interrupt.
    pub completion: Completion,
    /// How many of its commands may be on the device at once.
    pub depth: Depth,
    /// Its class for the scheduler (what it yields to, what yields to it).
    pub priority: Priority,
    /// Measure the request's service time and pass it to
    /// [`Mode::observe`] (two clock reads).
    pub measure: bool,
}

impl Plan {
    /// Polling, the scheduler's depth, the request's own class, unmeasured.
    pub fn new(req: &ModeRequest) -> Plan {
        Plan { completion: Completion::Poll, depth: Depth::Scheduler, priority: req.priority, measure: false }
    }

    /// Sets how the caller waits.
    pub fn completion(mut self, completion: Completion) -> Plan {
        self.completion = completion;
        self
    }

    /// Sets how many commands may be on the device at once.
    pub fn depth(mut self, depth: Depth) -> Plan {
        self.depth = depth;
        self
    }

    /// Sets the class.
    pub fn priority(mut self, priority: Priority) -> Plan {
        self.priority = priority;
        self
    }

    /// Sets whether to measure.
    pub fn measure(mut self, measure: bool) -> Plan {
        self.measure = measure;
        self
    }
}

/// How a handle serves its synchronous requests (see the module docs).
///
/// `plan` is called on the request's own thread before it is placed, from
/// as many threads at once as call the handle: keep it short and free of
/// locks (atomics with relaxed loads and stores, as [`Adaptive`] does).
/// One mode object may serve several handles if its state allows it.
pub trait Mode: Send + Sync + std::fmt::Debug {
    /// Its name (what `ugds bench --mode` and `UGDS_MODE` take for the
    /// built-in ones).
    fn name(&self) -> &str;

    /// Whether its plans may sleep on interrupts: asked once, when a handle
    /// opens, to give the synchronous queues interrupt vectors.
    fn interrupts(&self) -> bool;

    /// Whether its plans may poll (asked with [`interrupts`](Self::interrupts)):
    /// a mode that does both gets synchronous queues of each kind, polled
    /// requests on queues without a vector (which raise no interrupt).
    fn polls(&self) -> bool {
        true
    }

    /// The plan for one request.
    fn plan(&self, req: &ModeRequest) -> Plan;

    /// How long a request whose plan asked to be measured took, from before
    /// it was placed to its last completion consumed (not called when it
    /// failed).
    fn observe(&self, _req: &ModeRequest, _plan: &Plan, _took: Duration) {}
}

/// Polling and shallow queues (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Latency;

impl Mode for Latency {
    fn name(&self) -> &str {
        "latency"
    }
    fn interrupts(&self) -> bool {
        false
    }
    fn plan(&self, req: &ModeRequest) -> Plan {
        Plan::new(req).depth(Depth::Shallow)
    }
}

/// Deep queues and interrupt completion (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Throughput;

impl Mode for Throughput {
    fn name(&self) -> &str {
        "throughput"
    }
    fn interrupts(&self) -> bool {
        true
    }
    fn polls(&self) -> bool {
        false
    }
    fn plan(&self, req: &ModeRequest) -> Plan {
        Plan::new(req).completion(Completion::Interrupt).depth(Depth::Deep)
    }
}

/// Each request served by its class (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Prioritized;

impl Mode for Prioritized {
    fn name(&self) -> &str {
        "priority"
    }
    fn interrupts(&self) -> bool {
        true
    }
    fn plan(&self, req: &ModeRequest) -> Plan {
        match req.priority {
            Priority::Critical => Plan::new(req).depth(Depth::Deep),
            Priority::Normal => Plan::new(req),
            Priority::Background => Plan::new(req).completion(Completion::Interrupt),
        }
    }
}

/// Size classes: up to 4 KiB, 8 KiB, ..., 8 MiB and more.
const CLASSES: usize = 12;

/// One request in this many of each class is measured.
const SAMPLE: u32 = 4;

/// Measured requests in a row beyond a threshold that switch a class.
const STREAK: u32 = 4;

/// A class's first requests, all measured.
const LEARN: u32 = 16;

/// One request in this many of a sleeping class polls, as a probe, while
/// its requests take less than `PROBE_BELOW` times `to_interrupts`; one in
/// `PROBE_RARELY` polls whatever they take.
const PROBE: u32 = 16;
const PROBE_BELOW: u64 = 2;
const PROBE_RARELY: u32 = 256;

/// Polling or interrupts by the service times it measures.
///
/// Requests fall in size classes (powers of two from 4 KiB to 8 MiB); the
/// first 16 requests of a class are measured, then every fourth (so a new
/// class settles after four requests). A class that polls starts
/// sleeping on interrupts once four measured requests in a row took longer
/// than [`to_interrupts`](Self::new) (waits that long leave the CPU more to
/// gain than a wake-up costs) and so did the class's moving average
/// (weight 1/8), and polls again once four in a row took less than
/// `to_polling`; anything between keeps what it does. So a workload
/// near one threshold does not flap, and one request that was slow (its
/// thread preempted, say) changes nothing. A request that sleeps also pays
/// the wake-up, which may itself be more than `to_polling` (tens of
/// microseconds in a VM): while a sleeping class's requests take less than
/// twice `to_interrupts`, every sixteenth one polls, and those probes
/// decide whether it polls again (longer requests are probed once in 256:
/// polling them could hardly win, and would spend the CPU sleeping saves;
/// on QEMU's controller, probing every sixteenth 1 MiB read of 350 us cost
/// a fifth more CPU). What a request takes is its last polled time where
/// that is less than the average of all (a sleeping request's time has the
/// wake-up in it, which on a loaded machine or a VM can be longer than the
/// request itself: the rare probes renew the polled time, so a class of
/// fast requests does not sleep for good behind slow wake-ups). The times
/// are those the handle's requests meet: a class slows down, and sleeps,
/// under load. Every class starts polling.
#[derive(Debug)]
pub struct Adaptive {
    to_interrupts: u64,
    to_polling: u64,
    classes: [Class; CLASSES],
}

#[derive(Debug, Default)]
struct Class {
    sleeps: AtomicBool,
    /// Moving average of the measured service times, in nanoseconds (0: none yet).
    average_ns: AtomicU64,
    /// Requests planned (wraps), for sampling.
    seen: AtomicU32,
    /// Switches between polling and interrupts.
    switches: AtomicU32,
    /// Measured requests in a row beyond the threshold that would switch.
    streak: AtomicU32,
    /// The last measured polled request's time, in nanoseconds (0: none).
    polled_ns: AtomicU64,
}

impl Default for Adaptive {
    /// Interrupts above 100 us, polling again below 50 us.
    fn default() -> Self {
        Adaptive::new(Duration::from_micros(50), Duration::from_micros(100))
    }
}

impl Adaptive {
    /// Sleeps on interrupts once a size class's average service time is
    /// above `to_interrupts`, polls again once it is below `to_polling`
    /// (at most `to_interrupts`).
    pub fn new(to_polling: Duration, to_interrupts: Duration) -> Adaptive {
        let hi = to_interrupts.as_nanos().min(u64::MAX as u128) as u64;
        let lo = (to_polling.as_nanos().min(u64::MAX as u128) as u64).min(hi);
        Adaptive { to_interrupts: hi, to_polling: lo, classes: Default::default() }
    }

    fn class(bytes: usize) -> &'static str {
        const NAMES: [&str; CLASSES] =
            ["4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1m", "2m", "4m", "8m+"];
        NAMES[Self::index(bytes)]
    }

    fn index(bytes: usize) -> usize {
        let b = bytes.max(4096);
        // ceil(log2): 4097..=8192 bytes are the 8 KiB class.
        ((usize::BITS - (b - 1).leading_zeros()) as usize - 12).min(CLASSES - 1)
    }

    /// Whether requests of `bytes` now sleep on interrupts.
    pub fn sleeps(&self, bytes: usize) -> bool {
        self.classes[Self::index(bytes)].sleeps.load(Relaxed)
    }

    /// The moving average (weight 1/8) of the measured service times of
    /// requests of `bytes` (`None` before the first measured one).
    pub fn average(&self, bytes: usize) -> Option<Duration> {
        match self.classes[Self::index(bytes)].average_ns.load(Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// How often requests of `bytes` switched between polling and interrupts.
    pub fn switches(&self, bytes: usize) -> u32 {
        self.classes[Self::index(bytes)].switches.load(Relaxed)
    }

    /// Folds one service time of a request of `bytes` in (what
    /// [`observe`](Mode::observe) does); `polled`: the request polled
    /// (else it slept, and its time includes the wake-up).
    pub fn record(&self, bytes: usize, took: Duration, polled: bool) {
        let c = &self.classes[Self::index(bytes)];
        let t = took.as_nanos().clamp(1, u64::MAX as u128) as u64;
        // Loads and stores, no read-modify-write: threads racing here may
        // lose a sample, which an average can spare.
        let avg = match c.average_ns.load(Relaxed) {
            0 => t,
            a => (a as i64 + (t as i64 - a as i64) / 8).max(1) as u64,
        };
        c.average_ns.store(avg, Relaxed);
        if polled {
            c.polled_ns.store(t, Relaxed);
        }
        let sleeps = c.sleeps.load(Relaxed);
        let beyond = if sleeps { t < self.to_polling } else { t > self.to_interrupts };
        // A sleeping request's time above `to_polling` says nothing of what
        // polling would take (the wake-up is in it): only probes reset.
        if sleeps && !beyond && !polled {
            return;
        }
        let streak = if beyond { c.streak.load(Relaxed) + 1 } else { 0 };
        // To sleep, the moving average must say so too: a burst of slow
        // requests in a fast class (a VM's stalls) moves it less.
        if streak >= STREAK && (sleeps || avg > self.to_interrupts) {
            c.sleeps.store(!sleeps, Relaxed);
            c.switches.store(c.switches.load(Relaxed).wrapping_add(1), Relaxed);
            c.streak.store(0, Relaxed);
            tracing::debug!(class = Self::class(bytes), average_ns = avg, sleeps = !sleeps, "adaptive mode switched");
        } else {
            c.streak.store(streak, Relaxed);
        }
    }
}

impl Mode for Adaptive {
    fn name(&self) -> &str {
        "adaptive"
    }
    fn interrupts(&self) -> bool {
        true
    }
    fn plan(&self, req: &ModeRequest) -> Plan {
        let c = &self.classes[Self::index(req.bytes)];
        let seen = c.seen.load(Relaxed);
        c.seen.store(seen.wrapping_add(1), Relaxed);
        let sleeps = c.sleeps.load(Relaxed);
        let probe = sleeps && seen % PROBE == 0 && {
            let (avg, polled) = (c.average_ns.load(Relaxed), c.polled_ns.load(Relaxed));
            let takes = if polled == 0 { avg } else { avg.min(polled) };
            takes < PROBE_BELOW.saturating_mul(self.to_interrupts) || seen % PROBE_RARELY == 0
        };
        let completion = if sleeps && !probe { Completion::Interrupt } else { Completion::Poll };
        Plan::new(req).completion(completion).measure(probe || seen < LEARN || seen % SAMPLE == 0)
    }
    fn observe(&self, req: &ModeRequest, plan: &Plan, took: Duration) {
        self.record(req.bytes, took, plan.completion == Completion::Poll);
    }
}

/// The names [`mode_by_name`] knows.
pub const MODE_NAMES: [&str; 4] = ["latency", "throughput", "priority", "adaptive"];

/// A new built-in mode by its name (one of [`MODE_NAMES`]); an unknown
/// name is [`Error::InvalidArgument`].
pub fn mode_by_name(name: &str) -> Result<Arc<dyn Mode>> {
    Ok(match name {
        "latency" => Arc::new(Latency),
        "throughput" => Arc::new(Throughput),
        "priority" => Arc::new(Prioritized),
        "adaptive" => Arc::new(Adaptive::default()),
        _ => {
            return Err(Error::InvalidArgument(format!("unknown mode {name:?}: one of {}", MODE_NAMES.join(", "))));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn size_classes_are_powers_of_two() {
        assert_eq!(Adaptive::index(512), 0);
        assert_eq!(Adaptive::index(4096), 0);
        assert_eq!(Adaptive::index(4097), 1);
        assert_eq!(Adaptive::index(8192), 1);
        assert_eq!(Adaptive::index(1 << 20), 8);
        assert_eq!(Adaptive::index(usize::MAX), CLASSES - 1);
        assert_eq!(Adaptive::class(1 << 20), "1m");
    }

    #[test]
    fn adaptive_switches_with_hysteresis() {
        let a = Adaptive::new(us(50), us(100));
        let req = ModeRequest { bytes: 4096, write: false, priority: Priority::Normal };
        assert_eq!(a.plan(&req).completion, Completion::Poll, "every class starts polling");
        a.record(4096, us(90), true);
        assert!(!a.sleeps(4096), "90 us is under the threshold");
        // One slow request (or three) in a row changes nothing.
        for n in [1, 3] {
            for _ in 0..n {
                a.record(4096, us(50_000), true);
            }
            a.record(4096, us(20), true);
            assert!(!a.sleeps(4096), "{n} slow requests switched");
        }
        for _ in 0..4 {
            a.record(4096, us(400), true);
        }
        assert!(a.sleeps(4096), "four in a row switch");
        assert_eq!(a.switches(4096), 1);
        assert!(!a.sleeps(1 << 20), "classes are apart");
        // Between the thresholds: it keeps sleeping.
        for _ in 0..40 {
            a.record(4096, us(70), true);
        }
        assert!(a.sleeps(4096), "no flapping between the thresholds");
        assert!((us(65)..us(150)).contains(&a.average(4096).unwrap()), "{:?}", a.average(4096));
        a.record(4096, us(10), true);
        assert!(a.sleeps(4096), "one fast request changes nothing");
        for _ in 0..40 {
            a.record(4096, us(10), true);
        }
        assert!(!a.sleeps(4096));
        assert_eq!(a.switches(4096), 2);
        // Samples that straddle the threshold one by one do not flap either.
        for i in 0..100 {
            a.record(4096, if i % 2 == 0 { us(60) } else { us(130) }, true);
        }
        assert!(a.switches(4096) <= 3, "switched {} times", a.switches(4096));
    }

    /// A burst of slow requests in a fast class (a VM stalled for a moment)
    /// does not put it to sleep: the moving average must agree.
    #[test]
    fn adaptive_rides_out_a_burst() {
        let a = Adaptive::new(us(50), us(100));
        for _ in 0..20 {
            a.record(4096, us(35), true);
        }
        for _ in 0..4 {
            a.record(4096, us(150), true);
        }
        assert!(!a.sleeps(4096), "average {:?}", a.average(4096));
        for _ in 0..8 {
            a.record(4096, us(150), true);
        }
        assert!(a.sleeps(4096), "a lasting change does: average {:?}", a.average(4096));
    }

    /// A wake-up longer than `to_polling` (a VM's) must not keep a class of
    /// fast requests asleep: probes that poll bring it back; a class of long
    /// requests is not probed.
    #[test]
    fn adaptive_probes_a_sleeping_class_of_short_requests() {
        let a = Adaptive::new(us(50), us(100));
        let small = ModeRequest { bytes: 4096, write: false, priority: Priority::Normal };
        let large = ModeRequest { bytes: 1 << 20, ..small };
        // A cold start (say) makes the first four slow: the class sleeps.
        for _ in 0..4 {
            a.record(4096, us(400), true);
        }
        assert!(a.sleeps(4096));
        // Asleep, each takes 105 us: 30 of service, 75 of wake-up.
        for _ in 0..100 {
            a.record(4096, us(105), false);
        }
        assert!(a.sleeps(4096), "a sleeping time says nothing of polling's");
        let probes = (0..64).filter(|_| a.plan(&small).completion == Completion::Poll).count();
        assert_eq!(probes, 4, "every sixteenth polls");
        for _ in 0..4 {
            a.record(4096, us(30), true);
        }
        assert!(!a.sleeps(4096), "four fast probes: it polls again");
        for _ in 0..4 {
            a.record(1 << 20, us(2000), true);
        }
        assert!(a.sleeps(1 << 20));
        let probes = (0..512).filter(|_| a.plan(&large).completion == Completion::Poll).count();
        assert_eq!(probes, 2, "2 ms requests are probed once in 256");
        a.record(1 << 20, us(2000), true);
        assert!(a.sleeps(1 << 20), "and stay asleep when the probe says so");
    }

    /// Wake-ups longer than the requests (a loaded machine: 1 ms for a
    /// 20 us read) do not keep a class of fast requests asleep: the rare
    /// probe finds the polled time, and the probes that follow bring it
    /// back.
    #[test]
    fn slow_wake_ups_do_not_keep_a_fast_class_asleep() {
        let a = Adaptive::default();
        let small = ModeRequest { bytes: 4096, write: false, priority: Priority::Normal };
        for _ in 0..4 {
            a.record(4096, us(1000), true);
        }
        assert!(a.sleeps(4096));
        let mut slept = 0;
        for _ in 0..1024 {
            let plan = a.plan(&small);
            let polled = plan.completion == Completion::Poll;
            slept += !polled as u32;
            if plan.measure {
                a.record(4096, us(if polled { 20 } else { 1000 }), polled);
            }
            if !a.sleeps(4096) {
                break;
            }
        }
        assert!(!a.sleeps(4096), "back to polling; average {:?}", a.average(4096));
        assert!(slept < 100, "{slept} requests slept first");
    }

    #[test]
    fn adaptive_measures_its_first_requests_then_one_in_four() {
        let a = Adaptive::default();
        let req = ModeRequest { bytes: 1 << 20, write: true, priority: Priority::Normal };
        let measured = (0..16).filter(|_| a.plan(&req).measure).count();
        assert_eq!(measured, 16);
        let measured = (0..16).filter(|_| a.plan(&req).measure).count();
        assert_eq!(measured, 4);
    }

    #[test]
    fn built_in_modes_by_name() {
        for n in MODE_NAMES {
            assert_eq!(mode_by_name(n).unwrap().name(), n);
        }
        let e = mode_by_name("fast").unwrap_err();
        assert!(e.to_string().contains("unknown mode \"fast\""), "{e}");
        let req = |priority| ModeRequest { bytes: 1 << 20, write: false, priority };
        let p = Prioritized;
        assert_eq!(p.plan(&req(Priority::Background)).completion, Completion::Interrupt);
        assert_eq!(p.plan(&req(Priority::Critical)).depth, Depth::Deep);
        assert_eq!(Throughput.plan(&req(Priority::Normal)).completion, Completion::Interrupt);
        assert_eq!(Latency.plan(&req(Priority::Normal)).depth, Depth::Shallow);
    }
}
