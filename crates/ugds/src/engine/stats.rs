//! What each queue pair has done: counters the request path keeps without
//! a shared atomic operation per I/O.
//!
//! A queue pair is used by one thread at a time (the holder of its lock, or
//! the thread it is lent to), and every counter touched per command is
//! written only through `&mut` access to it: one writer at a time, whose
//! hand-over (the lock, or the lending) orders its writes after the last
//! holder's. Such a counter is a plain load and store of an atomic word (no
//! locked read-modify-write), which any thread may read at any time. The
//! two counters bumped outside the queue's ownership (interrupts woken, by
//! any waiter; timeouts, by whoever escalates) are rare and use
//! read-modify-writes.

use super::trace::Histogram;
use std::sync::{Arc, OnceLock};
use ugds_nvme::NvmOpcode;

pub use super::counter::Counter;

/// The counters of one queue pair, shared between the queue pair (which
/// writes them) and its handle (which reads them).
#[derive(Debug, Default)]
pub struct QueueCounters {
    /// Commands staged.
    pub submitted: Counter,
    /// Completions consumed that named a command in flight.
    pub completed: Counter,
    /// Of those, the ones with an error status.
    pub errors: Counter,
    /// Logical blocks of the read commands staged.
    pub blocks_read: Counter,
    /// Logical blocks of the write commands staged.
    pub blocks_written: Counter,
    /// Doorbell writes: submission tail and completion head registers
    /// written (a controller's), or submissions to the kernel (an
    /// io_uring ring's `io_uring_enter`).
    pub doorbell_writes: Counter,
    /// Waits on the queue's interrupt that it woke.
    pub interrupts: Counter,
    /// Commands whose data the queue copied through memory of its own
    /// because the device could not be given the caller's (NVMe/RDMA, for
    /// a buffer not registered with the RDMA device).
    pub copied: Counter,
    /// Commands still outstanding when a timeout check escalated them.
    pub timeouts: Counter,
    /// The kernel path: reads served, in whole or in part, from the page
    /// cache without waiting, and reads that tried it and found nothing
    /// there (`CachePolicy::Auto`).
    pub cache_hits: Counter,
    pub cache_misses: Counter,
    /// Command latencies, when the queue pair is traced.
    pub latency: OnceLock<Arc<Histogram>>,
}

/// What a queue pair counts as it stages commands, in its own memory (next
/// to its ring indices), published to its [`QueueCounters`] when it rings
/// the doorbell: a command counts as submitted once the device was told.
#[derive(Debug, Default, Clone, Copy)]
pub struct Staged {
    commands: u64,
    /// Blocks by opcode: a Write's (0x01) in slot 1, a Read's (0x02) in
    /// slot 2; any other command's block field lands in slot 0 or 3, never
    /// published. An index, not a branch per command.
    blocks: [u64; 4],
}

impl Staged {
    /// Counts a command, and its `nlb` blocks when a read or write (`nlb`
    /// of any other command is not counted).
    #[inline(always)]
    pub fn add(&mut self, opcode: u8, nlb: u32) {
        self.commands += 1;
        self.blocks[(opcode as usize).min(3)] += nlb as u64;
    }

    /// Makes the counts so far visible in `c`.
    #[inline]
    pub fn publish(&self, c: &QueueCounters) {
        c.submitted.set(self.commands);
        c.blocks_read.set(self.blocks[NvmOpcode::Read as usize]);
        c.blocks_written.set(self.blocks[NvmOpcode::Write as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_commands_count_blocks_by_direction_once_published() {
        let c = QueueCounters::default();
        let mut s = Staged::default();
        s.add(0x02, 8);
        s.add(0x01, 2);
        s.add(0x00, 0); // Flush: a command, no blocks
        s.add(0x08, 5); // Write Zeroes: a command, its blocks not read or written
        s.add(0x09, 1); // Dataset Management
        assert_eq!(c.submitted.get(), 0, "not before publishing");
        s.publish(&c);
        c.completed.add(2);
        c.errors.add(1);
        c.interrupts.add_shared(3);
        assert_eq!(
            (c.submitted.get(), c.blocks_read.get(), c.blocks_written.get(), c.completed.get(), c.errors.get()),
            (5, 8, 2, 2, 1)
        );
        assert_eq!(c.interrupts.get(), 3);
    }

    #[test]
    fn one_writer_at_a_time_through_a_lock_loses_nothing() {
        // The queue pair's own pattern: writers take turns through a lock;
        // plain load-and-store suffices.
        let c = std::sync::Arc::new(std::sync::Mutex::new(()));
        let n = std::sync::Arc::new(Counter::default());
        std::thread::scope(|s| {
            for _ in 0..4 {
                let (c, n) = (c.clone(), n.clone());
                s.spawn(move || {
                    for _ in 0..10_000 {
                        let _g = c.lock().unwrap();
                        n.add(1);
                    }
                });
            }
        });
        assert_eq!(n.get(), 40_000);
    }
}
