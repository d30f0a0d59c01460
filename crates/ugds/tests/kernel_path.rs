//! The kernel path (`Driver::open_file`, `Driver::open_fd`): what the shared
//! conformance suite does not cover (`scripts/test` runs that suite against
//! files too, with `UGDS_TEST_FILE_DIR`): files that end inside a block,
//! shrink under a batch, refuse writes or fill their filesystem, memory
//! that direct I/O cannot take, interrupt completion.

mod common;
use common::*;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;
use ugds::{BatchIo, BatchOp, BatchStatus, Completion, Driver, Error, Handle, HandleOptions, HostStream, StreamIo};

/// A file of `len` bytes holding `pattern(seed, ..)`, removed on drop;
/// one per test even where tests share a process (`cargo test`).
struct TestFile(PathBuf);

impl TestFile {
    fn new(dir: &str, len: usize, seed: u8) -> TestFile {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = Path::new(dir).join(format!("ugds-kernel-path-{}-{n}.img", std::process::id()));
        std::fs::write(&path, pattern(seed, 0, len)).unwrap();
        TestFile(path)
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn kopts() -> HandleOptions {
    HandleOptions::default().sync_queues(2).async_queues(1).queue_depth(64).timeout(Duration::from_secs(10))
}

fn open(d: &Driver, f: &TestFile) -> Handle {
    d.open_file(&f.0, kopts()).expect("open the file")
}

#[test]
fn the_capacity_is_the_file_rounded_up_to_a_block() {
    let d = Driver::open();
    let f = TestFile::new("/tmp", 10_000, 1);
    let h = open(&d, &f);
    assert_eq!(h.namespace().block_size, 512);
    assert_eq!(h.capacity(), 10_240);
    assert!(h.controller().platform.contains("io_uring"), "{}", h.controller().platform);
    let b = Buf::new(&d, 4096);
    assert!(matches!(h.read(&b.token, 512, 10_240, 0), Err(Error::OutOfRange { .. })));
    assert!(matches!(h.read(&b.token, 100, 0, 0), Err(Error::Misaligned { .. })));
}

/// A file grows on request (cuFile's writes past the end): the capacity
/// follows its size, only ever up; a file opened read-only, or an empty
/// one grown by another writer, is not cut.
#[test]
fn a_file_grows_and_the_capacity_follows() {
    let d = Driver::open();
    let f = TestFile::new("/tmp", 0, 6);
    let h = open(&d, &f);
    assert_eq!(h.capacity(), 0);
    let mut b = Buf::new(&d, 8192);
    b.mem.copy_from_slice(&pattern(6, 0, 8192));
    assert!(matches!(h.write(&b.token, 8192, 4096, 0), Err(Error::OutOfRange { .. })));
    assert_eq!(h.grow(4096 + 8192).unwrap(), 12_288);
    h.write(&b.token, 8192, 4096, 0).unwrap();
    h.flush().unwrap();
    let disk = std::fs::read(&f.0).unwrap();
    assert_eq!(disk.len(), 12_288);
    assert!(disk[..4096].iter().all(|&x| x == 0) && disk[4096..] == pattern(6, 0, 8192)[..]);
    // Grown by someone else: asking for less picks up the new size.
    std::fs::OpenOptions::new().append(true).open(&f.0).unwrap().set_len(20_000).unwrap();
    assert_eq!(h.grow(0).unwrap(), 20_480, "20000 bytes, rounded up to a block");
    // Never down.
    std::fs::OpenOptions::new().write(true).open(&f.0).unwrap().set_len(512).unwrap();
    assert_eq!(h.grow(0).unwrap(), 20_480);
    // Read-only: not extended.
    let ro = std::fs::File::open(&f.0).unwrap();
    let r = d.open_fd(ro.as_fd(), kopts()).unwrap();
    assert_eq!(r.grow(1 << 20).unwrap(), 512);
    assert_eq!(std::fs::metadata(&f.0).unwrap().len(), 512);
}

/// A read across the end of the file (into its last, partial block)
/// returns the bytes there are, on every API. (The buffer past them may be
/// written: direct I/O moves whole blocks, zeroes past the end.)
#[test]
fn a_read_across_the_end_of_the_file_returns_the_bytes_there_are() {
    let d = Driver::open();
    let f = TestFile::new("/tmp", 10_000, 2);
    let h = open(&d, &f);
    let mut b = Buf::new(&d, 16384);
    let want = pattern(2, 4096, 10_000 - 4096);
    // Synchronous.
    b.mem.fill(0xee);
    assert_eq!(h.read(&b.token, 6144, 4096, 0).unwrap(), 10_000 - 4096);
    assert!(b.mem[..want.len()] == want[..]);
    // A lent queue.
    {
        let mut q = h.io_queue().unwrap();
        q.submit_read(&b.token, 6144, 4096, 8192, 7).unwrap();
        q.ring();
        let mut got = Vec::new();
        q.drain(|tag, r| got.push((tag, r.unwrap()))).unwrap();
        assert_eq!(got, vec![(7, 10_000 - 4096)]);
    }
    // A batch: one read inside the file, one across its end, one past it
    // (within the last block's capacity there is nothing).
    let batch = h.batch(4).unwrap();
    let io = |size, file_offset, cookie| BatchIo {
        op: BatchOp::Read,
        buf: b.token,
        size,
        file_offset,
        buf_offset: 0,
        cookie,
    };
    batch.submit(&[io(4096, 0, 1), io(2048, 8192, 2)]).unwrap();
    let mut ev = Vec::new();
    while ev.len() < 2 {
        batch.get_status(1, 4, Some(Duration::from_secs(10)), &mut ev).unwrap();
    }
    ev.sort_by_key(|e| e.cookie);
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete), "{ev:?}");
    assert_eq!(ev[0].result.as_ref().unwrap(), &4096);
    assert_eq!(ev[1].result.as_ref().unwrap(), &(10_000 - 8192));
    drop(batch);
    // Stream-ordered: the bytes moved are what the stream sees.
    let s = HostStream::new();
    let (sio, res) = StreamIo::new(6144, 4096, 0);
    h.read_async(&b.token, sio, &s).unwrap();
    s.synchronize();
    assert_eq!(res.bytes(), (10_000 - 4096) as i64);
}

