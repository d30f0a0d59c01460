//! `ugds doctor` on machines of several shapes: synthetic sysfs/procfs
//! trees built here (a two-socket GPU server with switches, a laptop), and
//! trees recorded on real machines with `ugds doctor --record`
//! (tests/fixtures/doctor/).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn doctor(root: &Path, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ugds"))
        .arg("doctor")
        .arg("--root")
        .arg(root)
        .args(extra)
        .output()
        .expect("run ugds");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(root: &Path) -> Value {
    let (code, out, err) = doctor(root, &["--json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// A sysfs/procfs tree under a temporary directory.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Tree {
        let root = std::env::temp_dir().join(format!("ugds-doctor-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        Tree(root)
    }

    fn at(&self, p: &str) -> PathBuf {
        self.0.join(p.trim_start_matches('/'))
    }

    fn file(&self, p: &str, content: &str) -> &Self {
        let at = self.at(p);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(at, content).unwrap();
        self
    }

    fn dir(&self, p: &str) -> &Self {
        std::fs::create_dir_all(self.at(p)).unwrap();
        self
    }

    fn link(&self, p: &str, target: &str) -> &Self {
        let at = self.at(p);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, at).unwrap();
        self
    }

    /// A PCI function at sysfs device path `dev` (from /sys/devices on).
    #[allow(clippy::too_many_arguments)]
    fn function(&self, dev: &str, class: &str, vendor: &str, driver: Option<&str>, numa: i32, group: u32) -> &Self {
        let bdf = dev.rsplit('/').next().unwrap();
        let d = format!("/sys/devices/{dev}");
        self.file(&format!("{d}/class"), class)
            .file(&format!("{d}/vendor"), vendor)
            .file(&format!("{d}/device"), "0x1234")
            .file(&format!("{d}/numa_node"), &numa.to_string())
            .link(&format!("/sys/bus/pci/devices/{bdf}"), &format!("../../../devices/{dev}"))
            .link(&format!("{d}/iommu_group"), &format!("../../../../kernel/iommu_groups/{group}"))
            .link(&format!("/sys/kernel/iommu_groups/{group}/devices/{bdf}"), &format!("../../../../devices/{dev}"))
            .file(&format!("/sys/kernel/iommu_groups/{group}/type"), "DMA-FQ");
        if let Some(drv) = driver {
            self.link(&format!("{d}/driver"), &format!("../../../../bus/pci/drivers/{drv}"));
        }
        self
    }

    /// Namespace block device `name` (`major:minor` `dev`) of NVMe function `dev_path`.
    fn namespace(&self, dev_path: &str, ctrl: &str, name: &str, majmin: &str) -> &Self {
        self.dir(&format!("/sys/devices/{dev_path}/nvme/{ctrl}/{name}"))
            .file(&format!("/sys/block/{name}/dev"), majmin)
            .dir(&format!("/sys/block/{name}/holders"))
    }

    fn common(&self, release: &str, config: &str) -> &Self {
        self.file("/proc/sys/kernel/osrelease", release)
            .file(&format!("/boot/config-{release}"), config)
            .file("/proc/self/limits", "Limit Soft Limit Hard Limit Units\nMax locked memory 8388608 8388608 bytes\n")
            .file("/proc/self/status", "Name:\tugds\nCapEff:\t0000000000000000\n")
            .file("/proc/meminfo", "MemTotal: 1000 kB\nHugePages_Total: 0\nHugePages_Free: 0\nHugepagesize: 2048 kB\n")
            .file("/proc/swaps", "Filename Type Size Used Priority\n")
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const FULL_CONFIG: &str = "CONFIG_VFIO_PCI=m\nCONFIG_VFIO_DEVICE_CDEV=y\nCONFIG_IOMMUFD=y\nCONFIG_IOMMU_SUPPORT=y\n\
CONFIG_PCI_P2PDMA=y\nCONFIG_DMA_SHARED_BUFFER=y\nCONFIG_DMABUF_MOVE_NOTIFY=y\nCONFIG_IO_URING=y\nCONFIG_BLK_DEV_NVME=m\n";

/// Two sockets. Socket 0: root port 00:01.0, a switch (01:00.0 up,
/// 02:08.0 and 02:10.0 down) with GPU 03:00.0 and NVMe 04:00.0 (kernel's,
/// mounted) and, behind another downstream port, NVMe 05:00.0 (vfio-pci).
/// Socket 1: GPU 83:00.0 and NVMe 84:00.0 (ugds_drv) on two root ports.
fn gpu_server() -> Tree {
    let t = Tree::new("server");
    let sw = "pci0000:00/0000:00:01.0/0000:01:00.0";
    t.common("6.8.0-server", FULL_CONFIG)
        .dir("/sys/class/iommu/dmar0")
        .dir("/sys/module/ugds_drv")
        .file("/sys/module/ugds_drv/version", "2.0")
        .file("/proc/cmdline", "BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt quiet")
        .function(&format!("{sw}/0000:02:08.0/0000:03:00.0"), "0x030200", "0x10de", Some("nvidia"), 0, 10)
        .file(
            &format!("/sys/devices/{sw}/0000:02:08.0/0000:03:00.0/resource"),
            "0x00000000fa000000 0x00000000faffffff 0x0000000000040200\n\
             0x0000038000000000 0x00000397ffffffff 0x000000000014220c\n\
             0x0000039800000000 0x0000039801ffffff 0x000000000014220c\n",
        )
        .function(&format!("{sw}/0000:02:10.0/0000:04:00.0"), "0x010802", "0x144d", Some("nvme"), 0, 11)
        .namespace(&format!("{sw}/0000:02:10.0/0000:04:00.0"), "nvme0", "nvme0n1", "259:0")
        .file("/proc/self/mountinfo", "25 1 259:0 / /data rw,relatime shared:1 - ext4 /dev/nvme0n1 rw\n")
        .function(&format!("{sw}/0000:02:10.0/0000:05:00.0"), "0x010802", "0x144d", Some("vfio-pci"), 0, 12)
        .function("pci0000:80/0000:80:01.0/0000:83:00.0", "0x030200", "0x10de", Some("nvidia"), 1, 20)
        .function("pci0000:80/0000:80:03.0/0000:84:00.0", "0x010802", "0x8086", Some("ugds_drv"), 1, 21)
        .dir("/sys/devices/pci0000:80/0000:80:03.0/0000:84:00.0/ugds_drv/ugds_drv0")
        // A function sharing 05:00.0's IOMMU group.
        .function(&format!("{sw}/0000:02:10.0/0000:05:00.1"), "0x0c0330", "0x144d", None, 0, 12);
    t
}

fn pair<'a>(v: &'a Value, nvme: &str, gpu: &str) -> &'a Value {
    v["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["nvme"] == nvme && p["gpu"] == gpu)
        .unwrap_or_else(|| panic!("{v}"))
}

fn nvme<'a>(v: &'a Value, bdf: &str) -> &'a Value {
    v["nvme"].as_array().unwrap().iter().find(|n| n["bdf"] == bdf).unwrap_or_else(|| panic!("{v}"))
}

#[test]
fn a_two_socket_gpu_server() {
    let t = gpu_server();
    let v = json(&t.0);
    assert_eq!(v["kernel"]["release"], "6.8.0-server");
    assert_eq!(v["kernel"]["config"]["CONFIG_VFIO_PCI"], "m");
    assert_eq!(v["iommu"]["units"][0], "dmar0");
    assert_eq!(v["iommu"]["mode"], "DMA-FQ");
    assert_eq!(v["iommu"]["cmdline"], serde_json::json!(["intel_iommu=on", "iommu=pt"]));
    assert_eq!(v["ugds_drv"]["version"], "2.0");
    assert_eq!(v["memlock_binding"], true);
    // Functions: drivers, groups, holders.
    let n4 = nvme(&v, "0000:04:00.0");
    assert_eq!(n4["driver"], "nvme");
    assert_eq!(n4["namespaces"][0]["used_by"][0], "/dev/nvme0n1 is mounted on /data");
    assert_eq!(n4["modes"]["kernel"]["available"], true);
    assert_eq!(n4["modes"]["user"]["available"], false, "mounted: not to be taken from the kernel");
    let n5 = nvme(&v, "0000:05:00.0");
    assert_eq!(n5["iommu_group_peers"], serde_json::json!(["0000:05:00.1"]));
    assert!(n5["modes"]["user"]["how"].as_str().unwrap().contains("--pci 0000:05:00.0"), "{n5}");
    assert!(n5["modes"]["kernel"]["why"].as_str().unwrap().contains("vfio-pci"), "{n5}");
    // GPUs: BAR1 is the large prefetchable window.
    let g = &v["gpus"][0];
    assert_eq!(g["bdf"], "0000:03:00.0");
    assert_eq!(g["bar"]["index"], 1);
    assert_eq!(g["bar"]["bytes"], 96u64 << 30);
    assert_eq!(g["dmabuf_export"], Value::Null, "no driver asked on a recorded tree");
    // Distances and the fastest mode of each pair.
    assert_eq!(pair(&v, "0000:04:00.0", "0000:03:00.0")["distance"], "switch");
    assert_eq!(pair(&v, "0000:04:00.0", "0000:03:00.0")["fastest_mode"], "kernel", "its namespace is mounted");
    assert_eq!(pair(&v, "0000:05:00.0", "0000:03:00.0")["fastest_mode"], "p2p");
    assert!(pair(&v, "0000:05:00.0", "0000:03:00.0")["how"]
        .as_str()
        .unwrap()
        .contains("ugds bind 0000:05:00.0 ugds_drv"));
    assert_eq!(pair(&v, "0000:84:00.0", "0000:83:00.0")["distance"], "root-complex");
    assert_eq!(pair(&v, "0000:84:00.0", "0000:83:00.0")["fastest_mode"], "p2p");
    assert_eq!(pair(&v, "0000:84:00.0", "0000:03:00.0")["distance"], "sockets");
    assert_eq!(pair(&v, "0000:84:00.0", "0000:03:00.0")["fastest_mode"], "user", "no peer-to-peer across sockets");
    assert_eq!(v["available"], serde_json::json!({"kernel": true, "user": true, "p2p": true}));
    // The exit status answers --mode.
    assert_eq!(doctor(&t.0, &["--mode", "p2p"]).0, 0);
    // Plain text says the same things in words.
    let (code, out, err) = doctor(&t.0, &[]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "iommu group 12, shared with 0000:05:00.1",
        "/dev/nvme0n1: /dev/nvme0n1 is mounted on /data",
        "pair 0000:84:00.0 -> 0000:03:00.0  different CPU sockets (NUMA nodes): fastest user",
        "BAR1 96 GiB",
        "low: raise it",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
}

/// One NVMe SSD holding the root file system, no IOMMU, no GPU, no module.
#[test]
fn a_laptop_has_the_kernel_path_only() {
    let t = Tree::new("laptop");
    t.common("6.1.0-laptop", "CONFIG_VFIO_PCI=m\nCONFIG_IO_URING=y\n# CONFIG_PCI_P2PDMA is not set\n")
        .file("/proc/cmdline", "root=/dev/nvme0n1p2 ro quiet")
        .function("pci0000:00/0000:00:1d.0/0000:02:00.0", "0x010802", "0x15b7", Some("nvme"), -1, 5)
        .namespace("pci0000:00/0000:00:1d.0/0000:02:00.0", "nvme0", "nvme0n1", "259:0")
        .file("/sys/block/nvme0n1/nvme0n1p2/dev", "259:2")
        .dir("/sys/block/nvme0n1/nvme0n1p2/partition")
        .dir("/sys/block/nvme0n1/nvme0n1p2/holders")
        .file("/proc/self/mountinfo", "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n");
    let v = json(&t.0);
    assert_eq!(v["kernel"]["config"]["CONFIG_PCI_P2PDMA"], "n");
    assert_eq!(v["kernel"]["config"]["CONFIG_IOMMUFD"], "n");
    let n = nvme(&v, "0000:02:00.0");
    assert_eq!(n["namespaces"][1]["used_by"][0], "/dev/nvme0n1p2 is mounted on /");
    let why = n["modes"]["user"]["why"].as_str().unwrap();
    assert!(why.contains("no IOMMU") && why.contains("ugds_drv is not loaded"), "{why}");
    assert_eq!(v["available"], serde_json::json!({"kernel": true, "user": false, "p2p": false}));
    assert_eq!(doctor(&t.0, &["--mode", "user"]).0, 1, "user space cannot run here");
    assert_eq!(doctor(&t.0, &["--mode", "kernel"]).0, 0);
    let (_, out, _) = doctor(&t.0, &[]);
    assert!(out.contains("gpu          none found"), "{out}");
}

/// Trees recorded on real machines (`ugds doctor --record DIR`), one per
/// directory of tests/fixtures/doctor, each with the JSON doctor printed
/// there beside it (`expected.json`, GPU driver answers aside): the same
/// tree must give the same findings.
#[test]
fn recorded_machines_read_back_the_same() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor");
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten().filter(|e| e.path().is_dir()) {
        let root = e.path().join("root");
        let want: Value =
            serde_json::from_str(&std::fs::read_to_string(e.path().join("expected.json")).unwrap()).unwrap();
        let mut got = json(&root);
        for v in [&mut got] {
            // Recorded live: the driver was asked there, not here.
            v["gpu_driver_asked"] = Value::Null;
            v["gpu_driver_note"] = Value::Null;
            for g in v["gpus"].as_array_mut().unwrap() {
                g["name"] = Value::Null;
                g["dmabuf_export"] = Value::Null;
            }
        }
        assert_eq!(got, want, "{}", e.path().display());
        seen += 1;
    }
    assert!(seen >= 1, "no recorded machines under {}", dir.display());
}
