//! `ugds stats` and `ugds top`: the queue statistics other processes
//! publish (`HandleOptions::stats_dir`, or `UGDS_STATS_DIR` for the C
//! library, Python and `ugds bench`), read from their files.

use std::path::{Path, PathBuf};
use std::time::Duration;
use ugds::publish::{parse, role_name, Published};
use ugds::QueueStats;

pub const HELP: &str = "\
Usage: ugds stats [--dir DIR] [--json]
       ugds top [--dir DIR] [-i SECONDS] [-n COUNT]

Reads the queue statistics that running ugds processes publish: a process
publishes when its handles are opened with a statistics directory
(HandleOptions::stats_dir; UGDS_STATS_DIR for the C library, Python and
`ugds bench`). DIR defaults to $UGDS_STATS_DIR, else /dev/shm. Files of
processes that are gone are left out.

stats   each handle's queues: commands, bytes, errors, timeouts, doorbell
        writes and interrupts since the handle opened (--json: as JSON)
top     the same as rates, refreshed every SECONDS (1) until interrupted
        (or COUNT times)
";

fn default_dir() -> PathBuf {
    std::env::var_os("UGDS_STATS_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/dev/shm"))
}

/// Every published file in `dir` whose process is alive, by pid and handle.
fn read_all(dir: &Path) -> Result<Vec<Published>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out: Vec<Published> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "stats")
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("ugds-"))
        })
        .filter_map(|p| parse(&std::fs::read_to_string(p).ok()?))
        .filter(|p| Path::new(&format!("/proc/{}", p.pid)).exists())
        .collect();
    out.sort_by_key(|p| (p.pid, p.handle));
    Ok(out)
}

fn options(args: Vec<std::ffi::OsString>, top: bool) -> Result<(PathBuf, bool, f64, Option<u64>), String> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let (mut dir, mut json, mut interval, mut count) = (default_dir(), false, 1.0f64, None);
    while let Some(a) = p.next().map_err(|e| e.to_string())? {
        match a {
            Long("dir") => dir = p.value().map_err(|e| e.to_string())?.into(),
            Long("json") if !top => json = true,
            Short('i') if top => {
                interval = p
                    .value()
                    .map_err(|e| e.to_string())?
                    .string()
                    .map_err(|_| "-i: not UTF-8")?
                    .parse()
                    .map_err(|_| "-i: seconds, a number above 0".to_string())?;
                if interval.is_nan() || interval <= 0.0 {
                    return Err("-i: seconds, a number above 0".into());
                }
            }
            Short('n') if top => {
                count = Some(
                    p.value()
                        .map_err(|e| e.to_string())?
                        .string()
                        .map_err(|_| "-n: not UTF-8")?
                        .parse()
                        .map_err(|_| "-n: a count".to_string())?,
                )
            }
            Short('h') | Long("help") => {
                print!("{HELP}");
                std::process::exit(0);
            }
            _ => return Err(a.unexpected().to_string()),
        }
    }
    Ok((dir, json, interval, count))
}

fn queue_json(q: &QueueStats) -> serde_json::Value {
    serde_json::json!({
        "qid": q.qid, "role": role_name(q.role), "submitted": q.submitted, "completed": q.completed,
        "in_flight": q.in_flight, "bytes_read": q.bytes_read, "bytes_written": q.bytes_written,
        "errors": q.errors, "timeouts": q.timeouts, "doorbell_writes": q.doorbell_writes,
        "interrupts": q.interrupts,
    })
}

pub fn main(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    let (dir, json, _, _) = options(args, false)?;
    let all = read_all(&dir)?;
    if json {
        let doc: Vec<_> = all
            .iter()
            .map(|p| {
                let queues: Vec<_> = p
                    .queues
                    .iter()
                    .zip(&p.latency)
                    .map(|(q, l)| {
                        let mut v = queue_json(q);
                        if let Some(l) = l {
                            v["latency_ns"] = serde_json::json!({"commands": l.commands, "p50": l.p50_ns,
                                "p99": l.p99_ns, "max": l.max_ns});
                        }
                        v
                    })
                    .collect();
                serde_json::json!({"pid": p.pid, "handle": p.handle, "time_ms": p.time_ms as u64, "queues": queues})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?);
        return Ok(());
    }
    if all.is_empty() {
        println!("no process publishes statistics in {}", dir.display());
        return Ok(());
    }
    for p in &all {
        println!("pid {} handle {}", p.pid, p.handle);
        println!(
            "  {:>4} {:<9} {:>12} {:>12} {:>9} {:>12} {:>12} {:>7} {:>8} {:>12} {:>10}",
            "qid",
            "role",
            "submitted",
            "completed",
            "in flight",
            "read",
            "written",
            "errors",
            "timeouts",
            "doorbells",
            "interrupts"
        );
        for q in &p.queues {
            println!(
                "  {:>4} {:<9} {:>12} {:>12} {:>9} {:>12} {:>12} {:>7} {:>8} {:>12} {:>10}",
                q.qid,
                role_name(q.role),
                q.submitted,
                q.completed,
                q.in_flight,
                crate::bench::fmt_amount(q.bytes_read),
                crate::bench::fmt_amount(q.bytes_written),
                q.errors,
                q.timeouts,
                q.doorbell_writes,
                q.interrupts
            );
        }
        for (q, l) in p.queues.iter().zip(&p.latency) {
            if let Some(l) = l.filter(|l| l.commands > 0) {
                println!(
                    "  {:>4} latency over {} commands (traced): us p50 {:.2} p99 {:.2} max {:.2}",
                    q.qid,
                    l.commands,
                    l.p50_ns as f64 / 1e3,
                    l.p99_ns as f64 / 1e3,
                    l.max_ns as f64 / 1e3
                );
            }
        }
    }
    Ok(())
}

/// `ugds top`: rates between two readings.
pub fn top(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    let (dir, _, interval, count) = options(args, true)?;
    let mut last = read_all(&dir)?;
    let mut shown = 0u64;
    while count.is_none_or(|c| shown < c) {
        std::thread::sleep(Duration::from_secs_f64(interval));
        let now = read_all(&dir)?;
        println!("ugds top: {} ({} s)", dir.display(), interval);
        println!(
            "  {:>8} {:>6} {:>4} {:<9} {:>11} {:>12} {:>12} {:>9} {:>10} {:>8}",
            "pid", "handle", "qid", "role", "cmds/s", "read/s", "written/s", "in flight", "errors", "timeouts"
        );
        for p in &now {
            let before = last.iter().find(|o| o.pid == p.pid && o.handle == p.handle);
            for q in &p.queues {
                let b = before.and_then(|o| o.queues.iter().find(|x| x.qid == q.qid));
                let d = |f: fn(&QueueStats) -> u64| f(q).saturating_sub(b.map_or(0, f)) as f64 / interval;
                println!(
                    "  {:>8} {:>6} {:>4} {:<9} {:>11.0} {:>12} {:>12} {:>9} {:>10} {:>8}",
                    p.pid,
                    p.handle,
                    q.qid,
                    role_name(q.role),
                    d(|s| s.completed),
                    crate::bench::fmt_amount(d(|s| s.bytes_read) as u64),
                    crate::bench::fmt_amount(d(|s| s.bytes_written) as u64),
                    q.in_flight,
                    q.errors,
                    q.timeouts
                );
            }
        }
        if now.is_empty() {
            println!("  no process publishes statistics here");
        }
        last = now;
        shown += 1;
    }
    Ok(())
}
