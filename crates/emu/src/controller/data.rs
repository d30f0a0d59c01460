//! Moving data: IOVA translation, the namespace side of a transfer, the I/O
//! worker threads, and bounce buffers for GPU memory.

use super::*;
use ugds_platform::Recover;

pub(super) fn translate_region(table: &IovaTable, iova: u64, len: usize) -> Option<DmaRegion> {
    let host = table.translate(iova, len)?;
    // SAFETY: the range lies in a live IOVA table entry. The controller uses
    // the region only under the table's read lock, and drops or re-translates
    // it whenever the table's version shows that an entry was removed.
    Some(unsafe { DmaRegion::new(host, len, Iova(iova)) })
}

/// A translated data segment: address, length, and the GPU runtime when the
/// address is device memory.
pub(super) type DataSeg = (usize, usize, Option<Arc<dyn DeviceRuntime>>);

/// Moves a command's data between the namespace at byte `off` and the
/// translated segments `segs`.
///
/// # Safety
/// Every segment must stay mapped for the duration of the call (the caller
/// holds the IOVA table's read lock, which unmapping waits for).
pub(super) unsafe fn move_data(
    ns: &Namespace,
    op: NvmOpcode,
    mut off: u64,
    segs: &[DataSeg],
    staging: &mut Option<Bounce>,
) -> Result<(), Status> {
    let direct = matches!(ns.store, Store::DirectFile(_));
    for (addr, l, device) in segs {
        let (addr, l) = (*addr, *l);
        let r = match device {
            None if direct => (|| {
                let buf = bounce(staging, l, None)?;
                // SAFETY: `addr..addr+l` is mapped (this fn's contract) and
                // `buf` is our own page-aligned memory of at least `l` bytes.
                unsafe {
                    if op == NvmOpcode::Read {
                        ns.read_into(off, buf.as_mut_ptr(), l)?;
                        std::ptr::copy_nonoverlapping(buf.as_ptr(), addr as *mut u8, l);
                    } else {
                        std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), l);
                        ns.write_from(off, buf.as_ptr(), l)?;
                    }
                }
                Ok(())
            })(),
            // SAFETY: `addr..addr+l` lies inside an IOVA table entry that
            // stays mapped for the duration of this copy (this fn's contract).
            None => unsafe {
                if op == NvmOpcode::Read {
                    ns.read_into(off, addr as *mut u8, l)
                } else {
                    ns.write_from(off, addr as *const u8, l)
                }
            },
            // GPU memory: through a bounce buffer and the copy engine,
            // standing in for the P2P DMA a real controller does.
            Some(rt) => (|| {
                let buf = bounce(staging, l, Some(rt))?;
                if op == NvmOpcode::Read {
                    // SAFETY: `buf` is our own memory of `l` bytes.
                    unsafe { ns.read_into(off, buf.as_mut_ptr(), l) }.and_then(|()| {
                        // SAFETY: `addr..addr+l` was translated through the
                        // IOVA table from a registered device mapping of
                        // `rt`, which stays mapped for this copy (this fn's
                        // contract).
                        unsafe { rt.copy_to_device(addr as u64, buf) }.map_err(std::io::Error::other)
                    })
                } else {
                    // SAFETY: as above.
                    unsafe { rt.copy_from_device(buf, addr as u64) }
                        .map_err(std::io::Error::other)
                        // SAFETY: as above.
                        .and_then(|()| unsafe { ns.write_from(off, buf.as_ptr(), l) })
                }
            })(),
        };
        if let Err(e) = r {
            tracing::debug!("emulator: data transfer failed: {e}");
            let sc = if op == NvmOpcode::Read {
                ugds_nvme::status::media::UNRECOVERED_READ_ERROR
            } else {
                ugds_nvme::status::media::WRITE_FAULT
            };
            return Err(Status::new(2, sc));
        }
        off += l as u64;
    }
    Ok(())
}

/// A read or write handed to an I/O worker, its PRPs already translated.
pub(super) struct Job {
    pub(super) c: Completion,
    pub(super) op: NvmOpcode,
    pub(super) ns: usize,
    pub(super) off: u64,
    pub(super) len: usize,
    pub(super) segs: Vec<DataSeg>,
}

/// The I/O workers: a queue of jobs, and the finished ones for the
/// controller thread to complete.
pub(super) struct Workers {
    pub(super) tx: Option<std::sync::mpsc::Sender<Job>>,
    pub(super) done: Arc<std::sync::Mutex<Vec<Job>>>,
    pub(super) threads: Vec<std::thread::JoinHandle<()>>,
    /// Jobs sent and not yet collected from `done`.
    pub(super) inflight: usize,
}

