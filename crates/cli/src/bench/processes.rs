//! `ugds bench -p N`: N processes at once, each attached to the controller
//! `ugds serve` serves (queue pairs of its own), and their sum.

use super::Opts;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable that tells each process when its runs start
/// (nanoseconds since the epoch), so that their runs overlap.
pub(super) const START_AT: &str = "UGDS_BENCH_START_AT";

/// Waits until the instant the parent set, if any.
pub(super) fn wait_for_start() {
    let Some(at) = std::env::var(START_AT).ok().and_then(|v| v.parse::<u128>().ok()) else { return };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    if at > now {
        std::thread::sleep(Duration::from_nanos((at - now).min(60_000_000_000) as u64));
    }
}

/// Runs `o.processes` copies of this command (without `-p`), prints each
/// one's output and the sum of their runs.
pub(super) fn run(o: &Opts, command: &[String]) -> Result<(), String> {
    if o.target.attach.is_none() {
        return Err("-p N runs N processes on one controller: give --attach SOCKET (see `ugds serve`)".into());
    }
    let mut args = Vec::new();
    let mut it = command.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-p" | "--processes" | "--json" => {
                it.next();
            }
            s if s.starts_with("--processes=") || s.starts_with("--json=") => {}
            s if s.starts_with("-p") && s[2..].parse::<usize>().is_ok() => {}
            _ => args.push(a.clone()),
        }
    }
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let dir = std::env::temp_dir();
    // Setup (attach, queues, a verify prefill) takes the first moments: the
    // runs of every process start together after it.
    let lead = Duration::from_millis(500) + if o.verify { Duration::from_secs(2) } else { Duration::ZERO };
    let start = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| e.to_string())? + lead;
    let jsons: Vec<_> =
        (0..o.processes).map(|k| dir.join(format!("ugds-bench-{}-{k}.json", std::process::id()))).collect();
    let children: Vec<_> = jsons
        .iter()
        .map(|json| {
            Command::new(&exe)
                .arg("bench")
                .args(&args)
                .arg("--no-progress")
                .arg("--json")
                .arg(json)
                .env(START_AT, start.as_nanos().to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("start a bench process: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut failed = Vec::new();
    let mut docs = Vec::new();
    for (k, (child, json)) in children.into_iter().zip(&jsons).enumerate() {
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            println!("[{k}] {line}");
        }
        for line in String::from_utf8_lossy(&out.stderr).lines() {
            eprintln!("[{k}] {line}");
        }
        if !out.status.success() {
            failed.push(format!("process {k}: {}", out.status));
        }
        if let Ok(text) = std::fs::read_to_string(json) {
            let _ = std::fs::remove_file(json);
            docs.push(serde_json::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string())?);
        }
    }
    if !failed.is_empty() {
        return Err(format!("{} of {} processes failed: {}", failed.len(), o.processes, failed.join("; ")));
    }
    let runs = |d: &serde_json::Value| d["runs"].as_array().cloned().unwrap_or_default();
    let n = docs.iter().map(|d| runs(d).len()).min().unwrap_or(0);
    for i in 0..n {
        let (mut mib, mut iops) = (0.0, 0.0);
        for d in &docs {
            let r = &runs(d)[i];
            mib += r["mib_s"].as_f64().unwrap_or(0.0);
            iops += r["iops"].as_f64().unwrap_or(0.0);
        }
        let r = &runs(&docs[0])[i];
        println!(
            "sum      {} {}  {} processes x threads {} qd {} | {mib:>10.1} MiB/s {:>9} IOPS (each process over its own {:.2} s; runs started together)",
            r["mode"].as_str().unwrap_or("?"),
            crate::fmt_bytes(r["size"].as_u64().unwrap_or(0)),
            docs.len(),
            r["threads"],
            r["qd"],
            super::fmt_count(iops),
            r["seconds"].as_f64().unwrap_or(0.0),
        );
    }
    Ok(())
}
