//! The GPU path of the kernel path's queue, against a runtime whose copies
//! take several looks to finish (and move their bytes only then): a read
//! completes only after its copy to the device, a write reaches the file
//! only after its copy from the device, and a failed copy fails its command
//! alone.

use super::*;
use crate::engine::slow_gpu::SlowGpu;
use ugds_nvme::{Lba, Nsid};
use ugds_platform::device::DeviceMemory;
use ugds_platform::Platform;

const BLOCK: u32 = 512;

fn pattern(i: usize) -> u8 {
    (i * 7 + i / 4096) as u8
}

struct Fixture {
    dir: std::path::PathBuf,
    gpu: Arc<SlowGpu>,
    q: UringQueue,
    /// Where the GPU memory is mapped for the queue.
    iova: u64,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A queue on a 1 MiB file and 256 KiB of fake GPU memory; with
/// `interrupt`, completions signalled on the platform's vector 0.
fn fixture(name: &str, interrupt: bool) -> Fixture {
    let dir = std::env::temp_dir().join(format!("ugds-uring-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("data");
    std::fs::write(&file, (0..1 << 20).map(pattern).collect::<Vec<u8>>()).unwrap();
    let platform = Arc::new(KernelPlatform::open(&file).unwrap());
    let gpu = SlowGpu::new(256 << 10);
    let mem = DeviceMemory { ptr: gpu.base, len: 256 << 10, runtime: gpu.clone() };
    // SAFETY: the fake GPU memory lives as long as `gpu`, which the fixture keeps.
    let mapping = unsafe { platform.map_device(&mem) }.unwrap();
    let efd = interrupt.then(|| (0, platform.interrupt(0).unwrap().expect("vector 0")));
    let q = UringQueue::new(platform.clone(), efd, 1, 64, BLOCK, KernelRing::Plain).unwrap();
    Fixture { dir, gpu, q, iova: mapping.pages()[0] }
}

fn rw(op: NvmOpcode, offset: u64, len: usize, addr: u64) -> Sqe {
    Sqe::rw(op, Cid(0), Nsid(1), Lba(offset / BLOCK as u64), len as u32 / BLOCK, addr, 0)
}

/// Runs `cmds` (with owners 0..) to completion: their statuses by owner.
fn run(q: &mut UringQueue, cmds: &[(Sqe, u64)]) -> Vec<Status> {
    run_dw0(q, cmds).into_iter().map(|(s, _)| s).collect()
}

/// As `run`, with each completion's DW0 (the bytes a read did not move).
fn run_dw0(q: &mut UringQueue, cmds: &[(Sqe, u64)]) -> Vec<(Status, u32)> {
    let mut out = vec![None; cmds.len()];
    for (i, &(sqe, addr)) in cmds.iter().enumerate() {
        q.submit(sqe, Some(addr), Owner::Own(i as u32)).unwrap();
    }
    q.ring_sq_doorbell();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while out.iter().any(Option::is_none) {
        assert!(std::time::Instant::now() < deadline, "completions within 10 s: {out:?}");
        q.process_completions(usize::MAX, |owner, cqe| {
            let Owner::Own(i) = owner else { panic!("{owner:?}") };
            assert!(out[i as usize].replace((cqe.status(), cqe.dw0)).is_none(), "one completion per command");
        });
    }
    assert_eq!(q.outstanding(), 0);
    assert_eq!(q.copies.load(Ordering::Relaxed), 0, "no copy left counted");
    out.into_iter().map(Option::unwrap).collect()
}

#[test]
fn gpu_reads_complete_after_their_copy_to_the_device() {
    let mut f = fixture("read", true);
    let cmds: Vec<_> = (0..4).map(|i| (rw(NvmOpcode::Read, i * 65536 + 4096, 65536, f.iova + i * 65536), 0)).collect();
    let cmds: Vec<_> = cmds.into_iter().map(|(s, _)| (s, s.prp1)).collect();
    // Submitted and looked at once: whatever the kernel finished is only
    // now on its way to the device, so nothing has completed.
    for (i, &(sqe, addr)) in cmds.iter().enumerate() {
        f.q.submit(sqe, Some(addr), Owner::Own(i as u32)).unwrap();
    }
    f.q.ring_sq_doorbell();
    let mut done = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while f.gpu.in_flight() == 0 && std::time::Instant::now() < deadline {
        done += f.q.process_completions(usize::MAX, |_, _| {});
    }
    assert_eq!(done, 0, "a read completes only when its bytes are on the device");
    assert!(f.q.cq_view().is_new(0, false), "waiters keep looking while copies are in flight");
    assert!(f.q.completion_pending());
    let mut statuses = vec![None; 4];
    while statuses.iter().any(Option::is_none) {
        assert!(std::time::Instant::now() < deadline);
        f.q.process_completions(usize::MAX, |owner, cqe| {
            let Owner::Own(i) = owner else { panic!() };
            statuses[i as usize] = Some(cqe.status());
        });
    }
    assert!(statuses.iter().all(|s| s.unwrap().is_success()), "{statuses:?}");
    let mem = f.gpu.mem.lock().unwrap();
    assert!(mem.iter().enumerate().all(|(i, &b)| b == pattern(4096 + i)), "the device got the file's bytes");
    assert!(!f.q.cq_view().is_new(0, false), "an interrupt-driven ring's view is quiet again");
    assert!(f.q.ring.fixed_buffers() > 0, "bounce buffers are registered with the ring (Linux 5.19 and later)");
}

#[test]
fn a_gpu_read_across_the_end_of_the_file_moves_what_there_is() {
    let mut f = fixture("eof", false);
    f.gpu.mem.lock().unwrap().fill(0xee);
    let end = 1 << 20;
    let got = run_dw0(&mut f.q, &[(rw(NvmOpcode::Read, end - 4096, 16384, f.iova), f.iova)]);
    assert_eq!(got[0], (Status::SUCCESS, 12288), "success, 12 KiB short");
    let mem = f.gpu.mem.lock().unwrap();
    assert!((0..4096).all(|i| mem[i] == pattern(end as usize - 4096 + i)), "the last 4 KiB on the device");
    assert!(mem[4096..16384].iter().all(|&b| b == 0xee), "nothing copied past what was read");
}

#[test]
fn gpu_writes_reach_the_file_only_after_their_copy_from_the_device() {
    let mut f = fixture("write", false);
    f.gpu.mem.lock().unwrap().iter_mut().enumerate().for_each(|(i, b)| *b = !(i as u8));
    let cmds = [
        (rw(NvmOpcode::Write, 8192, 131072, f.iova), f.iova),
        (rw(NvmOpcode::Write, 524288, 4096, f.iova + 131072), f.iova + 131072),
    ];
    let statuses = run(&mut f.q, &cmds);
    assert!(statuses.iter().all(|s| s.is_success()), "{statuses:?}");
    let file = std::fs::read(f.dir.join("data")).unwrap();
    assert!((0..131072).all(|i| file[8192 + i] == !(i as u8)), "the first write's bytes are the device's");
    assert!((0..4096).all(|i| file[524288 + i] == !((131072 + i) as u8)), "the second write's bytes are the device's");
    assert_eq!(file[8191], pattern(8191), "nothing before it changed");
}

#[test]
fn a_failed_copy_fails_its_command_and_nothing_else() {
    let mut f = fixture("fail", false);
    f.gpu.fail.store(true, Ordering::Relaxed);
    let failed = run(&mut f.q, &[(rw(NvmOpcode::Read, 0, 4096, f.iova), f.iova)]);
    assert_eq!(failed[0], Status::generic(generic::DATA_TRANSFER_ERROR));
    let failed = run(&mut f.q, &[(rw(NvmOpcode::Write, 0, 4096, f.iova), f.iova)]);
    assert_eq!(failed[0], Status::generic(generic::DATA_TRANSFER_ERROR));
    let file = std::fs::read(f.dir.join("data")).unwrap();
    assert!((0..4096).all(|i| file[i] == pattern(i)), "a write whose copy failed wrote nothing");
    // The queue goes on.
    f.gpu.fail.store(false, Ordering::Relaxed);
    let ok = run(&mut f.q, &[(rw(NvmOpcode::Read, 4096, 4096, f.iova), f.iova)]);
    assert!(ok[0].is_success());
    assert!(f.gpu.mem.lock().unwrap()[..4096].iter().enumerate().all(|(i, &b)| b == pattern(4096 + i)));
}

/// The caller's registered host memory is a registered buffer of the ring
/// from its first I/O, and released by the ring once it is unregistered.
#[test]
fn registered_host_memory_is_a_ring_buffer_until_unmapped() {
    use ugds_platform::sys::uring::BOUNCE_BUFFERS;
    let mut f = fixture("host", false);
    let p = f.q.platform.clone();
    let (a, b) = (
        ugds_platform::sys::Anonymous::populated(1 << 20).unwrap(),
        ugds_platform::sys::Anonymous::populated(1 << 20).unwrap(),
    );
    // SAFETY: both mappings outlive theirs (unmapped below, or at the end).
    let (ma, mb) = unsafe { (p.map_host(a.as_ptr(), 1 << 20).unwrap(), p.map_host(b.as_ptr(), 1 << 20).unwrap()) };
    let (sa, ga, ..) = p.host_buffer(a.as_ptr() as usize, 1).expect("a slot");
    let (sb, gb, ..) = p.host_buffer(b.as_ptr() as usize, 1).expect("a slot");
    assert!(sa >= BOUNCE_BUFFERS && sb >= BOUNCE_BUFFERS && sa != sb);
    let addr = a.as_ptr() as u64 + 4096;
    let got = run(&mut f.q, &[(rw(NvmOpcode::Read, 65536, 131072, addr), addr)]);
    assert!(got[0].is_success());
    // SAFETY: the 128 KiB just read, inside `a`.
    let data = unsafe { std::slice::from_raw_parts(addr as *const u8, 131072) };
    assert!(data.iter().enumerate().all(|(i, &x)| x == pattern(65536 + i)), "the file's bytes, read through the slot");
    assert_eq!(f.q.ring.fixed_generation(sa), ga, "in the ring's table at its first use");
    if ugds_platform::sys::uring::fixed_copies() {
        // The table copied from the handle's source, where both were
        // pinned at registration.
        assert_eq!(f.q.ring.fixed_generation(sb), gb, "copied with the table");
    } else {
        assert_eq!(f.q.ring.fixed_generation(sb), 0, "registered by the ring itself: not before its use");
    }
    // `a` unregistered: the ring lets its slot go at its next use of host memory.
    // SAFETY: its mapping, no command in flight on it.
    unsafe { p.unmap_host(&ma) }.unwrap();
    let addr = b.as_ptr() as u64;
    let got = run(&mut f.q, &[(rw(NvmOpcode::Write, 0, 4096, addr), addr)]);
    assert!(got[0].is_success());
    assert_eq!(f.q.ring.fixed_generation(sa), 0, "the unregistered memory's slot is released");
    assert_eq!(f.q.ring.fixed_generation(sb), gb);
    // Memory that is not registered goes without a slot.
    let c = ugds_platform::sys::Anonymous::populated(4096).unwrap();
    let got = run(&mut f.q, &[(rw(NvmOpcode::Read, 0, 4096, c.as_ptr() as u64), c.as_ptr() as u64)]);
    assert!(got[0].is_success());
    // SAFETY: as above.
    unsafe { p.unmap_host(&mb) }.unwrap();
}

#[test]
fn rings_of_a_handle_share_its_registered_buffers() {
    use ugds_platform::sys::uring::{fixed_copies, BOUNCE_BUFFERS};
    let mut f = fixture("shared", false);
    let p = f.q.platform.clone();
    let mut q2 = UringQueue::new(p.clone(), None, 2, 64, BLOCK, KernelRing::Plain).unwrap();
    // A read into GPU memory on the first ring: a bounce slab in its table.
    let gpu = f.iova;
    assert!(run(&mut f.q, &[(rw(NvmOpcode::Read, 8192, 4096, gpu), gpu)])[0].is_success());
    let bounce = (0..BOUNCE_BUFFERS).find(|&i| f.q.ring.fixed_generation(i) != 0).expect("a bounce slot in use");
    let a = ugds_platform::sys::Anonymous::populated(1 << 20).unwrap();
    // SAFETY: `a` outlives its mapping (unmapped below).
    let ma = unsafe { p.map_host(a.as_ptr(), 1 << 20) }.unwrap();
    let (sa, ga, ..) = p.host_buffer(a.as_ptr() as usize, 1).expect("a slot");
    // Both rings read into it, each its own half.
    let (lo, hi) = (a.as_ptr() as u64, a.as_ptr() as u64 + (512 << 10));
    assert!(run(&mut f.q, &[(rw(NvmOpcode::Read, 0, 512 << 10, lo), lo)])[0].is_success());
    assert!(run(&mut q2, &[(rw(NvmOpcode::Read, 512 << 10, 512 << 10, hi), hi)])[0].is_success());
    // SAFETY: the 1 MiB just read.
    let data = unsafe { std::slice::from_raw_parts(a.as_ptr(), 1 << 20) };
    assert!(data.iter().enumerate().all(|(i, &x)| x == pattern(i)), "each ring read the file's bytes through the slot");
    assert_eq!((f.q.ring.fixed_generation(sa), q2.ring.fixed_generation(sa)), (ga, ga));
    if fixed_copies() {
        // The bounce slab went into the handle's source at its first use,
        // so the copies kept it on the first ring and brought it to the
        // second, which never read into GPU memory.
        assert_eq!(f.q.ring.fixed_generation(bounce), 1, "kept through the first ring's copy");
        assert_eq!(q2.ring.fixed_generation(bounce), 1, "copied to the second ring");
    }
    // GPU reads still go through the first ring's bounce slot.
    assert!(run(&mut f.q, &[(rw(NvmOpcode::Read, 16384, 4096, gpu + 4096), gpu + 4096)])[0].is_success());
    assert!(f.gpu.mem.lock().unwrap()[4096..8192].iter().enumerate().all(|(i, &b)| b == pattern(16384 + i)));
    // Unmapped: each ring lets the slot go at its next use of host memory.
    // SAFETY: its mapping, no command in flight on it.
    unsafe { p.unmap_host(&ma) }.unwrap();
    let c = ugds_platform::sys::Anonymous::populated(4096).unwrap();
    let addr = c.as_ptr() as u64;
    for q in [&mut f.q, &mut q2] {
        assert!(run(q, &[(rw(NvmOpcode::Read, 0, 4096, addr), addr)])[0].is_success());
        assert_eq!(q.ring.fixed_generation(sa), 0, "the unmapped memory's slot is released");
    }
}

/// Drops the file's pages from the page cache (written back first), and
/// waits until none is resident: pages still being read (a readahead that
/// an earlier miss started) are not dropped until their I/O is done.
fn evict(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        // SAFETY: a descriptor of ours; advice only.
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
        let resident = resident(path);
        if resident == 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{resident} pages stay in the page cache");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Brings `len` bytes at `off` of the file into the page cache (a
/// buffered read).
fn cache_part(path: &std::path::Path, off: u64, len: usize) {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; len];
    std::fs::File::open(path).unwrap().read_exact_at(&mut b, off).unwrap();
}

/// Pages of the file in the page cache (mincore).
fn resident(path: &std::path::Path) -> usize {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a read-only shared mapping of the file, unmapped below; its
    // pages are only asked about (mincore), never touched.
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED);
        let mut v = vec![0u8; len.div_ceil(ugds_platform::sys::PAGE_SIZE)];
        assert_eq!(libc::mincore(p, len, v.as_mut_ptr()), 0);
        libc::munmap(p, len);
        v.iter().filter(|&&b| b & 1 != 0).count()
    }
}

/// Host reads of `len` bytes at each offset, checked against the file.
fn read_checked(q: &mut UringQueue, offsets: &[u64], len: usize) {
    let mem = ugds_platform::sys::Anonymous::populated(len * offsets.len()).unwrap();
    let cmds: Vec<_> = offsets
        .iter()
        .enumerate()
        .map(|(i, &off)| {
            let addr = mem.as_ptr() as u64 + (i * len) as u64;
            (rw(NvmOpcode::Read, off, len, addr), addr)
        })
        .collect();
    assert!(run(q, &cmds).iter().all(|s| s.is_success()));
    for (i, &off) in offsets.iter().enumerate() {
        // SAFETY: the bytes just read, inside `mem`.
        let data = unsafe { std::slice::from_raw_parts((mem.as_ptr() as usize + i * len) as *const u8, len) };
        assert!(data.iter().enumerate().all(|(j, &b)| b == pattern(off as usize + j)), "read at {off}");
    }
}

#[test]
fn auto_reads_cached_data_from_the_page_cache_and_the_rest_from_the_disk() {
    let mut f = fixture("cache", false);
    f.q.set_cache_policy(CachePolicy::Auto);
    let path = f.dir.join("data");
    // Just written: cached.
    read_checked(&mut f.q, &[0, 65536], 65536);
    let c = f.q.counters().clone();
    assert_eq!((c.cache_hits.get(), c.cache_misses.get()), (2, 0), "cached data comes from the page cache");
    // Evicted: the attempt finds nothing, the disk serves it.
    evict(&path);
    read_checked(&mut f.q, &[262144], 65536);
    assert_eq!((c.cache_hits.get(), c.cache_misses.get()), (2, 1), "cold data is read from the disk");
    // Half cached: the cached part from the cache, the rest from the disk.
    evict(&path);
    cache_part(&path, 524288, 32768);
    read_checked(&mut f.q, &[524288], 65536);
    assert!(c.cache_hits.get() >= 3, "the cached half was a hit");
}

#[test]
fn cached_reads_into_gpu_memory_handed_to_the_kernels_workers_read_what_inline_ones_do() {
    let mut f = fixture("offload", false);
    f.q.set_cache_policy(CachePolicy::Auto);
    let placed = |q: &mut UringQueue, addr: u64, len: usize| {
        let mut t = q.transfer_of(NvmOpcode::Read, Some(addr), 0, len as u64);
        q.place(&mut t);
        if let Some(b) = t.bounce {
            bounce::give(b);
        }
        (t.nowait, t.offload)
    };
    let gpu = f.iova;
    f.q.offload = false;
    assert_eq!(placed(&mut f.q, gpu, 256 << 10), (true, false), "workers off: inline");
    f.q.offload = true;
    assert_eq!(placed(&mut f.q, gpu, 256 << 10), (true, true), "a cached GPU read of 256 KiB goes to the workers");
    assert_eq!(placed(&mut f.q, gpu, 128 << 10), (true, false), "a smaller one stays inline");
    assert_eq!(placed(&mut f.q, 0x10000, 256 << 10), (true, false), "host memory stays inline");
    let path = f.dir.join("data");
    let c = f.q.counters().clone();
    let read = |f: &mut Fixture, off: u64| {
        f.gpu.mem.lock().unwrap().fill(0xee);
        let got = run(&mut f.q, &[(rw(NvmOpcode::Read, off, 256 << 10, f.iova), f.iova)]);
        assert!(got[0].is_success(), "{got:?}");
        let mem = f.gpu.mem.lock().unwrap();
        assert!(mem.iter().enumerate().all(|(i, &b)| b == pattern(off as usize + i)), "read at {off}");
    };
    // Cached (just written): on a worker, then copied to the device.
    read(&mut f, 0);
    read(&mut f, 262144);
    assert_eq!((c.cache_hits.get(), c.cache_misses.get()), (2, 0), "served by the page cache");
    // Half cached: a worker reads what is cached, the disk the rest.
    evict(&path);
    cache_part(&path, 524288, 131072);
    read(&mut f, 524288);
    assert!(c.cache_hits.get() >= 3, "the cached half was a hit");
    // Cold: nothing tried in the cache, the disk serves it.
    evict(&path);
    read(&mut f, 786432);
    assert_eq!(c.cache_misses.get(), 1, "cold data is read from the disk");
}

#[test]
fn after_a_miss_auto_asks_the_page_cache_before_trying_it() {
    let mut f = fixture("cold", false);
    f.q.set_cache_policy(CachePolicy::Auto);
    let path = f.dir.join("data");
    // Evicted before each read: each asks first (cachestat) and goes to
    // the disk directly.
    for i in 0..64u64 {
        evict(&path);
        read_checked(&mut f.q, &[i * 16384], 4096);
    }
    let c = f.q.counters().clone();
    assert_eq!(c.cache_hits.get(), 0);
    if f.q.platform.cached_pages(0, 4096).is_none() {
        // A kernel without cachestat: 16 misses in a row, then one try in
        // 16 of the other 48.
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED (part): no cachestat here: the fallback was tested instead\n",
        );
        assert_eq!(c.cache_misses.get(), 16 + 48 / 16, "cold reads stop trying the cache after 16 misses");
        return;
    }
    assert_eq!(c.cache_misses.get(), 64, "every cold read counted as a miss");
    // Asking starts no readahead: nothing of the file is cached after a
    // cold read.
    evict(&path);
    read_checked(&mut f.q, &[1 << 19], 65536);
    assert_eq!(resident(&path), 0, "a cold read left pages in the page cache");
    // A read of cached data is tried in the cache again, and hits.
    let _ = std::fs::read(&path).unwrap();
    read_checked(&mut f.q, &[0], 4096);
    assert_eq!(c.cache_hits.get(), 1);
}

