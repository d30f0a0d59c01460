//! The `ugds` command as a user runs it.

use std::process::Command;

fn ugds(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ugds")).args(args).output().expect("run ugds");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn identify_describes_the_default_target() {
    let (ok, out, err) = ugds(&["identify", "--emu-size", "64M"]);
    assert!(ok, "{err}");
    assert!(out.contains("model        ugds emulated controller"), "{out}");
    assert!(out.contains("nsid 1    131072 blocks x 512 bytes = 64 MiB"), "{out}");
    assert!(out.contains("mdts         128 KiB per command"), "{out}");
}

#[test]
fn bench_with_no_flags_prints_figures() {
    // No flags but a short duration, to keep the test quick.
    let (ok, out, err) = ugds(&["bench", "-d", "0.3"]);
    assert!(ok, "{err}");
    let line = out.lines().find(|l| l.starts_with("randread")).unwrap_or_else(|| panic!("{out}"));
    for field in ["MiB/s", "IOPS", "mean", "p50", "p99", "p99.9"] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
    assert!(out.contains("backed by file"), "{out}");
}

#[test]
fn bench_verify_finds_no_mismatch() {
    for args in [
        &["bench", "--verify", "-d", "0.3", "--emu-size", "32M"][..],
        &["bench", "--verify", "-d", "0.3", "--emu-size", "32M", "-m", "randwrite", "-s", "4k,132k", "-q", "8"],
        &[
            "bench",
            "--verify",
            "-d",
            "0.3",
            "--emu-size",
            "32M",
            "-m",
            "write",
            "-q",
            "1",
            "-t",
            "2",
            "--emu-block",
            "4096",
        ],
        &[
            "bench",
            "--verify",
            "-d",
            "0.3",
            "--emu-memory",
            "--emu-size",
            "32M",
            "-m",
            "read",
            "--interrupt",
            "-q",
            "4",
        ],
    ] {
        let (ok, out, err) = ugds(args);
        assert!(ok, "{args:?}: {err}\n{out}");
        assert!(out.contains(", 0 mismatched 8-byte words"), "{args:?}: {out}");
        let checked: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("verify   "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(checked > 0, "{args:?}: nothing was checked\n{out}");
    }
}

#[test]
fn batch_and_stream_modes_verify() {
    for args in [
        &["bench", "--verify", "-d", "0.3", "--emu-size", "32M", "--batch", "1,16", "-s", "4k,20k"][..],
        &["bench", "--verify", "-d", "0.3", "--emu-size", "32M", "--batch", "8", "-m", "randwrite"],
        &["bench", "--verify", "-d", "0.3", "--emu-size", "32M", "--stream", "-q", "4"],
        &["bench", "--verify", "-d", "0.3", "--emu-size", "32M", "--stream", "-q", "4", "-m", "randwrite"],
        &["bench", "-d", "0.3", "--emu-size", "32M", "--stream", "-q", "2", "-m", "write", "-t", "2"],
    ] {
        let (ok, out, err) = ugds(args);
        assert!(ok, "{args:?}: {err}\n{out}");
        assert!(out.lines().any(|l| l.contains("IOPS")), "{args:?}: {out}");
        if args.contains(&"--verify") {
            assert!(out.contains(", 0 mismatched 8-byte words"), "{args:?}: {out}");
            assert!(!out.contains("verify   0 I/Os checked"), "{args:?}: nothing was checked\n{out}");
        }
    }
    let (ok, out, _) = ugds(&["bench", "--emu-null", "-d", "0.3", "--batch", "32"]);
    assert!(ok);
    assert!(out.contains("1.00 doorbell writes per batch"), "{out}");
    assert!(out.contains("first batch"), "{out}");
}

#[test]
fn bench_stops_after_a_byte_count() {
    let (ok, out, err) = ugds(&["bench", "--emu-null", "-b", "40M", "-s", "1M", "-q", "4"]);
    assert!(ok, "{err}");
    let line = out.lines().find(|l| l.starts_with("randread")).unwrap();
    let ios: u64 = line.rsplit(", ").next().unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(ios, 40, "{line}");
}

/// The scheduler's and the vectored workloads print their tables.
#[test]
fn mixed_and_vectored_workloads_print_their_rows() {
    let (ok, out, err) = ugds(&["bench", "--mixed", "--emu-memory", "--emu-size", "64M", "-d", "0.2"]);
    assert!(ok, "{err}");
    for row in ["alone", "round robin", "scheduler", "priorities"] {
        let line = out.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no {row} row: {out}"));
        assert!(line.ends_with('x'), "{line}");
    }
    let (ok, out, err) = ugds(&["bench", "--vectored", "8", "-s", "16k", "--emu-null", "-d", "0.2"]);
    assert!(ok, "{err}");
    for row in ["readv, one SGL", "readv, PRP windows", "separate calls"] {
        let line = out.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no {row} row: {out}"));
        assert!(line.contains("segments/s") && line.contains("ns CPU per segment"), "{line}");
    }
    let (ok, out, err) = ugds(&["bench", "--modes", "--emu-memory", "--emu-size", "64M", "-d", "0.1"]);
    assert!(ok, "{err}");
    for workload in ["latency-bound", "bandwidth-bound"] {
        for mode in ["polling", "interrupts", "latency", "throughput", "adaptive"] {
            let row = out.lines().find(|l| l.split_whitespace().take(2).eq([workload, mode]));
            assert!(row.is_some_and(|l| l.contains("us")), "no {workload} {mode} row: {out}");
        }
        assert!(out.contains(&format!("{workload:<16} adaptive mode: ")), "{out}");
    }
}

/// `--mode` takes a mode and names it in the row; the access patterns it
/// used to take still work, and an unknown name is refused.
#[test]
fn bench_takes_a_mode() {
    let (ok, out, err) =
        ugds(&["bench", "--emu-null", "-q", "1", "-d", "0.2", "--mode", "throughput", "--no-progress"]);
    assert!(ok, "{err}");
    let row = out.lines().find(|l| l.starts_with("randread")).unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("qd 1    throughput"), "{row}");
    assert!(out.contains("interrupts per command") && !out.contains("0.000 interrupts per command"), "{out}");
    let (ok, out, err) = ugds(&["bench", "--emu-null", "-q", "1", "-d", "0.2", "-m", "read", "--no-progress"]);
    assert!(ok && out.lines().any(|l| l.starts_with("read ")), "{err}");
    // Sampled latencies say so; `--sample 1` times every call.
    let (ok, out, err) = ugds(&["bench", "--emu-null", "-q", "1", "-d", "0.2", "--sample", "4", "--no-progress"]);
    assert!(ok, "{err}");
    assert!(out.lines().any(|l| l.starts_with("latency  at queue depth 1 one call in 4 timed")), "{out}");
    let (ok, out, err) = ugds(&["bench", "--emu-null", "-q", "1", "-d", "0.2", "--sample", "1", "--no-progress"]);
    assert!(ok && out.lines().any(|l| l.starts_with("latency  every I/O timed")), "{err}{out}");
}

