//! The C interface on an NVMe/TCP controller (`uGDSTcpOpen`, an
//! extension): refusals of bad arguments, then a handle on the emulated
//! NVMe/TCP target (with `UGDS_TEST_TCP=host:port/nqn`, that target
//! instead), sync and batch I/O with digests, data checked.

use std::ffi::{c_void, CString};
use ugds_capi::abi::{self, op};
use ugds_capi::*;
use ugds_emu::tcp::{EmuTcpConfig, EmuTcpTarget};

#[test]
fn c_interface_over_tcp() {
    let emu;
    let (addr, nqn) = match std::env::var("UGDS_TEST_TCP") {
        Ok(v) => {
            let (a, n) = v.split_once('/').expect("UGDS_TEST_TCP is host:port/nqn");
            (a.to_string(), n.to_string())
        }
        Err(_) => {
            emu = EmuTcpTarget::start(EmuTcpConfig::default()).unwrap();
            (emu.addr().to_string(), emu.nqn().to_string())
        }
    };
    let (addr, nqn) = (CString::new(addr).unwrap(), CString::new(nqn).unwrap());
    // SAFETY: every pointer passed is a live local (or `buf`, which outlives
    // its registration), as each entry point's contract asks.
    unsafe {
        assert_eq!(uGDSDriverOpen().err, op::SUCCESS);
        let mut fh: *mut c_void = std::ptr::null_mut();
        // Refused: null arguments, unknown flags, an unknown subsystem.
        assert_eq!(uGDSTcpOpen(&mut fh, std::ptr::null(), nqn.as_ptr(), 0, 0).err, op::INVALID_VALUE);
        assert_eq!(uGDSTcpOpen(&mut fh, addr.as_ptr(), nqn.as_ptr(), 0, 2).err, op::INVALID_VALUE);
        let absent = CString::new("nqn.2026-12.io.ugds:absent").unwrap();
        assert_ne!(uGDSTcpOpen(&mut fh, addr.as_ptr(), absent.as_ptr(), 0, 0).err, op::SUCCESS);
        assert!(fh.is_null(), "a refused open leaves no handle");

        assert_eq!(uGDSTcpOpen(&mut fh, addr.as_ptr(), nqn.as_ptr(), 0, abi::TCP_DIGESTS).err, op::SUCCESS);
        assert_eq!(*(fh as *const i32), -1, "no file descriptor behind it");
        let mut cap = 0u64;
        assert_eq!(uGDSGetDeviceCapacity(fh, &mut cap).err, op::SUCCESS);
        assert!(cap >= 16 << 20, "capacity {cap}");

        const LEN: usize = 1 << 20;
        let mut buf = ugds::HostBuffer::new(2 * LEN).unwrap();
        assert_eq!(uGDSBufRegister(buf.as_ptr().cast(), 2 * LEN, 0).err, op::SUCCESS);
        let data: Vec<u8> = (0..LEN).map(|i| (i as u8).wrapping_mul(7) ^ 0x5a).collect();
        buf[..LEN].copy_from_slice(&data);
        assert_eq!(uGDSWrite(fh, buf.as_ptr().cast(), LEN, 4 << 20, 0), LEN as isize);
        assert_eq!(uGDSRead(fh, buf.as_mut_ptr().cast(), LEN, 4 << 20, LEN as i64), LEN as isize);
        assert!(buf[LEN..] == data[..]);

        // A batch of 16 reads of 64 KiB.
        let mut b: *mut c_void = std::ptr::null_mut();
        assert_eq!(uGDSBatchIOSetUp(&mut b, fh, 16).err, op::SUCCESS);
        buf[LEN..].fill(0);
        let mut io: Vec<abi::uGDSIOParams_t> = (0..16)
            .map(|i| abi::uGDSIOParams_t {
                devPtr_base: buf.as_mut_ptr().cast(),
                file_offset: (4 << 20) + i * 65536,
                devPtr_offset: LEN as i64 + i * 65536,
                size: 65536,
                opcode: abi::READ,
                cookie: (i + 1) as *mut c_void,
            })
            .collect();
        assert_eq!(uGDSBatchIOSubmit(b, 16, io.as_mut_ptr(), 0).err, op::SUCCESS);
        let mut ev: Vec<abi::uGDSIOEvents_t> =
            (0..16).map(|_| abi::uGDSIOEvents_t { cookie: std::ptr::null_mut(), status: 0, ret: 0 }).collect();
        let mut nr = 16u32;
        let r = uGDSBatchIOGetStatus(b, 16, &mut nr, ev.as_mut_ptr(), std::ptr::null_mut());
        assert_eq!((r.err, nr), (op::SUCCESS, 16));
        assert!(ev.iter().all(|e| e.status == abi::BATCH_COMPLETE && e.ret == 65536));
        assert!(buf[LEN..] == data[..]);
        uGDSBatchIODestroy(b);

        assert_eq!(uGDSBufDeregister(buf.as_ptr().cast()).err, op::SUCCESS);
        uGDSHandleDeregister(fh);
        assert_eq!(uGDSDriverClose().err, op::SUCCESS);
    }
}