#[test]
fn a_run_of_hits_tries_without_asking_and_a_canary_ends_it_when_the_data_goes_cold() {
    let mut f = fixture("canary", false);
    f.q.set_cache_policy(CachePolicy::Auto);
    let path = f.dir.join("data");
    if f.q.platform.cached_pages(0, 4096).is_none() {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED: no cachestat here: reads try the cache without asking (tested above)\n",
        );
        return;
    }
    let mem = ugds_platform::sys::Anonymous::populated(4096).unwrap();
    let addr = mem.as_ptr() as u64;
    // Where a read of 4 KiB at `off` would go now: tried in the cache
    // without waiting, or direct.
    let place = |q: &mut UringQueue, off: u64| {
        let mut t = q.transfer(&rw(NvmOpcode::Read, off, 4096, addr), Some(addr));
        q.place(&mut t);
        t.nowait
    };
    // Just written: cached. 16 reads served by the cache in a row.
    let hits: Vec<u64> = (0..CACHE_HOT_RUN as u64).map(|i| i * 4096).collect();
    read_checked(&mut f.q, &hits, 4096);
    assert_eq!(f.q.counters().cache_hits.get(), CACHE_HOT_RUN as u64);
    // Gone cold, and a deep batch placed at once (no completion between):
    // tries without asking until the next canary, then every read asks
    // and goes direct.
    evict(&path);
    let tried: Vec<bool> = (0..64u64).map(|i| place(&mut f.q, i * 16384)).collect();
    let blind = tried.iter().take_while(|&&t| t).count();
    assert!(blind < CACHE_CANARY as usize, "{blind} tries before a canary asked");
    assert!(tried[blind..].iter().all(|&t| !t), "a read tried the cache after the canary found it cold: {tried:?}");
    // Without a run of hits every read asks: cold data is never tried.
    assert!((0..64u64).all(|i| !place(&mut f.q, i * 16384)));
}

