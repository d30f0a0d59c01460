//! NVMe over TCP through the handle API (`Driver::open_tcp`), against the
//! emulated NVMe/TCP target (`ugds_emu::tcp`, on 127.0.0.1): data in both
//! directions through every path (in-capsule and R2T writes, reads in
//! several C2HData PDUs, with and without SUCCESS, with and without
//! digests), batches and lent queues, keep-alive, and the faults a network
//! brings: a bad digest, data outside a command, a connection reset, a
//! target that stops answering. Each ends in a clear error, never a hang,
//! and a correct initiator leaves the target's host error counter at zero.
//!
//! Linux's own target (nvmet-tcp) runs the conformance suite in the QEMU
//! guest (`scripts/qemu-conformance tcp`).

mod common;
use common::*;
use std::time::Duration;
use ugds::fabrics::{Digests, TcpTarget};
use ugds::{BatchIo, BatchOp, BatchStatus, Driver, Error, Handle, HandleOptions};
use ugds_emu::tcp::{EmuTcpConfig, EmuTcpTarget, TcpFault};

fn target(cfg: EmuTcpConfig) -> EmuTcpTarget {
    EmuTcpTarget::start(cfg).expect("start the emulated NVMe/TCP target")
}

fn tcp_opts() -> HandleOptions {
    HandleOptions::default().sync_queues(2).async_queues(1).queue_depth(32).timeout(Duration::from_secs(2))
}

fn connect(d: &Driver, t: &EmuTcpTarget, digests: Digests) -> Handle {
    let mut tt = TcpTarget::new(t.addr(), t.nqn());
    tt.digests = digests;
    tt.timeout = Duration::from_secs(5);
    d.open_tcp(&tt, tcp_opts()).expect("open a handle over NVMe/TCP")
}

const BOTH: Digests = Digests { header: true, data: true };

#[test]
fn data_round_trips_through_every_transfer_path() {
    for digests in [Digests::default(), BOTH, Digests { header: true, data: false }] {
        // Small PDUs both ways: a 256 KiB read comes in 32 C2HData PDUs,
        // a 256 KiB write goes as 64 H2CData PDUs.
        let cfg = EmuTcpConfig { c2h_chunk: 8192, maxh2cdata: 4096, ..Default::default() };
        let t = target(cfg);
        let d = Driver::open();
        let h = connect(&d, &t, digests);
        assert_eq!(h.namespace().block_size, 4096);
        let mut b = Buf::new(&d, 1 << 20);
        let mut off = 0u64;
        // In the capsule (up to 8 KiB), then through R2T; reads of one
        // PDU and of many, with SUCCESS and with a response in turn.
        for (i, size) in [4096usize, 8192, 12288, 65536, 256 << 10, 1 << 20].into_iter().enumerate() {
            let data = pattern(i as u8 + 1, off, size);
            b.mem[..size].copy_from_slice(&data);
            assert_eq!(h.write(&b.token, size, off, 0).unwrap(), size);
            assert_eq!(t.read_back(off as usize, size), data, "{size} bytes written ({digests:?})");
            b.mem.fill(0);
            for _ in 0..2 {
                assert_eq!(h.read(&b.token, size, off, 0).unwrap(), size);
                assert!(b.mem[..size] == data[..], "{size} bytes read back ({digests:?})");
            }
            off += size as u64;
        }
        let s = t.stats();
        assert!(s.in_capsule_writes >= 2 && s.r2ts >= 4, "{s:?}");
        assert!(s.h2c_pdus >= 64, "{s:?}");
        assert_eq!(s.host_errors, 0, "the target found nothing wrong in what the host sent: {s:?}");
        drop(b);
        h.close(ugds::Drain::NoWait).unwrap();
    }
}

