//! A log-linear latency histogram: 16 sub-buckets per power of two of
//! nanoseconds, so every recorded value is within 1/16 (6.25%) of the
//! bucket it lands in. Fixed size, no allocation when recording.

const SUB: usize = 16;
const SUB_BITS: u32 = 4;
const BUCKETS: usize = 64 * SUB;

/// Latencies in nanoseconds.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    sum: u128,
    max: u64,
    min: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: Box::new([0; BUCKETS]), total: 0, sum: 0, max: 0, min: u64::MAX }
    }
}

fn index(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    let sub = (v >> shift) as usize & (SUB - 1);
    ((msb - SUB_BITS + 1) as usize) * SUB + sub
}

/// The largest value that lands in bucket `i`.
fn upper(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let band = (i / SUB) as u32 - 1 + SUB_BITS; // msb
    let sub = (i % SUB) as u64;
    let shift = band - SUB_BITS;
    (((SUB as u64) | sub) << shift) + (1u64 << shift) - 1
}

impl Histogram {
    /// Records one value.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.counts[index(ns).min(BUCKETS - 1)] += 1;
        self.total += 1;
        self.sum += ns as u128;
        self.max = self.max.max(ns);
        self.min = self.min.min(ns);
    }

    /// Adds another histogram's values.
    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.total += o.total;
        self.sum += o.sum;
        self.max = self.max.max(o.max);
        self.min = self.min.min(o.min);
    }

    /// Mean in nanoseconds.
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// Largest value recorded.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0..=1): the upper edge of the bucket that
    /// holds it, clamped to the largest value seen.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper(i).min(self.max).max(self.min);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_bound_values_within_a_sixteenth() {
        for v in [0u64, 1, 15, 16, 17, 100, 1000, 4095, 4096, 123_456, 10_000_000_000] {
            let i = index(v);
            assert!(upper(i) >= v, "{v} above its bucket {}", upper(i));
            if v >= 16 {
                assert!(upper(i) - v <= v / 16, "{v} bucket too wide: {}", upper(i));
            }
            if i > 0 {
                assert!(upper(i - 1) < v);
            }
        }
    }

    #[test]
    fn quantiles_of_a_uniform_run() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 100);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.07, "p50 {p50}");
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.07, "p99 {p99}");
        assert_eq!(h.quantile(1.0), 1_000_000);
        assert!((h.mean() - 500_050.0).abs() < 1.0);
    }
}
