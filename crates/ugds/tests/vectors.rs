//! Fewer interrupt vectors than queues (QEMU's `msix_qsize`): queues share
//! vectors, and a completion on one queue wakes its waiter even when a
//! thread of another queue drained the shared vector.

mod common;
use common::*;
use ugds::{Completion, Drain, HandleOptions, QueueRole};

fn interrupt_opts(sync_queues: u16) -> HandleOptions {
    HandleOptions { completion: Completion::Interrupt, sync_queues, async_queues: 1, ..opts() }
}

#[test]
fn queues_share_the_vectors_there_are_and_say_so() {
    // One vector: the admin queue's, shared by every synchronous queue; the
    // lendable queue polls.
    let (_d, h, _e) = open(small_emu().max_io_queues(8).interrupt_vectors(1), interrupt_opts(3));
    let q = h.queues();
    let sync: Vec<_> = q.iter().filter(|q| q.role == QueueRole::Sync).collect();
    assert_eq!(sync.len(), 3);
    assert!(sync.iter().all(|q| q.vector == Some(0) && q.vector_shared_with == 2), "{q:?}");
    assert!(q.iter().filter(|q| q.role == QueueRole::Lendable).all(|q| q.vector.is_none()), "{q:?}");
    assert!(q.iter().filter(|q| q.role == QueueRole::Batch).all(|q| q.vector.is_none()), "{q:?}");
    // Three vectors: 1 and 2 for I/O; the third synchronous queue shares 1.
    let (_d, h, _e) = open(small_emu().max_io_queues(8).interrupt_vectors(3), interrupt_opts(3));
    let v: Vec<_> = h.queues().iter().filter(|q| q.role == QueueRole::Sync).map(|q| q.vector).collect();
    assert_eq!(v, [Some(1), Some(2), Some(1)]);
}

#[test]
fn waiters_on_a_shared_vector_are_all_woken() {
    for vectors in [1, 2] {
        let (d, h, _e) = open(small_emu().max_io_queues(4).interrupt_vectors(vectors), interrupt_opts(4));
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let (d, h) = (&d, &h);
                sc.spawn(move || {
                    let mut b = Buf::new(d, 16384);
                    let base = t << 20;
                    for i in 0..200u64 {
                        let seed = (t * 7 + i) as u8;
                        b.mem.copy_from_slice(&pattern(seed, base, 16384));
                        h.write(&b.token, 16384, base, 0).unwrap();
                        b.mem.fill(0);
                        h.read(&b.token, 16384, base, 0).unwrap();
                        assert!(b.mem[..] == pattern(seed, base, 16384)[..], "thread {t} i {i}");
                    }
                });
            }
        });
        // A wake-up lost to a thread of another queue that drained the
        // vector shows as a wait that sleeps to its cap (100 ms).
        let capped = h.interrupt_waits_capped();
        eprintln!("vectors {vectors}: interrupt waits that reached their cap: {capped}");
        assert_eq!(capped, 0, "waits slept to their cap with {vectors} vector(s)");
        h.close(Drain::NoWait).unwrap();
    }
}
