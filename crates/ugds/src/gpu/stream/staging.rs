//! Staging blocks: device-mapped host memory that staged operations move
//! their data through (see the parent module's docs).

use super::words::{has_passed, Slot};
use super::StreamBackend;
use std::sync::{Arc, Mutex, OnceLock};
use ugds_platform::Recover;
use ugds_platform::Result;

/// Bytes at the start of a staging block that hold its copies' parameters,
/// one [`PIECE_HEADER`] per piece (`dst`, `src`, `len`: device addresses
/// and a byte count, 64-bit each); the data follows, page-aligned for the
/// controller.
pub(crate) const STAGE_HEADER: usize = 4096;
/// Bytes of one piece's copy parameters in the header.
const PIECE_HEADER: usize = 32;
/// The most pieces a block's data is copied in (each by a kernel of its
/// own, after its own wait: see `GpuStream::launch_staged`).
pub(crate) const MAX_PIECES: usize = 16;
const _: () = assert!(MAX_PIECES * PIECE_HEADER <= STAGE_HEADER);
/// The smallest staging block's data capacity.
const STAGE_MIN: usize = 64 << 10;
/// The largest: one staged request moves at most this many bytes.
pub(crate) const STAGE_MAX: usize = 256 << 20;

/// One staging block: device-mapped host memory, header then data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    host: usize,
    dev: u64,
    /// Data bytes after the header.
    cap: usize,
}

/// Staging blocks of one runtime context. Like word pages they are never
/// given back to the runtime (freeing pinned memory waits for the device);
/// a block is reused once the stream that used it has passed the copy.
#[derive(Default)]
pub(crate) struct StagePool {
    free: Vec<Block>,
    /// Blocks given back, with the stream slot and `passed` value after
    /// their copy.
    retired: Vec<(Block, Slot, u32)>,
    /// Bytes allocated.
    bytes: usize,
}

impl StagePool {
    /// A free block of at least `want` bytes, after moving the blocks the
    /// GPU is done with to `free`.
    fn take_free(&mut self, want: usize) -> Option<Block> {
        let free = &mut self.free;
        self.retired.retain(|(b, slot, v)| {
            let gone = has_passed(slot, *v);
            if gone {
                free.push(*b);
            }
            !gone
        });
        let best = self.free.iter().enumerate().filter(|(_, b)| b.cap >= want).min_by_key(|(_, b)| b.cap);
        best.map(|(i, _)| i).map(|i| self.free.swap_remove(i))
    }

    /// A block of at least `want` bytes: a free one, or a new one. The
    /// runtime is called without the pool's lock held: the completion path
    /// takes that lock to give blocks back, and a runtime call may wait
    /// for the device, which may be waiting for that completion.
    fn take(pool: &Mutex<StagePool>, backend: &dyn StreamBackend, want: usize) -> Result<Block> {
        if let Some(b) = pool.lock().recover().take_free(want) {
            return Ok(b);
        }
        let cap = want.next_power_of_two().clamp(STAGE_MIN, STAGE_MAX);
        let (host, dev) = backend.alloc_stage(STAGE_HEADER + cap)?;
        let mut p = pool.lock().recover();
        p.bytes += STAGE_HEADER + cap;
        tracing::debug!(bytes = p.bytes, retired = p.retired.len(), "staging block of {cap} bytes allocated");
        Ok(Block { host, dev, cap })
    }
}

/// A staging block lent to one stream operation. Given back with
/// [`give_back`](Self::give_back) once the controller is done with it (the
/// I/O completed and its registration is gone); dropped otherwise, it is
/// kept out of use for the process's life, since the controller may still
/// reach it.
pub(crate) struct StageLease {
    backend: Arc<dyn StreamBackend>,
    block: Block,
    mark: StageMark,
}

/// The stream slot and `passed` value after a staged operation's copies,
/// shared by its leases; set under the stream's lock before anything of
/// the operation is enqueued.
#[derive(Clone, Default)]
pub(crate) struct StageMark(pub(super) Arc<OnceLock<(Slot, u32)>>);

impl StageLease {
    /// A block of at least `want` data bytes from `pool`, for the operation
    /// `mark` will name; its copies set to nothing.
    pub(super) fn lend(
        pool: &Mutex<StagePool>,
        backend: &Arc<dyn StreamBackend>,
        want: usize,
        mark: &StageMark,
    ) -> Result<StageLease> {
        let block = StagePool::take(pool, &**backend, want)?;
        backend.stage_lent(block.dev, want);
        let lease = StageLease { backend: backend.clone(), block, mark: mark.clone() };
        for piece in 0..MAX_PIECES {
            lease.set_piece(piece, true, 0, 0, 0);
        }
        Ok(lease)
    }

    /// The block's data: host address and capacity.
    pub(crate) fn data(&self) -> (*mut u8, usize) {
        ((self.block.host + STAGE_HEADER) as *mut u8, self.block.cap)
    }

    /// Device address of piece `piece`'s copy parameters, the copy
    /// kernel's argument.
    pub(crate) fn header_dev(&self, piece: usize) -> u64 {
        assert!(piece < MAX_PIECES);
        self.block.dev + (piece * PIECE_HEADER) as u64
    }

    /// Sets piece `piece`'s copy: `len` bytes from the block's data at
    /// offset `at` to device address `user` (`to_user`), or from `user`
    /// into the block at `at`. A length of 0 (the state a block is lent
    /// in) copies nothing.
    pub(crate) fn set_piece(&self, piece: usize, to_user: bool, at: usize, user: u64, len: usize) {
        assert!(piece < MAX_PIECES && at + len <= self.block.cap);
        let data = self.block.dev + (STAGE_HEADER + at) as u64;
        let (dst, src) = if to_user { (user, data) } else { (data, user) };
        let h = (self.block.host + piece * PIECE_HEADER) as *mut u64;
        // SAFETY: one piece's 24 bytes of the header, in a block only this
        // lease uses. The GPU reads them only after the host part that
        // sets them (the binding, or the piece's I/O) has stored the
        // `done` value its copy waits for, with Release.
        unsafe {
            h.write_volatile(dst);
            h.add(1).write_volatile(src);
            h.add(2).write_volatile(len as u64);
        }
    }

    /// One copy (piece 0) from the start of the block's data; see
    /// [`set_piece`](Self::set_piece).
    pub(crate) fn set_copy(&self, to_user: bool, user: u64, len: usize) {
        self.set_piece(0, to_user, 0, user, len)
    }

    /// Cuts piece `piece`'s copy to `len` bytes (what its I/O moved; 0
    /// after an error), before the stream is let run it.
    pub(crate) fn cut_piece(&self, piece: usize, len: usize) {
        assert!(piece < MAX_PIECES);
        let h = (self.block.host + piece * PIECE_HEADER) as *mut u64;
        // SAFETY: as in `set_piece`; the length alone, only ever lowered.
        unsafe {
            let old = h.add(2).read_volatile();
            h.add(2).write_volatile(old.min(len as u64));
        }
    }

    /// Returns the block to its pool, to be reused once the GPU has passed
    /// the operation's copy. A lease of an operation never launched is kept
    /// out of use instead.
    pub(crate) fn give_back(self) {
        let Some(&(slot, v)) = self.mark.0.get() else { return };
        let mut pool = match self.backend.stage_pool() {
            Some(p) => p.lock().recover(),
            None => return,
        };
        pool.retired.push((self.block, slot, v));
    }
}
