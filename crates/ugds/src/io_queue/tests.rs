//! A lent queue against a controller whose rings are four entries deep and
//! which completes each burst in reverse order, with an error now and then:
//! the ring wraps hundreds of times, the phase tag flips as often, and each
//! request is reported once, with its own tag and outcome.

use crate::{Driver, HandleOptions, HostBuffer};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use ugds_emu::{EmuConfig, EmuPlatform, Fault, FaultAction, FaultTarget, NamespaceConfig};
use ugds_nvme::status::generic;
use ugds_nvme::Status;

#[test]
fn a_wrapping_ring_completed_out_of_order_reports_each_request_once() {
    let cfg =
        EmuConfig::default().namespaces(vec![NamespaceConfig::memory(4 << 20, 512)]).mqes(3).reverse_completions(true);
    let emu = EmuPlatform::new(cfg).unwrap();
    let control = emu.control();
    let d = Driver::open();
    let opts = HandleOptions::default().sync_queues(1).async_queues(1).queue_depth(4).timeout(Duration::from_secs(10));
    let h = d.open_handle(Arc::new(emu), opts).unwrap();
    let mut mem = HostBuffer::new(16 * 4096).unwrap();
    for (i, b) in mem.iter_mut().enumerate() {
        *b = (i * 7 + i / 4096) as u8;
    }
    // SAFETY: `mem` outlives the registration, deregistered below.
    let token = unsafe { d.register(mem.as_mut_ptr(), mem.len()) }.unwrap();
    h.write(&token, 16 * 4096, 0, 0).unwrap();
    let mut q = h.io_queue().unwrap();
    let depth = q.depth();
    assert!(depth <= 4, "a ring of four entries lends at most {depth}");
    let mut seen = HashSet::new();
    let (mut failed, mut tag) = (0, 0u64);
    for round in 0..300u64 {
        if round % 7 == 3 {
            control.inject(Fault::next(
                FaultTarget::Io(None),
                FaultAction::Status(Status::generic(generic::DATA_TRANSFER_ERROR)),
            ));
        }
        let first = tag;
        for k in 0..depth as u64 {
            let slot = ((round * 3 + k) % 16) as usize;
            q.submit_read(&token, 4096, slot as u64 * 4096, slot * 4096, tag).unwrap();
            tag += 1;
        }
        q.ring();
        let mut got = 0;
        while got < depth {
            got += q.poll(usize::MAX, |t, r| {
                assert!((first..first + depth as u64).contains(&t), "round {round}: tag {t} is not of this round");
                assert!(seen.insert(t), "tag {t} reported twice");
                match r {
                    Ok(n) => assert_eq!(n, 4096),
                    Err(_) => failed += 1,
                }
            });
        }
        assert_eq!(q.outstanding(), 0);
    }
    assert_eq!(seen.len() as u64, tag, "every request reported");
    assert!(failed >= 40, "the injected errors were reported ({failed})");
    drop(q);
    // The data is where it was written: no completion went to another slot.
    let mut back = HostBuffer::new(16 * 4096).unwrap();
    // SAFETY: as above.
    let t2 = unsafe { d.register(back.as_mut_ptr(), back.len()) }.unwrap();
    h.read(&t2, 16 * 4096, 0, 0).unwrap();
    assert!(back[..] == mem[..]);
    d.deregister(&t2).unwrap();
    d.deregister(&token).unwrap();
    assert_eq!(control.stats().dma_faults, 0);
}
