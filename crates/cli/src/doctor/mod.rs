//! `ugds doctor`: what will work on this machine, and why not.
//!
//! For each NVMe function: the kernel path (io_uring on its namespaces,
//! passthrough on their generic character devices), the user-space driver
//! (vfio-pci into host memory; ugds_drv, which also imports GPU memory as a
//! dma-buf), and for each GPU the fastest way its memory is reached from
//! that SSD: peer-to-peer (the SSD writes GPU memory), user space with host
//! staging (the SSD writes host memory, the application copies), or the
//! kernel path (pinned bounce buffers and the copy engine). Plain text, or
//! JSON with `--json`; with `--mode`, the exit status says whether that
//! mode can run here (0) or not (1).

mod facts;
mod topology;

use crate::sysfs::Sys;
use facts::{between, Facts, Gpu, Nvme, CONFIG_ITEMS};
use serde_json::{json, Value};
use std::path::PathBuf;
use topology::Distance;

pub const HELP: &str = "\
Usage: ugds doctor [--json] [--mode kernel|user|p2p] [--root DIR] [--record DIR]

Says what will work on this machine and why not: the kernel and its
configuration, the IOMMU, each NVMe function (driver, IOMMU group, what
holds its namespaces), ugds_drv, the memlock limit, hugepages, GPUs (BAR
size; through the loaded CUDA driver, dma-buf export), the PCIe distance of
each GPU from each NVMe function, and for each pair the fastest mode.

Options:
      --json          the same as JSON, for scripts
      --mode MODE     exit 0 if MODE can run here, 1 if not: kernel (the
                      kernel path on an NVMe namespace or any file), user
                      (the user-space driver), p2p (an SSD writing GPU memory)
      --root DIR      read a recorded tree instead of this machine's /sys,
                      /proc and /boot (GPU drivers are not asked)
      --record DIR    also copy every file read into DIR (a fixture)
";

/// A way for data to move between an NVMe namespace and memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    /// The SSD writes GPU memory (ugds_drv importing a dma-buf).
    P2p,
    /// The user-space driver into host memory (GPU data copied by the
    /// application).
    User,
    /// The kernel path.
    Kernel,
}

impl Mode {
    fn key(self) -> &'static str {
        match self {
            Mode::P2p => "p2p",
            Mode::User => "user",
            Mode::Kernel => "kernel",
        }
    }
}

/// Whether `mode` is available for function `n` (and GPU `g`), and how or
/// why not.
fn verdict(f: &Facts, n: &Nvme, g: Option<&Gpu>, mode: Mode) -> Result<String, String> {
    let held = n.holders();
    let bindable = |to: &str| -> Result<String, String> {
        if held.is_empty() {
            Ok(format!("after `ugds bind {} {to}`", n.bdf))
        } else {
            Err(format!("its namespaces are in use ({})", held.join("; ")))
        }
    };
    let vfio_ok = || -> Result<(), String> {
        let cfg = |k| f.kernel.config.iter().find(|(c, _)| *c == k).and_then(|(_, v)| v.clone());
        if cfg("CONFIG_VFIO_PCI").as_deref() == Some("n") {
            return Err("the kernel has no vfio-pci".into());
        }
        if f.iommu.units.is_empty() && !f.iommu.noiommu {
            return Err(
                "no IOMMU is on (enable it in firmware and on the kernel command line, e.g. intel_iommu=on)".into()
            );
        }
        Ok(())
    };
    match mode {
        Mode::Kernel => {
            if !f.kernel.io_uring {
                return Err("io_uring is disabled (sysctl kernel.io_uring_disabled)".into());
            }
            match n.driver.as_deref() {
                Some("nvme") if !n.namespaces.is_empty() => Ok(format!(
                    "io_uring on {} (NVMe passthrough on /dev/ng*)",
                    n.namespaces.iter().map(|(d, _)| format!("/dev/{d}")).collect::<Vec<_>>().join(", ")
                )),
                Some("nvme") => Err("bound to nvme but no namespace is attached".into()),
                Some(d) => Err(format!("bound to {d}: `ugds bind {} nvme` gives it back to the kernel", n.bdf)),
                None => Err(format!("bound to no driver: `ugds bind {} nvme`", n.bdf)),
            }
        }
        Mode::User => match n.driver.as_deref() {
            Some("vfio-pci") => vfio_ok().map(|()| format!("ready: `ugds bench --pci {}`", n.bdf)),
            Some("ugds_drv") => {
                Ok(format!("ready: `ugds bench --drv /dev/{}`", n.drv_nodes.first().map_or("ugds_drvN", |s| s)))
            }
            _ => match (vfio_ok(), f.drv.loaded) {
                (Ok(()), _) => bindable("vfio-pci"),
                (Err(_), true) => bindable("ugds_drv"),
                (Err(e), false) => Err(format!("{e}, and ugds_drv is not loaded")),
            },
        },
        Mode::P2p => {
            let Some(g) = g else { return Err("no GPU".into()) };
            if let Some((_, false)) = &g.runtime {
                return Err(format!("{} does not export dma-bufs (driver or kernel too old)", g.bdf));
            }
            let route = match n.driver.as_deref() {
                Some("ugds_drv") => {
                    Ok(format!("ready: `--drv /dev/{}`", n.drv_nodes.first().map_or("ugds_drvN", |s| s)))
                }
                _ if !f.drv.loaded => {
                    Err("needs ugds_drv (vfio-pci cannot import GPU memory): it is not loaded".to_string())
                }
                _ => bindable("ugds_drv"),
            }?;
            let note = match between(n, g) {
                Some(Distance::AcrossSockets) => return Err("the SSD and the GPU are on different CPU sockets".into()),
                Some(d @ (Distance::SameRootComplex | Distance::AcrossHostBridges)) => {
                    format!(" ({}: peer-to-peer through the CPU, fast on some CPUs, slow on others)", d.describe())
                }
                Some(d) => format!(" ({})", d.describe()),
                None => String::new(),
            };
            let known = if g.runtime.is_none() { "; dma-buf export not checked (no GPU driver asked)" } else { "" };
            Ok(format!("{route}{note}{known}"))
        }
    }
}

