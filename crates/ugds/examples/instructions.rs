//! Instructions per 4 KiB read on a lent `IoQueue`: submission (stage the
//! command, one doorbell per 32) and completion (consume the entry, report
//! the request), counted by callgrind in two functions that do nothing else.
//! `scripts/instructions` runs it under valgrind and prints the figures;
//! run alone it only checks that every round completes.
//!
//! The controller is the emulated one in null mode (no data moved), so what
//! is counted is the driver alone. Between the two measured calls the
//! program waits (uncounted) until the emulator has completed the round.

use std::sync::Arc;
use ugds::engine::{Controller, Owner, QueuePair};
use ugds::nvme::{Cid, Lba, Nsid, NvmOpcode, PrpPlan, Sqe};
use ugds::platform::Platform;
use ugds::{Driver, HandleOptions, HostBuffer, IoQueue};
use ugds_emu::{EmuConfig, EmuControl, EmuPlatform};

const DEPTH: usize = 32;
const WARMUP: usize = 20;
const ROUNDS: usize = 200;

/// Stages `DEPTH` 4 KiB reads and rings once (counted by callgrind).
#[inline(never)]
fn measured_submit(q: &mut IoQueue<'_>, token: &ugds::BufferToken, round: usize) {
    submit(q, token, round)
}

/// Reaps the round's completions (counted by callgrind).
#[inline(never)]
fn measured_complete(q: &mut IoQueue<'_>) -> usize {
    complete(q)
}

/// As [`measured_submit`], on a queue of a handle attached to a controller
/// served by `ugds::serve` (counted by callgrind).
#[inline(never)]
fn measured_attached_submit(q: &mut IoQueue<'_>, token: &ugds::BufferToken, round: usize) {
    // Keeps the function apart from `measured_submit` (identical bodies are
    // merged into one symbol): one instruction a round of 32.
    std::hint::black_box(1u8);
    submit(q, token, round)
}

/// As [`measured_complete`], attached (counted by callgrind).
#[inline(never)]
fn measured_attached_complete(q: &mut IoQueue<'_>) -> usize {
    std::hint::black_box(1u8);
    complete(q)
}

#[inline(always)]
fn submit(q: &mut IoQueue<'_>, token: &ugds::BufferToken, round: usize) {
    for i in 0..DEPTH {
        let off = ((round * DEPTH + i) % 4096) as u64 * 4096;
        q.submit_read(token, 4096, off, i * 4096, i as u64).expect("room for the round");
    }
    q.ring();
}

#[inline(always)]
fn complete(q: &mut IoQueue<'_>) -> usize {
    q.poll(usize::MAX, |_, r| {
        r.expect("read");
    })
}

/// The bare queue pair's round (counted by callgrind): stage `DEPTH` 4 KiB
/// reads with their PRPs planned beforehand, ring once.
#[inline(never)]
fn measured_bare_submit(qp: &mut QueuePair, plans: &[(u64, u64)], nsid: u32, shift: u32, round: usize) {
    bare_submit(qp, plans, nsid, shift, round)
}

/// Reaps the bare queue pair's round (counted by callgrind).
#[inline(never)]
fn measured_bare_complete(qp: &mut QueuePair) -> usize {
    bare_complete(qp)
}

#[inline(always)]
fn bare_submit(qp: &mut QueuePair, plans: &[(u64, u64)], nsid: u32, shift: u32, round: usize) {
    for (i, &(prp1, prp2)) in plans.iter().enumerate() {
        let off = ((round * DEPTH + i) % 4096) as u64 * 4096;
        let sqe = Sqe::rw(NvmOpcode::Read, Cid(0), Nsid(nsid), Lba(off >> shift), 4096 >> shift, 0, 0);
        qp.stage(sqe, Some(PrpPlan::Two { prp1, prp2 }), Owner::Own(i as u32)).expect("room for the round");
    }
    qp.ring_sq_doorbell();
}

#[inline(always)]
fn bare_complete(qp: &mut QueuePair) -> usize {
    let mut failed = 0;
    let n = qp.process_completions(usize::MAX, |_, cqe| failed += !cqe.is_success() as usize);
    assert_eq!(failed, 0, "every read succeeds");
    n
}

/// Waits until the emulator has posted `n` completion entries in all (not
/// counted). Its read counter will not do: it is published before the
/// entries are written.
fn wait_for(emu: &EmuControl, n: u64) {
    while emu.stats().completions_posted < n {
        std::thread::yield_now();
    }
}

