//! `ugds bench`'s options: the help text and the parser.

use super::*;

pub const HELP: &str = "\
Usage: ugds bench [OPTIONS] [TARGET]

Runs I/O against the target and prints, per run, throughput (MiB/s), IOPS
and latency (mean, p50, p99, p99.9, max) from submission to completion.

Options:
      --rw PATTERN        read, write, randread, randwrite [randread]
  -m, --mode MODE         how the handle serves synchronous requests: latency
                          (polling, shallow queues), throughput (deep queues,
                          interrupts), priority (by each request's class) or
                          adaptive (polling or interrupts by measured service
                          time) [none: as --interrupt says]; read, write,
                          randread and randwrite are still taken as --rw
  -s, --size SIZE         request size; a comma list sweeps sizes [4k]
  -t, --threads N         submitting threads, one queue each [1]
  -q, --qd N              requests outstanding per thread [32]
  -d, --duration SECS     time per run [3]
  -b, --bytes SIZE        stop each run after this many bytes instead
  -r, --range SIZE        bytes of the namespace to touch [whole namespace]
      --batch N[,N...]    batch mode: each thread submits batches of N requests
                          and waits for all (a list sweeps batch sizes)
      --stream            stream mode: each thread enqueues stream-ordered
                          requests on a host stream, qd of them ahead
      --verify            write a pattern, check every byte read against it
  -p, --processes N       with --attach: N processes at once, each with queue
                          pairs of its own on the served controller; prints
                          each one's figures and their sum [1]
      --json FILE         also write every figure, the configuration and the
                          machine as JSON to FILE (`ugds report` draws them)
      --interrupt         interrupt completion instead of polling
      --no-progress       no progress bar, even on a terminal
      --progress-lines    progress as a line a second (for logs: I/Os done,
                          IOPS over the last second), on any stderr
      --queue             at queue depth 1 too, use a lent I/O queue rather
                          than synchronous calls
      --shadow-doorbells  shadow doorbells where the controller offers
                          Doorbell Buffer Config [default: only under a
                          hypervisor where doorbell writes trap (KVM, Hyper-V,
                          VMware, Xen), or UGDS_SHADOW_DOORBELLS=1|0]
      --no-shadow-doorbells  MMIO doorbells always
      --kernel-ring plain|sqpoll|iopoll  with --file: how its io_uring rings
                          run (sqpoll: a kernel thread takes submissions;
                          iopoll: completions polled from the device) [plain]
      --cache auto|direct|buffered  with --file: reads tried in the page
                          cache first (auto), O_DIRECT, or through the page
                          cache [auto, or UGDS_CACHE_POLICY]
      --placement least-loaded|round-robin  where synchronous requests go
                          [least-loaded]
      --chunk SIZE        synchronous requests above SIZE keep at most SIZE on
                          the device while other work waits; 0: never [256k]
      --mixed             the scheduler's table: SIZE (the first -s) reads at
                          QD1 from one thread alone, then beside 1 MiB reads
                          at QD1 from another on the same handle, with round
                          robin, with the scheduler, and with priorities
                          (small latency-critical, large background); their
                          p50/p99 and the large reads' MiB/s
      --vectored N        N segments of SIZE (the first -s), scattered in one
                          buffer, read as one call (readv) against N calls
                          (segments/s, CPU time per segment)
      --modes             the modes' table: a latency-bound workload (SIZE, the
                          first -s, at QD1 from one thread) and a bandwidth-
                          bound one (1 MiB at QD1 from -t threads), each with
                          polling, interrupts and the latency, throughput and
                          adaptive modes: IOPS, MiB/s, p50/p99 and the CPU
                          time of the calling threads per GB
      --stripe SIZE       over several targets (several --pci, --drv or --file
                          flags, or --emu-controllers N): stripe them as one
                          volume (RAID 0) with SIZE stripes, a power of two of
                          at least 4k [128k]; the workload runs on the first
                          target alone, then on the volume (qd above 1 through
                          a queue lent by each member, Volume::io_queue)
      --concat            over several targets: concatenate them instead
      --volume-batch      over several targets: qd above 1 through a volume
                          batch context (one submit call per request) instead
      --gpu               over several targets: the buffers in GPU 0's memory
                          (CUDA) instead of host memory (no --verify; a build
                          with --features gpu-bench)
      --sample N          at queue depth 1, time one call in N (1: every
                          call; two clock reads and a histogram entry cost
                          about 8% of a 0.5 us call, hundreds of ns in VMs
                          whose TSC is not invariant) [16]
      --trace N           the library traces each queue's last N commands and
                          counts their latencies (two clock reads a command);
                          printed per queue after the runs [UGDS_TRACE, or 0]

