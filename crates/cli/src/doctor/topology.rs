//! Where two PCI functions sit relative to each other, from their sysfs
//! paths (`/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...`: the host
//! bridge, then every bridge down to the function).

use std::path::Path;

/// How far apart two functions are, nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Distance {
    /// Below one PCIe switch: peer-to-peer traffic stays in the switch.
    SameSwitch,
    /// Below one root port (without a switch between them).
    SameRootPort,
    /// Under one host bridge, through different root ports: traffic
    /// crosses the CPU's root complex (fast on some CPUs, slow or refused
    /// on others).
    SameRootComplex,
    /// Under different host bridges of one NUMA node.
    AcrossHostBridges,
    /// On different NUMA nodes (CPU sockets): traffic crosses the
    /// inter-socket link, where peer-to-peer is slow or unsupported.
    AcrossSockets,
}

impl Distance {
    /// The words for it.
    pub fn describe(self) -> &'static str {
        match self {
            Distance::SameSwitch => "same PCIe switch",
            Distance::SameRootPort => "same root port",
            Distance::SameRootComplex => "same root complex, different root ports",
            Distance::AcrossHostBridges => "different host bridges, same NUMA node",
            Distance::AcrossSockets => "different CPU sockets (NUMA nodes)",
        }
    }

    /// A short name for scripts.
    pub fn key(self) -> &'static str {
        match self {
            Distance::SameSwitch => "switch",
            Distance::SameRootPort => "root-port",
            Distance::SameRootComplex => "root-complex",
            Distance::AcrossHostBridges => "host-bridges",
            Distance::AcrossSockets => "sockets",
        }
    }
}

/// The host bridge and the chain of functions from the root port down to
/// (and including) the function itself.
fn chain(path: &Path) -> Option<(String, Vec<String>)> {
    let mut parts = path.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
    let host = parts.by_ref().find(|p| p.starts_with("pci") && p.contains(':'))?;
    let chain: Vec<String> = parts.filter(|p| p.len() == 12 && p.as_bytes()[4] == b':').collect();
    (!chain.is_empty()).then_some((host, chain))
}

/// The distance between functions at sysfs paths `a` and `b` on NUMA nodes
/// `node_a` and `node_b` (-1: unknown).
pub fn distance(a: &Path, b: &Path, node_a: i32, node_b: i32) -> Option<Distance> {
    let (ha, ca) = chain(a)?;
    let (hb, cb) = chain(b)?;
    if ha != hb {
        return Some(if node_a >= 0 && node_b >= 0 && node_a != node_b {
            Distance::AcrossSockets
        } else {
            Distance::AcrossHostBridges
        });
    }
    // Bridges both are below (the functions themselves are the last entries).
    let shared = ca[..ca.len() - 1].iter().zip(&cb[..cb.len() - 1]).take_while(|(x, y)| x == y).count();
    Some(match shared {
        0 => Distance::SameRootComplex,
        1 => Distance::SameRootPort,
        _ => Distance::SameSwitch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    #[test]
    fn distances_follow_the_shared_bridges() {
        // Root port 00:01.0 -> switch upstream 01:00.0 -> downstream 02:0x.0 -> endpoints.
        let gpu = p("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0");
        let ssd = p("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:04:00.0");
        let other_port = p("/sys/devices/pci0000:00/0000:00:03.0/0000:05:00.0");
        let other_host = p("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0");
        let sibling_fn = p("/sys/devices/pci0000:00/0000:00:03.0/0000:05:00.1");
        assert_eq!(distance(gpu, ssd, 0, 0), Some(Distance::SameSwitch));
        assert_eq!(distance(gpu, other_port, 0, 0), Some(Distance::SameRootComplex));
        assert_eq!(distance(other_port, sibling_fn, 0, 0), Some(Distance::SameRootPort));
        assert_eq!(distance(gpu, other_host, 0, 1), Some(Distance::AcrossSockets));
        assert_eq!(distance(gpu, other_host, 0, 0), Some(Distance::AcrossHostBridges));
        assert_eq!(distance(gpu, other_host, -1, -1), Some(Distance::AcrossHostBridges));
        assert_eq!(distance(p("/sys/devices/virtual/foo"), gpu, 0, 0), None);
        assert!(Distance::SameSwitch < Distance::AcrossSockets);
    }
}