/// A file that shrinks under a batch: the reads past its new end come back
/// short (no bytes), not as errors and not with stale data.
#[test]
fn a_file_truncated_under_a_batch_reads_short() {
    let d = Driver::open();
    let f = TestFile::new("/tmp", 1 << 20, 3);
    let h = open(&d, &f);
    let b = Buf::new(&d, 1 << 20);
    std::fs::OpenOptions::new().write(true).open(&f.0).unwrap().set_len(4096).unwrap();
    let batch = h.batch(8).unwrap();
    let ios: Vec<_> = (0..4u64)
        .map(|i| BatchIo {
            op: BatchOp::Read,
            buf: b.token,
            size: 65536,
            file_offset: i * 65536,
            buf_offset: (i * 65536) as usize,
            cookie: i,
        })
        .collect();
    batch.submit(&ios).unwrap();
    let mut ev = Vec::new();
    while ev.len() < 4 {
        batch.get_status(1, 8, Some(Duration::from_secs(10)), &mut ev).unwrap();
    }
    ev.sort_by_key(|e| e.cookie);
    let got: Vec<usize> = ev.iter().map(|e| *e.result.as_ref().unwrap()).collect();
    assert_eq!(got, vec![4096, 0, 0, 0]);
}

/// A descriptor opened for reading only: reads work, writes are refused
/// with a clear error (EROFS) and the file is unchanged.
#[test]
fn a_file_opened_read_only_refuses_writes_and_keeps_its_data() {
    let d = Driver::open();
    let f = TestFile::new("/tmp", 65536, 4);
    let fd = std::fs::File::open(&f.0).unwrap();
    let h = d.open_fd(fd.as_fd(), kopts()).unwrap();
    drop(fd); // the handle keeps its own descriptor
    let mut b = Buf::new(&d, 65536);
    h.read(&b.token, 65536, 0, 0).unwrap();
    assert!(b.mem[..] == pattern(4, 0, 65536)[..]);
    b.mem.fill(0);
    let e = h.write(&b.token, 4096, 0, 0).unwrap_err();
    assert_eq!(e.errno(), libc::EROFS, "{e}");
    assert!(e.to_string().contains("Write Protected"), "{e}");
    assert!(std::fs::read(&f.0).unwrap() == pattern(4, 0, 65536), "the file changed");
    // The handle goes on.
    h.read(&b.token, 4096, 0, 0).unwrap();
    // A descriptor open for writing only: the file is opened anew for
    // reading and writing (root here: the permissions allow it).
    let wo = std::fs::OpenOptions::new().write(true).open(&f.0).unwrap();
    let h = d.open_fd(wo.as_fd(), kopts()).unwrap();
    h.read(&b.token, 4096, 4096, 0).unwrap();
    assert!(b.mem[..4096] == pattern(4, 4096, 4096)[..]);
}

