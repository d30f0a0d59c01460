//! NVMe over RDMA through the handle API (`Driver::open_rdma`) where no
//! RDMA device can reach the target (this machine and CI's host: no verbs
//! device, or rdma-core not installed): a clear error, in bounded time.
//!
//! Linux's own target (nvmet-rdma over soft RoCE) runs the conformance
//! suite and `ugds bench --rdma` in the QEMU guest
//! (`scripts/qemu-conformance rdma`).

use std::time::{Duration, Instant};
use ugds::fabrics::RdmaTarget;
use ugds::{Driver, HandleOptions};

#[test]
fn no_rdma_path_to_the_target_is_a_clear_error() {
    let mut t = RdmaTarget::new("127.0.0.1:9", "nqn.2026-12.io.ugds:nobody");
    t.timeout = Duration::from_secs(2);
    let started = Instant::now();
    let e = Driver::open().open_rdma(&t, HandleOptions::default()).expect_err("no NVMe/RDMA target listens there");
    let msg = e.to_string();
    assert!(msg.to_lowercase().contains("rdma"), "the error says it is about RDMA: {msg}");
    assert!(started.elapsed() < Duration::from_secs(30), "answered in bounded time ({:?})", started.elapsed());
}
