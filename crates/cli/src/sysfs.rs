//! Reading sysfs and procfs under a root: `/` on a live machine, or a
//! recorded tree (a fixture) in tests. What `ugds list`, `ugds bind` and
//! `ugds doctor` learn about PCI functions, namespaces and their users
//! comes through here. With a recorder, every path read is remembered, and
//! [`Sys::save`] copies them (files, symlinks, directory entries) into a
//! tree that reads back the same: how fixtures of real machines are made.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The PCI functions' directory.
pub const PCI: &str = "/sys/bus/pci/devices";

/// A view of `/sys`, `/proc` and `/boot` under `root`.
#[derive(Debug)]
pub struct Sys {
    root: PathBuf,
    record: Option<RefCell<Recorded>>,
}

/// What was read, by system path (see [`Sys::save`]).
#[derive(Debug, Default)]
struct Recorded {
    links: BTreeMap<PathBuf, PathBuf>,
    files: BTreeMap<PathBuf, String>,
    dirs: BTreeSet<PathBuf>,
}

impl Sys {
    /// The machine itself.
    pub fn live() -> Sys {
        Sys { root: PathBuf::from("/"), record: None }
    }

    /// A recorded tree at `root`.
    pub fn at(root: impl Into<PathBuf>) -> Sys {
        Sys { root: root.into(), record: None }
    }

    /// The machine itself, remembering what is read for [`Sys::save`].
    pub fn recording() -> Sys {
        Sys { root: PathBuf::from("/"), record: Some(RefCell::default()) }
    }

    /// Whether this is the machine itself (device nodes and processes can
    /// be asked about too).
    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// The file at `p`, trimmed; empty when it cannot be read.
    pub fn read(&self, p: &str) -> String {
        let Ok(s) = fs::read_to_string(self.path(p)).map(|s| s.trim().to_string()) else { return String::new() };
        self.note(p, |r, at| {
            r.files.insert(at, s.clone());
        });
        s
    }

    /// The lines of `p` that `keep` selects (recorded alone: a kernel
    /// configuration is 300 KB, doctor needs a dozen of its lines).
    pub fn read_lines(&self, p: &str, keep: impl Fn(&str) -> bool) -> Option<Vec<String>> {
        let s = fs::read_to_string(self.path(p)).ok()?;
        let lines: Vec<String> = s.lines().filter(|l| keep(l)).map(str::to_string).collect();
        self.note(p, |r, at| {
            r.files.insert(at, lines.iter().map(|l| format!("{l}\n")).collect());
        });
        Some(lines)
    }

    /// The last component of the symlink at `p`'s target.
    pub fn link_name(&self, p: &str) -> Option<String> {
        let t = fs::read_link(self.path(p)).ok()?;
        self.note(p, |_, _| {});
        t.file_name().map(|s| s.to_string_lossy().into_owned())
    }

    /// The names in directory `p`, sorted (none when it cannot be read).
    /// Dot names are skipped: sysfs and procfs have none, and a recorded
    /// tree keeps its empty directories with a `.keep` file (git keeps no
    /// empty directory).
    pub fn list(&self, p: &str) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.path(p))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        if self.record.is_some() {
            self.note(p, |r, at| {
                r.dirs.insert(at);
            });
            for n in &v {
                let child = format!("{}/{n}", p.trim_end_matches('/'));
                self.note(&child, |r, at| {
                    if fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir()) {
                        r.dirs.insert(at);
                    }
                });
            }
        }
        v
    }

    /// Whether `p` exists.
    pub fn exists(&self, p: &str) -> bool {
        let e = self.path(p).exists();
        if e {
            self.note(p, |r, at| {
                if fs::metadata(&at).is_ok_and(|m| m.is_dir()) {
                    r.dirs.insert(at);
                }
            });
        }
        e
    }

    /// The sysfs path of a PCI function's device directory (symlinks
    /// resolved): its position in the PCI hierarchy.
    pub fn device_path(&self, bdf: &str) -> Option<PathBuf> {
        let p = format!("{PCI}/{bdf}");
        let real = resolve(&self.root, Path::new(&p))?;
        self.note(&p, |_, _| {});
        Some(real)
    }

    /// Remembers `p` (a system path) and every symlink on the way to it;
    /// `f` records what is at its resolved path.
    fn note(&self, p: &str, f: impl FnOnce(&mut Recorded, PathBuf)) {
        let Some(rec) = &self.record else { return };
        let mut r = rec.borrow_mut();
        let mut cur = PathBuf::from("/");
        for c in Path::new(p).components().skip(1) {
            cur.push(c);
            if let Ok(t) = fs::read_link(&cur) {
                r.links.insert(cur.clone(), t.clone());
                cur = normalize(&cur.parent().unwrap_or(Path::new("/")).join(t));
            }
        }
        f(&mut r, cur);
    }

    /// Writes what was read into `dir`, as a tree [`Sys::at`] reads back.
    pub fn save(&self, dir: &Path) -> std::io::Result<usize> {
        let Some(rec) = &self.record else { return Ok(0) };
        let r = rec.borrow();
        let under = |p: &Path| dir.join(p.strip_prefix("/").unwrap_or(p));
        for d in &r.dirs {
            fs::create_dir_all(under(d))?;
        }
        // Empty directories survive a git checkout with a file in them.
        for d in &r.dirs {
            let at = under(d);
            let empty =
                !r.files.keys().chain(r.links.keys()).chain(r.dirs.iter()).any(|p| p.parent() == Some(d.as_path()));
            if empty {
                fs::write(at.join(".keep"), "")?;
            }
        }
        for (p, s) in &r.files {
            let at = under(p);
            fs::create_dir_all(at.parent().unwrap_or(dir))?;
            fs::write(at, s)?;
        }
        for (p, t) in &r.links {
            let at = under(p);
            fs::create_dir_all(at.parent().unwrap_or(dir))?;
            if fs::symlink_metadata(&at).is_err() {
                std::os::unix::fs::symlink(t, at)?;
            }
        }
        Ok(r.files.len() + r.links.len())
    }
}

