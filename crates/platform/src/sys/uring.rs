//! io_uring, for the kernel path: one ring per queue, the file's
//! descriptors registered (fixed files), and the operations the kernel path
//! needs: reads, writes, syncs, allocations, and NVMe commands passed
//! through to a namespace the kernel keeps (`IORING_OP_URING_CMD` on its
//! generic character device, in a ring of 128-byte submission and 32-byte
//! completion entries).

use super::EventFd;
use crate::{Error, Result};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::os::fd::{AsRawFd, BorrowedFd};

/// `NVME_URING_CMD_IO`: `_IOWR('N', 0x80, struct nvme_uring_cmd)`.
pub const NVME_URING_CMD_IO: u32 = 0xc048_4e80;

/// Linux's `struct nvme_uring_cmd` (72 bytes, at the start of the 80-byte
/// command area of a 128-byte submission entry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct NvmeUringCmd {
    /// Opcode.
    pub opcode: u8,
    /// Flags (none used).
    pub flags: u8,
    /// Reserved.
    pub rsvd1: u16,
    /// Namespace.
    pub nsid: u32,
    /// Command dwords 2 and 3.
    pub cdw2: u32,
    /// Command dword 3.
    pub cdw3: u32,
    /// Metadata buffer (none used).
    pub metadata: u64,
    /// Data buffer (a virtual address: the kernel builds the PRPs).
    pub addr: u64,
    /// Metadata length.
    pub metadata_len: u32,
    /// Data length in bytes.
    pub data_len: u32,
    /// Command dwords 10 to 15.
    pub cdw10: u32,
    /// Command dword 11.
    pub cdw11: u32,
    /// Command dword 12.
    pub cdw12: u32,
    /// Command dword 13.
    pub cdw13: u32,
    /// Command dword 14.
    pub cdw14: u32,
    /// Command dword 15.
    pub cdw15: u32,
    /// Timeout (0: the kernel's default).
    pub timeout_ms: u32,
    /// Reserved.
    pub rsvd2: u32,
}

const _: () = assert!(std::mem::size_of::<NvmeUringCmd>() == 72);

/// `NVME_IOCTL_ID`: `_IO('N', 0x40)`, the namespace id of a namespace's device.
const NVME_IOCTL_ID: libc::c_ulong = 0x4e40;
/// `NVME_IOCTL_ADMIN_CMD`: `_IOWR('N', 0x41, struct nvme_admin_cmd)`.
const NVME_IOCTL_ADMIN_CMD: libc::c_ulong = 0xc048_4e41;

const _: () = assert!((NVME_IOCTL_ADMIN_CMD >> 16) & 0x3fff == std::mem::size_of::<NvmeUringCmd>() as libc::c_ulong);
const _: () = assert!((NVME_URING_CMD_IO >> 16) & 0x3fff == std::mem::size_of::<NvmeUringCmd>() as u32);

/// Identify Controller (CNS 1) through the kernel's admin passthrough
/// (root): the 4 KiB data structure.
pub fn nvme_identify_controller(fd: BorrowedFd<'_>) -> Result<Box<[u8; 4096]>> {
    nvme_identify(fd, 0, 1)
}

/// The namespace id of an NVMe namespace's block or generic character device.
pub fn nvme_namespace_id(fd: BorrowedFd<'_>) -> Result<u32> {
    // SAFETY: NVME_IOCTL_ID takes no argument and returns the id.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), NVME_IOCTL_ID) };
    if r <= 0 {
        return Err(Error::os("ioctl(NVME_IOCTL_ID)"));
    }
    Ok(r as u32)
}

/// Identify Namespace (CNS 0) of `nsid` through the kernel's admin
/// passthrough (root): the 4 KiB data structure.
pub fn nvme_identify_namespace(fd: BorrowedFd<'_>, nsid: u32) -> Result<Box<[u8; 4096]>> {
    nvme_identify(fd, nsid, 0)
}

