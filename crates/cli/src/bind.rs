//! `ugds list`, `ugds bind`, `ugds unbind`: NVMe functions and the driver
//! they are bound to, moved between nvme, vfio-pci and ugds_drv through
//! sysfs. A slip must not take a device from under the kernel or a process:
//!
//! - what the kernel itself refuses is refused, `--force` or not: a
//!   namespace or partition that cannot be opened exclusively (`O_EXCL`
//!   gives EBUSY while a file system in any mount namespace, swap, md/dm, a
//!   btrfs or ZFS pool or an external log device holds it);
//! - what we find otherwise is refused unless `--force`: mounts, swap and
//!   holders named (for the message), processes that have a namespace open
//!   (a VM on the raw device), loop devices, nvmet exports and LIO backstores
//!   on them, a process that has the function's `/dev/ugds_drvN` open.

use crate::sysfs::{self, Sys, PCI};
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The drivers a function can be moved to.
const DRIVERS: [&str; 3] = ["nvme", "vfio-pci", "ugds_drv"];

/// Kernel users that hold a device without claiming it exclusively: a loop
/// device backed by it, an NVMe-oF export (nvmet), a LIO backstore.
fn exports(name: &str) -> Vec<String> {
    let dev = format!("/dev/{name}");
    let mut out = Vec::new();
    let matches = |p: &Path| read(p) == dev;
    if let Ok(d) = fs::read_dir("/sys/block") {
        for e in d.flatten() {
            if matches(&e.path().join("loop/backing_file")) {
                out.push(format!("{dev} backs /dev/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    let dirs =
        |p: &Path| fs::read_dir(p).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>()).unwrap_or_default();
    for sub in dirs(Path::new("/sys/kernel/config/nvmet/subsystems")) {
        for ns in dirs(&sub.join("namespaces")) {
            if matches(&ns.join("device_path")) {
                let nqn = sub.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                out.push(format!("{dev} is exported by nvmet (subsystem {nqn})"));
            }
        }
    }
    for hba in dirs(Path::new("/sys/kernel/config/target/core")) {
        for store in dirs(&hba) {
            if matches(&store.join("udev_path")) {
                out.push(format!("{dev} is a LIO backstore ({})", store.display()));
            }
        }
    }
    out
}

/// Whether the kernel holds the device: an exclusive open fails with EBUSY.
fn claimed(name: &str) -> bool {
    let r = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(format!("/dev/{name}"));
    matches!(r, Err(e) if e.raw_os_error() == Some(libc::EBUSY))
}

/// Processes (of this PID namespace) with block device `dev` open.
fn openers(name: &str, dev: u64) -> Vec<String> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else { return out };
    for p in procs.flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let Ok(fds) = fs::read_dir(p.path().join("fd")) else { continue };
        let open = fds
            .flatten()
            .any(|fd| fs::metadata(fd.path()).is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == dev));
        if open {
            out.push(format!("/dev/{name} is open in process {pid} ({})", read(p.path().join("comm"))));
        }
    }
    out
}

/// Whether another process has a ugds_drv node of the function open (the
/// module allows one opener: opening it fails with EBUSY).
fn drv_nodes_busy(bdf: &str) -> Vec<String> {
    let Ok(d) = fs::read_dir(format!("{PCI}/{bdf}/ugds_drv")) else { return Vec::new() };
    d.flatten()
        .filter_map(|e| {
            let node = format!("/dev/{}", e.file_name().to_string_lossy());
            let r = fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(&node);
            matches!(r, Err(e) if e.raw_os_error() == Some(libc::EBUSY))
                .then(|| format!("{node} is open in another process"))
        })
        .collect()
}

fn read(p: impl AsRef<Path>) -> String {
    fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default()
}

fn devnum_from(majmin: &str) -> u64 {
    let mut it = majmin.split(':').map(|x| x.parse::<u32>().unwrap_or(0));
    libc::makedev(it.next().unwrap_or(0), it.next().unwrap_or(0))
}

pub fn list() -> Result<(), String> {
    let sys = Sys::live();
    let fns = sysfs::nvme_functions(&sys);
    if fns.is_empty() {
        println!("no NVMe functions");
        return Ok(());
    }
    for bdf in fns {
        let ids = format!("{}:{}", read(format!("{PCI}/{bdf}/vendor")), read(format!("{PCI}/{bdf}/device")));
        let drv = sysfs::driver_of(&sys, &bdf).unwrap_or_else(|| "(none)".into());
        println!("{bdf}  {ids}  driver {drv}");
        for (name, dev) in sysfs::block_devices(&sys, &bdf) {
            let u = sysfs::uses(&sys, &name, &dev);
            println!("    /dev/{name}{}", if u.is_empty() { String::new() } else { format!("  ({})", u.join("; ")) });
        }
        let drvdev = format!("{PCI}/{bdf}/ugds_drv");
        if let Ok(d) = fs::read_dir(drvdev) {
            for e in d.flatten() {
                println!("    /dev/{}", e.file_name().to_string_lossy());
            }
        }
    }
    Ok(())
}

fn write(path: &str, what: &str) -> Result<(), String> {
    fs::write(path, what).map_err(|e| format!("writing {what:?} to {path}: {e}"))
}

/// Moves `bdf` to `target` (nvme, vfio-pci, ugds_drv; "none" leaves it unbound).
pub fn bind(bdf: &str, target: &str, force: bool) -> Result<(), String> {
    let sys = Sys::live();
    if !sysfs::nvme_functions(&sys).iter().any(|f| f == bdf) {
        return Err(format!("{bdf} is not an NVMe function (see `ugds list`)"));
    }
    if target != "none" && !DRIVERS.contains(&target) {
        return Err(format!("unknown driver {target:?}: nvme, vfio-pci or ugds_drv"));
    }
    let current = sysfs::driver_of(&sys, bdf);
    if current.as_deref() == Some(target) {
        println!("{bdf} is bound to {target} already");
        return Ok(());
    }
    if target != "none" && !Path::new(&format!("/sys/bus/pci/drivers/{target}")).exists() {
        return Err(format!("driver {target} is not loaded (modprobe {target}, or insmod kmod/ugds_drv.ko)"));
    }
    let from = current.as_deref().unwrap_or("its driver");
    let (mut held, mut in_use) = (Vec::new(), Vec::new());
    for (name, majmin) in sysfs::block_devices(&sys, bdf) {
        let named = sysfs::uses(&sys, &name, &majmin);
        let dev = devnum_from(&majmin);
        if claimed(&name) {
            held.push(if named.is_empty() {
                format!(
                    "the kernel holds /dev/{name} (an exclusive open fails: a file system in some mount \
                     namespace, swap, md/dm, a btrfs or ZFS pool, or a log device)"
                )
            } else {
                named.join("; ")
            });
        } else {
            in_use.extend(named);
        }
        in_use.extend(openers(&name, dev));
        in_use.extend(exports(&name));
    }
    if current.as_deref() == Some("ugds_drv") {
        in_use.extend(drv_nodes_busy(bdf));
    }
    if !held.is_empty() {
        return Err(format!(
            "refusing to take {bdf} from {from}: {}; release it first (--force does not override what the \
             kernel itself refuses)",
            held.join("; ")
        ));
    }
    if !in_use.is_empty() {
        if !force {
            return Err(format!(
                "refusing to take {bdf} from {from}: {}; unmount / swapoff / remove the holders / stop those \
                 processes first, or pass --force",
                in_use.join("; ")
            ));
        }
        eprintln!("ugds: --force: taking {bdf} although {}", in_use.join("; "));
    }
    if current.is_some() {
        write(&format!("{PCI}/{bdf}/driver/unbind"), bdf)?;
    }
    // nvme binds by class; the others only through driver_override.
    let over = if target == "nvme" || target == "none" { "\n" } else { target };
    write(&format!("{PCI}/{bdf}/driver_override"), over)?;
    if target != "none" {
        write("/sys/bus/pci/drivers_probe", bdf)?;
        let now = sysfs::driver_of(&sys, bdf);
        if now.as_deref() != Some(target) {
            return Err(format!("{bdf} did not bind to {target} (now: {})", now.as_deref().unwrap_or("no driver")));
        }
    }
    println!("{bdf}: {} -> {target}", current.as_deref().unwrap_or("(none)"));
    Ok(())
}

pub fn main(cmd: &str, args: Vec<std::ffi::OsString>) -> Result<(), String> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut pos = Vec::new();
    let mut force = false;
    while let Some(a) = p.next().map_err(|e| e.to_string())? {
        match a {
            Long("force") => force = true,
            Value(v) => pos.push(v.string().map_err(|e| e.to_string())?),
            Short('h') | Long("help") => {
                print!("{HELP}");
                return Ok(());
            }
            _ => return Err(a.unexpected().to_string()),
        }
    }
    match (cmd, pos.as_slice()) {
        ("list", []) => list(),
        ("bind", [bdf, target]) => bind(bdf, target, force),
        ("unbind", [bdf]) => bind(bdf, "none", force),
        _ => Err(format!("usage:\n{HELP}")),
    }
}

pub const HELP: &str = "\
  ugds list                            NVMe functions, drivers, namespaces and their users
  ugds bind BDF nvme|vfio-pci|ugds_drv [--force]
                                       move a function to a driver; refuses one whose
                                       namespaces are mounted, swap or dm/md-held
  ugds unbind BDF [--force]            leave a function without a driver
";
