//! What `ugds doctor` finds on a machine: kernel, IOMMU, NVMe functions and
//! who holds them, ugds_drv, limits, GPUs. Everything from sysfs and procfs
//! through [`Sys`] (so a recorded tree reads the same), except what only
//! the loaded GPU driver knows.

use super::topology::{distance, Distance};
use crate::sysfs::{self, Sys, PCI};
use std::path::PathBuf;

/// Kernel configuration items that matter, and why.
pub const CONFIG_ITEMS: [(&str, &str); 9] = [
    ("CONFIG_VFIO_PCI", "user-space driver through vfio-pci"),
    ("CONFIG_VFIO_DEVICE_CDEV", "the vfio cdev interface (with iommufd)"),
    ("CONFIG_IOMMUFD", "iommufd I/O address spaces"),
    ("CONFIG_IOMMU_SUPPORT", "an IOMMU for vfio-pci"),
    ("CONFIG_PCI_P2PDMA", "peer-to-peer DMA between PCI functions"),
    ("CONFIG_DMA_SHARED_BUFFER", "dma-buf (GPU memory to the SSD)"),
    ("CONFIG_DMABUF_MOVE_NOTIFY", "dma-buf importers that follow moves"),
    ("CONFIG_IO_URING", "the kernel path (io_uring)"),
    ("CONFIG_BLK_DEV_NVME", "the kernel's NVMe driver (kernel path, passthrough)"),
];

