//! The shared queue against a device the test plays (`engine::fake`):
//! several threads' requests on a queue of three slots, completed in
//! reverse of the order fetched, some with an error status, across many
//! wraps of both rings.

use super::*;
use crate::engine::fake::{read, Device, Doorbells};
use crate::engine::qpair::NvmeQueue;
use std::sync::atomic::AtomicBool;
use ugds_nvme::Qid;

fn describe(r: Result<u64, Failure>) -> String {
    match r {
        Ok(n) => format!("Ok({n})"),
        Err(Failure::Error(e) | Failure::Stuck(e) | Failure::Late { error: e, .. }) => e.to_string(),
    }
}

/// Blocks at or past this one fail with LBA Out of Range.
const BAD_FROM: u64 = 1 << 20;

#[test]
fn each_waiter_gets_its_own_completion_whoever_reaps() {
    let bells = Arc::new(Doorbells::default());
    let qp = NvmeQueue::new(bells.clone(), Qid(1), 4, 0, None).unwrap();
    let mut dev = Device::of(&qp);
    let q = SyncQueue::new(QueuePair::Nvme(qp), bells.clone()).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // The device: fetch what the doorbell shows, complete it last
        // fetched first; LBA Out of Range for the blocks past BAD_FROM.
        let device = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let Some(tail) = bells.sq_tail(1) else { continue };
                for sqe in dev.fetch_sqes(tail).iter().rev() {
                    let status = if sqe.slba().0 >= BAD_FROM { 0x80 } else { 0 };
                    dev.post(sqe.cid().0, dev.sq_head, status);
                }
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let q = &q;
                s.spawn(move || {
                    for i in 0..200u64 {
                        let lba = if i % 7 == 3 { BAD_FROM + t * 1000 + i } else { t * 1000 + i };
                        let cmd = Cmd { sqe: read(lba), prp: None, sgl: None, bytes: 512 };
                        let r = q.execute(
                            std::iter::once(cmd),
                            "Read",
                            Completion::Poll,
                            Duration::from_secs(10),
                            Pacing::NONE,
                        );
                        match (lba >= BAD_FROM, r) {
                            (false, Ok(0)) => {}
                            (true, Err(Failure::Error(Error::Nvme { status, .. }))) => {
                                assert_eq!(status.sc, 0x80, "thread {t} read {i}: the error of its own command")
                            }
                            (bad, r) => panic!("thread {t} read {i} (bad {bad}): {}", describe(r)),
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        device.join().unwrap();
    });
    q.with_qp(|qp| {
        assert_eq!(qp.outstanding(), 0);
        assert_eq!(qp.protocol_errors(), 0);
    });
}