fn nvme_identify(fd: BorrowedFd<'_>, nsid: u32, cns: u32) -> Result<Box<[u8; 4096]>> {
    let mut data = Box::new([0u8; 4096]);
    // `struct nvme_admin_cmd` has `struct nvme_uring_cmd`'s layout (its
    // last field is the result).
    let mut cmd = NvmeUringCmd {
        opcode: 0x06,
        nsid,
        addr: data.as_mut_ptr() as u64,
        data_len: 4096,
        cdw10: cns,
        ..Default::default()
    };
    // SAFETY: the kernel reads the 72-byte command (size checked above
    // against the request number) and writes 4096 bytes at `addr`, which
    // `data` holds for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), NVME_IOCTL_ADMIN_CMD, &mut cmd as *mut NvmeUringCmd) };
    match r {
        0 => Ok(data),
        r if r < 0 => Err(Error::os("ioctl(NVME_IOCTL_ADMIN_CMD, Identify)")),
        status => Err(Error::Nvme { op: "Identify", status: ugds_nvme::Status::from_field((status as u16) << 1) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot that holds a passthrough command is not written again until
    /// that command's completion is reaped, however far the tail has come
    /// round; other entries never hold theirs.
    #[test]
    fn a_slot_is_written_again_only_after_its_command_completed() {
        let mut s = SqSlots::new(4);
        let held = s.pushed(s.next().unwrap(), true);
        assert_eq!(held, 1 << SLOT_SHIFT);
        for _ in 0..3 {
            let slot = s.next().unwrap();
            assert_eq!(s.pushed(slot, false), 0);
        }
        // Round to slot 0: its command is in flight.
        assert_eq!(s.next(), None);
        // Its completion frees it, and the caller gets its own user data.
        assert_eq!(s.completed(held | 7), 7);
        assert_eq!(s.next(), Some(0));
        // A completion without a slot (a plain entry) changes nothing.
        assert_eq!(s.completed(9), 9);
        assert_eq!(s.next(), Some(0));
    }

    #[test]
    fn the_passthrough_command_is_laid_out_as_linux_reads_it() {
        let c = NvmeUringCmd {
            opcode: 2,
            nsid: 7,
            addr: 0x1122_3344_5566_7788,
            data_len: 4096,
            cdw10: 0xaabb_ccdd,
            cdw11: 1,
            cdw12: 7,
            ..Default::default()
        };
        let b = c.bytes();
        let word = |off: usize| u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
        assert_eq!((b[0], word(4)), (2, 7));
        assert_eq!(u64::from_le_bytes(b[24..32].try_into().unwrap()), 0x1122_3344_5566_7788);
        assert_eq!((word(36), word(40), word(44), word(48)), (4096, 0xaabb_ccdd, 1, 7));
        assert!(b[72..].iter().all(|&x| x == 0));
    }
}

impl NvmeUringCmd {
    fn bytes(&self) -> [u8; 80] {
        let mut out = [0u8; 80];
        let words = [
            self.opcode as u32 | (self.flags as u32) << 8 | (self.rsvd1 as u32) << 16,
            self.nsid,
            self.cdw2,
            self.cdw3,
            self.metadata as u32,
            (self.metadata >> 32) as u32,
            self.addr as u32,
            (self.addr >> 32) as u32,
            self.metadata_len,
            self.data_len,
            self.cdw10,
            self.cdw11,
            self.cdw12,
            self.cdw13,
            self.cdw14,
            self.cdw15,
            self.timeout_ms,
            self.rsvd2,
        ];
        for (i, w) in words.iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        out
    }
}

/// One operation on a registered file (`file` is its index in the
/// registration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Reads `len` bytes at `offset` into `addr`.
    Read {
        /// Registered file index.
        file: u32,
        /// Destination.
        addr: *mut u8,
        /// Bytes.
        len: u32,
        /// File offset.
        offset: u64,
        /// The registered buffer holding `addr..addr + len`, if one does
        /// (see [`Ring::fixed_buffer`]): the kernel then pins nothing.
        buffer: Option<u16>,
        /// `RWF_NOWAIT`: a buffered read takes only what the page cache
        /// holds (a short read), or fails with `EAGAIN` when it holds none.
        nowait: bool,
        /// `IOSQE_ASYNC`: run by one of the kernel's io-wq workers, not
        /// inline in `io_uring_enter`, so that several buffered reads copy
        /// the page cache on several CPUs at once.
        offload: bool,
    },
    /// Writes `len` bytes from `addr` at `offset`.
    Write {
        /// Registered file index.
        file: u32,
        /// Source.
        addr: *const u8,
        /// Bytes.
        len: u32,
        /// File offset.
        offset: u64,
        /// As for `Read`.
        buffer: Option<u16>,
    },
    /// `fdatasync` (or `fsync` without `data_only`).
    Sync {
        /// Registered file index.
        file: u32,
        /// Data (and what is needed to read it back) only.
        data_only: bool,
    },
    /// Nothing (completes with 0): stands for a command refused at
    /// submission, so that its refusal arrives as a completion.
    Nop,
    /// An NVMe I/O command passed through to the namespace behind a
    /// generic character device (a passthrough ring only). Completes with
    /// the NVMe status (0: success; positive: the status field without its
    /// phase bit) or `-errno`, and DW0 as the extra result.
    Nvme {
        /// Registered file index.
        file: u32,
        /// The command.
        cmd: NvmeUringCmd,
    },
    /// `fallocate` with `mode` over `len` bytes at `offset`.
    Allocate {
        /// Registered file index.
        file: u32,
        /// `FALLOC_FL_*` flags.
        mode: i32,
        /// File offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

/// An io_uring instance: plain, or with big entries for NVMe passthrough.
pub struct Ring {
    ring: Kind,
    /// What each slot of the sparse registered-buffer table holds: the
    /// generation of the buffer registered there (0: nothing); `None`
    /// where the kernel has no such table (before 5.19).
    fixed: Option<Box<[u32]>>,
    /// NVMe passthrough rings: which submission slots hold a command the
    /// kernel may still read (see [`SqSlots`]).
    slots: Option<SqSlots>,
}

/// The submission slots of a passthrough ring, and which of them hold a
/// command not yet completed.
///
/// The kernel may read a passthrough command's entry after the
/// `io_uring_enter` that submitted it has returned: seen on Linux 6.12
/// (QEMU's controller with mdts=1 and mqes=1, where nearly every command
/// waits for the device's one tag in io-wq), a command issued late read
/// its slot after a newer command had been written there, ran that one
/// instead, and completed as a success with its own data never moved. So
/// a slot is written again only once the command it held has completed:
/// until then a push that would land on it is refused as if the ring were
/// full. Entries are written at the ring's tail in turn (the io-uring
/// crate's queue), so the slot of the next push is `tail` modulo the
/// ring's size; a command's slot rides in its user data's top 16 bits.
#[derive(Debug)]
struct SqSlots {
    /// Slot `i` holds a passthrough command not yet completed.
    busy: Box<[bool]>,
    /// Entries pushed so far (the queue's tail).
    tail: u32,
}

/// The user data bits [`SqSlots`] keeps a command's slot in (plus one).
const SLOT_SHIFT: u32 = 48;

impl SqSlots {
    fn new(entries: u32) -> SqSlots {
        debug_assert!(entries.is_power_of_two());
        SqSlots { busy: vec![false; entries as usize].into_boxed_slice(), tail: 0 }
    }

    /// The slot the next push writes, if no command the kernel may still
    /// read is there.
    fn next(&self) -> Option<usize> {
        let slot = self.tail as usize & (self.busy.len() - 1);
        (!self.busy[slot]).then_some(slot)
    }

    /// A push wrote `slot`; `held`: with a command the kernel may read
    /// late. Returns the user data bits that name the slot.
    fn pushed(&mut self, slot: usize, held: bool) -> u64 {
        self.tail = self.tail.wrapping_add(1);
        self.busy[slot] = held;
        if held {
            (slot as u64 + 1) << SLOT_SHIFT
        } else {
            0
        }
    }

    /// A completion's user data: its slot freed, the caller's part returned.
    fn completed(&mut self, user_data: u64) -> u64 {
        if let Some(slot) = (user_data >> SLOT_SHIFT).checked_sub(1) {
            if let Some(b) = self.busy.get_mut(slot as usize) {
                *b = false;
            }
        }
        user_data & ((1 << SLOT_SHIFT) - 1)
    }
}

/// Slots in each ring's registered-buffer table: the kernel path's bounce
/// buffers take `0..BOUNCE_BUFFERS`, the caller's registered host memory
/// the rest. The kernel fills the whole table when a ring is made, so
/// every slot costs each handle's open (2048 slots were about a quarter of
/// a 21-ring open); memory beyond the slots is pinned per I/O instead.
pub const FIXED_BUFFERS: u16 = 512;

/// Slots for bounce buffers (see [`FIXED_BUFFERS`]).
pub const BOUNCE_BUFFERS: u16 = 256;

/// The largest buffer io_uring registers.
pub const FIXED_BUFFER_MAX: usize = 1 << 30;

/// Set once a copy of a registered-buffer table failed: the kernel has no
/// `IORING_REGISTER_CLONE_BUFFERS` with offsets (before 6.13).
static NO_FIXED_COPIES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether rings may copy registered buffers from a source ring
/// ([`Ring::copy_fixed_from`]): true until a copy failed in this process.
pub fn fixed_copies() -> bool {
    !NO_FIXED_COPIES.load(std::sync::atomic::Ordering::Relaxed)
}

enum Kind {
    Plain(IoUring),
    Nvme(IoUring<squeue::Entry128, cqueue::Entry32>),
}

/// Calls `$f` on the ring whichever its entry size.
macro_rules! with_ring {
    ($r:expr, $ring:ident => $f:expr) => {
        match $r {
            Kind::Plain($ring) => $f,
            Kind::Nvme($ring) => $f,
        }
    };
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("entries", &self.entries())
            .field("nvme", &matches!(self.ring, Kind::Nvme(_)))
            .finish_non_exhaustive()
    }
}

impl Ring {
    /// A ring of `entries` submission entries (twice as many completion
    /// entries), with `files` registered as fixed files 0, 1, ...; with
    /// `nvme`, of the big entries NVMe passthrough needs; with `sqpoll`, a
    /// kernel thread polls its submissions; with `iopoll`, its completions
    /// are polled from the device.
    pub fn new(entries: u32, files: &[BorrowedFd<'_>], nvme: bool, sqpoll: bool, iopoll: bool) -> Result<Ring> {
        let setup = |e| Error::io("io_uring_setup", e);
        macro_rules! build {
            ($b:expr, $entries:expr) => {{
                let mut b = $b;
                if sqpoll {
                    // The thread sleeps after 100 ms without work; a
                    // submission then wakes it (io_uring_enter).
                    b.setup_sqpoll(100);
                }
                if iopoll {
                    b.setup_iopoll();
                }
                b.build($entries).map_err(setup)?
            }};
        }
        let ring = if nvme {
            // Twice the slots asked for: a slot waits for its command's
            // completion before it is written again (`SqSlots`).
            Kind::Nvme(build!(IoUring::<squeue::Entry128, cqueue::Entry32>::builder(), entries.saturating_mul(2)))
        } else {
            Kind::Plain(build!(IoUring::builder(), entries))
        };
        let fds: Vec<i32> = files.iter().map(|f| f.as_raw_fd()).collect();
        with_ring!(&ring, r => r.submitter().register_files(&fds))
            .map_err(|e| Error::io("io_uring_register(files)", e))?;
        let fixed = match with_ring!(&ring, r => r.submitter().register_buffers_sparse(FIXED_BUFFERS as u32)) {
            Ok(()) => Some(vec![0u32; FIXED_BUFFERS as usize].into_boxed_slice()),
            Err(e) => {
                tracing::debug!("no registered buffers on this kernel ({e}): the kernel pins pages per I/O");
                None
            }
        };
        let slots = match &ring {
            Kind::Nvme(r) => Some(SqSlots::new(r.params().sq_entries())),
            Kind::Plain(_) => None,
        };
        Ok(Ring { ring, fixed, slots })
    }

    /// How many slots of the registered-buffer table hold a buffer.
    pub fn fixed_buffers(&self) -> usize {
        self.fixed.as_ref().map_or(0, |s| s.iter().filter(|&&g| g != 0).count())
    }

    /// The generation of the buffer slot `index` holds (0: none).
    pub fn fixed_generation(&self, index: u16) -> u32 {
        self.fixed.as_ref().and_then(|s| s.get(index as usize).copied()).unwrap_or(0)
    }

    /// Makes slot `index` of the registered-buffer table hold `len` bytes
    /// at `addr`, generation `generation` (not 0) of what the slot names:
    /// a system call when the slot held something else, nothing when it
    /// holds this. False where it cannot (no table, index out of range, a
    /// buffer over [`FIXED_BUFFER_MAX`], the kernel refused: pinned memory
    /// is accounted to `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`), and
    /// operations on that memory then name no buffer. The kernel pins the
    /// pages until the slot is replaced or released or the ring closes.
    ///
    /// # Safety
    /// The memory must stay mapped while operations that name the slot may
    /// run (until their completions are reaped), and a slot's generation
    /// must name one buffer only.
    pub unsafe fn fixed_buffer(&mut self, index: u16, generation: u32, addr: *mut u8, len: usize) -> bool {
        let Some(slots) = &mut self.fixed else { return false };
        match slots.get(index as usize) {
            None => return false,
            Some(&g) if g == generation => return true,
            Some(_) if len > FIXED_BUFFER_MAX => return false,
            Some(_) => {}
        }
        let iov = [libc::iovec { iov_base: addr.cast(), iov_len: len }];
        let started = std::time::Instant::now();
        // SAFETY: the caller keeps the memory mapped while operations name
        // the slot; the kernel drops the slot's previous buffer once the
        // operations that use it are done.
        let r = with_ring!(&self.ring, r => unsafe { r.submitter().register_buffers_update(index as u32, &iov, None) });
        match r {
            Ok(()) => {
                slots[index as usize] = generation;
                // A first use's cost (`UGDS_LOG=debug`): the kernel pins
                // the buffer's pages for this ring.
                tracing::debug!(
                    index,
                    bytes = len,
                    us = started.elapsed().as_micros() as u64,
                    "buffer registered with a ring"
                );
                true
            }
            Err(e) => {
                tracing::debug!(index, "buffer not registered with the ring ({e}): the kernel pins it per I/O");
                false
            }
        }
    }

    /// A ring that only holds registered buffers: the table other rings
    /// copy ([`copy_fixed_from`](Self::copy_fixed_from)), so that memory
    /// is pinned once for all of them. `Unsupported` where the kernel has
    /// no sparse table.
    pub fn buffer_source() -> Result<Ring> {
        let ring = IoUring::builder().build(1).map_err(|e| Error::io("io_uring_setup", e))?;
        ring.submitter()
            .register_buffers_sparse(FIXED_BUFFERS as u32)
            .map_err(|e| Error::Unsupported(format!("registered buffers ({e})")))?;
        Ok(Ring { ring: Kind::Plain(ring), fixed: Some(vec![0u32; FIXED_BUFFERS as usize].into()), slots: None })
    }

    /// Makes this ring's registered-buffer table a copy of `source`'s,
    /// every slot (`IORING_REGISTER_CLONE_BUFFERS`, Linux 6.13): the kernel
    /// shares the pinned pages, nothing is pinned again, and operations in
    /// flight keep the buffers they name. False where the kernel cannot,
    /// the table then as it was.
    ///
    /// The whole table, never a range: some kernels drop the slots after a
    /// range copied into a table that has entries.
    pub fn copy_fixed_from(&mut self, source: &Ring) -> bool {
        /// `struct io_uring_clone_buffers`.
        #[repr(C)]
        struct CloneBuffers {
            src_fd: u32,
            flags: u32,
            src_off: u32,
            dst_off: u32,
            nr: u32,
            pad: [u32; 3],
        }
        const _: () = assert!(std::mem::size_of::<CloneBuffers>() == 32);
        /// `IORING_REGISTER_CLONE_BUFFERS` and `IORING_REGISTER_DST_REPLACE`.
        const CLONE_BUFFERS: libc::c_long = 30;
        const DST_REPLACE: u32 = 1 << 1;
        let (Some(mine), Some(theirs)) = (&mut self.fixed, &source.fixed) else { return false };
        if mine.len() != theirs.len() {
            return false;
        }
        let src_fd = with_ring!(&source.ring, r => r.as_raw_fd());
        let dst_fd = with_ring!(&self.ring, r => r.as_raw_fd());
        let arg = CloneBuffers {
            src_fd: src_fd as u32,
            flags: DST_REPLACE,
            src_off: 0,
            dst_off: 0,
            nr: theirs.len() as u32,
            pad: [0; 3],
        };
        // SAFETY: io_uring_register reads one `struct io_uring_clone_buffers`
        // (nr_args 1); both descriptors are rings this process owns. The
        // copied slots name memory `source`'s owner keeps registered.
        let r = unsafe {
            libc::syscall(libc::SYS_io_uring_register, dst_fd, CLONE_BUFFERS, &arg as *const CloneBuffers, 1)
        };
        if r < 0 {
            tracing::debug!(
                "registered buffers not copied between rings ({}): each ring registers its own",
                std::io::Error::last_os_error()
            );
            NO_FIXED_COPIES.store(true, std::sync::atomic::Ordering::Relaxed);
            return false;
        }
        mine.copy_from_slice(theirs);
        true
    }

    /// Empties slot `index` (its pages are unpinned once the operations
    /// that use it are done).
    pub fn release_fixed(&mut self, index: u16) {
        let Some(slots) = &mut self.fixed else { return };
        if slots.get(index as usize).is_none_or(|&g| g == 0) {
            return;
        }
        let iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }];
        // SAFETY: an empty entry registers no memory.
        let r = with_ring!(&self.ring, r => unsafe { r.submitter().register_buffers_update(index as u32, &iov, None) });
        match r {
            Ok(()) => slots[index as usize] = 0,
            Err(e) => {
                tracing::warn!(index, "registered buffer not released ({e}); it stays pinned until the ring closes")
            }
        }
    }

    /// Signals `efd` for every completion posted from now on.
    pub fn register_eventfd(&self, efd: &EventFd) -> Result<()> {
        with_ring!(&self.ring, r => r.submitter().register_eventfd(efd.as_raw_fd()))
            .map_err(|e| Error::io("io_uring_register(eventfd)", e))
    }

    /// Submission entries.
    pub fn entries(&self) -> u32 {
        with_ring!(&self.ring, r => r.params().sq_entries())
    }

    /// Stages `op` with `user_data` (below 2^48); false when the
    /// submission ring is full, or (passthrough rings) when the slot the
    /// entry would take still holds a command not yet completed.
    ///
    /// # Safety
    ///
    /// The memory `op` names must stay valid (and, for reads, not be used
    /// otherwise) until its completion is reaped.
    pub unsafe fn push(&mut self, op: Op, user_data: u64) -> bool {
        debug_assert!(user_data >> SLOT_SHIFT == 0, "user data above 2^48");
        let slot = match &self.slots {
            Some(s) => match s.next() {
                Some(slot) => Some(slot),
                None => return false,
            },
            None => None,
        };
        if let Op::Nvme { file, cmd } = op {
            let (Kind::Nvme(r), Some(slot), Some(slots)) = (&mut self.ring, slot, self.slots.as_mut()) else {
                return false;
            };
            let e = opcode::UringCmd80::new(types::Fixed(file), NVME_URING_CMD_IO).cmd(cmd.bytes()).build();
            // SAFETY: as below; the command's data buffer is the caller's
            // to keep valid (this function's contract).
            if !unsafe { r.submission().push(&e.user_data(user_data | ((slot as u64 + 1) << SLOT_SHIFT))).is_ok() } {
                return false;
            }
            slots.pushed(slot, true);
            return true;
        }
        let entry = match op {
            Op::Read { file, addr, len, offset, buffer: None, nowait, offload } => {
                opcode::Read::new(types::Fixed(file), addr, len)
                    .offset(offset)
                    .rw_flags(if nowait { libc::RWF_NOWAIT } else { 0 })
                    .build()
                    .flags(if offload { squeue::Flags::ASYNC } else { squeue::Flags::empty() })
            }
            Op::Read { file, addr, len, offset, buffer: Some(i), nowait, offload } => {
                opcode::ReadFixed::new(types::Fixed(file), addr, len, i)
                    .offset(offset)
                    .rw_flags(if nowait { libc::RWF_NOWAIT } else { 0 })
                    .build()
                    .flags(if offload { squeue::Flags::ASYNC } else { squeue::Flags::empty() })
            }
            Op::Write { file, addr, len, offset, buffer: None } => {
                opcode::Write::new(types::Fixed(file), addr, len).offset(offset).build()
            }
            Op::Write { file, addr, len, offset, buffer: Some(i) } => {
                opcode::WriteFixed::new(types::Fixed(file), addr, len, i).offset(offset).build()
            }
            Op::Sync { file, data_only } => {
                let flags = if data_only { types::FsyncFlags::DATASYNC } else { types::FsyncFlags::empty() };
                opcode::Fsync::new(types::Fixed(file)).flags(flags).build()
            }
            Op::Nop => opcode::Nop::new().build(),
            Op::Nvme { .. } => unreachable!("handled above"),
            Op::Allocate { file, mode, offset, len } => {
                opcode::Fallocate::new(types::Fixed(file), len).offset(offset).mode(mode).build()
            }
        };
        let entry = entry.user_data(user_data);
        // SAFETY: the caller keeps the memory valid until the completion
        // (this function's contract); the file is registered.
        let ok = unsafe {
            match &mut self.ring {
                Kind::Plain(r) => r.submission().push(&entry).is_ok(),
                Kind::Nvme(r) => r.submission().push(&squeue::Entry128::from(entry)).is_ok(),
            }
        };
        // Other operations are read whole at submission: their slots are
        // not held.
        if let (true, Some(s), Some(slot)) = (ok, self.slots.as_mut(), slot) {
            s.pushed(slot, false);
        }
        ok
    }

    /// Tells the kernel about the staged entries (one `io_uring_enter`);
    /// how many it took. EINTR, EAGAIN and EBUSY take none: try again later.
    pub fn submit(&self) -> Result<usize> {
        match with_ring!(&self.ring, r => r.submit()) {
            Ok(n) => Ok(n),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => Ok(0),
            Err(e) => Err(Error::io("io_uring_enter", e)),
        }
    }

    /// Entries staged and not yet taken by the kernel.
    pub fn staged(&mut self) -> usize {
        with_ring!(&mut self.ring, r => r.submission().len())
    }

    /// Consumes up to `max` completions, calling `f(user_data, result,
    /// extra)` (`extra`: an NVMe command's DW0, else 0); how many.
    pub fn reap(&mut self, max: usize, mut f: impl FnMut(u64, i32, u64)) -> usize {
        let mut n = 0;
        match &mut self.ring {
            Kind::Plain(r) => {
                let mut cq = r.completion();
                while n < max {
                    let Some(c) = cq.next() else { break };
                    f(c.user_data(), c.result(), 0);
                    n += 1;
                }
            }
            Kind::Nvme(r) => {
                let mut cq = r.completion();
                let slots = self.slots.as_mut().expect("a passthrough ring has slots");
                while n < max {
                    let Some(c) = cq.next() else { break };
                    f(slots.completed(c.user_data()), c.result(), c.big_cqe()[0]);
                    n += 1;
                }
            }
        }
        n
    }

    /// Whether completions are polled from the device (IOPOLL): they are
    /// found only by entering the kernel ([`submit`](Self::submit) does).
    pub fn polls_device(&self) -> bool {
        with_ring!(&self.ring, r => r.params().is_setup_iopoll())
    }

    /// Whether a completion is waiting.
    pub fn completion_pending(&mut self) -> bool {
        with_ring!(&mut self.ring, r => !r.completion().is_empty())
    }
}

/// How a file can take direct I/O: the alignment of memory and of file
/// offsets and sizes (`statx`'s `STATX_DIOALIGN`, Linux 6.1), or `None`
/// when it cannot (or the kernel does not say).
pub fn direct_io_alignment(fd: BorrowedFd<'_>) -> Option<(u32, u32)> {
    // SAFETY: all zeroes is a valid `statx` (plain integers).
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx fills `st`; the empty path with AT_EMPTY_PATH names
    // `fd` itself.
    let r = unsafe { libc::statx(fd.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut st) };
    if r != 0 || st.stx_mask & libc::STATX_DIOALIGN == 0 || st.stx_dio_mem_align == 0 {
        return None;
    }
    Some((st.stx_dio_mem_align, st.stx_dio_offset_align))
}

/// How many pages of `fd`'s file from `off` for `len` bytes are in the page
/// cache (`cachestat`, Linux 6.5: asks without reading anything, so
/// without starting readahead); `None` where the kernel has no such call.
pub fn cached_pages(fd: BorrowedFd<'_>, off: u64, len: u64) -> Option<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    /// `__NR_cachestat`, the same on x86-64 and arm64.
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off, len };
    let mut st = Stat::default();
    // SAFETY: cachestat reads one range and writes one struct, both ours
    // and laid out as the kernel's; flags 0.
    let r = unsafe { libc::syscall(SYS_CACHESTAT, fd.as_raw_fd(), &range as *const Range, &mut st as *mut Stat, 0) };
    (r == 0).then_some(st.nr_cache)
}