#[test]
fn batches_and_lent_queues_run_over_tcp() {
    let t = target(EmuTcpConfig::default());
    let d = Driver::open();
    let h = connect(&d, &t, BOTH);
    let mut b = Buf::new(&d, 64 * 16384);
    for i in 0..64usize {
        b.mem[i * 16384..(i + 1) * 16384].copy_from_slice(&pattern(i as u8, i as u64 * 16384, 16384));
    }
    let batch = h.batch(64).unwrap();
    let writes: Vec<BatchIo> = (0..64u64)
        .map(|i| BatchIo {
            op: BatchOp::Write,
            buf: b.token,
            size: 16384,
            file_offset: i * 16384,
            buf_offset: i as usize * 16384,
            cookie: i,
        })
        .collect();
    batch.submit(&writes).unwrap();
    let mut ev = Vec::new();
    let mut got = 0;
    while got < 64 {
        got += batch.get_status(1, 64 - got, Some(Duration::from_secs(10)), &mut ev).unwrap();
    }
    for e in &ev {
        assert!(e.status == BatchStatus::Complete && e.result.as_ref().is_ok_and(|&n| n == 16384), "{e:?}");
    }
    drop(batch);
    b.mem.fill(0);
    let mut q = h.io_queue().unwrap();
    let n = q.depth().min(32);
    assert!(n >= 16, "a lent queue of {n}");
    for i in 0..n {
        q.submit_read(&b.token, 16384, i as u64 * 16384, i * 16384, i as u64).unwrap();
    }
    q.ring();
    let mut done = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while done < n {
        done += q.poll(usize::MAX, |_, r| assert_eq!(r.unwrap(), 16384));
        assert!(std::time::Instant::now() < deadline, "lent queue reads did not complete");
    }
    drop(q);
    for i in 0..n {
        assert!(b.mem[i * 16384..(i + 1) * 16384] == pattern(i as u8, i as u64 * 16384, 16384)[..], "read {i}");
    }
    assert_eq!(t.stats().host_errors, 0);
    drop(b);
    h.close(ugds::Drain::NoWait).unwrap();
}

/// With interrupt completion the queues sleep until their socket has data
/// (the platform's epoll thread signals their vectors): reads complete from
/// several threads, and the wake-ups are counted as interrupts.
#[test]
fn interrupt_completion_sleeps_on_the_socket() {
    let t = target(EmuTcpConfig::default());
    t.fill(0, &pattern(21, 0, 1 << 20));
    let d = Driver::open();
    let opts = tcp_opts().completion(ugds::Completion::Interrupt);
    let h = d.open_tcp(&TcpTarget::new(t.addr(), t.nqn()), opts).unwrap();
    assert!(h.queues().iter().any(|q| q.vector.is_some()), "{:?}", h.queues());
    std::thread::scope(|sc| {
        for k in 0..4usize {
            let (d, h) = (&d, &h);
            sc.spawn(move || {
                let mut b = Buf::new(d, 65536);
                for i in 0..32usize {
                    let off = ((k * 32 + i) % 16) as u64 * 65536;
                    assert_eq!(h.read(&b.token, 65536, off, 0).unwrap(), 65536);
                    assert!(b.mem[..65536] == pattern(21, off, 65536)[..], "thread {k} read {i}");
                }
                b.mem.fill(0);
            });
        }
    });
    let irqs: u64 = h.queue_stats().iter().map(|q| q.interrupts).sum();
    assert!(irqs > 0, "no wake-up came through a vector: {:?}", h.queue_stats());
    h.close(ugds::Drain::NoWait).unwrap();
}

