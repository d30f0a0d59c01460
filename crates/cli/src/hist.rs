//! `ugds hist`: percentiles of latencies another program measured, computed
//! with the same HDR histogram `ugds bench` and `ugds gpu-bench` use, so
//! that both sides of a side-by-side benchmark count alike.

use crate::histogram::Histogram;
use std::io::Read;

pub const HELP: &str = "\
Usage: ugds hist [QUANTILE...]

Reads latencies in microseconds (whitespace separated) from standard input
and prints `n=N mean_us=M p<Q>_us=V ... max_us=X`, one figure per quantile
asked for (default 0.5 0.99), from an HDR histogram of three significant
digits (the one ugds bench and ugds gpu-bench use).
";

pub fn main(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    let mut qs = Vec::new();
    for a in args {
        let a = a.to_string_lossy().into_owned();
        if a == "-h" || a == "--help" {
            print!("{HELP}");
            return Ok(());
        }
        let q: f64 = a.parse().map_err(|_| format!("not a quantile: {a}"))?;
        if !(0.0..=1.0).contains(&q) {
            return Err(format!("a quantile is between 0 and 1, not {q}"));
        }
        qs.push(q);
    }
    if qs.is_empty() {
        qs = vec![0.5, 0.99];
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).map_err(|e| format!("reading standard input: {e}"))?;
    println!("{}", summarize(&input, &qs)?);
    Ok(())
}

/// The summary line of the latencies (microseconds) in `input`.
pub fn summarize(input: &str, qs: &[f64]) -> Result<String, String> {
    let mut h = Histogram::default();
    for w in input.split_whitespace() {
        let us: f64 = w.parse().map_err(|_| format!("not a latency in microseconds: {w}"))?;
        if !us.is_finite() || us < 0.0 {
            return Err(format!("not a latency in microseconds: {w}"));
        }
        h.record((us * 1e3).round() as u64);
    }
    if h.len() == 0 {
        return Err("no latencies on standard input".into());
    }
    let mut out = format!("n={} mean_us={:.3}", h.len(), h.mean() / 1e3);
    for q in qs {
        let name = format!("{}", q * 100.0).replace('.', "_");
        out += &format!(" p{name}_us={:.3}", h.quantile(*q) as f64 / 1e3);
    }
    out += &format!(" max_us={:.3}", h.max() as f64 / 1e3);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_microseconds() {
        let input: String = (1..=1000).map(|v| format!("{v} ")).collect();
        let s = summarize(&input, &[0.5, 0.99]).unwrap();
        assert!(s.starts_with("n=1000 mean_us=500.5"), "{s}");
        assert!(s.contains(" p50_us=500.") && s.contains(" p99_us=990."), "{s}");
        assert!(summarize("1 x", &[0.5]).is_err());
        assert!(summarize("", &[0.5]).is_err());
    }
}
