//! The posting path against a fake provider.

use super::*;

/// What the fake provider below was posted (wr_id, address), after how
/// many requests it refuses the rest, and how many calls it took.
#[derive(Default)]
struct Fake(Vec<(u64, u64)>, usize, usize);

thread_local! {
    static POSTED: std::cell::RefCell<Fake> = Default::default();
}

/// A provider's post_send that walks the chain as a provider does,
/// records each request, and refuses the one past its limit (`bad`
/// pointing at it, as libibverbs says).
unsafe extern "C" fn fake_send(_qp: *mut c_void, mut wr: *mut SendWr, bad: *mut *mut SendWr) -> c_int {
    POSTED.with(|p| {
        let mut p = p.borrow_mut();
        p.2 += 1;
        while !wr.is_null() {
            if p.0.len() == p.1 {
                // SAFETY: `bad` is the caller's out pointer.
                unsafe { *bad = wr };
                return libc::ENOMEM;
            }
            // SAFETY: the chain send_all built, alive across the call.
            let (id, addr, next) = unsafe { ((*wr).wr_id, (*(*wr).sg_list).addr, (*wr).next) };
            p.0.push((id, addr));
            wr = next;
        }
        0
    })
}

unsafe extern "C" fn fake_recv(_qp: *mut c_void, _wr: *mut RecvWr, _bad: *mut *mut RecvWr) -> c_int {
    0
}

/// `send_all` chains every request in order, 16 to a call, and says
/// how many were posted when the provider refuses one.
#[test]
fn send_all_chains_the_sends_and_counts_a_refusal() {
    let p = Poster { qp: std::ptr::null_mut(), send: fake_send, recv: fake_recv };
    let sends: Vec<(u64, Sge)> =
        (0..40u64).map(|i| (i | 1 << 63, Sge { addr: 0x1000 + i * 64, length: 64, lkey: 7 })).collect();
    POSTED.with(|x| *x.borrow_mut() = Fake(Vec::new(), usize::MAX, 0));
    let (n, r) = p.send_all(&sends);
    assert!(r.is_ok());
    assert_eq!(n, 40);
    POSTED.with(|x| {
        let x = x.borrow();
        assert_eq!(x.0, sends.iter().map(|(id, s)| (*id, s.addr)).collect::<Vec<_>>(), "each once, in order");
        assert_eq!(x.2, 3, "16, 16 and 8 to a call");
    });
    // Refused at the 21st: the first 20 were posted.
    POSTED.with(|x| *x.borrow_mut() = Fake(Vec::new(), 20, 0));
    let (n, r) = p.send_all(&sends);
    assert_eq!(n, 20);
    assert!(r.is_err());
    assert_eq!(p.send_all(&[]).0, 0);
}

/// Without libibverbs or an RDMA device (this machine and CI's), every
/// call is a clear error or an empty list, never a crash.
/// The structures the provider reads and writes have the C sizes (and
/// the completion channel's descriptor its place).
#[test]
fn work_requests_and_completions_have_the_c_layout() {
    assert_eq!(std::mem::size_of::<SendWr>(), 128);
    assert_eq!(std::mem::size_of::<RecvWr>(), 32);
    assert_eq!(std::mem::size_of::<Sge>(), 16);
    assert_eq!(std::mem::size_of::<WorkCompletion>(), 48);
    assert_eq!(std::mem::offset_of!(WorkCompletion, byte_len), 20);
    assert_eq!(std::mem::size_of::<RawChannel>(), 16);
    assert!(std::mem::size_of::<QpAttr>() >= 144, "room for ibv_qp_attr");
    assert_eq!(std::mem::offset_of!(RawChannel, fd), 8);
    assert_eq!(wc_status_str(10), "remote access error");
    assert_eq!(wc_status_str(99), "unknown");
}

#[test]
fn no_rdma_here_is_a_clear_answer() {
    match device_names() {
        Ok(names) => {
            for n in &names {
                let d = Device::open(n).expect("a listed device opens");
                assert_eq!(&d.info().name, n);
            }
            let e = Device::open("ugds-no-such-device").unwrap_err();
            assert!(e.to_string().contains("no RDMA device ugds-no-such-device"), "{e}");
        }
        Err(e) => {
            assert!(matches!(e, Error::Unsupported(ref m) if m.contains("libibverbs") || m.contains("no verbs")), "{e}")
        }
    }
}