/// A lent queue with interrupt completion sleeps in `wait` until its
/// socket has data, not only a synchronous caller: each read submitted
/// alone is waited for through the vector (counted as an interrupt on the
/// lendable queue), and its data is right.
#[test]
fn a_lent_queue_with_interrupts_sleeps_until_its_socket_has_data() {
    let t = target(EmuTcpConfig::default());
    t.fill(0, &pattern(22, 0, 1 << 20));
    let d = Driver::open();
    let opts = tcp_opts().completion(ugds::Completion::Interrupt);
    let h = d.open_tcp(&TcpTarget::new(t.addr(), t.nqn()), opts).unwrap();
    let lent = |h: &Handle| -> u64 {
        h.queue_stats().iter().filter(|s| s.role == ugds::QueueRole::Lendable).map(|s| s.interrupts).sum()
    };
    assert!(h.queues().iter().any(|q| q.role == ugds::QueueRole::Lendable && q.vector.is_some()), "{:?}", h.queues());
    let b = Buf::new(&d, 65536);
    let mut q = h.io_queue().unwrap();
    let rounds = 16u64;
    for i in 0..rounds {
        q.submit_read(&b.token, 4096, i * 65536, 0, i).unwrap();
        q.ring();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut done = false;
        while !done {
            q.wait(Duration::from_secs(5));
            q.poll(usize::MAX, |tag, r| {
                assert_eq!((tag, r.unwrap()), (i, 4096));
                done = true;
            });
            assert!(std::time::Instant::now() < deadline, "read {i} did not complete");
        }
        assert!(b.mem[..4096] == pattern(22, i * 65536, 4096)[..], "read {i}");
    }
    drop(q);
    // Each wait finds its read's response announced by the vector (or
    // already in hand); a queue that never sleeps counts none.
    assert!(lent(&h) >= rounds / 2, "{} interrupts for {rounds} reads waited for alone", lent(&h));
    assert_eq!(h.interrupt_wakeups_lost(), 0);
    h.close(ugds::Drain::NoWait).unwrap();
}

#[test]
fn keep_alive_is_sent_on_its_timer() {
    let t = target(EmuTcpConfig::default());
    let d = Driver::open();
    let mut tt = TcpTarget::new(t.addr(), t.nqn());
    tt.keep_alive = Duration::from_millis(200);
    let h = d.open_tcp(&tt, tcp_opts()).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let n = t.stats().keep_alives;
    assert!(n >= 2, "Keep Alive every 100 ms: {n} in 700 ms");
    drop(h);
    // None after the handle is gone (one sent just before may still be
    // counted: the count is taken once it has settled).
    std::thread::sleep(Duration::from_millis(200));
    let settled = t.stats().keep_alives;
    assert!(settled <= n + 1, "{settled} after {n}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(t.stats().keep_alives, settled, "Keep Alive after the handle was dropped");
}

#[test]
fn an_unknown_subsystem_is_a_clear_error() {
    let t = target(EmuTcpConfig::default());
    let e = Driver::open().open_tcp(&TcpTarget::new(t.addr(), "nqn.2026-12.io.ugds:absent"), tcp_opts()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("refused Connect") && e.to_string().contains("byte 256"), "{e}");
    let e = Driver::open().open_tcp(&TcpTarget::new("127.0.0.1:1", "nqn.x"), tcp_opts()).unwrap_err();
    assert!(e.to_string().contains("connecting to 127.0.0.1:1"), "{e}");
}

/// A read under `fault` fails with an error (never a hang, never data
/// reported as read), within the handle's timeout and a margin.
fn faulty_read(fault: TcpFault, digests: Digests) -> Error {
    let t = target(EmuTcpConfig::default());
    let d = Driver::open();
    let h = connect(&d, &t, digests);
    let mut b = Buf::new(&d, 65536);
    h.read(&b.token, 65536, 0, 0).unwrap();
    t.set_fault(fault);
    let started = std::time::Instant::now();
    let e = h.read(&b.token, 65536, 0, 0).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "{fault:?}: {:?}", started.elapsed());
    assert_eq!(t.stats().host_errors, 0);
    b.mem.fill(0);
    drop(b);
    e
}

#[test]
fn a_bad_digest_fails_the_command() {
    for digests in [BOTH, Digests { header: true, data: false }] {
        let e = faulty_read(TcpFault::BadDigest, digests);
        assert!(e.to_string().contains("Transient Transport Error"), "{digests:?}: {e}");
    }
}

#[test]
fn data_outside_a_command_fails_it() {
    let e = faulty_read(TcpFault::DataOutOfRange, Digests::default());
    assert!(e.to_string().contains("Transient Transport Error"), "{e}");
}

