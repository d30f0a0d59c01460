//! What libcufile.so.0's synchronous read adds to the library's:
//! `cuFileRead` of 4 KiB into a registered buffer, on an emulated
//! controller over a regular file (`UGDS_EMULATE=1`), through
//! `measured_cufile_read`. `scripts/instructions` runs it under callgrind,
//! counting from `measured_cufile_read` in, and subtracts what
//! `Handle::read` takes (the library's read and its wait for the device,
//! which varies): what is left is the binding alone. Run alone it only
//! checks that every read completes.

use cufile::abi::{self, op};
use std::ffi::c_void;
use std::io::Write;
use std::os::fd::AsRawFd;

const WARMUP: usize = 20;
const READS: usize = 200;

/// One 4 KiB read through the C ABI (counted by callgrind).
#[inline(never)]
fn measured_cufile_read(fh: *mut c_void, buf: *mut c_void, off: i64) -> isize {
    // SAFETY: `buf` is 64 KiB, registered, and outlives the call.
    unsafe { cufile::cuFileRead(fh, buf, 4096, off, 0) }
}

fn main() {
    std::env::set_var("UGDS_EMULATE", "1");
    // The waiter sleeps until the emulator signals (a polling waiter would
    // spin through valgrind's time slices).
    std::env::set_var("UGDS_INTERRUPT_MODE", "1");
    let dir = std::env::temp_dir().join(format!("ugds-cufile-instructions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join("ns.img");
    let mut file = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    file.write_all(&vec![0x5a; 1 << 20]).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let base: *mut c_void = buf.as_mut_ptr().cast();
    assert_eq!(cufile::cuFileDriverOpen().err, op::SUCCESS);
    let mut descr = abi::CUfileDescr_t {
        type_: abi::HANDLE_TYPE_OPAQUE_FD,
        handle: abi::DescrHandle { fd: file.as_raw_fd() },
        fs_ops: std::ptr::null(),
    };
    let mut fh: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid pointers for the calls; `buf` outlives its registration.
    unsafe {
        assert_eq!(cufile::cuFileHandleRegister(&mut fh, &mut descr).err, op::SUCCESS, "open the handle");
        assert_eq!(cufile::cuFileBufRegister(base, buf.len(), 0).err, op::SUCCESS, "register the buffer");
    }
    for i in 0..WARMUP + READS {
        let off = (i % 256) as i64 * 4096;
        let n = if i >= WARMUP {
            measured_cufile_read(fh, base, off)
        } else {
            // SAFETY: as in `measured_cufile_read`.
            unsafe { cufile::cuFileRead(fh, base, 4096, off, 0) }
        };
        assert_eq!(n, 4096, "read {i}");
    }
    assert_eq!(buf[..4096], [0x5a; 4096]);
    // SAFETY: no I/O in flight; the handle is the one registered above.
    unsafe {
        assert_eq!(cufile::cuFileBufDeregister(base).err, op::SUCCESS);
        cufile::cuFileHandleDeregister(fh);
    }
    assert_eq!(cufile::cuFileDriverClose().err, op::SUCCESS);
    drop(file);
    std::fs::remove_dir_all(&dir).ok();
    println!("cufile_instructions: {READS} measured reads of 4 KiB through cuFileRead completed");
}