impl Workers {
    /// `n` threads named `ugds-emu-{name}N`. A worker holds the IOVA table
    /// while it copies to or from host memory, so that unmapping waits for
    /// it; not for a job all on GPU memory (it touches no mapped host
    /// memory, and the runtime's copy may wait long), so registering and
    /// unmapping never wait for the GPU runtime.
    pub(super) fn start(n: usize, name: &str, shared: &Arc<Shared>, ns: &Arc<Vec<Namespace>>) -> Workers {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let done = Arc::new(std::sync::Mutex::new(Vec::new()));
        let threads = (0..n)
            .filter_map(|i| {
                let (rx, done, shared, ns) = (rx.clone(), done.clone(), shared.clone(), ns.clone());
                std::thread::Builder::new()
                    .name(format!("ugds-emu-{name}{i}"))
                    .spawn(move || {
                        let mut staging = None;
                        loop {
                            let job = rx.lock().recover().recv();
                            let Ok(mut job) = job else { break };
                            {
                                // Held for the copy: unmapping waits for it.
                                let host = job.segs.iter().any(|s| s.2.is_none());
                                let _table = host.then(|| shared.iova.read().recover());
                                // SAFETY: translated by the controller; the
                                // driver unmaps a buffer only after its
                                // commands completed, and a reset waits for
                                // every job first. Without the table held,
                                // every segment is device memory, reached
                                // only through the runtime it names.
                                let r = unsafe { move_data(&ns[job.ns], job.op, job.off, &job.segs, &mut staging) };
                                if let Err(s) = r {
                                    job.c.status = s;
                                }
                            }
                            done.lock().recover().push(job);
                            shared.wake();
                        }
                    })
                    .ok()
            })
            .collect();
        Workers { tx: Some(tx), done, threads, inflight: 0 }
    }

    /// Waits until every job sent has finished.
    pub(super) fn drain(&mut self) -> Vec<Job> {
        let mut all = Vec::new();
        while all.len() < self.inflight {
            all.append(&mut self.done.lock().recover());
            if all.len() < self.inflight {
                std::thread::yield_now();
            }
        }
        self.inflight = 0;
        all
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

pub(super) fn same_target(a: Option<&Arc<dyn DeviceRuntime>>, b: Option<&Arc<dyn DeviceRuntime>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

/// Page-aligned bounce memory, page-locked by a GPU runtime when it is used
/// for GPU transfers (so the copy engine reads and writes it directly).
pub(super) struct Bounce {
    pub(super) mem: std::mem::ManuallyDrop<Anonymous>,
    pub(super) pinned_by: Option<Arc<dyn DeviceRuntime>>,
}

/// Pinned bounce memory no emulator uses now, kept for the next one and
/// never unpinned: `cuMemHostUnregister` waits for every stream of the
/// context while holding the CUDA driver's process-wide lock (measured on an
/// H200), so unpinning while a stream waits on an emulated I/O would block
/// the copy that I/O needs, in any context, until it timed out.
static PINNED_BOUNCE: std::sync::Mutex<Vec<(Anonymous, Arc<dyn DeviceRuntime>)>> = std::sync::Mutex::new(Vec::new());

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: taken once, here; `mem` is not used after.
        let mem = unsafe { std::mem::ManuallyDrop::take(&mut self.mem) };
        match self.pinned_by.take() {
            Some(rt) => PINNED_BOUNCE.lock().recover().push((mem, rt)),
            None => drop(mem),
        }
    }
}

/// The first `len` bytes of the bounce buffer, grown (to a power of two, at
/// least 4 MiB) as needed and pinned by `rt` when given.
pub(super) fn bounce<'a>(
    staging: &'a mut Option<Bounce>,
    len: usize,
    rt: Option<&Arc<dyn DeviceRuntime>>,
) -> std::io::Result<&'a mut [u8]> {
    let fits = staging.as_ref().is_some_and(|b| {
        b.mem.len() >= len
            && match (rt, &b.pinned_by) {
                (Some(r), Some(p)) => Arc::ptr_eq(r, p),
                (Some(_), None) => false,
                (None, _) => true,
            }
    });
    if !fits {
        let size = staging.as_ref().map_or(0, |b| b.mem.len()).max(len.next_power_of_two()).max(4 << 20);
        *staging = None;
        let parked = rt.and_then(|r| {
            let mut pool = PINNED_BOUNCE.lock().recover();
            let i = pool.iter().position(|(m, p)| m.len() >= size && Arc::ptr_eq(r, p))?;
            Some(pool.swap_remove(i))
        });
        *staging = Some(match parked {
            Some((mem, rt)) => Bounce { mem: std::mem::ManuallyDrop::new(mem), pinned_by: Some(rt) },
            None => {
                let mem = Anonymous::populated(size).map_err(std::io::Error::other)?;
                // Best effort: unpinned memory still works, only slower.
                let pinned_by = rt.filter(|r| r.host_register(mem.as_ptr(), size)).cloned();
                Bounce { mem: std::mem::ManuallyDrop::new(mem), pinned_by }
            }
        });
    }
    let b = staging.as_ref().expect("just set");
    // SAFETY: our own mapping of at least `len` bytes, borrowed mutably
    // through `staging`.
    Ok(unsafe { std::slice::from_raw_parts_mut(b.mem.as_ptr(), len) })
}
