//! `ugds serve`: owns a controller and serves it to other processes.

use crate::target::{self, Source};
use std::path::PathBuf;
use ugds::serve::{ServeOptions, Server};

pub const HELP: &str = "\
Usage: ugds serve [OPTIONS] [TARGET]

Owns the controller (its admin queue, its bring-up and shutdown) and serves
it to other processes of the same user at a unix socket. Each process that
attaches (`--attach SOCKET` on any ugds command, UGDS_ATTACH=SOCKET for the
C library, ugds.Driver.attach in Python) gets I/O queue pairs of its own and
submits and reaps with no system call per I/O. When an attached process
ends (or is killed), its submission queues are deleted, then its completion
queues, and only then its memory unmapped. Runs until SIGINT or SIGTERM,
then cuts every process off the same way and shuts the controller down.

Options:
      --socket PATH           where to listen [$TMPDIR/ugds-UID.sock]
      --split N               each namespace split into N equal LBA ranges, one
                              per attached process; I/O outside its own is
                              refused [1: every process shares the namespace]
      --queues-per-process N  most I/O queue pairs one process gets [a quarter of
                              the controller's, 2 to 16]

";

fn default_socket() -> PathBuf {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("ugds-{uid}.sock"))
}

pub fn main(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    use lexopt::prelude::*;
    let mut t = target::TargetOpts::default();
    let mut opts = ServeOptions::default();
    let mut socket = default_socket();
    let mut p = lexopt::Parser::from_args(args);
    let err = |e: lexopt::Error| e.to_string();
    while let Some(arg) = p.next().map_err(err)? {
        match arg {
            Short('h') | Long("help") => {
                print!("{HELP}{}", target::HELP);
                return Ok(());
            }
            Long("socket") => socket = p.value().map_err(err)?.into(),
            Long("split") => opts.parts = p.value().map_err(err)?.parse().map_err(err)?,
            Long("queues-per-process") => opts.queues_per_process = p.value().map_err(err)?.parse().map_err(err)?,
            Long(l) => {
                let l = l.to_owned();
                if !target::parse_long(&mut t, &l, &mut p).map_err(err)? {
                    return Err(format!("unexpected option --{l}; try `ugds help serve`"));
                }
            }
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    if t.attach.is_some() {
        return Err("ugds serve owns a controller: --attach is for the processes it serves".into());
    }
    let target = target::open(&t)?;
    let Source::Controller(platform) = &target.source else {
        return Err("ugds serve serves a controller (emulated, --pci or --drv), not the kernel path or fabrics".into());
    };
    // SIGINT and SIGTERM are taken by sigwait below, in this thread: block
    // them before the server's threads start (they inherit the mask).
    // SAFETY: sigset_t is plain data, filled by sigemptyset/sigaddset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set is ours; pthread_sigmask changes this thread's mask.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let server =
        Server::start(platform.clone(), &socket, opts.clone()).map_err(|e| format!("{}: {e}", socket.display()))?;
    println!(
        "serving {} at {}: {} I/O queue pairs, at most {} per process, namespaces {}",
        target.description,
        socket.display(),
        server.queues(),
        server.queues_per_process(),
        if opts.parts > 1 { format!("split in {} parts", opts.parts) } else { "shared".into() }
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut sig = 0;
    // SAFETY: waits for one of the blocked signals in `set`.
    unsafe { libc::sigwait(&set, &mut sig) };
    let s = server.stats();
    let stopped = server.stop();
    println!(
        "stopped on signal {sig}: {} sessions served, {} refused at attach, {} requests refused, {} left their memory mapped",
        s.sessions, s.refused, s.bad_requests, s.leaked
    );
    if let Some(c) = &target.emu {
        let e = c.stats();
        println!("emulator {} commands, {} DMA faults", e.commands, e.dma_faults);
    }
    stopped.map_err(|e| format!("shutting the controller down: {e}"))
}