#[test]
fn a_reset_connection_fails_the_command() {
    let e = faulty_read(TcpFault::Reset, Digests::default());
    assert!(e.to_string().contains("Transient Transport Error"), "{e}");
}

#[test]
fn a_silent_target_times_out() {
    let e = faulty_read(TcpFault::Silent, Digests::default());
    assert!(matches!(e, Error::Timeout { .. } | Error::Wedged), "{e:?}");
}

#[test]
fn bad_input_changes_nothing_over_tcp() {
    let t = target(EmuTcpConfig { blocks: 256, ..Default::default() });
    let d = Driver::open();
    let h = connect(&d, &t, Digests::default());
    let b = Buf::new(&d, 65536);
    let before = t.stats();
    // Past the end, unaligned, beyond the buffer.
    assert!(h.read(&b.token, 8192, 255 * 4096, 0).is_err());
    assert!(h.write(&b.token, 1000, 0, 0).is_err());
    assert!(h.write(&b.token, 4096, 0, 65536).is_err());
    let after = t.stats();
    assert_eq!((after.reads, after.writes), (before.reads, before.writes), "nothing reached the target");
    drop(b);
    h.close(ugds::Drain::NoWait).unwrap();
}

/// A read whose data does not all arrive, each byte once and in place,
/// fails: two halves both at offset 0, or the second half twice and the
/// first never, each followed by SUCCESS. The buffer keeps no success.
#[test]
fn misplaced_read_data_is_never_a_success() {
    for fault in [TcpFault::DataOverlap, TcpFault::DataRepeated] {
        let e = faulty_read(fault, Digests::default());
        assert!(e.to_string().contains("Transient Transport Error"), "{fault:?}: {e}");
    }
    // The same through a lent queue: the error is the request's, counted.
    let t = target(EmuTcpConfig::default());
    t.fill(0, &pattern(31, 0, 65536));
    let d = Driver::open();
    let h = connect(&d, &t, Digests::default());
    let b = Buf::new(&d, 65536);
    let mut q = h.io_queue().unwrap();
    t.set_fault(TcpFault::DataOverlap);
    q.submit_read(&b.token, 65536, 0, 0, 7).unwrap();
    let mut got = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while got.is_none() {
        q.poll(usize::MAX, |tag, r| got = Some((tag, r.map_err(|e| e.to_string()))));
        assert!(std::time::Instant::now() < deadline, "the read never ended");
    }
    let (tag, r) = got.unwrap();
    assert_eq!(tag, 7);
    assert!(r.as_ref().is_err_and(|e| e.contains("Transient Transport Error")), "{r:?}");
    drop(q);
    assert!(h.queue_stats().iter().map(|s| s.errors).sum::<u64>() >= 1, "{:?}", h.queue_stats());
}

/// A target that asks again for bytes it was sent (400 R2Ts for one
/// write) is refused at the first repeat: the host sends the write's data
/// once, not 400 times.
#[test]
fn a_repeated_r2t_is_refused_and_nothing_is_sent_twice() {
    let t = target(EmuTcpConfig::default());
    let d = Driver::open();
    let h = connect(&d, &t, Digests::default());
    let mut b = Buf::new(&d, 1 << 20);
    b.mem.copy_from_slice(&pattern(32, 0, 1 << 20));
    let before = t.stats().h2c_bytes;
    t.set_fault(TcpFault::R2tRepeated);
    let e = h.write(&b.token, 1 << 20, 0, 0).unwrap_err();
    assert!(e.to_string().contains("Transient Transport Error"), "{e}");
    // The target counts what it reads until the host has closed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut sent = t.stats().h2c_bytes - before;
    while sent < 1 << 20 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        sent = t.stats().h2c_bytes - before;
    }
    std::thread::sleep(Duration::from_millis(200));
    sent = t.stats().h2c_bytes - before;
    assert_eq!(sent, 1 << 20, "bytes of data sent for one 1 MiB write asked for 401 times");
    drop(b);
}

