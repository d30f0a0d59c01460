//! The verify pattern: a word per 8 bytes that is a function of the byte's
//! namespace offset, written before reads (`prefill`) and checked after.

use ugds::{BufferToken, Driver, Handle, HostBuffer};

/// The value of the pattern word at namespace byte offset `off` (a multiple of 8).
#[inline]
pub(super) fn pattern_word(off: u64) -> u64 {
    // splitmix64 of the offset: every word differs, so a misplaced block
    // (wrong LBA, wrong buffer offset) never matches.
    let mut z = off.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `len` bytes at `dst` with the pattern of namespace offset `off`.
///
/// # Safety
/// `dst..dst+len` is writable, 8-byte aligned, and no I/O on it is in flight.
pub(super) unsafe fn fill_pattern(dst: *mut u8, len: usize, off: u64) {
    for i in 0..len / 8 {
        // SAFETY: within the range the caller vouches for.
        unsafe { (dst as *mut u64).add(i).write(pattern_word(off + 8 * i as u64)) };
    }
}

/// Counts the 8-byte words at `src` that differ from the pattern of `off`.
///
/// # Safety
/// `src..src+len` is readable, 8-byte aligned, and no I/O on it is in flight.
pub(super) unsafe fn check_pattern(src: *const u8, len: usize, off: u64) -> u64 {
    let mut bad = 0;
    for i in 0..len / 8 {
        // SAFETY: within the range the caller vouches for.
        let v = unsafe { (src as *const u64).add(i).read() };
        bad += (v != pattern_word(off + 8 * i as u64)) as u64;
    }
    bad
}

pub(super) fn prefill(driver: &Driver, handle: &Handle, base: u64, range: u64) -> Result<(), ugds::Error> {
    let chunk = 1usize << 20;
    let mut b = HostBuffer::new(chunk)?;
    // SAFETY: `b` outlives the registration (deregistered below) and is only
    // filled between the synchronous writes.
    let token = unsafe { driver.register(b.as_mut_ptr(), b.len())? };
    let mut off = base;
    let r = (|| {
        while off < base + range {
            let n = (base + range - off).min(chunk as u64) as usize;
            // SAFETY: no I/O is in flight on `b` between calls.
            unsafe { fill_pattern(b.as_mut_ptr(), n, off) };
            handle.write(&token, n, off, 0)?;
            off += n as u64;
        }
        Ok(())
    })();
    release(driver, &token, b)?;
    r
}

/// Deregisters the buffer `token` names, then frees its memory `mem`.
/// Where the library refuses (requests still hold it after a timeout: the
/// device may still write it) the memory is kept for the process's life,
/// never freed, and the refusal returned.
pub(crate) fn release<M>(driver: &Driver, token: &BufferToken, mem: M) -> Result<(), ugds::Error> {
    match driver.deregister(token) {
        Ok(()) => {
            drop(mem);
            Ok(())
        }
        Err(e) => {
            eprintln!("ugds bench: a buffer is kept, not freed: {e}");
            std::mem::forget(mem);
            Err(e)
        }
    }
}
