//! Tests of the parent module.

use super::*;

#[test]
fn pattern_depends_on_offset() {
    let mut b = vec![0u64; 64];
    // SAFETY: a live, aligned Vec of 512 bytes.
    unsafe { fill_pattern(b.as_mut_ptr().cast(), 512, 4096) };
    // SAFETY: as above.
    assert_eq!(unsafe { check_pattern(b.as_ptr().cast(), 512, 4096) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { check_pattern(b.as_ptr().cast(), 512, 4608) }, 64);
    b[3] ^= 1;
    // SAFETY: as above.
    assert_eq!(unsafe { check_pattern(b.as_ptr().cast(), 512, 4096) }, 1);
}
