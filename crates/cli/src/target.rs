//! Which controller a command runs against, from its flags.

use std::path::PathBuf;
use std::time::Duration;
use ugds_emu::{EmuConfig, LatencyModel, NamespaceConfig};

/// Options that pick and shape the target.
#[derive(Clone, Debug)]
pub struct TargetOpts {
    /// Backing file of the emulated namespace; a temporary file when unset.
    pub file: Option<PathBuf>,
    /// Keep the namespace in memory instead of a file.
    pub memory: bool,
    /// Open the backing file with O_DIRECT.
    pub direct: bool,
    /// Size of each emulated namespace in bytes.
    pub size: u64,
    /// Logical block size.
    pub block: u32,
    /// Emulated namespaces.
    pub namespaces: u32,
    /// MDTS (log2 of 4 KiB units, 0 = unlimited).
    pub mdts: u8,
    /// MQES (zero-based).
    pub mqes: u16,
    /// Maximum I/O queue pairs.
    pub queues: u16,
    /// Interrupt vectors (MSI-X), vector 0 the admin queue's.
    pub vectors: u16,
    /// Null mode.
    pub null: bool,
    /// Latency model: fixed time per command.
    pub latency_us: Option<u64>,
    /// Latency model: bandwidth in MB/s.
    pub bandwidth_mbs: Option<u64>,
    /// Namespace to use.
    pub nsid: Option<u32>,
    /// How long the emulator thread spins after its last work before parking.
    pub spin_us: Option<u64>,
    /// Emulator I/O worker threads (file-backed namespaces).
    pub io_workers: usize,
    /// A PCI function bound to vfio-pci: a real (or QEMU's) controller.
    pub pci: Option<String>,
    /// How to reach a PCI function: the vfio cdev + iommufd or the group.
    pub vfio: ugds::platform::vfio::VfioInterface,
    /// A controller bound to the ugds_drv module: its character device.
    pub drv: Option<String>,
    /// A file or block device through the kernel path (io_uring).
    pub kernel_file: Option<PathBuf>,
    /// Every `--pci`, `--drv` and `--file` given, in order: more than one
    /// makes a volume of them (`ugds bench`).
    pub targets: Vec<Member>,
    /// Emulated controllers (`--emu-controllers N`): more than one makes a
    /// volume of them, each with a namespace as the `--emu-*` flags say.
    pub emu_controllers: usize,
    /// An NVMe/TCP target: `host:port`, reached by ugds's initiator.
    pub tcp: Option<String>,
    /// An NVMe/RDMA target: `address:port`, reached by ugds's initiator.
    pub rdma: Option<String>,
    /// The subsystem NQN to connect to over NVMe/TCP or NVMe/RDMA.
    pub nqn: Option<String>,
    /// Ask for header and data digests over NVMe/TCP.
    pub digests: bool,
    /// NVMe/RDMA: copy every command's data through the queues' own
    /// memory instead of registering the caller's buffers.
    pub rdma_copy: bool,
    /// An emulated NVMe/TCP target in this process (memory namespace of
    /// `--emu-size`, `--emu-block`), reached over 127.0.0.1.
    pub emu_tcp: bool,
    /// A controller another process serves (`ugds serve`): its socket.
    pub attach: Option<PathBuf>,
}

/// One target named on the command line, of several.
#[derive(Clone, Debug)]
pub enum Member {
    /// `--pci BDF`.
    Pci(String),
    /// `--drv PATH`.
    Drv(String),
    /// `--file PATH`.
    File(PathBuf),
    /// `--tcp HOST:PORT` (of the one `--nqn`).
    Tcp(String),
    /// `--rdma ADDRESS:PORT` (of the one `--nqn`).
    Rdma(String),
}

impl Default for TargetOpts {
    fn default() -> Self {
        TargetOpts {
            file: None,
            memory: false,
            direct: false,
            size: 1 << 30,
            block: 512,
            namespaces: 1,
            mdts: 5,
            mqes: 1023,
            queues: 16,
            vectors: 17,
            null: false,
            latency_us: None,
            bandwidth_mbs: None,
            nsid: None,
            spin_us: None,
            io_workers: 0,
            pci: None,
            vfio: Default::default(),
            drv: None,
            kernel_file: None,
            targets: Vec::new(),
            emu_controllers: 1,
            tcp: None,
            rdma: None,
            nqn: None,
            digests: false,
            rdma_copy: false,
            emu_tcp: false,
            attach: None,
        }
    }
}

