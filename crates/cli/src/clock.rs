//! The benchmark's clock: the cheapest one that is correct. Where the CPU
//! says its time-stamp counter is invariant (CPUID 8000_0007h, EDX bit 8:
//! it ticks at one rate in every power state), the TSC, calibrated once
//! against the monotonic clock and turned into nanoseconds by a multiply
//! and a shift; elsewhere (a VM's CPU model that does not say so, another
//! architecture) `Instant`, which is `clock_gettime(CLOCK_MONOTONIC)`.

use std::time::{Duration, Instant};

/// Timestamps in ticks, and their differences in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    tsc: bool,
    base: Instant,
    /// Nanoseconds per tick, as `mult >> SHIFT`.
    mult: u64,
    ghz: f64,
}

const SHIFT: u32 = 32;

impl Clock {
    /// The TSC where it is invariant (calibrated over about 20 ms), else
    /// the monotonic clock.
    pub fn new() -> Clock {
        let base = Instant::now();
        if !invariant_tsc() {
            return Clock { tsc: false, base, mult: 1 << SHIFT, ghz: 0.0 };
        }
        let (t0, c0) = (Instant::now(), rdtsc());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, c1) = (Instant::now(), rdtsc());
        let ns = (t1 - t0).as_nanos() as f64;
        let ticks = c1.wrapping_sub(c0) as f64;
        if ticks <= 0.0 || ns <= 0.0 {
            return Clock { tsc: false, base, mult: 1 << SHIFT, ghz: 0.0 };
        }
        let mult = (ns / ticks * (1u64 << SHIFT) as f64).round() as u64;
        Clock { tsc: true, base, mult, ghz: ticks / ns }
    }

    /// Now, in ticks.
    #[inline]
    pub fn now(&self) -> u64 {
        if self.tsc {
            rdtsc()
        } else {
            self.base.elapsed().as_nanos() as u64
        }
    }

    /// Nanoseconds between two readings (a multiply and a shift).
    #[inline]
    pub fn ns(&self, from: u64, to: u64) -> u64 {
        ((to.wrapping_sub(from) as u128 * self.mult as u128) >> SHIFT) as u64
    }

    /// Which clock, in words.
    pub fn describe(&self) -> String {
        if self.tsc {
            format!("the TSC (invariant, {:.3} GHz by calibration)", self.ghz)
        } else {
            "clock_gettime (CLOCK_MONOTONIC): the CPU does not say its TSC is invariant".to_string()
        }
    }
}

/// CPU time of `clock` (a thread's or the process's), from `clock_gettime`.
pub fn cpu_time(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec on this stack for the call to fill.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    if r != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    use std::arch::x86_64::__cpuid;
    __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn invariant_tsc() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC reads a counter; it touches no memory (unsafe only as
    // an intrinsic).
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn rdtsc() -> u64 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_agrees_with_instant() {
        let c = Clock::new();
        let (i0, t0) = (Instant::now(), c.now());
        std::thread::sleep(Duration::from_millis(30));
        let (i1, t1) = (Instant::now(), c.now());
        let ours = c.ns(t0, t1) as f64;
        let theirs = (i1 - i0).as_nanos() as f64;
        assert!((ours / theirs - 1.0).abs() < 0.05, "{ours} ns against {theirs} ns ({})", c.describe());
    }
}