After the runs, a line per queue pair used: its commands, bytes, doorbell
writes and interrupts per command, errors and timeouts. With UGDS_STATS_DIR
set, the handle publishes its queue statistics there while it runs (read
them with `ugds stats` and `ugds top`).

";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Read,
    Write,
    RandRead,
    RandWrite,
}

impl Mode {
    pub(super) fn parse(s: &str) -> Result<Mode, String> {
        Ok(match s {
            "read" => Mode::Read,
            "write" => Mode::Write,
            "randread" => Mode::RandRead,
            "randwrite" => Mode::RandWrite,
            _ => return Err(format!("unknown mode {s:?}: read, write, randread or randwrite")),
        })
    }
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
            Mode::RandRead => "randread",
            Mode::RandWrite => "randwrite",
        }
    }
    pub(super) fn writes(self) -> bool {
        matches!(self, Mode::Write | Mode::RandWrite)
    }
    pub(super) fn random(self) -> bool {
        matches!(self, Mode::RandRead | Mode::RandWrite)
    }
}

#[derive(Clone, Debug)]
pub(super) struct Opts {
    pub(super) mode: Mode,
    /// The handle's mode (`--mode latency|throughput|priority|adaptive`).
    pub(super) service: Option<String>,
    /// The modes' table (`--modes`).
    pub(super) modes: bool,
    /// Where latencies are read from.
    pub(super) clock: crate::clock::Clock,
    /// At queue depth 1, one call in this many is timed (`--sample N`).
    pub(super) sample: u32,
    pub(super) sizes: Vec<usize>,
    pub(super) threads: usize,
    pub(super) qd: usize,
    pub(super) duration: Duration,
    pub(super) bytes: Option<u64>,
    pub(super) range: Option<u64>,
    pub(super) verify: bool,
    pub(super) interrupt: bool,
    pub(super) progress: bool,
    pub(super) progress_lines: bool,
    pub(super) batches: Vec<usize>,
    pub(super) stream: bool,
    pub(super) shadow_doorbells: bool,
    pub(super) kernel_ring: ugds::KernelRing,
    pub(super) cache: Option<ugds::CachePolicy>,
    pub(super) force_queue: bool,
    /// Commands each queue's trace keeps (`--trace N`, 0: not traced).
    pub(super) trace: usize,
    /// The scheduler's mixed-workload table (`--mixed`).
    pub(super) mixed: bool,
    /// Vectored reads of this many segments against separate calls (`--vectored N`).
    pub(super) vectored: Option<usize>,
    /// Where synchronous requests go (`--placement`).
    pub(super) placement: ugds::Placement,
    /// The scheduler's interleaving chunk (`--chunk`).
    pub(super) chunk: usize,
    pub(super) target: TargetOpts,
    /// Where to write every figure as JSON (`--json FILE`).
    pub(super) json: Option<std::path::PathBuf>,
    /// The targets as one volume (`--stripe SIZE`, `--concat`).
    pub(super) volume: Option<ugds::VolumeLayout>,
    /// A volume's deep runs through a `VolumeBatch`, not `Volume::io_queue`.
    pub(super) volume_batch: bool,
    /// A volume's buffers in GPU memory (`--gpu`).
    pub(super) gpu: bool,
    /// Processes at once, each attached (`-p N`, with `--attach`).
    pub(super) processes: usize,
}