/// Memory that direct I/O cannot take (not aligned as the file needs)
/// goes through the page cache: the data is the same either way.
#[test]
fn unaligned_memory_moves_through_the_page_cache() {
    let d = Driver::open();
    let f = TestFile::new("/tmp", 1 << 20, 5);
    let h = open(&d, &f);
    let mut b = Buf::new(&d, (1 << 20) + 4096);
    // 512 bytes into the buffer: sector aligned, not page aligned.
    h.read(&b.token, 256 << 10, 512 << 10, 512).unwrap();
    assert!(b.mem[512..512 + (256 << 10)] == pattern(5, 512 << 10, 256 << 10)[..]);
    b.mem[512..512 + 4096].copy_from_slice(&pattern(9, 0, 4096));
    h.write(&b.token, 4096, 8192, 512).unwrap();
    h.flush().unwrap();
    let disk = std::fs::read(&f.0).unwrap();
    assert!(disk[8192..8192 + 4096] == pattern(9, 0, 4096)[..]);
    // The same through a descriptor the caller opened O_DIRECT (as cuFile's
    // callers do): its own flags do not reach the page cache's path.
    use std::os::unix::fs::OpenOptionsExt;
    let direct = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(&f.0).unwrap();
    let h = d.open_fd(direct.as_fd(), kopts()).unwrap();
    b.mem.fill(0);
    // 8 bytes into the buffer: no direct I/O takes that.
    h.read(&b.token, 256 << 10, 512 << 10, 8).unwrap();
    assert!(b.mem[8..8 + (256 << 10)] == pattern(5, 512 << 10, 256 << 10)[..]);
}

/// A full filesystem: the write fails with ENOSPC (Capacity Exceeded) and
/// the handle goes on; what was written before stays.
#[test]
fn a_full_filesystem_is_enospc_and_nothing_else_is_lost() {
    let dir = std::env::temp_dir().join(format!("ugds-enospc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "this test mounts a 256 KiB tmpfs (as root) to fill it");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _u = Unmount(dir.clone());
    let path = dir.join("f");
    std::fs::File::create(&path).and_then(|f| f.set_len(1 << 20)).unwrap(); // sparse, larger than the fs
    let d = Driver::open();
    let h = d.open_file(&path, kopts()).unwrap();
    let mut b = Buf::new(&d, 1 << 20);
    b.mem.copy_from_slice(&pattern(6, 0, 1 << 20));
    h.write(&b.token, 64 << 10, 0, 0).unwrap();
    let e = h.write(&b.token, 1 << 20, 0, 0).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    h.flush().unwrap();
    b.mem.fill(0);
    h.read(&b.token, 64 << 10, 0, 0).unwrap();
    assert!(b.mem[..64 << 10] == pattern(6, 0, 64 << 10)[..], "the earlier write is intact");
}

/// Interrupt completion: each ring signals its vector's eventfd.
#[test]
fn interrupt_completion_on_the_kernel_path() {
    let d = Driver::open();
    let f = TestFile::new("/tmp", 1 << 20, 7);
    let h = d.open_file(&f.0, kopts().completion(Completion::Interrupt)).unwrap();
    assert!(h.queues().iter().filter(|q| q.role == ugds::QueueRole::Sync).all(|q| q.vector.is_some()));
    let b = Buf::new(&d, 1 << 20);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (h, tok) = (&h, b.token);
            move || {
                for i in 0..50u64 {
                    let off = ((t * 50 + i) % 256) * 4096;
                    h.read(&tok, 4096, off, off as usize).unwrap();
                }
            }
        })
        .collect();
    std::thread::scope(|s| {
        for t in threads {
            s.spawn(t);
        }
    });
    // A disk quiet for 100 ms caps a wait and loses nothing: what must
    // not happen is a waiter asleep past a completion.
    eprintln!("interrupt waits that reached their cap: {}", h.interrupt_waits_capped());
    assert_eq!(h.interrupt_wakeups_lost(), 0);
}

