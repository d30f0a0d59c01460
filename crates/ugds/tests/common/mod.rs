//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::Duration;
use ugds::platform::emu::{EmuConfig, EmuControl, NamespaceConfig};
use ugds::{BufferToken, Driver, Handle, HandleOptions, HostBuffer};

pub fn small_emu() -> EmuConfig {
    EmuConfig::default().namespaces(vec![NamespaceConfig::memory(16 << 20, 512)])
}

pub fn opts() -> HandleOptions {
    HandleOptions {
        sync_queues: 2,
        async_queues: 2,
        queue_depth: 64,
        timeout: Duration::from_secs(10),
        ..Default::default()
    }
}

pub fn open(cfg: EmuConfig, o: HandleOptions) -> (Driver, Handle, EmuControl) {
    let d = Driver::open();
    let (h, c) = d.open_emulated(cfg, o).expect("open emulated handle");
    (d, h, c)
}

/// A registered buffer; deregistered (and freed) on drop.
pub struct Buf<'d> {
    pub driver: &'d Driver,
    pub token: BufferToken,
    pub mem: HostBuffer,
}

impl<'d> Buf<'d> {
    pub fn new(driver: &'d Driver, len: usize) -> Buf<'d> {
        let mut mem = HostBuffer::new(len).unwrap();
        // SAFETY: `mem` lives in the returned Buf, which deregisters before
        // freeing it; tests touch it only between I/O calls.
        let token = unsafe { driver.register(mem.as_mut_ptr(), mem.len()) }.unwrap();
        Buf { driver, token, mem }
    }
}

impl Drop for Buf<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.driver.deregister(&self.token) {
            // A buffer a stuck command holds must not be freed: leak it.
            eprintln!("buffer kept (not freed): {e}");
            std::mem::forget(std::mem::replace(&mut self.mem, HostBuffer::new(1).unwrap()));
        }
    }
}

/// Deterministic bytes for offset `off` of a test pattern `seed`.
pub fn pattern(seed: u8, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| ((off + i).wrapping_mul(31) as u8) ^ seed ^ (((off + i) >> 9) as u8)).collect()
}