pub(super) fn parse(args: Vec<std::ffi::OsString>) -> Result<Option<Opts>, String> {
    use lexopt::prelude::*;
    let mut o = Opts {
        mode: Mode::RandRead,
        service: None,
        modes: false,
        clock: crate::clock::Clock::new(),
        sample: 0,
        sizes: vec![4096],
        threads: 1,
        qd: 32,
        duration: Duration::from_secs(3),
        bytes: None,
        range: None,
        verify: false,
        interrupt: false,
        progress: true,
        progress_lines: false,
        batches: Vec::new(),
        stream: false,
        shadow_doorbells: HandleOptions::from_env().shadow_doorbells,
        kernel_ring: ugds::KernelRing::Plain,
        cache: None,
        force_queue: false,
        trace: HandleOptions::from_env().trace,
        mixed: false,
        vectored: None,
        placement: ugds::Placement::LeastLoaded,
        chunk: HandleOptions::default().chunk_bytes,
        target: TargetOpts::default(),
        json: None,
        volume: None,
        volume_batch: false,
        gpu: false,
        processes: 1,
    };
    let mut p = lexopt::Parser::from_args(args);
    let err = |e: lexopt::Error| e.to_string();
    while let Some(arg) = p.next().map_err(err)? {
        match arg {
            Long("rw") => o.mode = Mode::parse(&p.value().map_err(err)?.string().map_err(err)?)?,
            Short('m') | Long("mode") => {
                let v = p.value().map_err(err)?.string().map_err(err)?;
                match Mode::parse(&v) {
                    Ok(m) => o.mode = m,
                    Err(_) if ugds::mode::MODE_NAMES.contains(&v.as_str()) => o.service = Some(v),
                    Err(_) => {
                        return Err(format!(
                            "unknown mode {v:?}: {} (or, as --rw, read, write, randread, randwrite)",
                            ugds::mode::MODE_NAMES.join(", ")
                        ))
                    }
                }
            }
            Long("modes") => o.modes = true,
            Long("sample") => {
                o.sample = p.value().map_err(err)?.parse().map_err(err)?;
                if o.sample == 0 {
                    return Err("--sample 0: time one call in N, N at least 1".into());
                }
            }
            Short('s') | Long("size") => {
                let v = p.value().map_err(err)?.string().map_err(err)?;
                o.sizes = v.split(',').map(|s| parse_size(s).map(|n| n as usize)).collect::<Result<_, _>>()?;
            }
            Short('t') | Long("threads") => o.threads = p.value().map_err(err)?.parse().map_err(err)?,
            Short('q') | Long("qd") => o.qd = p.value().map_err(err)?.parse().map_err(err)?,
            Short('d') | Long("duration") => {
                let secs: f64 = p.value().map_err(err)?.parse().map_err(err)?;
                o.duration = Duration::from_secs_f64(secs);
            }
            Short('b') | Long("bytes") => o.bytes = Some(parse_size(&p.value().map_err(err)?.string().map_err(err)?)?),
            Short('r') | Long("range") => o.range = Some(parse_size(&p.value().map_err(err)?.string().map_err(err)?)?),
            Long("verify") => o.verify = true,
            Short('p') | Long("processes") => {
                o.processes = p.value().map_err(err)?.parse().map_err(err)?;
                if o.processes == 0 {
                    return Err("-p 0: at least one process".into());
                }
            }
            Long("volume-batch") => o.volume_batch = true,
            Long("json") => o.json = Some(p.value().map_err(err)?.into()),
            Long("batch") => {
                let v = p.value().map_err(err)?.string().map_err(err)?;
                o.batches = v
                    .split(',')
                    .map(|x| x.trim().parse::<usize>().map_err(|_| format!("not a batch size: {x:?}")))
                    .collect::<Result<_, _>>()?;
                if o.batches.contains(&0) {
                    return Err("batch size must be at least 1".into());
                }
            }
            Long("stream") => o.stream = true,
            Long("no-shadow-doorbells") => o.shadow_doorbells = false,
            Long("shadow-doorbells") => o.shadow_doorbells = true,
            Long("kernel-ring") => {
                o.kernel_ring = match p.value().map_err(err)?.string().map_err(err)?.as_str() {
                    "plain" => ugds::KernelRing::Plain,
                    "sqpoll" => ugds::KernelRing::SqPoll,
                    "iopoll" => ugds::KernelRing::IoPoll,
                    v => return Err(format!("--kernel-ring {v}: plain, sqpoll or iopoll")),
                }
            }
            Long("cache") => {
                o.cache = Some(
                    p.value().map_err(err)?.string().map_err(err)?.parse().map_err(|e: ugds::Error| e.to_string())?,
                )
            }
            Long("queue") => o.force_queue = true,
            Long("trace") => o.trace = p.value().map_err(err)?.parse().map_err(err)?,
            Long("mixed") => o.mixed = true,
            Long("vectored") => {
                let n: usize = p.value().map_err(err)?.parse().map_err(err)?;
                if n == 0 || n > ugds::MAX_SEGMENTS {
                    return Err(format!("--vectored {n}: 1 to {} segments", ugds::MAX_SEGMENTS));
                }
                o.vectored = Some(n);
            }
            Long("placement") => {
                o.placement = match p.value().map_err(err)?.string().map_err(err)?.as_str() {
                    "least-loaded" => ugds::Placement::LeastLoaded,
                    "round-robin" => ugds::Placement::RoundRobin,
                    v => return Err(format!("--placement {v}: least-loaded or round-robin")),
                }
            }
            Long("chunk") => o.chunk = parse_size(&p.value().map_err(err)?.string().map_err(err)?)? as usize,
            Long("stripe") => {
                let stripe = parse_size(&p.value().map_err(err)?.string().map_err(err)?)?;
                o.volume = Some(ugds::VolumeLayout::Striped { stripe });
            }
            Long("concat") => o.volume = Some(ugds::VolumeLayout::Concat),
            Long("gpu") => o.gpu = true,
            Long("interrupt") => o.interrupt = true,
            Long("no-progress") => o.progress = false,
            Long("progress-lines") => o.progress_lines = true,
            Short('h') | Long("help") => {
                print!("{HELP}{}", target::HELP);
                return Ok(None);
            }
            Long(l) => {
                let l = l.to_owned();
                if !target::parse_long(&mut o.target, &l, &mut p).map_err(err)? {
                    return Err(format!("unexpected option --{l}; try `ugds help bench`"));
                }
            }
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    if o.sample == 0 {
        o.sample = 16;
    }
    if o.threads == 0 || o.qd == 0 {
        return Err("threads and queue depth must be at least 1".into());
    }
    if o.sizes.contains(&0) {
        return Err("request size must not be zero".into());
    }
    if o.stream && !o.batches.is_empty() {
        return Err("--batch and --stream are separate modes".into());
    }
    if (o.mixed || o.modes || o.vectored.is_some())
        && (o.verify || o.stream || !o.batches.is_empty() || o.mode != Mode::RandRead || o.service.is_some())
    {
        return Err(
            "--mixed, --modes and --vectored run reads of their own: no --verify, --stream, --batch, --rw or --mode"
                .into(),
        );
    }
    let several = o.target.targets.len() > 1 || o.target.emu_controllers > 1;
    if several && o.volume.is_none() {
        o.volume = Some(ugds::VolumeLayout::Striped { stripe: 128 << 10 });
    }
    if o.volume.is_some() && (o.mixed || o.modes || o.vectored.is_some() || o.stream || !o.batches.is_empty()) {
        return Err("a volume runs synchronous calls (qd 1), its members' lent queues or a volume batch context: \
                    no --mixed, --modes, --vectored, --stream or --batch"
            .into());
    }
    if o.volume_batch && o.volume.is_none() {
        return Err("--volume-batch is for several targets run as one volume".into());
    }
    if o.gpu && (o.volume.is_none() || o.verify) {
        return Err("--gpu runs a volume's workload (several targets) in GPU memory, without --verify".into());
    }
    if o.target.emu_controllers == 0 {
        return Err("--emu-controllers 0: at least one".into());
    }
    if o.verify && o.target.null {
        return Err("--verify needs a namespace that keeps data (not --emu-null)".into());
    }
    Ok(Some(o))
}