/// The kernel.
#[derive(Debug)]
pub struct Kernel {
    pub release: String,
    /// Each item of [`CONFIG_ITEMS`]: "y", "m", "n", or `None` when the
    /// configuration could not be read.
    pub config: Vec<(&'static str, Option<String>)>,
    /// Where the configuration came from.
    pub config_source: Option<String>,
    /// io_uring allowed for this process (`kernel.io_uring_disabled` 0).
    pub io_uring: bool,
}

/// The IOMMU.
#[derive(Debug)]
pub struct Iommu {
    /// IOMMU units the kernel registered (`/sys/class/iommu`).
    pub units: Vec<String>,
    /// The default domain type of the groups ("DMA", "DMA-FQ", "identity").
    pub mode: Option<String>,
    /// IOMMU-related kernel parameters.
    pub cmdline: Vec<String>,
    /// vfio's unsafe no-IOMMU mode is on.
    pub noiommu: bool,
}

/// One NVMe function.
#[derive(Debug)]
pub struct Nvme {
    pub bdf: String,
    pub ids: String,
    pub driver: Option<String>,
    pub numa: i32,
    pub path: Option<PathBuf>,
    pub iommu_group: Option<String>,
    /// Other functions in its IOMMU group (vfio takes the whole group).
    pub group_peers: Vec<String>,
    /// Its namespaces' block devices and what uses each.
    pub namespaces: Vec<(String, Vec<String>)>,
    /// Its ugds_drv nodes.
    pub drv_nodes: Vec<String>,
}

impl Nvme {
    /// What holds its namespaces (a reason not to unbind it).
    pub fn holders(&self) -> Vec<String> {
        self.namespaces.iter().flat_map(|(_, u)| u.iter().cloned()).collect()
    }
}

/// One GPU.
#[derive(Debug)]
pub struct Gpu {
    pub bdf: String,
    pub vendor: &'static str,
    pub driver: Option<String>,
    pub numa: i32,
    pub path: Option<PathBuf>,
    /// Its largest memory BAR: (index, bytes). NVIDIA's BAR1 is the window
    /// peers reach its memory through.
    pub bar: Option<(usize, u64)>,
    /// From the loaded driver: its name and whether it exports dma-bufs
    /// (`None`: the driver was not asked or could not be loaded).
    pub runtime: Option<(String, bool)>,
}

/// ugds_drv.
#[derive(Debug)]
pub struct Drv {
    pub loaded: bool,
    pub version: Option<String>,
    pub srcversion: Option<String>,
}

/// The memlock limit and the hugepages.
#[derive(Debug)]
pub struct Limits {
    /// `RLIMIT_MEMLOCK` soft limit in bytes (`None`: unlimited).
    pub memlock: Option<Option<u64>>,
    /// The process may lock memory beyond the limit (`CAP_IPC_LOCK`: root).
    pub ipc_lock: bool,
    pub hugepages_total: u64,
    pub hugepages_free: u64,
    pub hugepage_kb: u64,
}

/// Everything found.
#[derive(Debug)]
pub struct Facts {
    pub kernel: Kernel,
    pub iommu: Iommu,
    pub nvme: Vec<Nvme>,
    pub gpus: Vec<Gpu>,
    pub drv: Drv,
    pub limits: Limits,
    /// Whether GPU drivers were asked (not on a recorded tree).
    pub runtime_asked: bool,
    pub runtime_note: Option<String>,
}

pub fn kernel(sys: &Sys) -> Kernel {
    let release = sys.read("/proc/sys/kernel/osrelease");
    let want = |l: &str| {
        CONFIG_ITEMS.iter().any(|(k, _)| l.starts_with(&format!("{k}=")) || l.contains(&format!(" {k} is not set")))
    };
    let source = format!("/boot/config-{release}");
    let lines = sys.read_lines(&source, want);
    let config = CONFIG_ITEMS
        .iter()
        .map(|(k, _)| {
            let v = lines.as_ref().map(|ls| {
                ls.iter()
                    .find_map(|l| l.strip_prefix(&format!("{k}=")).map(str::to_string))
                    .unwrap_or_else(|| "n".to_string())
            });
            (*k, v)
        })
        .collect();
    let disabled = sys.read("/proc/sys/kernel/io_uring_disabled");
    Kernel { release, config, config_source: lines.map(|_| source), io_uring: disabled.is_empty() || disabled == "0" }
}

pub fn iommu(sys: &Sys) -> Iommu {
    let units = sys.list("/sys/class/iommu");
    let mode =
        sys.list("/sys/kernel/iommu_groups").first().map(|g| sys.read(&format!("/sys/kernel/iommu_groups/{g}/type")));
    let cmdline = sys
        .read("/proc/cmdline")
        .split_whitespace()
        .filter(|w| w.contains("iommu") || w.starts_with("vfio"))
        .map(str::to_string)
        .collect();
    let noiommu = sys.read("/sys/module/vfio/parameters/enable_unsafe_noiommu_mode") == "Y";
    Iommu { units, mode: mode.filter(|m| !m.is_empty()), cmdline, noiommu }
}

fn numa(sys: &Sys, bdf: &str) -> i32 {
    sys.read(&format!("{PCI}/{bdf}/numa_node")).parse().unwrap_or(-1)
}

pub fn nvme(sys: &Sys) -> Vec<Nvme> {
    sysfs::nvme_functions(sys)
        .into_iter()
        .map(|bdf| {
            let group = sys.link_name(&format!("{PCI}/{bdf}/iommu_group"));
            let group_peers = group
                .as_ref()
                .map(|g| sys.list(&format!("/sys/kernel/iommu_groups/{g}/devices")))
                .unwrap_or_default()
                .into_iter()
                .filter(|p| *p != bdf)
                .collect();
            let namespaces = sysfs::block_devices(sys, &bdf)
                .into_iter()
                .map(|(n, dev)| (n.clone(), sysfs::uses(sys, &n, &dev)))
                .collect();
            Nvme {
                ids: format!(
                    "{}:{}",
                    sys.read(&format!("{PCI}/{bdf}/vendor")),
                    sys.read(&format!("{PCI}/{bdf}/device"))
                ),
                driver: sysfs::driver_of(sys, &bdf),
                numa: numa(sys, &bdf),
                path: sys.device_path(&bdf),
                iommu_group: group,
                group_peers,
                namespaces,
                drv_nodes: sys.list(&format!("{PCI}/{bdf}/ugds_drv")),
                bdf,
            }
        })
        .collect()
}

/// GPUs: display or 3D controllers of NVIDIA or AMD.
pub fn gpus(sys: &Sys) -> Vec<Gpu> {
    sys.list(PCI)
        .into_iter()
        .filter_map(|bdf| {
            let class = sys.read(&format!("{PCI}/{bdf}/class"));
            if !(class.starts_with("0x0300") || class.starts_with("0x0302")) {
                return None;
            }
            let vendor = match sys.read(&format!("{PCI}/{bdf}/vendor")).as_str() {
                "0x10de" => "NVIDIA",
                "0x1002" => "AMD",
                _ => return None,
            };
            // `resource`: one line per BAR, "start end flags" in hex.
            let bar = sys
                .read(&format!("{PCI}/{bdf}/resource"))
                .lines()
                .take(6)
                .enumerate()
                .filter_map(|(i, l)| {
                    let v: Vec<u64> = l
                        .split_whitespace()
                        .filter_map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok())
                        .collect();
                    (v.len() == 3 && v[1] > v[0] && v[2] & 0x200 != 0).then(|| (i, v[1] - v[0] + 1))
                })
                .max_by_key(|&(_, n)| n);
            Some(Gpu {
                driver: sysfs::driver_of(sys, &bdf),
                numa: numa(sys, &bdf),
                path: sys.device_path(&bdf),
                bar,
                runtime: None,
                vendor,
                bdf,
            })
        })
        .collect()
}

