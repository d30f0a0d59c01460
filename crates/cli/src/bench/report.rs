//! What `ugds bench` prints while and after it runs: the progress line,
//! numbers, and how the queues learn of completions.

use super::*;

pub(super) fn progress_bar(
    stop: &AtomicBool,
    finished: &AtomicBool,
    done: &AtomicU64,
    start: Instant,
    total: Option<Duration>,
    label: &str,
    lines: bool,
) {
    let mut err = std::io::stderr();
    let mut last = (Instant::now(), 0u64);
    while !finished.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(if lines { 1000 } else { 200 }));
        let now = Instant::now();
        let d = done.load(Ordering::Relaxed);
        let rate = (d - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        last = (now, d);
        let el = start.elapsed();
        if lines {
            let _ = writeln!(err, "{label} {:.1}s: {d} I/Os done, {} IOPS", el.as_secs_f64(), fmt_count(rate));
            if stop.load(Ordering::Relaxed) {
                break;
            }
            continue;
        }
        let frac = total.map_or(0.0, |t| (el.as_secs_f64() / t.as_secs_f64()).min(1.0));
        let w = 30;
        let filled = (frac * w as f64) as usize;
        let _ = write!(
            err,
            "\r{label} [{}{}] {:5.1}s  {:>9} IOPS  ",
            "#".repeat(filled),
            ".".repeat(w - filled),
            el.as_secs_f64(),
            fmt_count(rate)
        );
        let _ = err.flush();
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    if !lines {
        let _ = write!(err, "\r{}\r", " ".repeat(label.len() + 64));
        let _ = err.flush();
    }
}

pub(super) fn fmt_count(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

pub(super) fn us(ns: f64) -> String {
    format!("{:.2}", ns / 1000.0)
}

/// "irq", "poll" or "irq+poll": how the handle's queues of these roles
/// learn of completions.
pub(super) fn completion_label(handle: &Handle, roles: &[QueueRole]) -> &'static str {
    let mut qs = handle.queues().iter().filter(|q| roles.contains(&q.role)).peekable();
    if qs.peek().is_none() {
        return "poll";
    }
    let (mut irq, mut poll) = (false, false);
    for q in qs {
        irq |= q.vector.is_some();
        poll |= q.vector.is_none();
    }
    match (irq, poll) {
        (true, true) => "irq+poll",
        (true, false) => "irq",
        _ => "poll",
    }
}

/// The entries the queues were granted: "N entries", with what was asked
/// for when the controller gave fewer (its MQES), or a range when they differ.
pub(super) fn granted_entries(handle: &Handle, asked: u16) -> String {
    // The synchronous and lendable queues (the batch queue has a line of its own).
    let (lo, hi) = handle
        .queues()
        .iter()
        .filter(|q| q.role != QueueRole::Batch)
        .fold((u16::MAX, 0), |(lo, hi), q| (lo.min(q.entries), hi.max(q.entries)));
    match (lo, hi) {
        (u16::MAX, _) => format!("{asked} entries"),
        (lo, hi) if lo != hi => format!("{lo} to {hi} entries (asked for {asked})"),
        (n, _) if n < asked => format!("{n} entries (asked for {asked}: the controller's limit)"),
        (n, _) => format!("{n} entries"),
    }
}

/// One line per queue: what it is for and how it learns of completions.
pub(super) fn describe_queues(handle: &Handle) -> String {
    let mut out = Vec::new();
    for q in handle.queues() {
        let role = match q.role {
            QueueRole::Sync => "sync",
            QueueRole::Batch => "batch",
            _ => "lendable",
        };
        let how = match (q.vector, q.vector_shared_with) {
            (None, _) => "polled".to_string(),
            (Some(0), 0) => "vector 0 (shared with the admin queue)".to_string(),
            (Some(0), n) => format!("vector 0 (shared with the admin queue and {n} other queue(s))"),
            (Some(v), 0) => format!("vector {v}"),
            (Some(v), n) => format!("vector {v} (shared with {n} other queue(s))"),
        };
        out.push(format!("q{} {role} {how}", q.qid));
    }
    out.join(", ")
}
