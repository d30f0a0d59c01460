//! The C interface on a controller bound to ugds_drv: a handle registered on
//! the fd of /dev/ugds_drvN (as LMCache and other uGDS callers do), sync and
//! batch I/O, data verified. Runs in the QEMU guest of the conformance
//! harness (UGDS_TEST_DRV=/dev/ugds_drv0); elsewhere it says it skipped.

use std::ffi::c_void;
use std::os::fd::AsRawFd;
use ugds_capi::abi::{self, op};
use ugds_capi::*;

fn pattern(seed: u8, off: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (((off + i) as u64).wrapping_mul(31) as u8) ^ seed).collect()
}

#[test]
fn c_interface_on_ugds_drv() {
    let Ok(path) = std::env::var("UGDS_TEST_DRV") else {
        eprintln!("skipped: UGDS_TEST_DRV is not set (runs in the QEMU guest)");
        return;
    };
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    // SAFETY: every pointer passed below is a live local (or `buf`, which
    // outlives its registration), as each entry point's contract asks.
    unsafe { c_calls(file.as_raw_fd()) }
}

/// The calls of the test, in the caller's unsafe context.
///
/// # Safety
/// `fd` is an open ugds_drv device.
unsafe fn c_calls(fd: i32) {
    // SAFETY: see the test.
    unsafe {
        assert_eq!(uGDSDriverOpen().err, op::SUCCESS);
        let mut d = abi::uGDSDescr_t { type_: abi::HANDLE_TYPE_OPAQUE_FD, handle: abi::DescrHandle { fd } };
        let mut fh: *mut c_void = std::ptr::null_mut();
        assert_eq!(uGDSHandleRegister(&mut fh, &mut d).err, op::SUCCESS);
        // The handle object's first member is the fd.
        assert_eq!(*(fh as *const i32), fd);
        let mut cap = 0u64;
        assert_eq!(uGDSGetDeviceCapacity(fh, &mut cap).err, op::SUCCESS);
        assert!(cap >= 32 << 20, "capacity {cap}");

        const LEN: usize = 1 << 20;
        let mut buf = ugds::HostBuffer::new(2 * LEN).unwrap();
        assert_eq!(uGDSBufRegister(buf.as_ptr().cast(), 2 * LEN, 0).err, op::SUCCESS);
        let data = pattern(3, 0, LEN);
        buf[..LEN].copy_from_slice(&data);
        let off = 8 << 20;
        assert_eq!(uGDSWrite(fh, buf.as_ptr().cast(), LEN, off, 0), LEN as isize);
        assert_eq!(uGDSRead(fh, buf.as_mut_ptr().cast(), LEN, off, LEN as i64), LEN as isize);
        assert!(buf[LEN..] == data[..]);

        // A batch of 32 reads of 8 KiB, by cookie.
        let mut b: *mut c_void = std::ptr::null_mut();
        assert_eq!(uGDSBatchIOSetUp(&mut b, fh, 32).err, op::SUCCESS);
        buf[LEN..].fill(0);
        let mut io: Vec<abi::uGDSIOParams_t> = (0..32)
            .map(|i| abi::uGDSIOParams_t {
                devPtr_base: buf.as_mut_ptr().cast(),
                file_offset: off + i * 8192,
                devPtr_offset: LEN as i64 + i * 8192,
                size: 8192,
                opcode: abi::READ,
                cookie: (i + 1) as *mut c_void,
            })
            .collect();
        assert_eq!(uGDSBatchIOSubmit(b, 32, io.as_mut_ptr(), 0).err, op::SUCCESS);
        let mut ev: Vec<abi::uGDSIOEvents_t> =
            (0..32).map(|_| abi::uGDSIOEvents_t { cookie: std::ptr::null_mut(), status: 0, ret: 0 }).collect();
        let mut nr = 32u32;
        let r = uGDSBatchIOGetStatus(b, 32, &mut nr, ev.as_mut_ptr(), std::ptr::null_mut());
        assert_eq!((r.err, nr), (op::SUCCESS, 32));
        assert!(ev.iter().all(|e| e.status == abi::BATCH_COMPLETE && e.ret == 8192));
        assert!(buf[LEN..LEN + 32 * 8192] == data[..32 * 8192]);
        uGDSBatchIODestroy(b);

        // A second registration of the same device is refused by the module
        // (one opener) only at open; through the same fd it is "already registered".
        let mut fh2: *mut c_void = std::ptr::null_mut();
        assert_eq!(uGDSHandleRegister(&mut fh2, &mut d).err, op::HANDLE_ALREADY_REGISTERED);

        assert_eq!(uGDSBufDeregister(buf.as_ptr().cast()).err, op::SUCCESS);
        assert_eq!(uGDSHandleDeregisterEx(fh, 0).err, op::SUCCESS);
        assert_eq!(uGDSDriverClose().err, op::SUCCESS);
        // The caller's fd is still open and the device usable again through it.
        assert_eq!(uGDSDriverOpen().err, op::SUCCESS);
        assert_eq!(uGDSHandleRegister(&mut fh2, &mut d).err, op::SUCCESS);
        assert_eq!(uGDSHandleDeregisterEx(fh2, 0).err, op::SUCCESS);
        assert_eq!(uGDSDriverClose().err, op::SUCCESS);
    }
}
