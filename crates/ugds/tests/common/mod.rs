//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::Duration;
use ugds::{BufferToken, Driver, Handle, HandleOptions, HostBuffer};
use ugds_emu::{EmuConfig, EmuControl, NamespaceConfig};

pub fn small_emu() -> EmuConfig {
    EmuConfig::default().namespaces(vec![NamespaceConfig::memory(16 << 20, 512)])
}

pub fn opts() -> HandleOptions {
    HandleOptions::default().sync_queues(2).async_queues(2).queue_depth(64).timeout(Duration::from_secs(10))
}

pub fn open(cfg: EmuConfig, o: HandleOptions) -> (Driver, Handle, EmuControl) {
    let d = Driver::open();
    let (h, c) = open_emulated(&d, cfg, o).expect("open emulated handle");
    (d, h, c)
}

/// Starts an emulated controller and opens a handle on it; the control
/// reads its counters and injects faults.
pub fn open_emulated(d: &Driver, cfg: EmuConfig, o: HandleOptions) -> ugds::Result<(Handle, EmuControl)> {
    let emu = ugds_emu::EmuPlatform::new(cfg)?;
    let control = emu.control();
    Ok((d.open_handle(std::sync::Arc::new(emu), o)?, control))
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

/// A token whose registration has gone (the memory is kept, so no later
/// registration takes its address): every use must be refused as not
/// registered.
pub fn gone_token(driver: &Driver) -> (BufferToken, HostBuffer) {
    let mut mem = HostBuffer::new(4096).unwrap();
    // SAFETY: `mem` is returned and outlives the registration, removed here.
    let token = unsafe { driver.register(mem.as_mut_ptr(), mem.len()) }.unwrap();
    driver.deregister(&token).unwrap();
    (token, mem)
}

impl Drop for Buf<'_> {
    fn drop(&mut self) {
        match self.driver.deregister(&self.token) {
            // Deregistered now, or by the test before.
            Ok(()) | Err(ugds::Error::NotRegistered { .. }) => {}
            Err(e) => {
                // A buffer a stuck command holds must not be freed: leak it.
                eprintln!("buffer kept (not freed): {e}");
                std::mem::forget(std::mem::replace(&mut self.mem, HostBuffer::new(1).unwrap()));
            }
        }
    }
}

/// Deterministic bytes for offset `off` of a test pattern `seed`.
pub fn pattern(seed: u8, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| ((off + i).wrapping_mul(31) as u8) ^ seed ^ (((off + i) >> 9) as u8)).collect()
}

/// Waits until `cond` holds (checked every millisecond), failing the test
/// after 10 s with `what`: tests order their threads on events, not sleeps.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < give_up, "waited 10 s for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
