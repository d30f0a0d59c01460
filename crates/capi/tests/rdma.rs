//! The C interface's NVMe/RDMA open (`uGDSRdmaOpen`, an extension): bad
//! arguments refused, and where no RDMA device reaches the target (this
//! machine, CI's host) a clear error and no handle. The handle itself runs
//! in the QEMU `rdma` guest through the library (`Driver::open_rdma`).

use std::ffi::{c_void, CString};
use ugds_capi::abi::op;
use ugds_capi::*;

#[test]
fn c_interface_rdma_open_refuses_and_reports() {
    let addr = CString::new("127.0.0.1:9").unwrap();
    let nqn = CString::new("nqn.2026-12.io.ugds:absent").unwrap();
    // SAFETY: every pointer passed is a live local, as the contract asks.
    unsafe {
        assert_eq!(uGDSDriverOpen().err, op::SUCCESS);
        let mut fh: *mut c_void = std::ptr::null_mut();
        assert_eq!(uGDSRdmaOpen(&mut fh, std::ptr::null(), nqn.as_ptr(), 0, 0).err, op::INVALID_VALUE);
        assert_eq!(uGDSRdmaOpen(&mut fh, addr.as_ptr(), std::ptr::null(), 0, 0).err, op::INVALID_VALUE);
        assert_eq!(uGDSRdmaOpen(&mut fh, addr.as_ptr(), nqn.as_ptr(), 0, 2).err, op::INVALID_VALUE);
        assert_ne!(uGDSRdmaOpen(&mut fh, addr.as_ptr(), nqn.as_ptr(), 0, 0).err, op::SUCCESS);
        // UGDS_RDMA_COPY is taken; no target there either way.
        assert_ne!(uGDSRdmaOpen(&mut fh, addr.as_ptr(), nqn.as_ptr(), 0, abi::RDMA_COPY).err, op::SUCCESS);
        assert!(fh.is_null(), "a refused open leaves no handle");
        assert_eq!(uGDSDriverClose().err, op::SUCCESS);
    }
}
