//! Instructions per 4 KiB read submitted through a batch context, one
//! request per call (as `ugds bench`'s volume runs submit): a handle's
//! [`Batch`](ugds::Batch) on one emulated null controller, and a
//! [`VolumeBatch`](ugds::VolumeBatch) over four striped in 128 KiB stripes
//! (each request within a stripe: one member's), then the same volume's
//! [`VolumeQueue`](ugds::VolumeQueue) (the members' lent queues; each
//! request submitted and rung alone, as a batch submission rings). Counted
//! by callgrind in the three submission functions, which do nothing else;
//! waiting for completions is not counted. `scripts/instructions` runs it under
//! valgrind and prints the figures; run alone it only checks that every
//! request completes.

use std::sync::Arc;
use ugds::{BatchEvent, BatchIo, BatchOp, Driver, HandleOptions, HostBuffer, Volume, VolumeLayout};
use ugds_emu::{EmuConfig, EmuPlatform};

/// Requests kept outstanding.
const QD: usize = 8;
/// Requests per context (the first `WARMUP` not counted).
const REQUESTS: u64 = 20_000;
const WARMUP: u64 = 1_000;

/// Submits one request on the volume (counted).
#[inline(never)]
fn measured_volume_submit(b: &ugds::VolumeBatch, io: &[BatchIo]) {
    b.submit(io).expect("room for the request");
}

/// Submits one read on the volume's queue and rings (counted).
#[inline(never)]
fn measured_volume_queue_submit(q: &mut ugds::VolumeQueue<'_>, io: &BatchIo) {
    q.submit_read(&io.buf, io.size, io.file_offset, io.buf_offset, io.cookie).expect("room for the request");
    q.ring();
}

/// Submits one request on the handle's batch context (counted).
#[inline(never)]
fn measured_batch_submit(b: &ugds::Batch, io: &[BatchIo]) {
    b.submit(io).expect("room for the request");
}

fn emulated(d: &Driver) -> ugds::Result<ugds::Handle> {
    d.open_handle(Arc::new(EmuPlatform::new(EmuConfig::default().null(true))?), HandleOptions::default())
}

fn main() -> ugds::Result<()> {
    let d = Driver::open();
    let members = (0..4).map(|_| emulated(&d)).collect::<ugds::Result<Vec<_>>>()?;
    let volume = Volume::new(members, VolumeLayout::Striped { stripe: 128 << 10 })?;
    let single = emulated(&d)?;
    let mut buf = HostBuffer::new(QD * 4096)?;
    // SAFETY: `buf` outlives the registration (deregistered below).
    let token = unsafe { d.register(buf.as_mut_ptr(), buf.len())? };
    let vb = volume.batch(QD)?;
    let hb = single.batch(QD)?;
    let mut out: Vec<BatchEvent> = Vec::with_capacity(QD);
    for on_volume in [true, false] {
        let (mut submitted, mut done, mut off) = (0u64, 0u64, 0u64);
        while done < REQUESTS {
            while submitted - done < QD as u64 && submitted < REQUESTS {
                // Steps of a stripe and 7 blocks of 4 KiB: every member in
                // turn, each request within one stripe.
                off = (off + 7 * 4096 + (128 << 10)) % (60 << 20);
                let slot = (submitted % QD as u64) as usize;
                let io = [BatchIo {
                    op: BatchOp::Read,
                    buf: token,
                    size: 4096,
                    file_offset: off,
                    buf_offset: slot * 4096,
                    cookie: submitted,
                }];
                match (on_volume, submitted >= WARMUP) {
                    (true, true) => measured_volume_submit(&vb, &io),
                    (true, false) => vb.submit(&io).map(drop)?,
                    (false, true) => measured_batch_submit(&hb, &io),
                    (false, false) => hb.submit(&io).map(drop)?,
                }
                submitted += 1;
            }
            out.clear();
            done +=
                if on_volume { vb.get_status(1, QD, None, &mut out)? } else { hb.get_status(1, QD, None, &mut out)? }
                    as u64;
            assert!(out.iter().all(|e| e.result.as_ref().is_ok_and(|&n| n == 4096)), "{out:?}");
        }
    }
    // The volume's queue: the same requests, reported by poll.
    let mut q = volume.io_queue()?;
    let (mut submitted, mut done, mut off) = (0u64, 0u64, 0u64);
    let mut bad = 0;
    while done < REQUESTS {
        while submitted - done < QD as u64 && submitted < REQUESTS {
            off = (off + 7 * 4096 + (128 << 10)) % (60 << 20);
            let slot = (submitted % QD as u64) as usize;
            let io = BatchIo {
                op: BatchOp::Read,
                buf: token,
                size: 4096,
                file_offset: off,
                buf_offset: slot * 4096,
                cookie: 0,
            };
            if submitted >= WARMUP {
                measured_volume_queue_submit(&mut q, &io);
            } else {
                q.submit_read(&io.buf, io.size, io.file_offset, io.buf_offset, 0)?;
                q.ring();
            }
            submitted += 1;
        }
        match q.poll(usize::MAX, |_, r| bad += usize::from(r.ok() != Some(4096))) {
            // Let the emulator's threads run (valgrind runs one thread at a time).
            0 => std::thread::yield_now(),
            n => done += n as u64,
        }
    }
    assert_eq!(bad, 0, "every read on the volume's queue moved 4 KiB");
    drop(q);
    drop((vb, hb));
    d.deregister(&token)?;
    println!("batch_instructions: {} measured requests on each context completed", REQUESTS - WARMUP);
    Ok(())
}
