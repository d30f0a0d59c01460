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

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

const PCI: &str = "/sys/bus/pci/devices";

/// The drivers a function can be moved to.
const DRIVERS: [&str; 3] = ["nvme", "vfio-pci", "ugds_drv"];

fn read(p: impl AsRef<Path>) -> String {
    fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default()
}

fn driver_of(bdf: &str) -> Option<String> {
    fs::read_link(format!("{PCI}/{bdf}/driver")).ok()?.file_name().map(|s| s.to_string_lossy().into_owned())
}

/// NVMe functions (class 0x010802), sorted.
fn functions() -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(PCI)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|b| read(format!("{PCI}/{b}/class")) == "0x010802")
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Block devices of the function's namespaces (and their partitions), by
/// name, with their device numbers.
fn block_devices(bdf: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let Ok(ctrls) = fs::read_dir(format!("{PCI}/{bdf}/nvme")) else { return out };
    for c in ctrls.flatten() {
        let Ok(entries) = fs::read_dir(c.path()) else { continue };
        for e in entries.flatten() {
            let mut name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("nvme") && name[4..].contains('n')) {
                continue;
            }
            // With native multipath the controller holds the hidden path
            // device (nvme0c0n1); the namespace is used through its head
            // (nvme0n1).
            if name[4..].contains('c') {
                match head_of(&name) {
                    Some(h) => name = h,
                    None => continue,
                }
            }
            if !Path::new(&format!("/sys/block/{name}")).exists() || out.iter().any(|(n, _)| *n == name) {
                continue;
            }
            out.push((name.clone(), devnum(&format!("/sys/block/{name}/dev"))));
            if let Ok(parts) = fs::read_dir(format!("/sys/block/{name}")) {
                for p in parts.flatten() {
                    let pn = p.file_name().to_string_lossy().into_owned();
                    if pn.starts_with(&name) && p.path().join("partition").exists() {
                        out.push((pn.clone(), devnum(&format!("/sys/block/{name}/{pn}/dev"))));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// The namespace head of a path device: `nvme<S>c<C>n<N>` is controller
/// C's path to namespace head `nvme<S>n<N>` of subsystem S (the names the
/// kernel's nvme multipath code gives).
fn head_of(path_dev: &str) -> Option<String> {
    let rest = path_dev.strip_prefix("nvme")?;
    let (subsys, rest) = rest.split_once('c')?;
    let (_, ns) = rest.split_once('n')?;
    Some(format!("nvme{subsys}n{ns}"))
}

fn devnum(path: &str) -> u64 {
    let s = read(path);
    let mut it = s.split(':').map(|x| x.parse::<u64>().unwrap_or(0));
    let (maj, min) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    libc::makedev(maj as u32, min as u32)
}

/// What uses a block device: mounts, swap, holders.
fn uses(name: &str, dev: u64) -> Vec<String> {
    let mut u = Vec::new();
    for line in read("/proc/self/mountinfo").lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 4 && devnum_from(f[2]) == dev {
            u.push(format!("/dev/{name} is mounted on {}", f[4]));
        }
    }
    for line in read("/proc/swaps").lines().skip(1) {
        if let Some(p) = line.split_whitespace().next() {
            if fs::metadata(p).map(|m| m.rdev()).ok() == Some(dev) {
                u.push(format!("/dev/{name} is used as swap"));
            }
        }
    }
    let holders = if Path::new(&format!("/sys/block/{name}")).exists() {
        format!("/sys/block/{name}/holders")
    } else {
        let disk: String = name.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches('p').to_string();
        format!("/sys/block/{disk}/{name}/holders")
    };
    if let Ok(h) = fs::read_dir(holders) {
        for e in h.flatten() {
            u.push(format!("/dev/{name} is held by {} (dm/md)", e.file_name().to_string_lossy()));
        }
    }
    u
}

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

fn devnum_from(majmin: &str) -> u64 {
    let mut it = majmin.split(':').map(|x| x.parse::<u32>().unwrap_or(0));
    libc::makedev(it.next().unwrap_or(0), it.next().unwrap_or(0))
}

pub fn list() -> Result<(), String> {
    let fns = functions();
    if fns.is_empty() {
        println!("no NVMe functions");
        return Ok(());
    }
    for bdf in fns {
        let ids = format!("{}:{}", read(format!("{PCI}/{bdf}/vendor")), read(format!("{PCI}/{bdf}/device")));
        let drv = driver_of(&bdf).unwrap_or_else(|| "(none)".into());
        println!("{bdf}  {ids}  driver {drv}");
        for (name, dev) in block_devices(&bdf) {
            let u = uses(&name, dev);
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
    if !functions().iter().any(|f| f == bdf) {
        return Err(format!("{bdf} is not an NVMe function (see `ugds list`)"));
    }
    if target != "none" && !DRIVERS.contains(&target) {
        return Err(format!("unknown driver {target:?}: nvme, vfio-pci or ugds_drv"));
    }
    let current = driver_of(bdf);
    if current.as_deref() == Some(target) {
        println!("{bdf} is bound to {target} already");
        return Ok(());
    }
    if target != "none" && !Path::new(&format!("/sys/bus/pci/drivers/{target}")).exists() {
        return Err(format!("driver {target} is not loaded (modprobe {target}, or insmod kmod/ugds_drv.ko)"));
    }
    let from = current.as_deref().unwrap_or("its driver");
    let (mut held, mut in_use) = (Vec::new(), Vec::new());
    for (name, dev) in block_devices(bdf) {
        let named = uses(&name, dev);
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
        let now = driver_of(bdf);
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

#[cfg(test)]
mod tests {
    #[test]
    fn path_devices_map_to_their_heads() {
        assert_eq!(super::head_of("nvme0c0n1").as_deref(), Some("nvme0n1"));
        assert_eq!(super::head_of("nvme2c5n13").as_deref(), Some("nvme2n13"));
        assert_eq!(super::head_of("nvme0n1"), None);
    }
}