/// Closing a handle with I/O in flight waits for it first.
#[test]
fn closing_with_io_in_flight_drains_first() {
    let d = Driver::open();
    let f = TestFile::new("/tmp", 4 << 20, 8);
    let h = open(&d, &f);
    let b = Buf::new(&d, 4 << 20);
    let batch = h.batch(64).unwrap();
    let ios: Vec<_> = (0..64u64)
        .map(|i| BatchIo {
            op: BatchOp::Read,
            buf: b.token,
            size: 65536,
            file_offset: i * 65536,
            buf_offset: (i * 65536) as usize,
            cookie: i,
        })
        .collect();
    batch.submit(&ios).unwrap();
    // The batch holds the handle: a close that may not wait is refused,
    // and nothing is lost; once the batch is gone the close succeeds.
    assert!(matches!(h.close(ugds::Drain::NoWait), Err(Error::Busy { .. })));
    let mut ev = Vec::new();
    while ev.len() < 64 {
        batch.get_status(1, 64, Some(Duration::from_secs(10)), &mut ev).unwrap();
    }
    assert!(ev.iter().all(|e| e.result.as_ref().is_ok_and(|&n| n == 65536)));
    drop(batch);
    h.close(ugds::Drain::Timeout(Duration::from_secs(10))).unwrap();
    assert!(b.mem[..] == pattern(8, 0, 4 << 20)[..]);
}

/// A ring whose submissions a kernel thread polls (SQPOLL): the same data
/// through every API.
#[test]
fn sqpoll_rings_move_the_same_data() {
    let d = Driver::open();
    let f = TestFile::new("/tmp", 4 << 20, 10);
    let h = d.open_file(&f.0, kopts().kernel_ring(ugds::KernelRing::SqPoll)).unwrap();
    let mut b = Buf::new(&d, 4 << 20);
    for &(size, off) in &[(512usize, 512u64), (4096, 8192), (1 << 20, 1 << 20), (3 << 20, 0)] {
        b.mem[..size].fill(0);
        assert_eq!(h.read(&b.token, size, off, 0).unwrap(), size);
        assert!(b.mem[..size] == pattern(10, off, size)[..], "{size}@{off}");
    }
    b.mem[..65536].copy_from_slice(&pattern(11, 0, 65536));
    h.write(&b.token, 65536, 65536, 0).unwrap();
    h.flush().unwrap();
    assert!(std::fs::read(&f.0).unwrap()[65536..131072] == pattern(11, 0, 65536)[..]);
    let batch = h.batch(16).unwrap();
    let ios: Vec<_> = (0..16u64)
        .map(|i| BatchIo {
            op: BatchOp::Read,
            buf: b.token,
            size: 4096,
            file_offset: (2 << 20) + i * 4096,
            buf_offset: (i * 4096) as usize,
            cookie: i,
        })
        .collect();
    batch.submit(&ios).unwrap();
    let mut ev = Vec::new();
    while ev.len() < 16 {
        batch.get_status(1, 16, Some(Duration::from_secs(10)), &mut ev).unwrap();
    }
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete), "{ev:?}");
    assert!(b.mem[..65536] == pattern(10, 2 << 20, 65536)[..]);
}

/// IOPOLL: refused with interrupt completion; on a file whose device has
/// no poll queues (this machine's disk, tmpfs) refused at open with a
/// clear error, never at the first I/O; where it opens, the data is right.
#[test]
fn iopoll_opens_only_where_the_file_takes_it() {
    let d = Driver::open();
    let f = TestFile::new("/tmp", 1 << 20, 12);
    let iopoll = kopts().kernel_ring(ugds::KernelRing::IoPoll);
    let e = d.open_file(&f.0, iopoll.clone().completion(Completion::Interrupt)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    match d.open_file(&f.0, iopoll.clone()) {
        Ok(h) => {
            let b = Buf::new(&d, 65536);
            h.read(&b.token, 65536, 4096, 0).unwrap();
            assert!(b.mem[..] == pattern(12, 4096, 65536)[..]);
        }
        Err(e) => assert!(matches!(e, Error::Unsupported(ref m) if m.contains("IOPOLL")), "{e:?}"),
    }
    let shm = TestFile::new("/dev/shm", 1 << 20, 13);
    let e = d.open_file(&shm.0, iopoll).unwrap_err();
    assert!(matches!(e, Error::Unsupported(ref m) if m.contains("IOPOLL")), "{e:?}");
}
