//! Where devices sit in the PCIe hierarchy, read from sysfs, so that a GPU
//! is given the SSDs nearest to it: peer-to-peer DMA under one switch never
//! crosses the root complex, and under one root port it crosses no
//! interconnect between sockets.
//!
//! A device's place is its path of bridges from the host bridge down
//! (`/sys/bus/pci/devices/BDF` links to
//! `/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:01.0/0000:03:00.0`:
//! host bridge `pci0000:00`, root port `00:02.0`, a switch's upstream port
//! `01:00.0` and downstream port `02:01.0`, the device `03:00.0`). Two
//! devices are as near as the deepest bridge their paths share.

use std::path::Path;
use ugds_platform::{Error, Result};

/// How near two PCIe devices are, nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Affinity {
    /// Below one PCIe switch: traffic turns in the switch.
    SameSwitch,
    /// Below one root port, not one switch.
    SameRootPort,
    /// Below one host bridge (root complex), through different root ports.
    SameHostBridge,
    /// Below different host bridges (often different sockets).
    Distant,
    /// A place could not be read for one of them (not a PCI device: an
    /// emulated controller, a file).
    Unknown,
}

impl Affinity {
    /// A short name for output.
    pub fn name(self) -> &'static str {
        match self {
            Affinity::SameSwitch => "same PCIe switch",
            Affinity::SameRootPort => "same root port",
            Affinity::SameHostBridge => "same host bridge",
            Affinity::Distant => "different host bridges",
            Affinity::Unknown => "unknown",
        }
    }
}

/// A device's path in the hierarchy: the host bridge, then each bridge and
/// finally the device itself, as sysfs names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciPath(pub Vec<String>);