/// Values a target reports that no controller may: CAP.MQES 0, a
/// namespace whose size in bytes overflows. Each is refused at open with
/// the field named, never a panic or a wrapped size.
#[test]
fn impossible_controller_values_are_refused_at_open() {
    let t = target(EmuTcpConfig { mqes: 0, ..Default::default() });
    let e = Driver::open().open_tcp(&TcpTarget::new(t.addr(), t.nqn()), tcp_opts()).unwrap_err();
    assert!(e.to_string().contains("CAP.MQES is 0"), "{e}");
    // 2^52 + 1 blocks of 4 KiB: 2^64 + 4096 bytes, which wraps to 4096.
    let t = target(EmuTcpConfig { reported_nsze: Some((1 << 52) + 1), ..Default::default() });
    let e = Driver::open().open_tcp(&TcpTarget::new(t.addr(), t.nqn()), tcp_opts()).unwrap_err();
    assert!(e.to_string().contains("overflows 64 bits"), "{e}");
}

/// A lent queue whose target stops answering reports the late request as
/// a timeout and counts it in what `poll` returns, so a caller that polls
/// until its count is met ends; polled and sleeping in `wait` alike, within
/// a bound of the handle's timeout (1 s here).
#[test]
fn a_lent_queue_on_a_silent_target_ends_with_the_timeout() {
    for interrupt in [false, true] {
        let t = target(EmuTcpConfig::default());
        let d = Driver::open();
        let mut opts = tcp_opts().timeout(Duration::from_secs(1));
        if interrupt {
            opts = opts.completion(ugds::Completion::Interrupt);
        }
        let h = d.open_tcp(&TcpTarget::new(t.addr(), t.nqn()), opts).unwrap();
        let b = Buf::new(&d, 8 * 4096);
        let mut q = h.io_queue().unwrap();
        t.set_fault(TcpFault::Silent);
        for i in 0..8u64 {
            q.submit_read(&b.token, 4096, i * 4096, i as usize * 4096, i).unwrap();
        }
        q.ring();
        let started = std::time::Instant::now();
        let (mut n, mut timeouts) = (0, 0);
        while n < 8 {
            q.wait(Duration::from_millis(500));
            n += q.poll(usize::MAX, |_, r| timeouts += matches!(r, Err(Error::Timeout { .. })) as usize);
            assert!(started.elapsed() < Duration::from_secs(20), "interrupt {interrupt}: {n} of 8 reported");
        }
        assert_eq!(timeouts, 1, "interrupt {interrupt}: the one read the target never answered");
        assert!(started.elapsed() < Duration::from_secs(6), "interrupt {interrupt}: {:?}", started.elapsed());
        drop(q);
        drop(b);
    }
}

/// The timeout ladder never waits behind a slow admin reply: with Keep
/// Alive answered after 5 s (and sent every 100 ms, so that it nearly
/// always holds the admin queue), a read the target never answers still
/// fails within about its timeout (1 s) and the Abort grace (1 s).
#[test]
fn the_timeout_ladder_does_not_wait_behind_keep_alive() {
    let t = target(EmuTcpConfig { keep_alive_delay: Duration::from_secs(5), ..Default::default() });
    let d = Driver::open();
    let mut tt = TcpTarget::new(t.addr(), t.nqn());
    tt.keep_alive = Duration::from_millis(200);
    tt.timeout = Duration::from_secs(8);
    let h = d.open_tcp(&tt, tcp_opts().timeout(Duration::from_secs(1))).unwrap();
    let b = Buf::new(&d, 4096);
    // Keep Alive is under way.
    while t.stats().keep_alives == 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    t.set_fault(TcpFault::Silent);
    let started = std::time::Instant::now();
    let e = h.read(&b.token, 4096, 0, 0).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_millis(4500), "{:?} behind a 5 s Keep Alive", started.elapsed());
    std::mem::forget(b);
}