#[test]
fn bad_arguments_are_refused() {
    for args in [
        &["bench", "-m", "sideways"][..],
        &["bench", "-s", "1000"],
        &["bench", "-q", "0"],
        &["bench", "--frobnicate"],
        &["bench", "--verify", "--emu-null"],
        &["bench", "--batch", "0"],
        &["bench", "--batch", "4", "--stream"],
        &["bench", "--vectored", "0"],
        &["bench", "--vectored", "257"],
        &["bench", "--mixed", "--verify"],
        &["bench", "--placement", "random"],
        &["bench", "--mode", "fastest"],
        &["bench", "--sample", "0"],
        &["bench", "--modes", "--mode", "latency"],
        &["identify", "--emu-block", "1024"],
        &["rdma", "--connect", "10.9.0.1:4420"],
        &["rdma", "--nqn", "nqn.2026-12.io.ugds:rdma"],
        &["rdma", "--connect", "10.9.0.1:4420", "--nqn", "nqn.x", "--bytes", "256k"],
        &["rdma", "--frobnicate"],
        &["nonsense"],
    ] {
        let (ok, _, err) = ugds(args);
        assert!(!ok, "{args:?} was accepted");
        assert!(err.starts_with("ugds: "), "{args:?}: {err}");
    }
}

/// The library's messages reach standard error: `-vv` (debug) shows the
/// bring-up, the default (warn) does not, and UGDS_LOG sets the level.
#[test]
fn library_messages_go_to_stderr_at_the_asked_level() {
    let (ok, _, err) = ugds(&["-vv", "identify", "--emu-memory"]);
    assert!(ok, "{err}");
    assert!(err.contains("ugds DEBUG ugds::engine::pcie: controller up"), "{err}");
    let (ok, _, err) = ugds(&["identify", "--emu-memory"]);
    assert!(ok && !err.contains("DEBUG"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_ugds"))
        .args(["identify", "--emu-memory"])
        .env("UGDS_LOG", "debug")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("controller up"));
}

/// The bench says which doorbells it rang and why: the flags and
/// UGDS_SHADOW_DOORBELLS ask, the controller decides (the emulated one
/// offers no Doorbell Buffer Config; QEMU's does, in the conformance runs).
#[test]
fn bench_says_which_doorbells_and_why() {
    let bench = |env: Option<&str>, flag: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ugds"));
        c.args(["bench", "--emu-null", "-d", "0.1", "--no-progress"]).args(flag);
        c.env_remove("UGDS_SHADOW_DOORBELLS");
        if let Some(v) = env {
            c.env("UGDS_SHADOW_DOORBELLS", v);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        words(out.lines().find(|l| l.contains("doorbells:")).unwrap_or_else(|| panic!("{out}")))
    };
    assert_eq!(bench(None, Some("--no-shadow-doorbells")), "doorbells: MMIO (shadow doorbells not asked for)");
    assert_eq!(bench(Some("0"), None), "doorbells: MMIO (shadow doorbells not asked for)");
    let offers_none = "doorbells: MMIO (the controller offers no Doorbell Buffer Config)";
    assert_eq!(bench(None, Some("--shadow-doorbells")), offers_none);
    assert_eq!(bench(Some("1"), None), offers_none);
    assert_eq!(bench(Some("1"), Some("--no-shadow-doorbells")), "doorbells: MMIO (shadow doorbells not asked for)");
    // Left to the default: asked for exactly where a hypervisor traps doorbell writes.
    let default = bench(None, None);
    match ugds::trapping_hypervisor() {
        Some(_) => assert_eq!(default, offers_none),
        None => assert_eq!(default, "doorbells: MMIO (shadow doorbells not asked for)"),
    }
}

/// Collapses runs of spaces, so that checks read the words, not the layout.
fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The messages a newcomer meets first say what is wrong with what they
/// typed, and the set-up line says what the device granted.
#[test]
fn messages_name_what_was_asked_for_and_what_was_granted() {
    // A PCI address with no function behind it.
    let (ok, _, err) = ugds(&["bench", "--pci", "0000:7f:1f.7"]);
    assert!(!ok);
    let err = words(&err);
    assert!(err.contains("no PCI function 0000:7f:1f.7"), "{err}");
    assert!(!err.contains("bound to"), "not a binding problem: {err}");
    // A ugds_drv node that does not exist: the path is named.
    let (ok, _, err) = ugds(&["bench", "--drv", "/dev/ugds_drv_nonexistent"]);
    assert!(!ok);
    let err = words(&err);
    assert!(err.contains("/dev/ugds_drv_nonexistent") && err.contains("No such file"), "{err}");
    // A file that does not exist, likewise.
    let (ok, _, err) = ugds(&["bench", "--file", "/nonexistent/ugds.img"]);
    assert!(!ok);
    assert!(words(&err).contains("/nonexistent/ugds.img"), "{err}");
    // Queue depth beyond the controller's MQES: the granted entries, and what was asked.
    let (ok, out, err) = ugds(&["bench", "--emu-null", "-d", "0.2", "-q", "64", "--emu-mqes", "15"]);
    assert!(ok, "{err}");
    let out = words(&out);
    assert!(out.contains("queue pairs of 16 entries (asked for 65"), "{out}");
    // Interrupt completion asked for where the controller has only the
    // admin queue's vector: the lent queue polls, and the line says so.
    let (ok, out, err) = ugds(&["bench", "--emu-null", "-d", "0.2", "--interrupt", "--emu-vectors", "1"]);
    assert!(ok, "{err}");
    let out = words(&out);
    assert!(out.contains("q2 lendable polled"), "{out}");
    let line = out.split("randread").nth(1).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("qd 32 poll"), "the run's label is the queues' mode: {line}");
}