/// The fastest mode for an NVMe function and a GPU, with its verdict.
fn fastest(f: &Facts, n: &Nvme, g: &Gpu) -> Option<(Mode, String)> {
    [Mode::P2p, Mode::User, Mode::Kernel].into_iter().find_map(|m| verdict(f, n, Some(g), m).ok().map(|s| (m, s)))
}

/// Whether `mode` can run anywhere here.
fn available(f: &Facts, mode: Mode) -> bool {
    match mode {
        // Files on any filesystem take the kernel path.
        Mode::Kernel => f.kernel.io_uring,
        Mode::User => f.nvme.iter().any(|n| verdict(f, n, None, Mode::User).is_ok()),
        Mode::P2p => f.nvme.iter().any(|n| f.gpus.iter().any(|g| verdict(f, n, Some(g), Mode::P2p).is_ok())),
    }
}

fn bytes(n: u64) -> String {
    crate::fmt_bytes(n)
}

fn to_json(f: &Facts) -> Value {
    let nvme: Vec<Value> = f
        .nvme
        .iter()
        .map(|n| {
            let modes: serde_json::Map<String, Value> = [Mode::Kernel, Mode::User]
                .into_iter()
                .map(|m| {
                    let v = match verdict(f, n, None, m) {
                        Ok(how) => json!({"available": true, "how": how}),
                        Err(why) => json!({"available": false, "why": why}),
                    };
                    (m.key().to_string(), v)
                })
                .collect();
            json!({
                "bdf": n.bdf, "ids": n.ids, "driver": n.driver, "numa_node": n.numa,
                "iommu_group": n.iommu_group, "iommu_group_peers": n.group_peers,
                "namespaces": n.namespaces.iter().map(|(d, u)| json!({"device": format!("/dev/{d}"), "used_by": u})).collect::<Vec<_>>(),
                "ugds_drv_nodes": n.drv_nodes, "modes": modes,
            })
        })
        .collect();
    let gpus: Vec<Value> = f
        .gpus
        .iter()
        .map(|g| {
            json!({
                "bdf": g.bdf, "vendor": g.vendor, "driver": g.driver, "numa_node": g.numa,
                "bar": g.bar.map(|(i, n)| json!({"index": i, "bytes": n})),
                "name": g.runtime.as_ref().map(|r| r.0.clone()),
                "dmabuf_export": g.runtime.as_ref().map(|r| r.1),
            })
        })
        .collect();
    let pairs: Vec<Value> = f
        .nvme
        .iter()
        .flat_map(|n| f.gpus.iter().map(move |g| (n, g)))
        .map(|(n, g)| {
            let best = fastest(f, n, g);
            json!({
                "nvme": n.bdf, "gpu": g.bdf, "distance": between(n, g).map(Distance::key),
                "fastest_mode": best.as_ref().map(|b| b.0.key()), "how": best.map(|b| b.1),
            })
        })
        .collect();
    json!({
        "kernel": {
            "release": f.kernel.release, "config_source": f.kernel.config_source,
            "config": f.kernel.config.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "io_uring": f.kernel.io_uring,
        },
        "iommu": {"units": f.iommu.units, "mode": f.iommu.mode, "cmdline": f.iommu.cmdline, "vfio_noiommu": f.iommu.noiommu},
        "ugds_drv": {"loaded": f.drv.loaded, "version": f.drv.version, "srcversion": f.drv.srcversion},
        "memlock_bytes": f.limits.memlock.map(|m| m.map_or(json!("unlimited"), |b| json!(b))),
        "memlock_binding": !f.limits.ipc_lock,
        "handle_queue_memory_bytes": ugds::HandleOptions::default().queue_memory(),
        "hugepages": {"total": f.limits.hugepages_total, "free": f.limits.hugepages_free, "size_kib": f.limits.hugepage_kb},
        "nvme": nvme, "gpus": gpus, "pairs": pairs,
        "gpu_driver_asked": f.runtime_asked, "gpu_driver_note": f.runtime_note,
        "available": {"kernel": available(f, Mode::Kernel), "user": available(f, Mode::User), "p2p": available(f, Mode::P2p)},
    })
}