fn main() -> Result<(), ugds::Error> {
    local()?;
    bare()?;
    attached()
}

fn local() -> Result<(), ugds::Error> {
    let p = EmuPlatform::new(EmuConfig::default().null(true))?;
    let emu = p.control();
    rounds(&emu, Arc::new(p), measured_submit, measured_complete)?;
    println!("instructions: {ROUNDS} measured rounds of {DEPTH} reads of 4 KiB completed");
    Ok(())
}

/// The lent queue's rounds again, from a handle attached (over a unix
/// socket of this process) to the controller a `ugds::serve::Server` owns:
/// the same engine, ringing doorbells in the owner's shared registers.
fn attached() -> Result<(), ugds::Error> {
    let p = EmuPlatform::new(EmuConfig::default().null(true))?;
    let emu = p.control();
    let path = std::env::temp_dir().join(format!("ugds-instructions-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let server = ugds::serve::Server::start(Arc::new(p), &path, Default::default())?;
    let attached = ugds::platform::attach::AttachPlatform::connect(&path)?;
    rounds(&emu, Arc::new(attached), measured_attached_submit, measured_attached_complete)?;
    server.stop()?;
    println!("instructions: {ROUNDS} measured rounds of {DEPTH} reads of 4 KiB on an attached queue completed");
    Ok(())
}

/// Warm-up rounds, then the measured ones through `sub` and `comp`, on a
/// lent queue of a handle on `platform` (`emu` counts its completions).
fn rounds(
    emu: &EmuControl,
    platform: Arc<dyn Platform>,
    sub: fn(&mut IoQueue<'_>, &ugds::BufferToken, usize),
    comp: fn(&mut IoQueue<'_>) -> usize,
) -> Result<(), ugds::Error> {
    let driver = Driver::open();
    let opts = HandleOptions::default().sync_queues(1).async_queues(1).queue_depth(64);
    let handle = driver.open_handle(platform, opts)?;
    let mut buf = HostBuffer::new(DEPTH * 4096)?;
    // SAFETY: `buf` outlives the registration (deregistered below).
    let token = unsafe { driver.register(buf.as_mut_ptr(), buf.len())? };
    let mut q = handle.io_queue()?;
    let mut done = emu.stats().completions_posted;
    for round in 0..WARMUP + ROUNDS {
        let measured = round >= WARMUP;
        if measured {
            sub(&mut q, &token, round);
        } else {
            submit(&mut q, &token, round);
        }
        done += DEPTH as u64;
        wait_for(emu, done);
        let n = if measured { comp(&mut q) } else { complete(&mut q) };
        assert_eq!(n, DEPTH, "round {round}: every read of the round completes in one poll");
    }
    drop(q);
    driver.deregister(&token)?;
    Ok(())
}

/// The same rounds on the bare queue pair: the engine's queue pair alone
/// (CID, tracker entry, the entry written, doorbell, phase tag), with no
/// request above it: no checks, no buffer claim, no request entry.
fn bare() -> Result<(), ugds::Error> {
    let e = EmuPlatform::new(EmuConfig::default().null(true))?;
    let emu = e.control();
    let p: Arc<dyn Platform> = Arc::new(e);
    let ctrl = Controller::bring_up(p.clone(), 1)?;
    let ns = ctrl.info().namespaces[0];
    let mut qp = ctrl.create_io_qpair(1, 64, None)?;
    let buf = p.alloc_dma(DEPTH * 4096)?;
    let shift = ns.block_size.trailing_zeros();
    let plans: Vec<(u64, u64)> = (0..DEPTH).map(|i| (buf.iova(i * 4096), 0)).collect();
    let mut done = emu.stats().completions_posted;
    for round in 0..WARMUP + ROUNDS {
        let measured = round >= WARMUP;
        if measured {
            measured_bare_submit(&mut qp, &plans, ns.nsid, shift, round);
        } else {
            bare_submit(&mut qp, &plans, ns.nsid, shift, round);
        }
        done += DEPTH as u64;
        wait_for(&emu, done);
        let n = if measured { measured_bare_complete(&mut qp) } else { bare_complete(&mut qp) };
        assert_eq!(n, DEPTH, "round {round}: every read of the round completes in one poll");
    }
    ctrl.delete_io_qpair(&qp)?;
    ctrl.shutdown()?;
    println!("instructions: {ROUNDS} measured rounds of {DEPTH} reads of 4 KiB on the bare queue pair completed");
    Ok(())
}
