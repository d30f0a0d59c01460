//! The kernel path (`Driver::open_file`): what the shared conformance suite
//! does not cover (it runs against files too, with `UGDS_TEST_FILE_DIR`).

mod common;
use common::*;
use std::time::Duration;
use ugds::{Completion, Driver, HandleOptions};

fn file(dir: &str, len: u64) -> std::path::PathBuf {
    let path =
        std::path::Path::new(dir).join(format!("ugds-kp-{}-{:?}.img", std::process::id(), std::thread::current().id()));
    std::fs::File::create(&path).and_then(|f| f.set_len(len)).unwrap();
    path
}

#[test]
fn interrupt_mode_completes() {
    let d = Driver::open();
    let path = file("/tmp", 1 << 20);
    let h = d
        .open_file(&path, HandleOptions::default().completion(Completion::Interrupt).timeout(Duration::from_secs(5)))
        .unwrap();
    let b = Buf::new(&d, 8192);
    h.write(&b.token, 8192, 0, 0).unwrap();
    h.read(&b.token, 8192, 4096, 0).unwrap();
    std::fs::remove_file(&path).unwrap();
}
