//! `ugds rdma`: what RDMA this machine offers NVMe over RDMA (issue 18,
//! part 3, whose initiator is not built yet): libibverbs, the devices and
//! their ports, and whether memory registers with each device, host memory
//! and a dma-buf (GPU memory's way in; a udmabuf stands in for it).

use ugds::platform::sys::verbs::{device_names, Device};

pub const HELP: &str = "\
Usage: ugds rdma

Lists the RDMA devices (through rdma-core's libibverbs, loaded at run time)
with their ports, and registers 1 MiB of host memory and a 1 MiB dma-buf
(from /dev/udmabuf) with each: what NVMe over RDMA would need. Exits 1 when
there is no RDMA device or a registration fails.
";

pub fn main(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    if let Some(a) = args.first() {
        if a == "-h" || a == "--help" {
            print!("{HELP}");
            return Ok(());
        }
        return Err(format!("unexpected {a:?}; try `ugds help rdma`"));
    }
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