/// `p` without `.` and `..` (sysfs's symlinks are relative and loop-free).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// `p` (a system path) with every symlink under `root` resolved, as a
/// system path.
fn resolve(root: &Path, p: &Path) -> Option<PathBuf> {
    let mut cur = PathBuf::from("/");
    for c in p.components().skip(1) {
        cur.push(c);
        let at = root.join(cur.strip_prefix("/").ok()?);
        if let Ok(t) = fs::read_link(&at) {
            cur = normalize(&cur.parent().unwrap_or(Path::new("/")).join(t));
        } else if fs::symlink_metadata(&at).is_err() {
            return None;
        }
    }
    Some(cur)
}

/// The driver a PCI function is bound to.
pub fn driver_of(sys: &Sys, bdf: &str) -> Option<String> {
    sys.link_name(&format!("{PCI}/{bdf}/driver"))
}

/// NVMe functions (class 0x010802), sorted.
pub fn nvme_functions(sys: &Sys) -> Vec<String> {
    sys.list(PCI).into_iter().filter(|b| sys.read(&format!("{PCI}/{b}/class")) == "0x010802").collect()
}

/// Block devices of the function's namespaces (and their partitions), by
/// name, with their `major:minor`.
pub fn block_devices(sys: &Sys, bdf: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for c in sys.list(&format!("{PCI}/{bdf}/nvme")) {
        for mut name in sys.list(&format!("{PCI}/{bdf}/nvme/{c}")) {
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
            if !sys.exists(&format!("/sys/block/{name}")) || out.iter().any(|(n, _)| *n == name) {
                continue;
            }
            out.push((name.clone(), sys.read(&format!("/sys/block/{name}/dev"))));
            for pn in sys.list(&format!("/sys/block/{name}")) {
                if pn.starts_with(&name) && sys.exists(&format!("/sys/block/{name}/{pn}/partition")) {
                    let dev = sys.read(&format!("/sys/block/{name}/{pn}/dev"));
                    out.push((pn, dev));
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

/// What uses block device `name` (`major:minor` `dev`): mounts, swap,
/// holders (dm, md).
pub fn uses(sys: &Sys, name: &str, dev: &str) -> Vec<String> {
    let mut u = Vec::new();
    for line in sys.read("/proc/self/mountinfo").lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 4 && f[2] == dev {
            u.push(format!("/dev/{name} is mounted on {}", f[4]));
        }
    }
    for line in sys.read("/proc/swaps").lines().skip(1) {
        if line.split_whitespace().next() == Some(format!("/dev/{name}").as_str()) {
            u.push(format!("/dev/{name} is used as swap"));
        }
    }
    let holders = if sys.exists(&format!("/sys/block/{name}")) {
        format!("/sys/block/{name}/holders")
    } else {
        let disk: String = name.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches('p').to_string();
        format!("/sys/block/{disk}/{name}/holders")
    };
    for h in sys.list(&holders) {
        u.push(format!("/dev/{name} is held by {h} (dm/md)"));
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalize_and_namespace_heads_are_found() {
        assert_eq!(
            normalize(Path::new("/sys/bus/pci/devices/../../../devices/pci0000:00")),
            Path::new("/sys/devices/pci0000:00")
        );
        assert_eq!(head_of("nvme0c1n2").as_deref(), Some("nvme0n2"));
        assert_eq!(head_of("nvme0n1"), None);
    }
}
