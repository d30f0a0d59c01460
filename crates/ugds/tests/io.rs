//! Data moved through the public API lands where it should.

mod common;
use common::*;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;
use ugds::{Completion, Driver};
use ugds_emu::{EmuConfig, NamespaceConfig};

#[test]
fn sizes_across_prp_boundaries_round_trip() {
    let (d, h, emu) = open(small_emu(), opts());
    let mut b = Buf::new(&d, 4 << 20);
    // One page, two pages, a PRP list, MDTS-chunked; with buffer offsets
    // at a page, inside a page, and at a dword.
    let sizes =
        [512usize, 4096, 4608, 8192, 8704, 12288, 65536, 128 << 10, (128 << 10) + 512, 1 << 20, (2 << 20) + 1536];
    let buf_offsets = [0usize, 512, 4096 - 512, 4, 4096 + 4];
    let mut file_off = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        for (j, &bo) in buf_offsets.iter().enumerate() {
            let seed = (i * 7 + j) as u8;
            let data = pattern(seed, file_off, size);
            b.mem[bo..bo + size].copy_from_slice(&data);
            assert_eq!(h.write(&b.token, size, file_off, bo).unwrap(), size);
            b.mem.fill(0);
            let ro = (bo + 516) & !3;
            assert_eq!(h.read(&b.token, size, file_off, ro).unwrap(), size);
            assert!(b.mem[ro..ro + size] == data[..], "size {size} buf offset {bo}");
            assert!(b.mem[..ro].iter().all(|&x| x == 0), "bytes before the read range were written");
            assert!(b.mem[ro + size..].iter().all(|&x| x == 0), "bytes after the read range were written");
            file_off = (file_off + size as u64 + 512) % (8 << 20);
            file_off -= file_off % 512;
        }
    }
    assert_eq!(emu.stats().dma_faults, 0);
    drop(b);
    h.close(ugds::Drain::NoWait).unwrap();
}

