//! Reads into GPU memory over NVMe/TCP, against the emulated target and
//! a runtime whose copies take several looks to finish (and move their
//! bytes only then): a read completes only after its copy to the device,
//! copies run while the socket is read (more than one in flight), and a
//! failed copy fails its read alone.

use crate::engine::slow_gpu::SlowGpu;
use crate::fabrics::TcpTarget;
use crate::{Driver, HandleOptions};
use std::sync::atomic::Ordering;
use std::time::Duration;
use ugds_emu::tcp::{EmuTcpConfig, EmuTcpTarget};
use ugds_nvme::status::generic;
use ugds_platform::device::DeviceMemory;
use ugds_platform::Error;

fn pattern(i: usize) -> u8 {
    (i * 7 + i / 4096) as u8
}

#[test]
fn reads_into_gpu_memory_complete_with_their_copies_which_overlap() {
    let target = EmuTcpTarget::start(EmuTcpConfig::default()).unwrap();
    let data: Vec<u8> = (0..1 << 20).map(pattern).collect();
    target.fill(0, &data);
    let d = Driver::open();
    let opts = HandleOptions::default().sync_queues(1).async_queues(1).queue_depth(64).timeout(Duration::from_secs(5));
    let h = d.open_tcp(&TcpTarget::new(target.addr(), target.nqn()), opts).unwrap();
    let gpu = SlowGpu::new(256 << 10);
    let t = d.register_test_device(DeviceMemory { ptr: gpu.base, len: 256 << 10, runtime: gpu.clone() }).unwrap();
    let mut q = h.io_queue().unwrap();
    for i in 0..32usize {
        q.submit_read(&t, 8192, (i * 8192) as u64, i * 8192, i as u64).unwrap();
    }
    // The responses wait in the socket when the queue first reads it, so
    // that whether copies overlap the reading does not hang on how the
    // target's thread is scheduled against this one (seen on a loaded CI
    // machine: the data came one read at a time, each copy done before the
    // next arrived).
    std::thread::sleep(Duration::from_millis(100));
    let mut done = Vec::new();
    q.drain(|tag, r| done.push((tag, r.map_err(|e| e.to_string())))).unwrap();
    done.sort_by_key(|&(tag, _)| tag);
    assert_eq!(done, (0..32).map(|i| (i, Ok(8192))).collect::<Vec<_>>());
    assert!(gpu.mem.lock().unwrap()[..] == data[..256 << 10], "every read's bytes reached the device");
    assert!(gpu.peak() > 1, "copies ran one at a time ({}), not while the socket was read", gpu.peak());
    assert_eq!(gpu.in_flight(), 0, "every copy was answered");

    // A copy that fails fails its read alone, with a data transfer error.
    gpu.fail.store(true, Ordering::Relaxed);
    q.submit_read(&t, 4096, 0, 0, 100).unwrap();
    let mut r = None;
    q.drain(|tag, res| r = Some((tag, res))).unwrap();
    gpu.fail.store(false, Ordering::Relaxed);
    match r {
        Some((100, Err(Error::Nvme { status, .. }))) => {
            assert_eq!((status.sct, status.sc), (0, generic::DATA_TRANSFER_ERROR), "{status:?}")
        }
        other => panic!("expected a data transfer error, got {other:?}"),
    }
    // The queue and the handle go on.
    gpu.mem.lock().unwrap().fill(0);
    assert_eq!(h.read(&t, 4096, 4096, 0).unwrap(), 4096);
    assert!(gpu.mem.lock().unwrap()[..4096] == data[4096..8192]);
    drop(q);
    d.deregister(&t).unwrap();
    assert_eq!(target.stats().host_errors, 0);
}
