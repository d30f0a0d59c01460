//! Stream-ordered I/O on a volume: when the stream reaches the operation,
//! its values (size, offsets; late-bound ones read then) go to the volume's
//! stream thread, which runs it as a synchronous volume request (split
//! across the members, on their devices at once) and writes the bytes moved
//! (or `-errno`) before letting the stream go on.
//!
//! One thread per volume, made at the first stream operation and ended
//! when the volume is: operations of different streams on one volume run
//! one after another (each request itself runs on all its members at
//! once). The buffer must be registered when the operation is enqueued; it
//! stays claimed until the operation has run.

use super::{Inner, Volume};
use crate::batch::BatchOp;
use crate::handle::Segment;
use crate::registry::BufGuard;
use crate::registry::BufferToken;
use crate::stream::{Stream, StreamIo, StreamSignal};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

/// One operation, handed to the stream thread when the stream reaches it.
struct Job {
    volume: Arc<Inner>,
    op: BatchOp,
    buf: BufferToken,
    io: StreamIo,
    _hold: BufGuard,
    signal: StreamSignal,
}

/// The volume's stream thread, by its queue of jobs.
#[derive(Default)]
pub(super) struct StreamThread(Mutex<Option<Sender<Job>>>);

impl StreamThread {
    /// The thread's queue, the thread started at the first call.
    fn queue(&self) -> Result<Sender<Job>> {
        let mut g = self.0.lock().recover();
        if let Some(s) = g.as_ref() {
            return Ok(s.clone());
        }
        let (tx, rx) = channel::<Job>();
        std::thread::Builder::new()
            .name("ugds-volume-stream".into())
            .spawn(move || {
                // Ends when the volume (the last sender) is gone.
                for job in rx {
                    let r = job.io.values().and_then(|(size, file_offset, buf_offset)| {
                        job.volume.rwv(job.op, &[Segment::new(&job.buf, buf_offset, size)], file_offset)
                    });
                    job.io.finish(r);
                    let Job { volume, _hold, signal, .. } = job;
                    // The buffer and the volume released; now the stream may
                    // go on, and whoever waits on it may drop the volume
                    // and find its members closed (not closed later here).
                    drop((_hold, volume));
                    signal.set();
                }
            })
            .map_err(|e| Error::Platform(format!("starting the volume's stream thread: {e}")))?;
        *g = Some(tx.clone());
        Ok(tx)
    }
}

impl Volume {
    /// Reads in stream order: when `stream` reaches this point, `io`'s
    /// size at its namespace offset of the volume goes into `buf` at its
    /// buffer offset (values read then); the bytes read (or `-errno`) are
    /// written before later work on the stream runs. The buffer must be
    /// registered now.
    pub fn read_async(&self, buf: &BufferToken, io: StreamIo, stream: &dyn Stream) -> Result<()> {
        self.stream_op(BatchOp::Read, buf, io, stream)
    }

    /// Writes in stream order; see [`read_async`](Self::read_async).
    pub fn write_async(&self, buf: &BufferToken, io: StreamIo, stream: &dyn Stream) -> Result<()> {
        self.stream_op(BatchOp::Write, buf, io, stream)
    }

    fn stream_op(&self, op: BatchOp, buf: &BufferToken, io: StreamIo, stream: &dyn Stream) -> Result<()> {
        let v = &self.inner;
        // Claimed whole until the operation has run: it cannot be
        // deregistered meanwhile.
        let hold = v.members[0].inner.registry().acquire(buf, 0, buf.len as u64)?;
        let queue = v.stream.queue()?;
        let (volume, buf) = (v.clone(), *buf);
        stream.launch(Box::new(move |signal| {
            let job = Job { volume, op, buf, io, _hold: hold, signal };
            // The thread ends only with the volume, which this job holds.
            if let Err(e) = queue.send(job) {
                let job = e.0;
                job.io.finish(Err(Error::Closed));
                job.signal.set();
            }
        }))
    }
}