#[test]
fn direct_and_buffered_policies_never_try_the_cache_without_waiting() {
    for policy in [CachePolicy::Direct, CachePolicy::Buffered] {
        let mut f = fixture(&format!("{policy:?}"), false);
        f.q.set_cache_policy(policy);
        read_checked(&mut f.q, &[0, 8192, 1 << 19], 4096);
        let c = f.q.counters();
        assert_eq!((c.cache_hits.get(), c.cache_misses.get()), (0, 0), "{policy:?}");
    }
}

#[test]
fn cache_policies_are_named_auto_direct_and_buffered() {
    assert_eq!("auto".parse::<CachePolicy>().unwrap(), CachePolicy::Auto);
    assert_eq!("direct".parse::<CachePolicy>().unwrap(), CachePolicy::Direct);
    assert_eq!("buffered".parse::<CachePolicy>().unwrap(), CachePolicy::Buffered);
    let e = "cached".parse::<CachePolicy>().unwrap_err().to_string();
    assert!(e.contains("unknown cache policy \"cached\""), "{e}");
}

#[test]
fn cached_read_workers_takes_on_and_off_only() {
    assert!(!cached_read_workers(None, 2).unwrap());
    assert!(cached_read_workers(None, 16).unwrap());
    assert!(!cached_read_workers(Some(""), 2).unwrap());
    assert!(cached_read_workers(Some("on"), 2).unwrap());
    assert!(!cached_read_workers(Some("off"), 16).unwrap());
    // It used to warn and fall back to the CPU count.
    for v in ["1", "yes", "ON"] {
        let why = cached_read_workers(Some(v), 16).unwrap_err();
        assert!(why.contains("UGDS_CACHED_READ_WORKERS") && why.contains("on or off"), "{why}");
    }
}

