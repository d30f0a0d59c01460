//! Memory barriers between host memory the controller reads or writes and
//! the register writes that tell it to look.
//!
//! One helper per kind, as Linux names them. On x86-64 the hardware keeps
//! stores in order with each other and loads in order with each other (TSO),
//! and uncached MMIO writes are not reordered with earlier stores, so both
//! helpers only stop the compiler from moving accesses. On aarch64 they emit
//! the outer-shareable barriers that Linux's `dma_wmb()` / `dma_rmb()` use.

use std::sync::atomic::{compiler_fence, Ordering};

/// Orders every store to queue memory (SQEs, PRP lists) before the doorbell
/// write that follows: the controller fetches the entry only after it sees
/// the doorbell, and must then see the entry's final contents.
#[inline(always)]
pub fn dma_wmb() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; no memory or register operands.
    unsafe {
        std::arch::asm!("dmb oshst", options(nostack, preserves_flags));
    }
    compiler_fence(Ordering::SeqCst);
}

/// Orders the load that saw a completion entry's new phase tag before the
/// loads of the entry's other fields: the controller writes the phase last,
/// so fields read after it are the new ones.
#[inline(always)]
pub fn dma_rmb() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; no memory or register operands.
    unsafe {
        std::arch::asm!("dmb oshld", options(nostack, preserves_flags));
    }
    compiler_fence(Ordering::SeqCst);
}

/// Orders the reads of consumed completion entries before the completion
/// doorbell write that hands their slots back to the controller, which may
/// then overwrite them. x86-64 never moves a store ahead of an earlier load
/// (only the compiler must be stopped); on aarch64 the observer is the
/// device, so the barrier is the outer-shareable `dmb osh` (loads and
/// stores), not the inner-shareable one a Rust fence emits.
#[inline(always)]
pub fn consumed_before_doorbell() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; no memory or register operands.
    unsafe {
        std::arch::asm!("dmb osh", options(nostack, preserves_flags));
    }
    std::sync::atomic::fence(Ordering::Release);
}
