//! `ugds rdma`: what RDMA this machine offers NVMe over RDMA (libibverbs,
//! the devices and their ports, and whether memory registers with each
//! device, host memory and a dma-buf: GPU memory's way in; a udmabuf
//! stands in for it), and with `--connect` ugds's own NVMe/RDMA initiator
//! against a target: the admin queue and one I/O queue, and a read (and a
//! write) through them.

use ugds::fabrics::{RdmaSession, RdmaTarget, RDMA_STAGING};
use ugds::platform::sys::verbs::{device_names, Device};

pub const HELP: &str = "\
Usage: ugds rdma
       ugds rdma --connect ADDR:PORT --nqn NQN [--nsid N] [--bytes SIZE] [--write] [--dump FILE]

Without --connect: lists the RDMA devices (through rdma-core's libibverbs,
loaded at run time) with their ports, and registers 1 MiB of host memory
and a 1 MiB dma-buf (from /dev/udmabuf) with each: what NVMe over RDMA
would need. Exits 1 when there is no RDMA device or a registration fails.

With --connect: ugds's NVMe/RDMA initiator (librdmacm and libibverbs)
connects the admin queue of the subsystem NQN at ADDR:PORT (an address on
an RDMA device's network; 4420 is NVMe/RDMA's port), enables and
identifies the controller, connects one I/O queue, and reads SIZE bytes
(default 64k, at most 128k) at offset 0 of namespace N (default 1): the
target moves them with RDMA WRITE into registered host memory. --write
first writes a pattern there (RDMA READ by the target) and checks that the
read returns it (overwrites those blocks). --dump FILE saves what was read.
";

pub fn main(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    use lexopt::prelude::*;
    let (mut connect, mut nqn, mut nsid, mut bytes, mut write, mut dump) =
        (None::<String>, None::<String>, 1u32, 64u64 << 10, false, None::<std::path::PathBuf>);
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        match arg {
            Short('h') | Long("help") => {
                print!("{HELP}");
                return Ok(());
            }
            Long("connect") => {
                connect = Some(p.value().map_err(|e| e.to_string())?.string().map_err(|e| format!("{e:?}"))?)
            }
            Long("nqn") => nqn = Some(p.value().map_err(|e| e.to_string())?.string().map_err(|e| format!("{e:?}"))?),
            Long("nsid") => nsid = p.value().map_err(|e| e.to_string())?.parse().map_err(|e| e.to_string())?,
            Long("bytes") => {
                let v = p.value().map_err(|e| e.to_string())?.string().map_err(|e| format!("{e:?}"))?;
                bytes = crate::parse_size(&v)?;
            }
            Long("write") => write = true,
            Long("dump") => dump = Some(p.value().map_err(|e| e.to_string())?.into()),
            _ => return Err(format!("{}; try `ugds help rdma`", arg.unexpected())),
        }
    }
    match (connect, nqn) {
        (Some(addr), Some(nqn)) => session(&addr, &nqn, nsid, bytes, write, dump),
        (Some(_), None) => Err("--connect needs --nqn: the subsystem to connect to".into()),
        (None, Some(_)) => Err("--nqn goes with --connect".into()),
        (None, None) => devices(),
    }
}

/// The byte at `i` of the pattern `--write` writes.
fn pattern(i: usize) -> u8 {
    (i as u64).wrapping_mul(0x9e37_79b9).wrapping_shr(13) as u8 ^ (i >> 12) as u8
}

fn session(
    addr: &str,
    nqn: &str,
    nsid: u32,
    bytes: u64,
    write: bool,
    dump: Option<std::path::PathBuf>,
) -> Result<(), String> {
    if bytes == 0 || bytes > RDMA_STAGING as u64 {
        return Err(format!("--bytes {bytes}: from one block to {} KiB", RDMA_STAGING >> 10));
    }
    let t = RdmaTarget::new(addr, nqn);
    let mut s = RdmaSession::connect(&t).map_err(|e| e.to_string())?;
    let pr = s.probe();
    println!("target       {nqn} at {addr} (NVMe/RDMA)");
    println!("controller   {} (given by Connect)", pr.cntlid);
    println!("model        {}", pr.identify.mn);
    println!("version      {}", pr.version);
    for (id, blocks, bs) in &pr.namespaces {
        println!("  nsid {id:<4} {blocks} blocks x {bs} bytes");
    }
    println!("io queue     1 connected");
    let n = bytes as usize;
    if write {
        let data: Vec<u8> = (0..n).map(pattern).collect();
        s.write(nsid, 0, &data).map_err(|e| e.to_string())?;
        println!("write        {n} bytes at 0 of namespace {nsid}");
    }
    let mut back = vec![0u8; n];
    s.read(nsid, 0, &mut back).map_err(|e| e.to_string())?;
    println!("read         {n} bytes at 0 of namespace {nsid}");
    if write {
        match (0..n).find(|&i| back[i] != pattern(i)) {
            None => println!("verify       the read returned what was written"),
            Some(i) => return Err(format!("byte {i} read back as {:#04x}, written as {:#04x}", back[i], pattern(i))),
        }
    }
    if let Some(f) = dump {
        std::fs::write(&f, &back).map_err(|e| format!("{}: {e}", f.display()))?;
        println!("dump         {}", f.display());
    }
    Ok(())
}

fn devices() -> Result<(), String> {
    let names = device_names().map_err(|e| e.to_string())?;
    if names.is_empty() {
        return Err("no RDMA device (libibverbs loaded; no provider found one)".into());
    }
    let mut failed = false;
    for name in names {
        let d = Device::open(&name).map_err(|e| e.to_string())?;
        let i = d.info();
        println!("device       {} (firmware {:?}, vendor {:#x})", i.name, i.fw_ver, i.vendor_id);
        for p in &i.ports {
            let state = match p.state {
                4 => "active",
                2 => "down",
                3 => "init",
                _ => "other",
            };
            println!("  port {}     {state} (state {}), active MTU {} bytes", p.port, p.state, p.active_mtu);
        }
        let mut host = ugds::HostBuffer::new(1 << 20).map_err(|e| e.to_string())?;
        // SAFETY: `host` outlives the region (dropped at the end of the match).
        match unsafe { d.register_host(host.as_mut_ptr(), host.len()) } {
            Ok(mr) => println!("  host memory  1 MiB registered: lkey {:#x}, rkey {:#x}", mr.lkey(), mr.rkey()),
            Err(e) => {
                failed = true;
                println!("  host memory  not registered: {e}");
            }
        }
        match ugds::platform::sys::udmabuf(1 << 20) {
            Ok((_memfd, buf)) => {
                use std::os::fd::AsRawFd;
                match d.register_dmabuf(buf.as_raw_fd(), 0, 1 << 20, 0) {
                    Ok(mr) => println!("  dma-buf      1 MiB (udmabuf) registered: rkey {:#x}", mr.rkey()),
                    Err(e) => println!("  dma-buf      not registered: {e}"),
                }
            }
            Err(e) => println!("  dma-buf      not tried: {e}"),
        }
    }
    if failed {
        return Err("a registration failed".into());
    }
    Ok(())
}
