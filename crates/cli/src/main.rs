//! `ugds`: identify an NVMe controller, benchmark it through ugds.
//!
//! With no target flags both commands run against an emulated controller
//! whose namespace is a temporary file, so they work on any machine.

mod bench;
mod bind;
mod clock;
mod doctor;
#[cfg(feature = "gpu-bench")]
mod gpubench;
mod hist;
mod histogram;
mod rdma;
mod report;
mod serve;
mod stats;
mod sysfs;
mod target;

use std::process::ExitCode;
use ugds::{Driver, HandleOptions};

const USAGE: &str = "\
ugds: user-space GPU Direct Storage

Usage:
  ugds identify [TARGET]          controller and namespace facts
  ugds bench [OPTIONS] [TARGET]   throughput, IOPS and latency
  ugds gpu-bench [OPTIONS] [TARGET]
                                  the same with CUDA device memory (GPU 0;
                                  in a build with --features gpu-bench)
  ugds serve [OPTIONS] [TARGET]   own a controller and serve it to other
                                  processes (each attaches with --attach)
  ugds doctor [--json] [--mode M] what will work on this machine, and why not
  ugds list | bind | unbind       NVMe functions and their drivers (ugds help bind)
  ugds hist [QUANTILE...]         percentiles of latencies (us) read from stdin
  ugds report [-o SVG] JSON...    draws `ugds bench --json` files: bandwidth, latency CDFs
  ugds stats | top                queue statistics of running processes (ugds help stats)
  ugds rdma                       RDMA devices and memory registration (NVMe over RDMA's needs)
  ugds help [COMMAND]

  -v, --verbose   more messages on standard error (-vv, -vvv); without it,
                  UGDS_LOG sets the level (off, error, warn: the default,
                  info, debug, trace)

Run `ugds help bench` for the benchmark's options.
";

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of our output goes
    // (`ugds identify | head -1`) instead of panicking on EPIPE.
    // SAFETY: restores the default disposition of one signal, before any
    // thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // -v, -vv, -vvv or --verbose, anywhere: the level of the library's
    // messages (no subcommand has a -v of its own).
    let mut verbose = 0;
    let all: Vec<_> = std::env::args_os()
        .skip(1)
        .filter(|a| match a.to_str() {
            Some("--verbose") => {
                verbose += 1;
                false
            }
            Some(s) if s.len() > 1 && s.starts_with('-') && s[1..].bytes().all(|b| b == b'v') => {
                verbose += s.len() - 1;
                false
            }
            _ => true,
        })
        .collect();
    use ugds::log::{Level, StderrLog};
    match verbose {
        0 => ugds::log::install_from_env(Level::WARN),
        n => {
            let level = [Level::INFO, Level::DEBUG, Level::TRACE][n.min(3) - 1];
            StderrLog::new(level).install();
        }
    }
    let mut args = all.into_iter();
    let cmd = args.next().map(|a| a.to_string_lossy().into_owned());
    let rest: Vec<_> = args.collect();
    let r = match cmd.as_deref() {
        Some("identify") => identify(rest),
        Some("bench") => bench::main(rest),
        Some("serve") => serve::main(rest),
        Some("gpu-bench") => gpu_bench(rest),
        Some("rdma") => rdma::main(rest),
        Some("hist") => hist::main(rest),
        Some("report") => report::main(rest),
        Some("stats") => stats::main(rest),
        Some("top") => stats::top(rest),
        Some("doctor") => match doctor::main(rest) {
            Ok(code) => return code,
            Err(e) => {
                eprintln!("ugds: {e}");
                return ExitCode::from(2);
            }
        },
        Some(c @ ("list" | "bind" | "unbind")) => bind::main(c, rest),
        Some("help") | Some("-h") | Some("--help") => {
            match rest.first().map(|a| a.to_string_lossy().into_owned()).as_deref() {
                Some("bench") => print!("{}", bench::HELP),
                Some("serve") => print!("{}{}", serve::HELP, target::HELP),
                #[cfg(feature = "gpu-bench")]
                Some("gpu-bench") => print!("{}{}", gpubench::HELP, target::HELP),
                Some("hist") => print!("{}", hist::HELP),
                Some("rdma") => print!("{}", rdma::HELP),
                Some("doctor") => print!("{}", doctor::HELP),
                Some("report") => print!("{}", report::HELP),
                Some("stats" | "top") => print!("{}", stats::HELP),
                Some("identify") => print!("Usage: ugds identify [TARGET]\n\n{}", target::HELP),
                Some("bind" | "unbind" | "list") => print!("{}", bind::HELP),
                _ => print!("{USAGE}"),
            }
            Ok(())
        }
        Some("--version") | Some("-V") => {
            println!("ugds {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        None => {
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
        Some(other) => Err(format!("unknown command {other:?}; try `ugds help`")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ugds: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What a benchmark ran on, for its JSON: host name, kernel, CPU, memory.
pub fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim().to_string()));
    let mem_kib: Option<u64> = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:")?.split_whitespace().next()?.parse().ok());
    serde_json::json!({
        "hostname": read("/proc/sys/kernel/hostname"),
        "kernel": read("/proc/sys/kernel/osrelease"),
        "cpu": cpu,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "memory_bytes": mem_kib.map(|k| k * 1024),
    })
}

/// Parses "4096", "4k", "4KiB", "1m", "2G".
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (num, mult) = match lower.trim_end_matches("ib").trim_end_matches('b') {
        x if x.ends_with('k') => (&x[..x.len() - 1], 1u64 << 10),
        x if x.ends_with('m') => (&x[..x.len() - 1], 1 << 20),
        x if x.ends_with('g') => (&x[..x.len() - 1], 1 << 30),
        x if x.ends_with('t') => (&x[..x.len() - 1], 1 << 40),
        x => (x, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("not a size: {s:?} (examples: 4096, 4k, 1M, 2G)"))
}

/// Formats bytes with a binary unit.
pub fn fmt_bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut i = 0;
    let mut v = n;
    while i < 4 && v >= 1024 && v % 1024 == 0 {
        v /= 1024;
        i += 1;
    }
    format!("{v} {}", U[i])
}

const IDENTIFY_TCP_HELP: &str = "\
With --tcp, identify probes the admin queue alone (connect, enable, identify,
shut down) and prints what the controller says of itself and its namespaces.
";