/// Parses the long target flag `name`; returns false when it is not one.
pub fn parse_long(t: &mut TargetOpts, name: &str, p: &mut lexopt::Parser) -> Result<bool, lexopt::Error> {
    use lexopt::prelude::*;
    match name {
        "emu-file" => t.file = Some(p.value()?.into()),
        "emu-memory" => t.memory = true,
        "emu-direct" => t.direct = true,
        "emu-size" => t.size = crate::parse_size(&p.value()?.string()?)?,
        "emu-block" => t.block = p.value()?.parse()?,
        "emu-namespaces" => t.namespaces = p.value()?.parse()?,
        "emu-mdts" => t.mdts = p.value()?.parse()?,
        "emu-mqes" => t.mqes = p.value()?.parse()?,
        "emu-queues" => t.queues = p.value()?.parse()?,
        "emu-vectors" => t.vectors = p.value()?.parse()?,
        "emu-null" => t.null = true,
        "emu-latency-us" => t.latency_us = Some(p.value()?.parse()?),
        "emu-bandwidth-mbs" => t.bandwidth_mbs = Some(p.value()?.parse()?),
        "nsid" => t.nsid = Some(p.value()?.parse()?),
        "emu-spin-us" => t.spin_us = Some(p.value()?.parse()?),
        "emu-io-workers" => t.io_workers = p.value()?.parse()?,
        "pci" => {
            let v = p.value()?.string()?;
            t.targets.push(Member::Pci(v.clone()));
            t.pci.get_or_insert(v);
        }
        "vfio" => t.vfio = p.value()?.parse()?,
        "drv" => {
            let v = p.value()?.string()?;
            t.targets.push(Member::Drv(v.clone()));
            t.drv.get_or_insert(v);
        }
        "file" => {
            let v: PathBuf = p.value()?.into();
            t.targets.push(Member::File(v.clone()));
            t.kernel_file.get_or_insert(v);
        }
        "emu-controllers" => t.emu_controllers = p.value()?.parse()?,
        "tcp" => {
            let v = p.value()?.string()?;
            t.targets.push(Member::Tcp(v.clone()));
            t.tcp.get_or_insert(v);
        }
        "rdma" => {
            let v = p.value()?.string()?;
            t.targets.push(Member::Rdma(v.clone()));
            t.rdma.get_or_insert(v);
        }
        "nqn" => t.nqn = Some(p.value()?.string()?),
        "digests" => t.digests = true,
        "rdma-copy" => t.rdma_copy = true,
        "emu-tcp" => t.emu_tcp = true,
        "attach" => t.attach = Some(p.value()?.into()),
        _ => return Ok(false),
    }
    Ok(true)
}

/// The help text for the target flags.
pub const HELP: &str = "\
Target (default: an emulated controller whose namespace is a temporary file):
      --pci BDF               the controller at PCI address BDF (e.g. 0000:01:00.0),
                              bound to vfio-pci; the --emu-* flags are ignored
      --vfio auto|cdev|group  how to reach it: the vfio cdev with iommufd, or the
                              IOMMU group in a type1 container [auto: cdev where
                              the kernel has it]
      --drv PATH              the controller behind ugds_drv's /dev/ugds_drvN
      --file PATH             a file (any filesystem) or block device through the
                              kernel: io_uring, O_DIRECT where aligned, else the
                              page cache; its size is the capacity; the --emu-*
                              flags are ignored
      --tcp HOST:PORT         an NVMe/TCP target (port 4420 by convention), reached
                              by ugds's own initiator in user space; with --nqn
      --rdma ADDRESS:PORT     an NVMe/RDMA target (4420 by convention) on an RDMA
                              device's network, reached by ugds's own initiator
                              (rdma-core loaded at run time); with --nqn; host
                              memory (each buffer registered with the RDMA
                              device: the target moves its data)
      --rdma-copy             NVMe/RDMA: register no buffers; copy every
                              command's data through the queues' own memory
      --nqn NQN               the subsystem to connect to over NVMe/TCP or RDMA
      --digests               NVMe/TCP: ask for header and data digests (CRC32C)
      --attach SOCKET         the controller `ugds serve` serves at SOCKET: queue
                              pairs of this process's own, no admin queue; the
                              --emu-* flags are ignored
      --emu-tcp               an emulated NVMe/TCP target in this process, on
                              127.0.0.1 (a memory namespace of --emu-size and
                              --emu-block), reached by the same initiator
      --emu-file PATH         back the namespace with PATH (kept afterwards)
      --emu-memory            back the namespace with memory
      --emu-direct            read and write the backing file with O_DIRECT (no page cache)
      --emu-null              null mode: commands complete without moving data
      --emu-size SIZE         namespace size [1G]
      --emu-block 512|4096    logical block size [512]
      --emu-namespaces N      number of namespaces [1]
      --emu-mdts N            MDTS, 4 KiB << N per command, 0 = unlimited [5]
      --emu-mqes N            MQES, zero-based [1023]
      --emu-queues N          I/O queue pairs the controller grants [16]
      --emu-vectors N         interrupt vectors, vector 0 the admin queue's; fewer
                              than queues + 1 and queues share them [17]
      --emu-latency-us N      latency model: microseconds per command
      --emu-bandwidth-mbs N   latency model: MB/s, transfers serialised
      --emu-io-workers N      N threads move file-backed data, several commands at
                              once (as an SSD); 0: the controller thread does [0]
      --emu-spin-us N         emulator spins N us after its last work, then parks
                              [100; bench: 20000]
      --nsid N                namespace to use [first active]
      --emu-controllers N     N emulated controllers, each as the --emu-* flags
                              say (`ugds bench`: as one volume) [1]

