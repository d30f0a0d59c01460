//! Interrupt vectors for controllers whose completions arrive on file
//! descriptors rather than as MSI-X messages: a socket (NVMe/TCP), an RDMA
//! completion channel (NVMe/RDMA). A queue that sleeps between looks has
//! its descriptor watched; a thread of the platform waiting in epoll
//! signals the queue's vector (an eventfd, as a controller's MSI-X would)
//! when the descriptor becomes readable. Watching is one shot: the queue
//! watches again after each look ([`ReadinessVectors::rearm`]), and a
//! descriptor readable by then signals at once, so a wake-up is never lost
//! between a look and the next sleep.

use crate::sys::EventFd;
use crate::{Error, Recover, Result};
use rustix::event::epoll;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// The epoll data of the poller's stop eventfd.
const STOP: u64 = u64::MAX;

/// Vectors signalled by readable descriptors; see the module docs.
#[derive(Debug)]
pub struct ReadinessVectors {
    vectors: Arc<[EventFd]>,
    /// Started at the first watched descriptor.
    poller: Mutex<Option<Poller>>,
    /// The poller thread's name.
    name: &'static str,
}

/// The thread that turns readable descriptors into vector signals.
#[derive(Debug)]
struct Poller {
    epoll: Arc<OwnedFd>,
    stop: Arc<EventFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl ReadinessVectors {
    /// `count` vectors, their poller thread (named `name`) started when the
    /// first descriptor is watched.
    pub fn new(count: u16, name: &'static str) -> Result<ReadinessVectors> {
        let vectors = (0..count).map(|_| EventFd::new()).collect::<Result<Vec<_>>>()?.into();
        Ok(ReadinessVectors { vectors, poller: Mutex::new(None), name })
    }

    /// How many vectors there are.
    pub fn count(&self) -> u16 {
        self.vectors.len() as u16
    }

    /// Vector `vector`'s eventfd, if there is such a vector.
    pub fn get(&self, vector: u16) -> Option<&EventFd> {
        self.vectors.get(vector as usize)
    }

    /// Signals `vector` once when `fd` has something to read (or is
    /// closed); [`rearm`](Self::rearm) after each look for the next time.
    pub fn watch(&self, fd: BorrowedFd<'_>, vector: u16) -> Result<()> {
        if vector >= self.count() {
            return Err(Error::InvalidArgument(format!("no interrupt vector {vector}")));
        }
        let mut g = self.poller.lock().recover();
        if g.is_none() {
            *g = Some(self.start_poller()?);
        }
        let p = g.as_ref().expect("started above");
        epoll::add(&*p.epoll, fd, epoll::EventData::new_u64(vector as u64), readable())
            .map_err(|e| Error::io("epoll_ctl ADD", e.into()))
    }

    /// Watches `fd` again (see [`watch`](Self::watch)): signalled at once
    /// if it has something to read now.
    pub fn rearm(&self, fd: BorrowedFd<'_>, vector: u16) -> Result<()> {
        let g = self.poller.lock().recover();
        let Some(p) = g.as_ref() else { return Err(Error::InvalidArgument("descriptor not watched".into())) };
        epoll::modify(&*p.epoll, fd, epoll::EventData::new_u64(vector as u64), readable())
            .map_err(|e| Error::io("epoll_ctl MOD", e.into()))
    }

    /// Stops watching `fd`.
    pub fn unwatch(&self, fd: BorrowedFd<'_>) {
        if let Some(p) = self.poller.lock().recover().as_ref() {
            let _ = epoll::delete(&*p.epoll, fd);
        }
    }

    fn start_poller(&self) -> Result<Poller> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| Error::io("epoll_create1", e.into()))?;
        let epoll = Arc::new(ep);
        let stop = Arc::new(EventFd::new()?);
        epoll::add(&*epoll, stop.as_fd(), epoll::EventData::new_u64(STOP), epoll::EventFlags::IN)
            .map_err(|e| Error::io("epoll_ctl ADD", e.into()))?;
        let (ep, st, vectors, name) = (epoll.clone(), stop.clone(), self.vectors.clone(), self.name);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _keep = st;
                let none = epoll::Event { flags: epoll::EventFlags::empty(), data: epoll::EventData::new_u64(0) };
                let mut events = [none; 64];
                loop {
                    let n = match epoll::wait(&*ep, &mut events[..], None) {
                        Ok(n) => n,
                        Err(rustix::io::Errno::INTR) => continue,
                        Err(e) => {
                            tracing::error!("{name}: epoll_wait: {e}; queues fall back to capped waits");
                            return;
                        }
                    };
                    for e in &events[..n] {
                        match e.data.u64() {
                            STOP => return,
                            v => vectors[v as usize].signal(),
                        }
                    }
                }
            })
            .map_err(|e| Error::io("spawn an interrupt thread", e))?;
        Ok(Poller { epoll, stop, thread: Some(thread) })
    }
}

/// Readable (or closed), once per arming.
fn readable() -> epoll::EventFlags {
    epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A watched descriptor signals its vector once per arming, at once
    /// when it is already readable as it is armed again.
    #[test]
    fn a_readable_descriptor_signals_its_vector_once_per_arming() {
        let v = ReadinessVectors::new(4, "ugds-test-irq").unwrap();
        let source = EventFd::new().unwrap();
        assert!(v.watch(source.as_fd(), 4).is_err(), "no vector 4");
        v.watch(source.as_fd(), 2).unwrap();
        let irq = v.get(2).unwrap();
        assert!(!irq.wait(Duration::from_millis(50)), "nothing readable yet");
        source.signal();
        assert!(irq.wait(Duration::from_secs(5)), "signalled when readable");
        irq.drain();
        // One shot: still readable, but not watched until armed again.
        assert!(!irq.wait(Duration::from_millis(50)));
        v.rearm(source.as_fd(), 2).unwrap();
        assert!(irq.wait(Duration::from_secs(5)), "readable when armed again: at once");
        irq.drain();
        assert!(!v.get(1).unwrap().wait(Duration::ZERO), "other vectors untouched");
        v.unwatch(source.as_fd());
        assert!(v.rearm(source.as_fd(), 2).is_err(), "no longer watched");
    }
}