/// `bench --json` writes every run's figures, the configuration and the
/// machine; `report` draws several such files into one SVG.
#[test]
fn bench_json_and_the_report_drawn_from_it() {
    let dir = std::env::temp_dir().join(format!("ugds-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b, svg) = (dir.join("qd1.json"), dir.join("qd8.json"), dir.join("r.svg"));
    for (qd, path) in [("1", &a), ("8", &b)] {
        let p = path.to_str().unwrap();
        let (ok, _, err) = ugds(&["bench", "--emu-null", "-s", "4k,64k", "-q", qd, "-d", "0.2", "--json", p]);
        assert!(ok, "{err}");
    }
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&a).unwrap()).unwrap();
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["size"], 65536);
    assert!(runs[0]["iops"].as_f64().unwrap() > 0.0 && runs[0]["latency_us"]["p99"].as_f64().unwrap() > 0.0);
    assert_eq!(runs[0]["latency_us"]["cdf"].as_array().unwrap().last().unwrap()[1], 1.0);
    assert!(doc["command"].as_str().unwrap().contains("--json"), "{doc}");
    assert!(doc["machine"]["cpus"].as_u64().unwrap() >= 1);
    assert!(doc["target"].as_str().unwrap().contains("emulated controller"));
    // The queue pairs' own counts of the runs: every I/O of the runs, each
    // one command (4 KiB and 64 KiB fit one), on the lent queue.
    let ios: u64 = runs.iter().map(|r| r["ios"].as_u64().unwrap()).sum();
    let used: Vec<_> = doc["queues"].as_array().unwrap().iter().filter(|q| !q["during_runs"].is_null()).collect();
    assert_eq!(used.len(), 1, "{doc}");
    let d = &used[0]["during_runs"];
    assert!(d["submitted"].as_u64().unwrap() >= ios && d["errors"] == 0 && d["timeouts"] == 0, "{doc}");
    assert_eq!(d["submitted"], d["completed"]);
    let (ok, _, err) = ugds(&["report", "-o", svg.to_str().unwrap(), a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(ok, "{err}");
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    // Two bandwidth lines and four CDF curves, labelled by file.
    assert_eq!(s.matches("<polyline").count(), 6, "{s}");
    assert!(s.contains("qd1 randread queue qd 1") && s.contains("qd8 randread queue qd 8"), "{s}");
    assert!(s.contains(">64 KiB<"), "{s}");
    // Not bench output: refused with the file named.
    std::fs::write(dir.join("bad.json"), "{}").unwrap();
    let (ok, _, err) = ugds(&["report", "-o", svg.to_str().unwrap(), dir.join("bad.json").to_str().unwrap()]);
    assert!(!ok && err.contains("bad: no \"runs\""), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn stats_and_top_read_what_a_running_bench_publishes() {
    let dir = std::env::temp_dir().join(format!("ugds-stats-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let mut bench = Command::new(env!("CARGO_BIN_EXE_ugds"))
        .args(["bench", "--emu-null", "-q", "4", "-d", "5", "--no-progress", "--trace", "16"])
        .env("UGDS_STATS_DIR", d)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = bench.id() as u64;
    // Published once the handle is open, and I/O under way.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let doc = loop {
        let (ok, out, err) = ugds(&["stats", "--dir", d, "--json"]);
        assert!(ok, "{err}");
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        let busy = doc.as_array().unwrap().iter().any(|h| {
            h["pid"] == pid && h["queues"].as_array().unwrap().iter().any(|q| q["completed"].as_u64().unwrap() > 0)
        });
        if busy {
            break doc;
        }
        assert!(std::time::Instant::now() < give_up, "nothing published by pid {pid}: {out}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let h = doc.as_array().unwrap().iter().find(|h| h["pid"] == pid).unwrap();
    assert!(h["queues"].as_array().unwrap().iter().all(|q| q["errors"] == 0 && q["timeouts"] == 0), "{doc}");
    // Traced: each queue's latencies, the busy one's counting its commands.
    let busy = h["queues"].as_array().unwrap().iter().find(|q| q["completed"].as_u64().unwrap() > 0).unwrap();
    let lat = &busy["latency_ns"];
    assert!(
        lat["commands"].as_u64().unwrap() > 0 && lat["p50"].as_u64().unwrap() <= lat["max"].as_u64().unwrap(),
        "{doc}"
    );
    let (ok, out, err) = ugds(&["top", "--dir", d, "-n", "1", "-i", "0.2"]);
    assert!(ok, "{err}");
    assert!(words(&out).contains(&format!("{pid} 1 2 lendable")), "{out}");
    let (ok, out, _) = ugds(&["stats", "--dir", d]);
    assert!(ok && words(&out).contains(&format!("pid {pid} handle 1")), "{out}");
    assert!(out.contains("latency over") && out.contains("(traced): us p50"), "{out}");
    assert!(bench.wait().unwrap().success());
    // The file went with the handle.
    let (ok, out, _) = ugds(&["stats", "--dir", d]);
    assert!(ok && out.contains("no process publishes statistics"), "{out}");
    let (ok, _, err) = ugds(&["top", "--dir", d, "-i", "0"]);
    assert!(!ok && err.contains("-i: seconds"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What the bench counted is what the queues counted: the I/Os of the run
/// line equal the commands of the queue lines (4 KiB reads, one command
/// each), for synchronous calls and lent queues, one thread and two.
#[test]
fn the_bench_and_the_queues_count_the_same_commands() {
    for args in [&["-q", "1", "-t", "2"][..], &["-q", "8", "-t", "2"], &["-q", "1", "--mode", "adaptive"]] {
        let mut a = vec!["bench", "--emu-null", "-d", "0.2", "--no-progress"];
        a.extend_from_slice(args);
        let (ok, out, err) = ugds(&a);
        assert!(ok, "{err}");
        let run = out.lines().find(|l| l.starts_with("randread")).unwrap_or_else(|| panic!("{out}"));
        let ios: u64 = run.rsplit(", ").next().and_then(|s| s.strip_suffix(" I/Os")).unwrap().parse().unwrap();
        let commands: u64 = out
            .lines()
            .filter(|l| l.starts_with("queue "))
            .map(|l| l.split_whitespace().nth(3).unwrap().parse::<u64>().unwrap())
            .sum();
        assert!(ios > 0);
        assert_eq!(ios, commands, "{args:?}: {out}");
    }
}

#[test]
fn bench_runs_several_targets_as_one_volume() {
    let dir = std::env::temp_dir().join(format!("ugds-cli-volume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("volume.json");
    // Two files through the kernel, striped, every byte read from the
    // volume checked against the pattern written through it.
    let (a, b) = (dir.join("a.img"), dir.join("b.img"));
    for f in [&a, &b] {
        std::fs::write(f, vec![0u8; 4 << 20]).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ugds"))
        .args(["bench", "--file", a.to_str().unwrap(), "--file", b.to_str().unwrap(), "--stripe", "64k"])
        .args(["-s", "128k", "-q", "4", "-d", "0.3", "--verify", "--no-progress", "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("volume of 2: striped (RAID 0), 64 KiB stripes"), "{text}");
    assert!(text.contains("member 0 alone") && text.contains("the volume"), "{text}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r["errors"] == 0 && r["mismatched_words"] == 0 && r["ios"].as_u64().unwrap() > 0));
    assert!(runs[1]["vs_one_member"].is_null(), "no ratio where only the volume's reads are checked");
    // Emulated controllers, concatenated, at qd 1, with the ratio.
    let out = Command::new(env!("CARGO_BIN_EXE_ugds"))
        .args(["bench", "--emu-controllers", "3", "--emu-memory", "--emu-size", "8m", "--concat"])
        .args(["-s", "4k", "-q", "1", "-d", "0.2", "--no-progress", "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("volume of 3: concatenated"), "{text}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(doc["runs"][1]["vs_one_member"].as_f64().is_some_and(|r| r > 0.0), "{doc}");
    // Refused: a stripe that is not a power of two; a volume with --stream.
    for bad in [&["--stripe", "96k"][..], &["--stream"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_ugds"))
            .args(["bench", "--emu-controllers", "2", "--emu-memory", "--emu-size", "8m", "-d", "0.1", "--no-progress"])
            .args(bad)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad:?} accepted");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ugds bench --tcp -q 8` against a target that stops answering (one read
/// never answered, mid-run) ends with the timeout's error, not spinning on
/// and not hiding it behind the refused deregistration: the handle's
/// timeout is 30 s, so the bench must end within that, the late check's
/// tenth, the Abort grace and a margin.
#[test]
fn a_tcp_bench_against_a_silent_target_ends_with_the_timeout() {
    use ugds_emu::tcp::{EmuTcpConfig, EmuTcpTarget, TcpFault};
    let t = EmuTcpTarget::start(EmuTcpConfig::default()).unwrap();
    let mut bench = Command::new(env!("CARGO_BIN_EXE_ugds"))
        .args(["bench", "--tcp", t.addr(), "--nqn", t.nqn(), "-q", "8", "-s", "4k", "-d", "120", "--no-progress"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Reads under way, then one never answered.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while t.stats().reads < 1000 {
        assert!(std::time::Instant::now() < give_up, "the bench did not start reading: {:?}", t.stats());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    t.set_fault(TcpFault::Silent);
    let stalled = std::time::Instant::now();
    let ended = loop {
        if let Some(s) = bench.try_wait().unwrap() {
            break s;
        }
        if stalled.elapsed() > std::time::Duration::from_secs(60) {
            let _ = bench.kill();
            panic!("the bench still ran 60 s after the target stopped answering");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let took = stalled.elapsed();
    let out = bench.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!ended.success(), "{err}");
    assert!(err.contains("did not complete within 30s"), "{err}");
    assert!(took < std::time::Duration::from_secs(40), "ended {took:?} after the stall");
}

#[test]
fn a_kernel_path_bench_reads_warm_data_from_the_page_cache_and_refuses_an_unknown_policy_from_flag_or_environment() {
    let dir = std::env::temp_dir().join(format!("ugds-cli-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("data");
    std::fs::write(&file, vec![7u8; 8 << 20]).unwrap();
    let f = file.to_str().unwrap();
    // Just written: in the page cache, which `auto` (the default) reads from.
    let (ok, out, err) = ugds(&["bench", "--file", f, "-d", "0.3", "--cache", "auto"]);
    let (ok2, _, err2) = ugds(&["bench", "--file", f, "-d", "0.3", "--cache", "cached"]);
    // The same name in the environment variable the option stands in for.
    let env = Command::new(env!("CARGO_BIN_EXE_ugds"))
        .args(["bench", "--file", f, "-d", "0.3"])
        .env("UGDS_CACHE_POLICY", "cached")
        .output()
        .expect("run ugds");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(ok, "{err}");
    let hits = out.lines().find(|l| l.contains("page cache:")).unwrap_or_else(|| panic!("{out}"));
    assert!(!hits.contains(": 0 reads served"), "cached data is read from the page cache: {hits}");
    assert!(!ok2, "an unknown cache policy is refused");
    assert!(err2.contains("unknown cache policy \"cached\": expected auto, direct or buffered"), "{err2}");
    let err3 = String::from_utf8_lossy(&env.stderr);
    assert!(!env.status.success(), "an unknown UGDS_CACHE_POLICY is refused: {err3}");
    assert!(err3.contains("UGDS_CACHE_POLICY: invalid argument: unknown cache policy \"cached\""), "{err3}");
}
