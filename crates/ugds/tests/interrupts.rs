//! Interrupt completion: no waiter sleeps to its cap while its request is
//! done. Threads sharing a queue with fewer free slots than threads; fewer
//! interrupt vectors than queues (QEMU's `msix_qsize`), where a completion
//! on one queue wakes its waiter even when a thread of another queue drained
//! the shared vector.

mod common;
use common::*;
use ugds::{Completion, Drain, HandleOptions, QueueRole};

fn interrupt_opts(sync_queues: u16) -> HandleOptions {
    opts().completion(Completion::Interrupt).sync_queues(sync_queues).async_queues(1)
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
        eprintln!(
            "vectors {vectors}: interrupt waits that reached their cap: {capped}, lost {}",
            h.interrupt_wakeups_lost()
        );
        assert_eq!(capped, 0, "waits slept to their cap with {vectors} vector(s)");
        h.close(Drain::NoWait).unwrap();
    }
}

/// Four threads, one queue pair with one request slot (MQES 1): a thread
/// whose request another thread reaped, or that waits for the slot, is
/// woken by whoever makes progress. (Waits slept to the 100 ms cap: 16 to
/// 24 in 2 s of `ugds bench --emu-queues 1 --emu-mqes 1 --interrupt -t 4`
/// before, when a thread whose request was done found the queue's lock
/// taken and went back to sleep; 24 to 36 I/Os per second before that.)
#[test]
fn threads_sharing_one_slot_are_all_woken() {
    let o = opts().completion(Completion::Interrupt).sync_queues(1).async_queues(0);
    let (d, h, _e) = open(small_emu().max_io_queues(1).mqes(1), o);
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let (d, h) = (&d, &h);
            sc.spawn(move || {
                let mut b = Buf::new(d, 4096);
                for i in 0..300u64 {
                    let off = (t * 300 + i) * 4096;
                    b.mem.copy_from_slice(&pattern(t as u8, off, 4096));
                    h.write(&b.token, 4096, off, 0).unwrap();
                    b.mem.fill(0);
                    h.read(&b.token, 4096, off, 0).unwrap();
                    assert!(b.mem[..] == pattern(t as u8, off, 4096)[..]);
                }
            });
        }
    });
    let capped = h.interrupt_waits_capped();
    eprintln!("interrupt waits that reached their cap: {capped}, lost {}", h.interrupt_wakeups_lost());
    assert_eq!(capped, 0);
    h.close(Drain::NoWait).unwrap();
}