#[test]
fn file_backed_writes_land_at_lba_times_block_size() {
    for block in [512u32, 4096] {
        let dir = std::env::temp_dir().join(format!("ugds-test-{}-{block}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let cfg = EmuConfig::default().namespaces(vec![NamespaceConfig::file(&dir, 8 << 20, block)]);
        let (d, h, _emu) = open(cfg, opts());
        assert_eq!(h.namespace().block_size, block);
        let mut b = Buf::new(&d, 1 << 20);
        let writes =
            [(0u64, 4096usize), (block as u64 * 8, block as usize), (1 << 20, 296 << 10), ((8 << 20) - 8192, 8192)];
        for (k, &(off, len)) in writes.iter().enumerate() {
            b.mem[..len].copy_from_slice(&pattern(k as u8 + 1, off, len));
            h.write(&b.token, len, off, 0).unwrap();
        }
        drop(b);
        h.close(ugds::Drain::NoWait).unwrap();
        drop(h);
        let mut file = Vec::new();
        std::fs::File::open(&dir).unwrap().read_to_end(&mut file).unwrap();
        assert_eq!(file.len(), 8 << 20);
        for (k, &(off, len)) in writes.iter().enumerate() {
            let exp = pattern(k as u8 + 1, off, len);
            let first_bad = (0..len).find(|&i| file[off as usize + i] != exp[i]);
            assert_eq!(first_bad, None, "write {k} at {off}, block {block}");
        }
        std::fs::remove_file(&dir).unwrap();
    }
}

#[test]
fn direct_file_namespace_moves_data_at_unaligned_buffer_offsets() {
    // O_DIRECT needs a file system that supports it: the target directory
    // is on disk (tmpfs before Linux 6.6 refuses O_DIRECT).
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("direct-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let cfg = EmuConfig::default().namespaces(vec![NamespaceConfig::direct_file(&path, 8 << 20, 4096)]);
    let d = ugds::Driver::open();
    let (h, emu) = match open_emulated(&d, cfg, opts()) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("SKIPPED: O_DIRECT not available here ({e})");
            return;
        }
    };
    let mut b = Buf::new(&d, 1 << 20);
    // Buffer offsets that are not block-aligned reach the bounce buffer.
    for (k, &(off, len, boff)) in
        [(0u64, 4096usize, 512usize), (1 << 20, 300 << 10, 8), (4 << 20, 64 << 10, 4096)].iter().enumerate()
    {
        b.mem[boff..boff + len].copy_from_slice(&pattern(k as u8, off, len));
        h.write(&b.token, len, off, boff).unwrap();
        b.mem.fill(0);
        h.read(&b.token, len, off, 0).unwrap();
        assert!(b.mem[..len] == pattern(k as u8, off, len)[..], "request {k}");
    }
    assert_eq!(emu.stats().dma_faults, 0);
    drop(b);
    h.close(ugds::Drain::NoWait).unwrap();
    drop(h);
    let file = std::fs::read(&path).unwrap();
    assert!(file[1 << 20..(1 << 20) + (300 << 10)] == pattern(1, 1 << 20, 300 << 10)[..]);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn io_workers_move_file_data_concurrently_and_correctly() {
    // A file-backed namespace served by 4 I/O threads: mixed reads and
    // writes in flight together, data checked in the file and back.
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("workers-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let cfg = EmuConfig::default().namespaces(vec![NamespaceConfig::file(&path, 16 << 20, 512)]).io_workers(4);
    let (d, h, emu) = open(cfg, opts());
    let mut b = Buf::new(&d, 256 * 8192);
    for i in 0..128usize {
        b.mem[i * 8192..(i + 1) * 8192].copy_from_slice(&pattern(i as u8, (i * 8192) as u64, 8192));
    }
    let batch = h.batch(256).unwrap();
    let writes: Vec<ugds::BatchIo> = (0..128)
        .map(|i| ugds::BatchIo {
            op: ugds::BatchOp::Write,
            buf: b.token,
            size: 8192,
            file_offset: (i * 8192) as u64,
            buf_offset: i * 8192,
            cookie: i as u64,
        })
        .collect();
    batch.submit(&writes).unwrap();
    let mut ev = Vec::new();
    batch.get_status(128, 256, Some(std::time::Duration::from_secs(10)), &mut ev).unwrap();
    assert!(ev.iter().all(|e| e.result.as_ref().ok() == Some(&8192)), "{ev:?}");
    // Reads of what was written, and more writes elsewhere, all at once.
    let mixed: Vec<ugds::BatchIo> = (0..256)
        .map(|i| {
            if i % 2 == 0 {
                ugds::BatchIo {
                    op: ugds::BatchOp::Read,
                    buf: b.token,
                    size: 8192,
                    file_offset: (i / 2 * 8192) as u64,
                    buf_offset: (128 + i / 2) * 8192,
                    cookie: 1000 + i as u64,
                }
            } else {
                ugds::BatchIo {
                    op: ugds::BatchOp::Write,
                    buf: b.token,
                    size: 8192,
                    file_offset: (8 << 20) + (i / 2 * 8192) as u64,
                    buf_offset: (i / 2) * 8192,
                    cookie: 1000 + i as u64,
                }
            }
        })
        .collect();
    batch.submit(&mixed).unwrap();
    ev.clear();
    batch.get_status(256, 256, Some(std::time::Duration::from_secs(10)), &mut ev).unwrap();
    assert_eq!(ev.len(), 256);
    assert!(ev.iter().all(|e| e.result.as_ref().ok() == Some(&8192)));
    for i in 0..128usize {
        assert!(b.mem[(128 + i) * 8192..(129 + i) * 8192] == pattern(i as u8, (i * 8192) as u64, 8192)[..]);
    }
    let s = emu.stats();
    assert_eq!((s.reads, s.writes, s.dma_faults), (128, 256, 0));
    drop(batch);
    drop(b);
    h.close(ugds::Drain::NoWait).unwrap();
    drop(h);
    let file = std::fs::read(&path).unwrap();
    assert!(file[(8 << 20) + 5 * 8192..(8 << 20) + 6 * 8192] == pattern(5, 5 * 8192, 8192)[..]);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn small_mdts_splits_into_many_commands() {
    let cfg = small_emu().mdts(1); // 8 KiB per command
    let (d, h, emu) = open(cfg, opts());
    let mut b = Buf::new(&d, 1 << 20);
    let data = pattern(9, 0, 1 << 20);
    b.mem.copy_from_slice(&data);
    let before = emu.stats();
    h.write(&b.token, 1 << 20, 0, 0).unwrap();
    let after = emu.stats();
    assert_eq!(after.writes - before.writes, 128);
    b.mem.fill(0);
    h.read(&b.token, 1 << 20, 0, 0).unwrap();
    assert!(b.mem[..] == data[..]);
}

#[test]
fn second_namespace_is_separate() {
    let cfg = EmuConfig::default()
        .namespaces(vec![NamespaceConfig::memory(1 << 20, 512), NamespaceConfig::memory(2 << 20, 4096)]);
    let d = Driver::open();
    let (h2, _e) = open_emulated(&d, cfg, opts().nsid(Some(2))).unwrap();
    assert_eq!(h2.namespace().nsid, 2);
    assert_eq!(h2.capacity(), 2 << 20);
    assert_eq!(h2.controller().namespaces.len(), 2);
    let mut b = Buf::new(&d, 8192);
    b.mem.copy_from_slice(&pattern(3, 0, 8192));
    h2.write(&b.token, 8192, 4096, 0).unwrap();
    b.mem.fill(0);
    h2.read(&b.token, 8192, 4096, 0).unwrap();
    assert!(b.mem[..] == pattern(3, 0, 8192)[..]);
}

#[test]
fn buffer_registered_before_the_handle_is_mapped_for_it() {
    let d = Driver::open();
    let mut b = Buf::new(&d, 65536);
    b.mem.copy_from_slice(&pattern(5, 0, 65536));
    let (h, _e) = open_emulated(&d, small_emu(), opts()).unwrap();
    h.write(&b.token, 65536, 0, 0).unwrap();
    b.mem.fill(0);
    h.read(&b.token, 65536, 0, 0).unwrap();
    assert!(b.mem[..] == pattern(5, 0, 65536)[..]);
}

#[test]
fn many_threads_share_one_queue_pair() {
    let o = opts().sync_queues(1).async_queues(0).queue_depth(16);
    let (d, h, _e) = open(small_emu(), o);
    assert_eq!(h.queue_counts().0, 1);
    let h = Arc::new(h);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (d, h) = (&d, h.clone());
            s.spawn(move || {
                let mut b = Buf::new(d, 64 << 10);
                for i in 0..50u64 {
                    let off = (t * 50 + i) * (32 << 10) % (16 << 20);
                    let data = pattern((t + i) as u8, off, 32 << 10);
                    b.mem[..32 << 10].copy_from_slice(&data);
                    h.write(&b.token, 32 << 10, off, 0).unwrap();
                    h.read(&b.token, 32 << 10, off, 32 << 10).unwrap();
                    assert!(b.mem[32 << 10..] == data[..]);
                }
            });
        }
    });
}

#[test]
fn interrupt_completion_moves_data_and_raises_interrupts() {
    let o = opts().completion(Completion::Interrupt);
    let (d, h, emu) = open(small_emu(), o);
    let mut b = Buf::new(&d, 256 << 10);
    let before = emu.stats().interrupts;
    for i in 0..20u64 {
        let data = pattern(i as u8, i * 4096, 256 << 10);
        b.mem.copy_from_slice(&data);
        h.write(&b.token, 256 << 10, i * 4096, 0).unwrap();
        b.mem.fill(0);
        h.read(&b.token, 256 << 10, i * 4096, 0).unwrap();
        assert!(b.mem[..] == data[..]);
    }
    let mut q = h.io_queue().unwrap();
    for i in 0..8u64 {
        q.submit_read(&b.token, 4096, i * 4096, (i * 4096) as usize, i).unwrap();
    }
    let mut got = 0;
    while got < 8 {
        q.wait(Duration::from_secs(1));
        got += q.poll(usize::MAX, |_, r| assert_eq!(r.unwrap(), 4096));
    }
    drop(q);
    assert!(emu.stats().interrupts > before);
}

#[test]
fn io_queue_keeps_many_requests_in_flight() {
    let (d, h, emu) = open(small_emu(), opts());
    let mut b = Buf::new(&d, 1 << 20);
    for i in 0..256u64 {
        b.mem[(i as usize) * 4096..(i as usize + 1) * 4096].copy_from_slice(&pattern(1, i * 4096, 4096));
    }
    h.write(&b.token, 1 << 20, 0, 0).unwrap();
    b.mem.fill(0);
    let mut q = h.io_queue().unwrap();
    assert_eq!(q.depth(), 63);
    let doorbells = emu.stats().doorbell_writes;
    for i in 0..63u64 {
        q.submit_read(&b.token, 4096, (255 - i) * 4096, (i * 4096) as usize, i).unwrap();
    }
    // The 64th does not fit: refused before anything is staged.
    assert!(matches!(q.submit_read(&b.token, 4096, 0, 0, 99), Err(ugds::Error::QueueFull)));
    q.ring();
    assert_eq!(emu.stats().doorbell_writes - doorbells, 1, "63 submissions, one doorbell write");
    let mut seen = [false; 63];
    q.drain(|tag, r| {
        assert_eq!(r.unwrap(), 4096);
        seen[tag as usize] = true;
    })
    .unwrap();
    assert!(seen.iter().all(|&s| s));
    drop(q);
    for i in 0..63usize {
        assert!(b.mem[i * 4096..(i + 1) * 4096] == pattern(1, (255 - i as u64) * 4096, 4096)[..]);
    }
    // Requests larger than one command go through an IoQueue too.
    let mut q = h.io_queue().unwrap();
    q.submit_read(&b.token, 1 << 20, 0, 0, 7).unwrap();
    q.drain(|tag, r| assert_eq!((tag, r.unwrap()), (7, 1 << 20))).unwrap();
}

#[test]
fn io_queues_are_lent_one_at_a_time() {
    let (_d, h, _e) = open(small_emu(), opts().async_queues(1));
    let q = h.io_queue().unwrap();
    assert!(matches!(h.io_queue(), Err(ugds::Error::Busy { .. })));
    assert!(matches!(h.close(ugds::Drain::NoWait), Err(ugds::Error::Busy { .. })));
    drop(q);
    let _q = h.io_queue().unwrap();
}

#[test]
fn write_zeroes_and_flush() {
    let (d, h, _e) = open(small_emu(), opts());
    let mut b = Buf::new(&d, 16384);
    b.mem.fill(0x5a);
    h.write(&b.token, 16384, 0, 0).unwrap();
    h.write_zeroes(4096, 4096).unwrap();
    h.flush().unwrap();
    h.read(&b.token, 16384, 0, 0).unwrap();
    assert!(b.mem[..4096].iter().all(|&x| x == 0x5a));
    assert!(b.mem[4096..8192].iter().all(|&x| x == 0));
    assert!(b.mem[8192..].iter().all(|&x| x == 0x5a));
}

#[test]
fn a_request_waits_without_holding_its_queue() {
    // One shared queue; the first read is stalled by the device. A second
    // thread's read on the same queue must complete while the first waits.
    use ugds_emu::{Fault, FaultAction, FaultTarget};
    let o = opts().sync_queues(1).async_queues(0);
    let (d, h, emu) = open(small_emu(), o);
    emu.inject(Fault::next(FaultTarget::Io(Some(0x02)), FaultAction::Stall(Duration::from_millis(400))));
    let a = Buf::new(&d, 4096);
    let b = Buf::new(&d, 4096);
    let fetched = emu.stats().commands;
    let (ta, tb) = std::thread::scope(|s| {
        let ja = s.spawn(|| {
            h.read(&a.token, 4096, 0, 0).unwrap();
            std::time::Instant::now()
        });
        // The first read is on the device (fetched, and stalled there).
        wait_for("the first read to reach the device", || emu.stats().commands > fetched);
        let jb = s.spawn(|| {
            h.read(&b.token, 4096, 4096, 0).unwrap();
            std::time::Instant::now()
        });
        (ja.join().unwrap(), jb.join().unwrap())
    });
    assert!(tb < ta, "the second request finished after the stalled first one");
}

#[test]
fn idle_emulator_parks() {
    let (_d, h, _e) = open(small_emu(), opts());
    std::thread::sleep(Duration::from_millis(50));
    let cpu = |name: &str| -> u64 {
        let mut total = 0;
        for t in std::fs::read_dir("/proc/self/task").unwrap() {
            let p = t.unwrap().path();
            let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
            if comm.trim() == name {
                let stat = std::fs::read_to_string(p.join("stat")).unwrap();
                let f: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
                total += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
            }
        }
        total
    };
    let before = cpu("ugds-emu");
    std::thread::sleep(Duration::from_millis(500));
    let used = cpu("ugds-emu") - before;
    // Clock ticks (usually 100 per second): a spinning thread would use ~50.
    assert!(used <= 10, "idle emulator used {used} ticks in 500 ms");
    drop(h);
}

#[test]
fn null_mode_completes_without_moving_data() {
    let (d, h, emu) = open(small_emu().null(true), opts());
    let mut b = Buf::new(&d, 65536);
    b.mem.fill(0x77);
    h.write(&b.token, 65536, 0, 0).unwrap();
    b.mem.fill(0x11);
    h.read(&b.token, 65536, 0, 0).unwrap();
    assert!(b.mem.iter().all(|&x| x == 0x11), "null mode moved data");
    let s = emu.stats();
    assert_eq!((s.reads, s.writes), (1, 1));
}

#[test]
fn latency_model_delays_completions() {
    use ugds_emu::LatencyModel;
    // 20 ms per command plus 1 MB/s: a 64 KiB read is due after about 85 ms.
    let m = LatencyModel::new(Duration::from_millis(20), 1_000_000);
    let (d, h, _e) = open(small_emu().latency(Some(m)), opts());
    let b = Buf::new(&d, 65536);
    let t = std::time::Instant::now();
    h.read(&b.token, 4096, 0, 0).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(20));
    let t = std::time::Instant::now();
    h.read(&b.token, 65536, 0, 0).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(20 + 65));
}

/// Synchronous queue pairs beyond 4 (one per CPU by default) give way to
/// the lendable ones when the controller grants too few for both.
#[test]
fn synchronous_queues_beyond_four_make_room_for_the_lendable_ones() {
    let counts = |granted: u16| {
        let (_d, h, _e) = open(small_emu().max_io_queues(granted), opts().sync_queues(16).async_queues(4));
        h.queue_counts()
    };
    // One batch queue first; then 4 synchronous, and what is left lent.
    assert_eq!(counts(8), (4, 3));
    // Room for the 4 lendable ones, the rest synchronous.
    assert_eq!(counts(16), (11, 4));
    // All asked for.
    assert_eq!(counts(64), (16, 4));
    // Fewer than 4 left: all synchronous, as before.
    assert_eq!(counts(3), (2, 0));
}
