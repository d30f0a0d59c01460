//! How a synchronous request waits for something to look at: polled, a
//! re-check of the phase tag (with a yield now and then); with interrupts,
//! one waiter (the leader) sleeps on the queue's eventfd and the others on
//! the queue's condition variable, and an interrupt wakes them all (and the
//! queues sharing its vector). Also what counts interrupts and lost
//! wake-ups, and how whoever reaps wakes the sleepers.

use super::*;

impl SyncQueue {
    /// Whether a completion is known to be there: as `completion_waiting`,
    /// less the kernel path's copies in flight (which may take a while).
    pub(super) fn completion_posted(&self) -> bool {
        let c = self.cursor.load(Ordering::Acquire);
        self.cq.posted(c >> 1, c & 1 != 0) || self.irq_hint.load(Ordering::Acquire)
    }

    /// Records that the vector fired (see `irq_hint`). SeqCst, with the
    /// reap's swap: a reap that clears the hint after this store also sees
    /// the completion the interrupt announced.
    pub(super) fn note_interrupt(&self) {
        self.irq_hint.store(true, Ordering::SeqCst);
        self.counters.interrupts.add_shared(1);
    }

    /// Waits for something to look at; `seen` is the epoch the caller's
    /// last look started from. True when an interrupt wait slept to its cap
    /// (the caller counts a lost wake-up if its next look finds work).
    pub(super) fn wait(&self, mode: Completion, spins: &mut u32, deadline: &mut Deadline, seen: &mut u32) -> bool {
        *spins = spins.wrapping_add(1);
        match (mode, self.vector) {
            (Completion::Interrupt, Some(v)) => {
                if let Ok(Some(efd)) = self.platform.interrupt(v) {
                    let left = deadline.at().saturating_duration_since(Instant::now()).min(WAIT_CAP);
                    let mut sl = self.sleep.lock().recover();
                    if sl.epoch != *seen || self.completion_waiting() {
                        *seen = sl.epoch;
                        return false;
                    }
                    let capped = if sl.leader {
                        let (g, t) = self.woken.wait_timeout(sl, left).recover();
                        sl = g;
                        t.timed_out() && sl.epoch == *seen
                    } else {
                        sl.leader = true;
                        drop(sl);
                        let (irq, kicked) = match &self.kick {
                            Some(k) => efd.wait_either(k, left),
                            None => (efd.wait(left), false),
                        };
                        if irq {
                            efd.drain();
                            self.note_interrupt();
                        }
                        if kicked {
                            self.kick.as_ref().map(EventFd::drain);
                        }
                        let signalled = irq || kicked;
                        sl = self.sleep.lock().recover();
                        sl.leader = false;
                        if signalled {
                            // An interrupt (or a kick): everyone looks.
                            sl.epoch = sl.epoch.wrapping_add(1);
                        }
                        // Woken or not, the followers look (one of them
                        // takes the eventfd over if it must sleep again).
                        self.woken.notify_all();
                        let capped = !signalled && sl.epoch == *seen;
                        if irq {
                            // The interrupt may have been for a queue that
                            // shares the vector: it looks too.
                            drop(sl);
                            self.wake_siblings();
                            sl = self.sleep.lock().recover();
                        }
                        capped
                    };
                    *seen = sl.epoch;
                    if capped && left >= WAIT_CAP {
                        self.capped_waits.fetch_add(1, Ordering::Relaxed);
                        return true;
                    }
                    return false;
                }
                std::hint::spin_loop();
            }
            _ => {
                // A plain re-check of the phase tag, as SPDK's pollers do: no
                // pause instruction (under QEMU's TCG each one leaves the
                // execution loop and costs microseconds); a yield now and
                // then so a waiter never starves the thread it waits for.
                if *spins % 32768 == 0 {
                    std::thread::yield_now();
                }
            }
        }
        false
    }

    /// Counts a lost wake-up when a wait slept to its cap and the look
    /// after it found work ready.
    pub(super) fn note_look(&self, after_cap: bool, found: bool) {
        if after_cap && found {
            self.lost_wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Signals the eventfd while anyone sleeps on it (interrupt mode).
    pub(super) fn wake_sleepers(&self, mode: Completion) {
        if mode != Completion::Interrupt {
            return;
        }
        let mut sl = self.sleep.lock().recover();
        sl.epoch = sl.epoch.wrapping_add(1);
        self.woken.notify_all();
        let leader = sl.leader;
        drop(sl);
        if leader {
            self.kick();
        }
    }

    pub(super) fn kick(&self) {
        if let Some(k) = &self.kick {
            k.signal();
        }
    }

    /// After draining a shared vector: every other queue on it looks.
    pub(super) fn wake_siblings(&self) {
        for q in self.siblings.get().into_iter().flatten().filter_map(Weak::upgrade) {
            q.note_interrupt();
            q.wake_sleepers(Completion::Interrupt);
        }
    }
}