Several --pci, --drv, --file, --tcp and --rdma flags (in any mix) name several targets;
`ugds bench` runs on them as one volume (see --stripe and --concat).
";

/// A temporary backing file, removed on drop.
pub struct TempFile(pub PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The emulator configuration, and the temporary file to remove after.
pub fn emu_config(t: &TargetOpts) -> (EmuConfig, Option<TempFile>) {
    emu_config_of(t, 0)
}

/// As [`emu_config`], for emulated controller `k` of several (its own
/// backing files).
fn emu_config_of(t: &TargetOpts, k: usize) -> (EmuConfig, Option<TempFile>) {
    let mut tmp = None;
    let mut namespaces = Vec::new();
    for i in 0..t.namespaces.max(1) {
        let ns = if t.memory || t.null {
            NamespaceConfig::memory(t.size, t.block)
        } else {
            let path = match &t.file {
                Some(f) if i == 0 && k == 0 => f.clone(),
                Some(f) if k == 0 => PathBuf::from(format!("{}.{}", f.display(), i + 1)),
                Some(f) => PathBuf::from(format!("{}.c{k}.{}", f.display(), i + 1)),
                None => {
                    let p = std::env::temp_dir().join(temp_name(k, i as usize + 1));
                    if i == 0 {
                        tmp = Some(TempFile(p.clone()));
                    }
                    p
                }
            };
            if t.direct {
                NamespaceConfig::direct_file(path, t.size, t.block)
            } else {
                NamespaceConfig::file(path, t.size, t.block)
            }
        };
        namespaces.push(ns);
    }
    let latency = match (t.latency_us, t.bandwidth_mbs) {
        (None, None) => None,
        (l, b) => Some(LatencyModel::new(Duration::from_micros(l.unwrap_or(0)), b.unwrap_or(0) * 1_000_000)),
    };
    let mut cfg = EmuConfig::default()
        .namespaces(namespaces)
        .mdts(t.mdts)
        .mqes(t.mqes)
        .max_io_queues(t.queues)
        .interrupt_vectors(t.vectors)
        .null(t.null)
        .io_workers(t.io_workers)
        .latency(latency);
    if let Some(us) = t.spin_us {
        cfg.spin = Duration::from_micros(us);
    }
    (cfg, tmp)
}

/// Extra temporary files of namespaces 2.. (removed with the first).
pub fn extra_temp_files(t: &TargetOpts) -> Vec<TempFile> {
    extra_temp_files_of(t, 0)
}

/// As [`extra_temp_files`], of emulated controller `k`.
fn extra_temp_files_of(t: &TargetOpts, k: usize) -> Vec<TempFile> {
    if t.file.is_some() || t.memory || t.null {
        return vec![];
    }
    (2..=t.namespaces).map(|i| TempFile(std::env::temp_dir().join(temp_name(k, i as usize)))).collect()
}

/// The temporary backing file of namespace `ns` of emulated controller `k`.
fn temp_name(k: usize, ns: usize) -> String {
    match k {
        0 => format!("ugds-emu-{}-{ns}.img", std::process::id()),
        _ => format!("ugds-emu-{}-c{k}-{ns}.img", std::process::id()),
    }
}

/// A one-line description of the target.
pub fn describe(t: &TargetOpts, tmp: &Option<TempFile>) -> String {
    let backing = if t.null {
        "null (no data moved)".to_string()
    } else if t.memory {
        "memory".to_string()
    } else {
        let p = t.file.clone().or_else(|| tmp.as_ref().map(|f| f.0.clone())).unwrap_or_default();
        format!("file {}{}", p.display(), if t.direct { " (O_DIRECT)" } else { "" })
    };
    format!(
        "emulated controller, namespace {} x {}-byte blocks, backed by {backing}",
        crate::fmt_bytes(t.size),
        t.block
    )
}

/// Where a target's handles come from.
pub enum Source {
    /// A controller on a platform.
    Controller(std::sync::Arc<dyn ugds::platform::Platform>),
    /// A file through the kernel path.
    File(PathBuf),
    /// A controller over NVMe/TCP.
    Tcp(ugds::fabrics::TcpTarget),
    /// A controller over NVMe/RDMA.
    Rdma(ugds::fabrics::RdmaTarget),
}

/// An opened target: what handles are opened on, the emulator's controls
/// when emulated, and the temporary files to remove afterwards.
pub struct Target {
    /// Where the handles come from.
    pub source: Source,
    /// Counters and faults, for an emulated controller.
    pub emu: Option<ugds_emu::EmuControl>,
    /// One line for the report.
    pub description: String,
    _tmp: Option<TempFile>,
    _more: Vec<TempFile>,
    /// The emulated NVMe/TCP target, kept while the target is.
    _emu_tcp: Option<ugds_emu::tcp::EmuTcpTarget>,
}

impl Target {
    /// Opens a handle on the target.
    pub fn open_handle(&self, driver: &ugds::Driver, opts: ugds::HandleOptions) -> ugds::Result<ugds::Handle> {
        match &self.source {
            Source::Controller(p) => driver.open_handle(p.clone(), opts),
            Source::File(path) => driver.open_file(path, opts),
            Source::Tcp(t) => driver.open_tcp(t, opts),
            Source::Rdma(t) => driver.open_rdma(t, opts),
        }
    }

    /// Whether it is the kernel path.
    pub fn is_kernel_path(&self) -> bool {
        matches!(self.source, Source::File(_))
    }

    /// Whether it is a controller over fabrics (NVMe/TCP or NVMe/RDMA):
    /// its queues copy each command's data.
    pub fn is_fabrics(&self) -> bool {
        matches!(self.source, Source::Tcp(_) | Source::Rdma(_))
    }
}

/// The NVMe/TCP target at `addr` exporting `nqn`, with both digests or none.
fn tcp_target(addr: &str, nqn: &str, digests: bool) -> ugds::fabrics::TcpTarget {
    let mut t = ugds::fabrics::TcpTarget::new(addr, nqn);
    t.digests = ugds::fabrics::Digests { header: digests, data: digests };
    t
}

/// Opens the target the flags name.
pub fn open(t: &TargetOpts) -> Result<Target, String> {
    if let Some(path) = &t.attach {
        let p = ugds::platform::attach::AttachPlatform::connect(path).map_err(|e| e.to_string())?;
        let description = format!("the controller served at {} (ugds serve)", path.display());
        let source = Source::Controller(std::sync::Arc::new(p));
        return Ok(Target { source, emu: None, description, _tmp: None, _more: vec![], _emu_tcp: None });
    }
    if t.emu_tcp {
        let cfg =
            ugds_emu::tcp::EmuTcpConfig { blocks: t.size / t.block as u64, block_size: t.block, ..Default::default() };
        let emu = ugds_emu::tcp::EmuTcpTarget::start(cfg).map_err(|e| format!("emulated NVMe/TCP target: {e}"))?;
        let tt = tcp_target(emu.addr(), emu.nqn(), t.digests);
        let description = format!(
            "emulated NVMe/TCP target at {} ({} x {}-byte blocks in memory), through ugds's NVMe/TCP initiator{}",
            emu.addr(),
            crate::fmt_bytes(t.size),
            t.block,
            if t.digests { ", digests on" } else { "" }
        );
        return Ok(Target {
            source: Source::Tcp(tt),
            emu: None,
            description,
            _tmp: None,
            _more: vec![],
            _emu_tcp: Some(emu),
        });
    }
    if let Some(addr) = &t.tcp {
        let nqn = t.nqn.as_deref().ok_or("--tcp needs --nqn: the subsystem to connect to")?;
        let description = format!(
            "{nqn} at {addr} through ugds's NVMe/TCP initiator{}",
            if t.digests { " (digests on)" } else { "" }
        );
        let source = Source::Tcp(tcp_target(addr, nqn, t.digests));
        return Ok(Target { source, emu: None, description, _tmp: None, _more: vec![], _emu_tcp: None });
    }
    if let Some(addr) = &t.rdma {
        let nqn = t.nqn.as_deref().ok_or("--rdma needs --nqn: the subsystem to connect to")?;
        let description = format!("{nqn} at {addr} through ugds's NVMe/RDMA initiator");
        let mut rt = ugds::fabrics::RdmaTarget::new(addr, nqn);
        rt.register_memory = !t.rdma_copy;
        let description = match t.rdma_copy {
            true => format!("{description} (data copied through its queues' memory)"),
            false => description,
        };
        let source = Source::Rdma(rt);
        return Ok(Target { source, emu: None, description, _tmp: None, _more: vec![], _emu_tcp: None });
    }
    if let Some(path) = &t.kernel_file {
        let description = format!("{} through the kernel path (io_uring)", path.display());
        return Ok(Target {
            source: Source::File(path.clone()),
            emu: None,
            description,
            _tmp: None,
            _more: vec![],
            _emu_tcp: None,
        });
    }
    if let Some(path) = &t.drv {
        let p = ugds::platform::ugds_drv::UgdsDrvPlatform::open(path).map_err(|e| e.to_string())?;
        let c = p.counters().map_err(|e| e.to_string())?;
        let description = format!(
            "controller behind {path} (module-wide before this run: {} pinned pages, {} ledger entries)",
            c.total_pinned_pages, c.total_mappings
        );
        let source = Source::Controller(std::sync::Arc::new(p));
        return Ok(Target { source, emu: None, description, _tmp: None, _more: vec![], _emu_tcp: None });
    }
    if let Some(bdf) = &t.pci {
        let p = ugds::platform::vfio::VfioPlatform::open_with(bdf, t.vfio).map_err(|e| e.to_string())?;
        let via = match p.interface() {
            ugds::platform::vfio::VfioInterface::Cdev => "vfio cdev and iommufd",
            _ => "vfio group and type1 container",
        };
        let description = format!("controller at {bdf} through vfio-pci ({via})");
        let source = Source::Controller(std::sync::Arc::new(p));
        return Ok(Target { source, emu: None, description, _tmp: None, _more: vec![], _emu_tcp: None });
    }
    let (cfg, tmp) = emu_config(t);
    let more = extra_temp_files(t);
    let description = describe(t, &tmp);
    let p = ugds_emu::EmuPlatform::new(cfg).map_err(|e| e.to_string())?;
    let emu = Some(p.control());
    Ok(Target {
        source: Source::Controller(std::sync::Arc::new(p)),
        emu,
        description,
        _tmp: tmp,
        _more: more,
        _emu_tcp: None,
    })
}

/// Opens every target the flags name: several `--pci`/`--drv`/`--file`
/// targets in order, or `--emu-controllers` emulated ones; one otherwise.
pub fn open_all(t: &TargetOpts) -> Result<Vec<Target>, String> {
    if t.targets.len() > 1 {
        return t
            .targets
            .iter()
            .map(|m| {
                let mut one = t.clone();
                (one.pci, one.drv, one.kernel_file, one.tcp, one.rdma) = (None, None, None, None, None);
                match m {
                    Member::Pci(b) => one.pci = Some(b.clone()),
                    Member::Drv(d) => one.drv = Some(d.clone()),
                    Member::File(f) => one.kernel_file = Some(f.clone()),
                    Member::Tcp(a) => one.tcp = Some(a.clone()),
                    Member::Rdma(a) => one.rdma = Some(a.clone()),
                }
                open(&one)
            })
            .collect();
    }
    if t.emu_controllers > 1 && t.targets.is_empty() {
        return (0..t.emu_controllers)
            .map(|k| {
                let (cfg, tmp) = emu_config_of(t, k);
                let description = describe(t, &tmp);
                let p = ugds_emu::EmuPlatform::new(cfg).map_err(|e| e.to_string())?;
                let emu = Some(p.control());
                let source = Source::Controller(std::sync::Arc::new(p));
                Ok(Target { source, emu, description, _tmp: tmp, _more: extra_temp_files_of(t, k), _emu_tcp: None })
            })
            .collect();
    }
    open(t).map(|x| vec![x])
}
