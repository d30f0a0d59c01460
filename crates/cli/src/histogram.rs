//! Latencies in nanoseconds, in an HDR histogram (the `hdrhistogram` crate,
//! three significant digits: every value within 0.1% of what is reported),
//! the same on both sides of every side-by-side benchmark (`kbench`, the
//! cuFile samples through `ugds hist`). Recording allocates nothing.

/// Latencies in nanoseconds.
#[derive(Clone)]
pub struct Histogram(hdrhistogram::Histogram<u64>);

/// The range recorded exactly: 1 ns to an hour; longer values are clamped.
pub const HIGHEST_NS: u64 = 3_600_000_000_000;

impl Default for Histogram {
    fn default() -> Self {
        Histogram(hdrhistogram::Histogram::new_with_bounds(1, HIGHEST_NS, 3).expect("valid bounds"))
    }
}

impl Histogram {
    /// Records one value (clamped to 1 ns .. an hour).
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns.max(1));
    }

    /// Adds another histogram's values.
    pub fn merge(&mut self, o: &Histogram) {
        self.0.add(&o.0).expect("histograms of the same bounds");
    }

    /// Mean in nanoseconds.
    pub fn mean(&self) -> f64 {
        self.0.mean()
    }

    /// Largest value recorded.
    pub fn max(&self) -> u64 {
        self.0.max()
    }

    /// Values recorded.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// The value at quantile `q` (0..=1).
    pub fn quantile(&self, q: f64) -> u64 {
        self.0.value_at_quantile(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_uniform_run() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 100);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.002, "p50 {p50}");
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.002, "p99 {p99}");
        assert!((h.quantile(1.0) as f64 - 1_000_000.0).abs() < 1000.0);
        assert!((h.mean() - 500_050.0).abs() / 500_050.0 < 0.001);
        assert_eq!(h.len(), 10_000);
    }

    #[test]
    fn merged_histograms_count_both() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        a.record(1_000);
        b.record(3_000);
        a.merge(&b);
        assert_eq!(a.len(), 2);
        assert!((a.mean() - 2_000.0).abs() < 2.0);
        assert!(a.max() >= 3_000 && a.max() <= 3_003);
    }
}