pub fn drv(sys: &Sys) -> Drv {
    let loaded = sys.exists("/sys/module/ugds_drv");
    let opt = |s: String| (!s.is_empty()).then_some(s);
    Drv {
        loaded,
        version: opt(sys.read("/sys/module/ugds_drv/version")),
        srcversion: opt(sys.read("/sys/module/ugds_drv/srcversion")),
    }
}

pub fn limits(sys: &Sys) -> Limits {
    let memlock = sys.read("/proc/self/limits").lines().find_map(|l| {
        let rest = l.strip_prefix("Max locked memory")?;
        let soft = rest.split_whitespace().next()?;
        Some(if soft == "unlimited" { None } else { soft.parse().ok() })
    });
    // CapEff is hex; CAP_IPC_LOCK is bit 14.
    let ipc_lock = sys
        .read("/proc/self/status")
        .lines()
        .find_map(|l| u64::from_str_radix(l.strip_prefix("CapEff:")?.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0);
    let meminfo = sys.read("/proc/meminfo");
    let field = |k: &str| {
        meminfo
            .lines()
            .find_map(|l| {
                l.strip_prefix(k).and_then(|r| r.trim_start_matches(':').split_whitespace().next()?.parse().ok())
            })
            .unwrap_or(0)
    };
    Limits {
        memlock,
        ipc_lock,
        hugepages_total: field("HugePages_Total"),
        hugepages_free: field("HugePages_Free"),
        hugepage_kb: field("Hugepagesize"),
    }
}

/// Asks the loaded CUDA driver about each NVIDIA GPU: its name and whether
/// it exports dma-bufs.
pub fn ask_cuda(gpus: &mut [Gpu]) -> Option<String> {
    let cuda = match ugds::gpu::cuda::Cuda::get() {
        Ok(c) => c,
        Err(e) => return Some(format!("CUDA: {e}")),
    };
    let n = match cuda.device_count() {
        Ok(n) => n,
        Err(e) => return Some(format!("CUDA: {e}")),
    };
    for i in 0..n {
        let Ok(bus) = cuda.pci_bus_id(i) else { continue };
        let name = cuda.device_name(i).unwrap_or_else(|_| "?".into());
        let dmabuf = cuda.dmabuf_supported(i).unwrap_or(false);
        if let Some(g) = gpus.iter_mut().find(|g| g.bdf.eq_ignore_ascii_case(&bus)) {
            g.runtime = Some((name, dmabuf));
        }
    }
    None
}

/// The PCIe distance between an NVMe function and a GPU.
pub fn between(n: &Nvme, g: &Gpu) -> Option<Distance> {
    distance(n.path.as_deref()?, g.path.as_deref()?, n.numa, g.numa)
}

pub fn gather(sys: &Sys, ask_runtime: bool) -> Facts {
    let mut gpus = gpus(sys);
    let runtime_note =
        if ask_runtime && gpus.iter().any(|g| g.vendor == "NVIDIA") { ask_cuda(&mut gpus) } else { None };
    Facts {
        kernel: kernel(sys),
        iommu: iommu(sys),
        nvme: nvme(sys),
        gpus,
        drv: drv(sys),
        limits: limits(sys),
        runtime_asked: ask_runtime,
        runtime_note,
    }
}