impl PciPath {
    /// Reads the path of PCI function `bdf` (`0000:03:00.0`) under the
    /// sysfs mounted at `sysfs` (`/sys`, or a test's fixture).
    pub fn read(sysfs: &Path, bdf: &str) -> Result<PciPath> {
        let link = sysfs.join("bus/pci/devices").join(bdf);
        let real = std::fs::canonicalize(&link).map_err(|e| Error::Os {
            op: format!("resolving {}", link.display()).into(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        })?;
        let devices = std::fs::canonicalize(sysfs.join("devices")).unwrap_or_else(|_| sysfs.join("devices"));
        let rel = real
            .strip_prefix(&devices)
            .map_err(|_| Error::InvalidArgument(format!("{} is not under {}", real.display(), devices.display())))?;
        let parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        match parts.first() {
            Some(p) if p.starts_with("pci") && parts.len() >= 2 => Ok(PciPath(parts)),
            _ => Err(Error::InvalidArgument(format!("{} is not a PCI device's path", real.display()))),
        }
    }

    /// The device's bridges, upstream first (the host bridge not counted).
    fn bridges(&self) -> &[String] {
        &self.0[1..self.0.len() - 1]
    }

    /// How near this device is to `other`.
    pub fn affinity(&self, other: &PciPath) -> Affinity {
        if self.0[0] != other.0[0] {
            return Affinity::Distant;
        }
        let (a, b) = (self.bridges(), other.bridges());
        let shared = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        match shared {
            0 => Affinity::SameHostBridge,
            // Only the root port: its ports below are a switch's only
            // where there are more bridges in both paths.
            1 => Affinity::SameRootPort,
            _ => Affinity::SameSwitch,
        }
    }
}

/// Orders `members` (PCI addresses, `None` for those that are not PCI
/// devices) nearest to the GPU at `gpu` first, stably: the members'
/// indices with their affinity.
pub fn rank(sysfs: &Path, gpu: &str, members: &[Option<String>]) -> Vec<(usize, Affinity)> {
    let g = PciPath::read(sysfs, gpu).ok();
    let mut ranked: Vec<(usize, Affinity)> = members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let a = match (&g, m.as_deref().and_then(|b| PciPath::read(sysfs, b).ok())) {
                (Some(g), Some(p)) => g.affinity(&p),
                _ => Affinity::Unknown,
            };
            (i, a)
        })
        .collect();
    ranked.sort_by_key(|&(i, a)| (a, i));
    ranked
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use std::path::PathBuf;

    /// A directory removed when dropped.
    pub(crate) struct Fixture(PathBuf);

    impl Fixture {
        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A sysfs fixture: devices at the given paths under `devices/`, with
    /// their `bus/pci/devices` links.
    pub(crate) fn fixture(paths: &[&str]) -> Fixture {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ugds-sysfs-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let root = Fixture(dir);
        let by_bdf = root.path().join("bus/pci/devices");
        std::fs::create_dir_all(&by_bdf).unwrap();
        for p in paths {
            let dir = root.path().join("devices").join(p);
            std::fs::create_dir_all(&dir).unwrap();
            let bdf = Path::new(p).file_name().unwrap();
            std::os::unix::fs::symlink(&dir, by_bdf.join(bdf)).unwrap();
        }
        root
    }

    /// Two sockets; on the first, a root port with a switch holding the
    /// GPU and one SSD, a second SSD on another port of the switch's root
    /// port... and SSDs on another root port and on the other socket.
    const GPU: &str = "pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:01.0/0000:03:00.0";
    const SSD_SWITCH: &str = "pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:02.0/0000:04:00.0";
    const SSD_ROOT_PORT: &str = "pci0000:00/0000:00:02.0/0000:05:00.0";
    const SSD_OTHER_PORT: &str = "pci0000:00/0000:00:03.0/0000:06:00.0";
    const SSD_OTHER_SOCKET: &str = "pci0000:80/0000:80:01.0/0000:81:00.0";

    #[test]
    fn affinity_follows_the_deepest_shared_bridge() {
        let f = fixture(&[GPU, SSD_SWITCH, SSD_ROOT_PORT, SSD_OTHER_PORT, SSD_OTHER_SOCKET]);
        let at = |bdf: &str| PciPath::read(f.path(), bdf).unwrap();
        let gpu = at("0000:03:00.0");
        assert_eq!(gpu.affinity(&at("0000:04:00.0")), Affinity::SameSwitch);
        assert_eq!(gpu.affinity(&at("0000:05:00.0")), Affinity::SameRootPort);
        assert_eq!(gpu.affinity(&at("0000:06:00.0")), Affinity::SameHostBridge);
        assert_eq!(gpu.affinity(&at("0000:81:00.0")), Affinity::Distant);
    }

    #[test]
    fn rank_puts_the_nearest_first_and_unknowns_last() {
        let f = fixture(&[GPU, SSD_SWITCH, SSD_ROOT_PORT, SSD_OTHER_PORT, SSD_OTHER_SOCKET]);
        let members = [
            Some("0000:81:00.0".to_string()),
            None,
            Some("0000:06:00.0".to_string()),
            Some("0000:04:00.0".to_string()),
            Some("0000:ff:00.0".to_string()),
            Some("0000:05:00.0".to_string()),
        ];
        let r = rank(f.path(), "0000:03:00.0", &members);
        assert_eq!(
            r,
            vec![
                (3, Affinity::SameSwitch),
                (5, Affinity::SameRootPort),
                (2, Affinity::SameHostBridge),
                (0, Affinity::Distant),
                (1, Affinity::Unknown),
                (4, Affinity::Unknown),
            ]
        );
        // No GPU place: nothing is known, the order is kept.
        let r = rank(f.path(), "0000:aa:00.0", &members);
        assert!(r.iter().enumerate().all(|(k, &(i, a))| k == i && a == Affinity::Unknown));
    }

    #[test]
    fn a_drv_device_names_its_function() {
        let f = fixture(&[SSD_SWITCH]);
        let class = f.path().join("class/ugds_drv/ugds_drv0");
        std::fs::create_dir_all(&class).unwrap();
        let target = "../../../devices/pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:02.0/0000:04:00.0";
        std::os::unix::fs::symlink(target, class.join("device")).unwrap();
        let at = |dev| ugds_platform::ugds_drv::pci_address_in(f.path(), dev);
        assert_eq!(at("/dev/ugds_drv0").as_deref(), Some("0000:04:00.0"));
        assert_eq!(at("/dev/ugds_drv1"), None);
    }

    #[test]
    fn a_path_outside_the_devices_tree_is_refused() {
        let f = fixture(&[]);
        std::fs::create_dir_all(f.path().join("elsewhere/0000:09:00.0")).unwrap();
        std::os::unix::fs::symlink(
            f.path().join("elsewhere/0000:09:00.0"),
            f.path().join("bus/pci/devices/0000:09:00.0"),
        )
        .unwrap();
        assert!(PciPath::read(f.path(), "0000:09:00.0").is_err());
        assert!(PciPath::read(f.path(), "0000:0a:00.0").is_err(), "no such device");
    }
}
