//! `ugds serve` and processes attached to it: several at once, on shared
//! and split namespaces, one killed mid-I/O, the owner killed.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Served {
    child: Child,
    socket: PathBuf,
}

impl Served {
    /// `ugds serve` on an emulated memory namespace, ready once it says so.
    fn start(name: &str, extra: &[&str]) -> Served {
        let socket = std::env::temp_dir().join(format!("ugds-serve-test-{}-{name}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let mut child = Command::new(env!("CARGO_BIN_EXE_ugds"))
            .args(["serve", "--socket"])
            .arg(&socket)
            .args(["--emu-memory", "--emu-size", "64M"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("run ugds serve");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("serving"), "{line}");
        Served { child, socket }
    }

    fn ugds(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ugds"));
        c.args(args).arg("--attach").arg(&self.socket);
        c
    }

    /// SIGTERM, then what it printed.
    fn stop(mut self) -> String {
        // SAFETY: signals a child process of ours.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap()).wait_with_output().unwrap();
        assert!(out.status.success(), "ugds serve: {}", out.status);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn check(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}\n{text}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn four_processes_with_two_queue_pairs_each_verify_on_a_shared_namespace() {
    let s = Served::start("shared", &[]);
    for rw in ["randwrite", "randread"] {
        let out = check(
            &s.ugds(&["bench", "-p", "4", "-t", "2", "-q", "8", "-d", "0.5", "--verify", "--rw", rw]).output().unwrap(),
        );
        assert_eq!(out.matches(" 0 mismatched 8-byte words").count(), 4, "{out}");
        assert!(out.lines().any(|l| l.starts_with("sum ") && l.contains("4 processes")), "{out}");
    }
    let out = s.stop();
    assert!(out.contains("8 sessions served, 0 refused at attach, 0 requests refused, 0 left"), "{out}");
    assert!(out.contains(" 0 DMA faults"), "{out}");
}

#[test]
fn a_split_namespace_gives_each_process_its_own_range() {
    let s = Served::start("split", &["--split", "4"]);
    let out = check(&s.ugds(&["bench", "-p", "4", "-q", "4", "-d", "0.3", "--verify"]).output().unwrap());
    assert_eq!(out.matches(" 0 mismatched 8-byte words").count(), 4, "{out}");
    // Each prefilled its own 16 MiB part.
    assert_eq!(out.matches("prefill  16 MiB written").count(), 4, "{out}");
    let out = s.stop();
    assert!(out.contains(" 0 DMA faults") && out.contains("0 left"), "{out}");
}

#[test]
fn a_process_killed_mid_io_leaves_the_others_running_with_right_data() {
    let s = Served::start("kill", &[]);
    let spawn = |d: &str| {
        s.ugds(&["bench", "-q", "16", "-d", d, "--verify", "--rw", "randwrite", "--no-progress"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let survivors: Vec<Child> = (0..2).map(|_| spawn("3")).collect();
    for round in 0..3 {
        let mut victim = spawn("10");
        std::thread::sleep(Duration::from_millis(700));
        victim.kill().unwrap(); // SIGKILL
        let st = victim.wait().unwrap();
        assert!(!st.success(), "round {round}: the victim finished before it was killed");
    }
    for c in survivors {
        let out = check(&c.wait_with_output().unwrap());
        assert!(out.contains(" 0 mismatched 8-byte words"), "{out}");
    }
    // Served as before: data written by the dead is the pattern or older.
    let out = check(&s.ugds(&["bench", "-q", "8", "-d", "0.3", "--verify", "--no-progress"]).output().unwrap());
    assert!(out.contains(" 0 mismatched 8-byte words"), "{out}");
    let out = s.stop();
    assert!(out.contains("6 sessions served") && out.contains("0 left their memory mapped"), "{out}");
    assert!(out.contains(" 0 DMA faults"), "{out}");
}

#[test]
fn the_owner_killed_ends_an_attached_process_with_an_error_not_a_hang() {
    let mut s = Served::start("owner", &[]);
    let client = s
        .ugds(&["bench", "-q", "8", "-d", "60", "--rw", "randwrite", "--no-progress"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    s.child.kill().unwrap(); // SIGKILL: no teardown
    s.child.wait().unwrap();
    let t = Instant::now();
    let out = client.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the client went on: {}", String::from_utf8_lossy(&out.stdout));
    assert!(err.contains("gone") || err.contains("owner"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(30), "the client took {:?} to fail", t.elapsed());
}

#[test]
fn serve_refuses_what_it_cannot_serve() {
    let out = Command::new(env!("CARGO_BIN_EXE_ugds")).args(["serve", "--file", "/dev/null"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("serves a controller"));
    let out = Command::new(env!("CARGO_BIN_EXE_ugds")).args(["bench", "-p", "2", "-d", "0.1"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--attach"));
    let out = Command::new(env!("CARGO_BIN_EXE_ugds"))
        .args(["identify", "--attach", "/nonexistent/ugds.sock"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/ugds.sock"));
}