/// `ugds gpu-bench`: only in a build with the `gpu-bench` feature, which
/// brings the CUDA test objects into the binary.
fn gpu_bench(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    #[cfg(feature = "gpu-bench")]
    return gpubench::main(args);
    #[cfg(not(feature = "gpu-bench"))]
    {
        drop(args);
        Err("this ugds was built without gpu-bench: `cargo build --release -p ugds-cli --features gpu-bench` \
             (scripts/gpu-bench does)"
            .into())
    }
}

/// `ugds identify --tcp`: a target's controller through NVMe/TCP.
fn identify_tcp(addr: &str, nqn: &str, digests: bool) -> Result<(), String> {
    let mut t = ugds::fabrics::TcpTarget::new(addr, nqn);
    t.digests = ugds::fabrics::Digests { header: digests, data: digests };
    let p = ugds::fabrics::probe(&t).map_err(|e| e.to_string())?;
    let id = &p.identify;
    println!("target       {nqn} at {addr} (NVMe/TCP)");
    println!(
        "digests      header {}, data {}",
        if p.digests.header { "on" } else { "off" },
        if p.digests.data { "on" } else { "off" }
    );
    println!("controller   {} (given by Connect)", p.cntlid);
    println!("model        {}", id.mn);
    println!("serial       {}", id.sn);
    println!("firmware     {}", id.fr);
    println!("version      {}", p.version);
    println!("mqes         {} entries per queue", p.cap.mqes() as u32 + 1);
    println!("namespaces   {}", p.namespaces.len());
    for (nsid, blocks, bs) in &p.namespaces {
        println!("  nsid {nsid:<4} {blocks} blocks x {bs} bytes = {}", fmt_bytes(blocks * *bs as u64));
    }
    Ok(())
}

fn identify(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    use lexopt::prelude::*;
    let mut t = target::TargetOpts::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        match arg {
            Short('h') | Long("help") => {
                print!("Usage: ugds identify [TARGET]\n\n{}\n{IDENTIFY_TCP_HELP}", target::HELP);
                return Ok(());
            }
            Long(l) => {
                let l = l.to_owned();
                if !target::parse_long(&mut t, &l, &mut p).map_err(|e| e.to_string())? {
                    return Err(format!("unexpected option --{l}; try `ugds help identify`"));
                }
            }
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    if let (Some(addr), false) = (&t.tcp, t.emu_tcp) {
        let nqn = t.nqn.as_deref().ok_or("--tcp needs --nqn: the subsystem to connect to")?;
        return identify_tcp(addr, nqn, t.digests);
    }
    let target = target::open(&t)?;
    let driver = Driver::open();
    let opts = HandleOptions::default().nsid(t.nsid).sync_queues(1).async_queues(0);
    let h = target.open_handle(&driver, opts).map_err(|e| e.to_string())?;
    let c = h.controller();
    let id = &c.identify;
    println!("target       {}", target.description);
    println!("platform     {}", c.platform);
    println!("model        {}", id.mn);
    println!("serial       {}", id.sn);
    println!("firmware     {}", id.fr);
    println!("version      {}", c.version);
    println!("vendor       {:#06x} (subsystem {:#06x})", id.vid, id.ssvid);
    println!("controller   {}", id.cntlid);
    println!(
        "mdts         {}",
        c.max_transfer.map_or("unlimited".to_string(), |b| format!("{} per command", fmt_bytes(b as u64)))
    );
    println!("mqes         {} entries per queue", c.cap.mqes() as u32 + 1);
    println!("doorbells    stride {} bytes, timeout {} ms", 4u32 << c.cap.dstrd(), c.cap.to() as u32 * 500);
    println!("io queues    {} granted to this handle", c.io_queues);
    println!(
        "oncs         {:#06x} (dataset management {}, write zeroes {})",
        id.oncs,
        yes(id.oncs & ugds::nvme::IdentifyController::ONCS_DSM != 0),
        yes(id.oncs & ugds::nvme::IdentifyController::ONCS_WRITE_ZEROES != 0)
    );
    println!(
        "oacs         {:#06x} (doorbell buffer config {})",
        id.oacs,
        yes(id.oacs & ugds::nvme::IdentifyController::OACS_DBBUF != 0)
    );
    println!(
        "sgls         {:#010x} (SGLs {}; vectored requests that fit one command go as one {})",
        id.sgls,
        yes(ugds::nvme::sgl::supported(id.sgls)),
        if h.sgl() { "SGL command" } else { "command or more per segment (PRP windows)" }
    );
    println!("namespaces   {}", c.namespaces.len());
    for ns in &c.namespaces {
        println!("  nsid {:<4} {} blocks x {} bytes = {}", ns.nsid, ns.blocks, ns.block_size, fmt_bytes(ns.capacity()));
    }
    h.close(ugds::Drain::NoWait).map_err(|e| e.to_string())?;
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("x").is_err());
        assert_eq!(fmt_bytes(4096), "4 KiB");
        assert_eq!(fmt_bytes(1 << 30), "1 GiB");
        assert_eq!(fmt_bytes(1000), "1000 B");
    }
}