fn print_text(f: &Facts) {
    let k = &f.kernel;
    println!("kernel       {}{}", k.release, if k.io_uring { "" } else { " (io_uring disabled)" });
    match &k.config_source {
        Some(src) => {
            for ((item, v), (_, why)) in k.config.iter().zip(CONFIG_ITEMS) {
                println!("  {item:<26} {:<2} {why}", v.as_deref().unwrap_or("?"));
            }
            println!("  (from {src})");
        }
        None => println!("  configuration not found (/boot/config-{}): items not checked", k.release),
    }
    let i = &f.iommu;
    if i.units.is_empty() {
        println!("iommu        none registered{}", if i.noiommu { " (vfio unsafe no-IOMMU mode on)" } else { "" });
    } else {
        println!("iommu        on ({}), default domain {}", i.units.join(", "), i.mode.as_deref().unwrap_or("?"));
    }
    if !i.cmdline.is_empty() {
        println!("  command line: {}", i.cmdline.join(" "));
    }
    let d = &f.drv;
    println!(
        "ugds_drv     {}",
        match (d.loaded, &d.version) {
            (false, _) => "not loaded".to_string(),
            (true, Some(v)) => format!("loaded, version {v} (the library speaks ABI {})", ugds_platform_abi()),
            (true, None) => "loaded (no version exported)".to_string(),
        }
    );
    let l = &f.limits;
    let queues = ugds::HandleOptions::default().queue_memory() as u64;
    println!(
        "memlock      {}",
        match (l.memlock, l.ipc_lock) {
            (None, _) => "unknown".to_string(),
            (Some(None), _) => "unlimited".to_string(),
            (Some(Some(b)), true) => format!("{} (not binding: this process has CAP_IPC_LOCK)", bytes(b)),
            (Some(Some(b)), false) => format!(
                "{}{}",
                bytes(b),
                if b < queues + (64 << 20) { " (low: raise it with `ulimit -l` or limits.conf)" } else { "" }
            ),
        }
    );
    println!(
        "  vfio-pci and ugds_drv pin a handle's queues ({} with the default options) and every buffer registered; the kernel path pins the host buffers its rings register",
        bytes(queues)
    );
    println!(
        "hugepages    {} of {} free ({} KiB each; ugds needs none)",
        l.hugepages_free, l.hugepages_total, l.hugepage_kb
    );
    if f.nvme.is_empty() {
        println!("nvme         no NVMe functions (the kernel path still reads files on any filesystem)");
    }
    for n in &f.nvme {
        println!("nvme {}  {}  driver {}  numa {}", n.bdf, n.ids, n.driver.as_deref().unwrap_or("(none)"), n.numa);
        match &n.iommu_group {
            Some(g) if n.group_peers.is_empty() => println!("  iommu group {g} (alone)"),
            Some(g) => {
                println!("  iommu group {g}, shared with {} (vfio-pci takes them all)", n.group_peers.join(", "))
            }
            None => println!("  no iommu group"),
        }
        for (dev, used) in &n.namespaces {
            println!("  /dev/{dev}{}", if used.is_empty() { String::new() } else { format!(": {}", used.join("; ")) });
        }
        for m in [Mode::Kernel, Mode::User] {
            match verdict(f, n, None, m) {
                Ok(how) => println!("  {:<7} yes: {how}", m.key()),
                Err(why) => println!("  {:<7} no: {why}", m.key()),
            }
        }
    }
    if f.gpus.is_empty() {
        println!("gpu          none found");
    }
    for g in &f.gpus {
        let bar = g.bar.map_or(String::new(), |(i, n)| format!("  BAR{i} {}", bytes(n)));
        let rt = match &g.runtime {
            Some((name, dmabuf)) => format!("  {name}, dma-buf export {}", if *dmabuf { "yes" } else { "no" }),
            None => String::new(),
        };
        println!(
            "gpu {}  {}  driver {}  numa {}{bar}{rt}",
            g.bdf,
            g.vendor,
            g.driver.as_deref().unwrap_or("(none)"),
            g.numa
        );
    }
    if let Some(note) = &f.runtime_note {
        println!("  {note}");
    }
    for n in &f.nvme {
        for g in &f.gpus {
            let dist = between(n, g).map_or("distance unknown", Distance::describe);
            match fastest(f, n, g) {
                Some((m, how)) => println!("pair {} -> {}  {dist}: fastest {}: {how}", n.bdf, g.bdf, m.key()),
                None => println!("pair {} -> {}  {dist}: no mode available", n.bdf, g.bdf),
            }
        }
    }
    println!(
        "available    kernel {}, user {}, p2p {}",
        yes(available(f, Mode::Kernel)),
        yes(available(f, Mode::User)),
        yes(available(f, Mode::P2p))
    );
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn ugds_platform_abi() -> u32 {
    ugds::UGDS_DRV_ABI_VERSION
}

/// Runs `ugds doctor`; the exit status is the caller's.
pub fn main(args: Vec<std::ffi::OsString>) -> Result<std::process::ExitCode, String> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let (mut json_out, mut mode, mut root, mut record): (bool, Option<Mode>, Option<PathBuf>, Option<PathBuf>) =
        (false, None, None, None);
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        match arg {
            Long("json") => json_out = true,
            Long("mode") => {
                let v = p.value().map_err(|e| e.to_string())?.string().map_err(|_| "--mode: not UTF-8".to_string())?;
                mode = Some(match v.as_str() {
                    "kernel" => Mode::Kernel,
                    "user" => Mode::User,
                    "p2p" => Mode::P2p,
                    _ => return Err(format!("--mode {v}: kernel, user or p2p")),
                });
            }
            Long("root") => root = Some(p.value().map_err(|e| e.to_string())?.into()),
            Long("record") => record = Some(p.value().map_err(|e| e.to_string())?.into()),
            Short('h') | Long("help") => {
                print!("{HELP}");
                return Ok(std::process::ExitCode::SUCCESS);
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    let sys = match (&root, &record) {
        (Some(_), Some(_)) => return Err("--root and --record: one or the other".into()),
        (Some(r), None) if !r.is_dir() => return Err(format!("--root {}: no such directory", r.display())),
        (Some(r), None) => Sys::at(r),
        (None, Some(_)) => Sys::recording(),
        (None, None) => Sys::live(),
    };
    let facts = facts::gather(&sys, sys.is_live());
    if json_out {
        println!("{}", serde_json::to_string_pretty(&to_json(&facts)).map_err(|e| e.to_string())?);
    } else {
        print_text(&facts);
    }
    if let Some(dir) = record {
        let n = sys.save(&dir).map_err(|e| format!("--record {}: {e}", dir.display()))?;
        eprintln!("ugds doctor: {n} files and links recorded under {}", dir.display());
    }
    Ok(match mode {
        Some(m) if !available(&facts, m) => std::process::ExitCode::from(1),
        _ => std::process::ExitCode::SUCCESS,
    })
}
