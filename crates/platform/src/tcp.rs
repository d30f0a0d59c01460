//! A controller at the other end of an NVMe/TCP connection. What it needs
//! of a platform is memory: the connection's queues copy each command's
//! data between the socket and the caller's buffer themselves, so host
//! memory is addressed by its own virtual address (a command's data is
//! contiguous there), and GPU memory by a window above
//! [`DEVICE_IOVA_BASE`](crate::window::DEVICE_IOVA_BASE) that the queues
//! copy through pinned host buffers ([`crate::window`]). It has no
//! registers: the engine speaks to the controller through the connection
//! (Property Get and Set). Its interrupts are the sockets': a queue that
//! sleeps between looks has its socket watched ([`TcpPlatform::watch`]),
//! and a thread of the platform waiting in epoll signals the queue's vector
//! (an eventfd, as a controller's MSI-X would) when data arrives.

use crate::device::{DeviceMemory, DeviceRuntime};
use crate::dma::DmaBuffer;
use crate::sys::EventFd;
use crate::window::DeviceWindows;
use crate::{Error, HostMapping, Platform, Recover, Result};
use rustix::event::epoll;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use ugds_nvme::regs;

/// Interrupt vectors (eventfds) a controller over TCP has.
const VECTORS: u16 = 64;

/// The epoll data of the poller's stop eventfd.
const STOP: u64 = u64::MAX;

/// The memory side of an NVMe/TCP controller; see the module docs.
#[derive(Debug)]
pub struct TcpPlatform {
    /// `host:port`, and the subsystem's NQN.
    addr: String,
    subnqn: String,
    devices: DeviceWindows,
    vectors: Arc<[EventFd]>,
    /// Started at the first watched socket.
    poller: Mutex<Option<Poller>>,
}

/// The thread that turns readable sockets into vector signals.
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

impl TcpPlatform {
    /// The platform of the controller of `subnqn` at `addr` (for what it
    /// says of itself; nothing is connected here).
    pub fn new(addr: &str, subnqn: &str) -> Result<TcpPlatform> {
        let vectors = (0..VECTORS).map(|_| EventFd::new()).collect::<Result<Vec<_>>>()?.into();
        Ok(TcpPlatform {
            addr: addr.to_string(),
            subnqn: subnqn.to_string(),
            devices: DeviceWindows::default(),
            vectors,
            poller: Mutex::new(None),
        })
    }

    /// Signals `vector` once when `socket` has something to read (or is
    /// closed); [`rearm`](Self::rearm) after each look for the next time.
    pub fn watch(&self, socket: BorrowedFd<'_>, vector: u16) -> Result<()> {
        if vector >= VECTORS {
            return Err(Error::InvalidArgument(format!("no interrupt vector {vector}")));
        }
        let mut g = self.poller.lock().recover();
        if g.is_none() {
            *g = Some(self.start_poller()?);
        }
        let p = g.as_ref().expect("started above");
        epoll::add(&*p.epoll, socket, epoll::EventData::new_u64(vector as u64), readable())
            .map_err(|e| Error::io("epoll_ctl ADD", e.into()))
    }

    /// Watches `socket` again (see [`watch`](Self::watch)): signalled at
    /// once if it has something to read now.
    pub fn rearm(&self, socket: BorrowedFd<'_>, vector: u16) -> Result<()> {
        let g = self.poller.lock().recover();
        let Some(p) = g.as_ref() else { return Err(Error::InvalidArgument("socket not watched".into())) };
        epoll::modify(&*p.epoll, socket, epoll::EventData::new_u64(vector as u64), readable())
            .map_err(|e| Error::io("epoll_ctl MOD", e.into()))
    }

    /// Stops watching `socket`.
    pub fn unwatch(&self, socket: BorrowedFd<'_>) {
        if let Some(p) = self.poller.lock().recover().as_ref() {
            let _ = epoll::delete(&*p.epoll, socket);
        }
    }

    fn start_poller(&self) -> Result<Poller> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| Error::io("epoll_create1", e.into()))?;
        let epoll = Arc::new(ep);
        let stop = Arc::new(EventFd::new()?);
        epoll::add(&*epoll, stop.as_fd(), epoll::EventData::new_u64(STOP), epoll::EventFlags::IN)
            .map_err(|e| Error::io("epoll_ctl ADD", e.into()))?;
        let (ep, st, vectors) = (epoll.clone(), stop.clone(), self.vectors.clone());
        let thread = std::thread::Builder::new()
            .name("ugds-tcp-irq".into())
            .spawn(move || {
                let _keep = st;
                let none = epoll::Event { flags: epoll::EventFlags::empty(), data: epoll::EventData::new_u64(0) };
                let mut events = [none; 64];
                loop {
                    let n = match epoll::wait(&*ep, &mut events[..], None) {
                        Ok(n) => n,
                        Err(rustix::io::Errno::INTR) => continue,
                        Err(e) => {
                            tracing::error!(
                                "NVMe/TCP interrupt thread: epoll_wait: {e}; queues fall back to capped waits"
                            );
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
            .map_err(|e| Error::io("spawn the NVMe/TCP interrupt thread", e))?;
        Ok(Poller { epoll, stop, thread: Some(thread) })
    }

    /// The GPU memory at window address `addr` for `len` bytes (see
    /// [`DeviceWindows::at`]).
    pub fn device_at(&self, addr: u64, len: usize) -> Option<(u64, Arc<dyn DeviceRuntime>)> {
        self.devices.at(addr, len)
    }
}

impl Platform for TcpPlatform {
    fn describe(&self) -> String {
        format!("NVMe/TCP controller of {} at {} (ugds's initiator)", self.subnqn, self.addr)
    }

    /// No registers here: ready, as far as the engine's register reads go
    /// (the controller's own status comes through Property Get).
    fn read32(&self, off: usize) -> u32 {
        (off == regs::CSTS) as u32
    }

    fn write32(&self, _off: usize, _val: u32) {}

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        DmaBuffer::anonymous(len)
    }

    unsafe fn map_host(&self, vaddr: *mut u8, len: usize) -> Result<HostMapping> {
        HostMapping::identity(vaddr, len)
    }

    unsafe fn map_device(&self, mem: &DeviceMemory) -> Result<HostMapping> {
        Ok(self.devices.map(mem))
    }

    fn copies_device_memory(&self) -> bool {
        true
    }

    fn unmap_host(&self, mapping: &HostMapping) -> Result<()> {
        self.devices.unmap(mapping);
        Ok(())
    }

    fn interrupt(&self, vector: u16) -> Result<Option<&EventFd>> {
        Ok(self.vectors.get(vector as usize))
    }

    fn interrupt_vectors(&self) -> u16 {
        VECTORS
    }
}

/// Readable (or closed), once per arming.
fn readable() -> epoll::EventFlags {
    epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT
}