#[test]
fn a_bounce_slab_held_at_open_serves_a_rings_first_read_into_gpu_memory() {
    use ugds_platform::sys::uring::fixed_copies;
    let f = fixture("held", false);
    let p = f.q.platform.clone();
    // What a handle's open does after the first slab was made.
    crate::engine::bounce::warm(&*f.gpu).unwrap();
    let (slab, index) = crate::engine::bounce::current_slab().expect("a slab with a slot");
    // SAFETY: bounce slabs are mapped for the process's life; generation 1
    // as every ring names them.
    let held = unsafe { p.hold_fixed(index, 1, slab.0 as *mut u8, slab.1) };
    assert_eq!(held, fixed_copies(), "held in the source wherever rings copy from it");
    // A ring that never met the slab: its first read into GPU memory.
    let mut q = UringQueue::new(p, None, 2, 64, BLOCK, KernelRing::Plain).unwrap();
    let gpu = f.iova;
    assert!(run(&mut q, &[(rw(NvmOpcode::Read, 8192, 4096, gpu), gpu)])[0].is_success());
    assert!(f.gpu.mem.lock().unwrap()[..4096].iter().enumerate().all(|(i, &b)| b == pattern(8192 + i)));
    if held {
        assert_eq!(q.ring.fixed_generation(index), 1, "the held slab's slot, copied to the ring");
    }
}
