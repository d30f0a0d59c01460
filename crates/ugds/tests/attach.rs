//! Processes attached to a controller another one owns (`ugds::serve`),
//! through the public API: here each attached session is a platform of
//! this process on its own socket (the protocol, the owner's checks and
//! its teardown are the same as across processes; the ugds tool's tests
//! run them across processes, killed ones included).

mod common;

use common::{pattern, wait_for, Buf};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use ugds::platform::attach::wire::{self, op, Reader, Writer};
use ugds::platform::attach::AttachPlatform;
use ugds::platform::sys::shared::SharedMemory;
use ugds::platform::sys::unix::Seqpacket;
use ugds::serve::{ServeOptions, Server};
use ugds::{Driver, ErrorKind, Handle, HandleOptions, HostBuffer};
use ugds_emu::{EmuConfig, EmuControl, EmuPlatform, Fault, FaultAction, FaultTarget, NamespaceConfig};

fn socket_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("ugds-attach-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn serve(name: &str, opts: ServeOptions) -> (Server, EmuControl) {
    let cfg = EmuConfig::default().namespaces(vec![NamespaceConfig::memory(16 << 20, 512)]).max_io_queues(16);
    let emu = EmuPlatform::new(cfg).unwrap();
    let control = emu.control();
    (Server::start(Arc::new(emu), &socket_path(name), opts).unwrap(), control)
}

fn handle_opts() -> HandleOptions {
    HandleOptions::default()
        .sync_queues(1)
        .async_queues(1)
        .batch_queues(0)
        .queue_depth(32)
        .timeout(Duration::from_secs(5))
}

fn attach(d: &Driver, server: &Server) -> ugds::Result<Handle> {
    d.open_handle(Arc::new(AttachPlatform::connect(server.path())?), handle_opts())
}

fn write_read(d: &Driver, h: &Handle, seed: u8, off: u64, len: usize) {
    let mut b = Buf::new(d, len);
    write_read_with(&mut b, h, seed, off, len);
}

fn write_read_with(b: &mut Buf<'_>, h: &Handle, seed: u8, off: u64, len: usize) {
    b.mem[..len].copy_from_slice(&pattern(seed, off, len));
    assert_eq!(h.write(&b.token, len, off, 0).unwrap(), len);
    b.mem.fill(0);
    assert_eq!(h.read(&b.token, len, off, 0).unwrap(), len);
    assert!(b.mem[..len] == pattern(seed, off, len)[..], "data read back at {off:#x} differs");
}

#[test]
fn two_attached_sessions_share_a_namespace_and_see_each_others_data() {
    let (server, emu) = serve("share", ServeOptions::default());
    let d = Driver::open();
    let a = attach(&d, &server).unwrap();
    let b = attach(&d, &server).unwrap();
    assert_eq!(a.share(), 0..16 << 20);
    assert!(a.controller().platform.starts_with("attached to"));
    write_read(&d, &a, 1, 0, 64 << 10);
    write_read(&d, &b, 2, 1 << 20, 128 << 10);
    // Each reads what the other wrote.
    let mut buf = Buf::new(&d, 64 << 10);
    b.read(&buf.token, 64 << 10, 0, 0).unwrap();
    assert!(buf.mem[..] == pattern(1, 0, 64 << 10)[..]);
    a.read(&buf.token, 64 << 10, 1 << 20, 0).unwrap();
    assert!(buf.mem[..] == pattern(2, 1 << 20, 64 << 10)[..]);
    buf.mem.fill(0);
    let s = server.stats();
    assert_eq!((s.attached, s.sessions, s.bad_requests), (2, 2, 0), "{s:?}");
    assert!(s.queues_in_use >= 4, "{s:?}");
    drop(buf);
    a.close(ugds::Drain::NoWait).unwrap();
    b.close(ugds::Drain::NoWait).unwrap();
    drop((a, b));
    wait_for("both sessions torn down", || {
        let s = server.stats();
        s.attached == 0 && s.queues_in_use == 0 && s.mappings == 0
    });
    assert_eq!(emu.stats().dma_faults, 0);
    server.stop().unwrap();
}

#[test]
fn a_split_namespace_gives_each_session_its_part_and_refuses_the_rest() {
    let (server, _emu) = serve("split", ServeOptions { parts: 2, ..Default::default() });
    let d = Driver::open();
    let a = attach(&d, &server).unwrap();
    let b = attach(&d, &server).unwrap();
    let half = 8u64 << 20;
    assert_eq!((a.share(), b.share()), (0..half, half..2 * half));
    write_read(&d, &a, 3, half - 4096, 4096);
    write_read(&d, &b, 4, half, 4096);
    let buf = Buf::new(&d, 8192);
    let e = a.write(&buf.token, 4096, half, 0).unwrap_err();
    assert!(matches!(e, ugds::Error::OutOfRange { .. }), "{e}");
    let e = b.read(&buf.token, 4096, half - 4096, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("share"), "{e}");
    let e = b.read(&buf.token, 8192, half - 4096, 0).unwrap_err();
    assert!(e.to_string().contains("share"), "straddling the boundary: {e}");
    // A queue lent out checks the share too.
    let mut q = b.io_queue().unwrap();
    assert!(q.submit_read(&buf.token, 4096, 0, 0, 1).is_err());
    drop(q);
    // Both parts are held: a third session is refused at attach.
    let e = attach(&d, &server).unwrap_err();
    assert!(e.to_string().contains("parts"), "{e}");
    drop(buf);
    drop(a);
    // Its part is free again.
    wait_for("the first session torn down", || server.stats().attached == 1);
    let c = attach(&d, &server).unwrap();
    assert_eq!(c.share(), 0..half);
}

#[test]
fn a_session_that_hangs_up_mid_io_leaves_no_queue_and_no_mapping() {
    let (server, emu) = serve("hangup", ServeOptions::default());
    let d = Driver::open();
    let keep = attach(&d, &server).unwrap();
    let used = server.stats().queues_in_use;
    let sock = Seqpacket::connect(server.path()).unwrap();
    let cut = sock.as_fd().try_clone_to_owned().unwrap();
    let gone = d.open_handle(Arc::new(AttachPlatform::over(sock, server.path()).unwrap()), handle_opts()).unwrap();
    assert_eq!(server.stats().queues_in_use, 2 * used);
    // A read stalled in the controller when the session ends.
    let before = emu.stats().commands;
    emu.inject(Fault::next(FaultTarget::Io(None), FaultAction::Stall(Duration::from_secs(2))));
    let buf = Buf::new(&d, 4096);
    let mut keep_buf = Buf::new(&d, 8192);
    let mut q = gone.io_queue().unwrap();
    q.submit_read(&buf.token, 4096, 0, 0, 7).unwrap();
    q.ring();
    wait_for("the stalled read reached the controller", || emu.stats().commands > before);
    // The socket closes as at a process's death: the owner deletes the
    // session's submission queues, then its completion queues, then
    // removes its mappings.
    // SAFETY: shuts down a socket this test holds a descriptor of.
    unsafe { libc::shutdown(cut.as_raw_fd(), libc::SHUT_RDWR) };
    wait_for("the departed session's queues deleted", || server.stats().queues_in_use == used);
    let s = server.stats();
    assert_eq!((s.attached, s.leaked), (1, 0), "{s:?}");
    // The other session's I/O goes on, its data right.
    for i in 0..16u64 {
        write_read_with(&mut keep_buf, &keep, i as u8, i * 8192, 8192);
    }
    // The departed session's own calls fail: its owner is gone for it.
    let e = gone.read(&buf.token, 4096, 0, 0).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Device | ErrorKind::Timeout | ErrorKind::Closed), "{e}");
    // Registering more memory while a handle whose owner is gone is
    // open is refused (registrations map for every open handle): close it.
    let mut more = HostBuffer::new(4096).unwrap();
    // SAFETY: `more` outlives the attempt, which is refused.
    let refused = unsafe { d.register(more.as_mut_ptr(), 4096) }.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Device, "{refused}");
    drop(q);
    let e = gone.close(ugds::Drain::Timeout(Duration::from_secs(1)));
    eprintln!("close of the departed session's handle: {e:?}");
    drop(gone);
    write_read(&d, &keep, 42, 0, 4096);
    drop((buf, keep_buf));
    assert_eq!(emu.stats().dma_faults, 0);
}

/// A raw client: sends `req` (with `fds`), returns the reply's status and body.
fn call(sock: &Seqpacket, req: &Writer, fds: &[std::os::fd::BorrowedFd<'_>]) -> (ugds::Result<()>, Vec<u8>) {
    sock.send(&req.0, fds).unwrap();
    let mut buf = vec![0u8; wire::MAX_MESSAGE];
    let (n, _) = sock.recv(&mut buf).unwrap();
    buf.truncate(n);
    (Reader::new(&buf).status(), buf)
}

#[test]
fn requests_that_are_not_the_sessions_are_refused_and_change_nothing() {
    let (server, emu) = serve("bad", ServeOptions { queues_per_process: 2, ..Default::default() });
    let sock = Seqpacket::connect(server.path()).unwrap();
    let refused = |req: &Writer, fds: &[std::os::fd::BorrowedFd<'_>], why: &str| {
        let (st, _) = call(&sock, req, fds);
        let e = st.expect_err(why);
        assert!(e.to_string().contains(why), "{why}: {e}");
    };
    refused(&Writer::new(op::QUEUES), &[], "HELLO");
    let mut hello = Writer::new(op::HELLO);
    hello.u32(wire::VERSION);
    call(&sock, &hello, &[]).0.unwrap();
    refused(&hello, &[], "second HELLO");
    refused(&Writer::new(99), &[], "unknown request");
    refused(&Writer(vec![1, 2]), &[], "malformed");
    let mut q = Writer::new(op::QUEUES);
    q.u32(64).u32(0); // no interrupt vectors: its queues poll
    let (st, body) = call(&sock, &q, &[]);
    st.unwrap();
    let mut r = Reader::new(&body);
    r.status().unwrap();
    assert_eq!(r.u32().unwrap(), 2, "capped at queues_per_process");
    // Reserved again while no queue of the session exists: the block is
    // given back and taken anew.
    call(&sock, &q, &[]).0.unwrap();
    // A mapping: one sealed memfd, whole pages inside the file.
    let mem = SharedMemory::new(8192).unwrap();
    let mut m = Writer::new(op::MAP);
    m.u64(0).u64(8192);
    refused(&m, &[], "descriptors");
    let mut too_long = Writer::new(op::MAP);
    too_long.u64(0).u64(3 * 4096);
    refused(&too_long, &[mem.as_fd()], "beyond");
    // GPU memory comes as a dma-buf, which only a platform that imports
    // them (ugds_drv) maps; the emulator refuses.
    let mut dmabuf = Writer::new(op::MAPDMABUF);
    dmabuf.u64(0).u64(4096);
    refused(&dmabuf, &[mem.as_fd()], "cannot import a dma-buf");
    refused(&dmabuf, &[], "descriptors");
    let (st, body) = call(&sock, &m, &[mem.as_fd()]);
    st.unwrap();
    let mut r = Reader::new(&body);
    r.status().unwrap();
    let iova = r.u64().unwrap();
    let admin = |sqe: ugds::nvme::Sqe| {
        let mut w = Writer::new(op::ADMIN);
        w.bytes(&sqe.to_bytes());
        w
    };
    use ugds::nvme::{Cid, Qid, Sqe};
    refused(&admin(Sqe::create_io_cq(Cid(0), Qid(3), 16, iova, 0, false)), &[], "not yours");
    refused(&admin(Sqe::create_io_cq(Cid(0), Qid(0), 16, iova, 0, false)), &[], "not yours");
    refused(&admin(Sqe::create_io_cq(Cid(0), Qid(1), 16, iova + (1 << 20), 0, false)), &[], "mappings");
    refused(&admin(Sqe::create_io_cq(Cid(0), Qid(1), 1024, iova, 0, false)), &[], "mappings");
    refused(&admin(Sqe::create_io_cq(Cid(0), Qid(1), 16, iova, 1, true)), &[], "you hold none");
    let mut vector = Writer::new(op::VECTOR);
    vector.u32(1);
    refused(&vector, &[], "you hold none");
    refused(&admin(Sqe::create_io_sq(Cid(0), Qid(1), 16, iova, Qid(1))), &[], "does not");
    refused(&admin(Sqe::set_num_queues(Cid(0), 64, 64)), &[], "owner's");
    refused(&admin(Sqe::delete_io_sq(Cid(0), Qid(1))), &[], "no submission queue");
    // Good ones work, and the rings' mapping cannot go while they exist.
    call(&sock, &admin(Sqe::create_io_cq(Cid(0), Qid(1), 16, iova, 0, false)), &[]).0.unwrap();
    call(&sock, &admin(Sqe::create_io_sq(Cid(0), Qid(1), 16, iova + 4096, Qid(1))), &[]).0.unwrap();
    refused(&admin(Sqe::delete_io_cq(Cid(0), Qid(1))), &[], "still completes");
    // Its queues exist: no second block for a second handle.
    refused(&q, &[], "another handle");
    let mut un = Writer::new(op::UNMAP);
    un.u64(iova);
    refused(&un, &[], "rings");
    let mut un_other = Writer::new(op::UNMAP);
    un_other.u64(iova + 4096);
    refused(&un_other, &[], "no mapping of yours");
    let s = server.stats();
    assert!(s.bad_requests >= 21, "{s:?}");
    assert_eq!((s.mappings, s.queues_in_use), (1, 2), "{s:?}");
    call(&sock, &Writer::new(op::DETACH), &[]).0.unwrap();
    call(&sock, &un, &[]).0.unwrap();
    assert_eq!(server.stats().mappings, 0);
    drop(sock);
    wait_for("the raw session torn down", || server.stats().queues_in_use == 0);
    // The server still serves.
    let d = Driver::open();
    let h = attach(&d, &server).unwrap();
    write_read(&d, &h, 9, 0, 4096);
    assert_eq!(emu.stats().dma_faults, 0);
}

#[test]
fn private_memory_is_refused_in_an_attached_process_with_a_clear_error() {
    let (server, _emu) = serve("private", ServeOptions::default());
    let d = Driver::open();
    let h = attach(&d, &server).unwrap();
    let mut v = vec![0u8; 8192];
    // SAFETY: `v` outlives the registration attempt, which fails.
    let e = match unsafe { d.register(v.as_mut_ptr(), v.len()) } {
        Ok(tok) => h.read(&tok, 4096, 0, 0).map(drop).unwrap_err(),
        Err(e) => e,
    };
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("private to this process"), "{e}");
}

#[test]
fn one_attachment_serves_one_handle_at_a_time() {
    let (server, _emu) = serve("reopen", ServeOptions::default());
    let d = Driver::open();
    let p: Arc<dyn ugds::platform::Platform> = Arc::new(AttachPlatform::connect(server.path()).unwrap());
    let h = d.open_handle(p.clone(), handle_opts()).unwrap();
    write_read(&d, &h, 5, 0, 4096);
    // A second handle while the first holds the session's queues: refused,
    // and the first goes on.
    let e = d.open_handle(p.clone(), handle_opts()).unwrap_err();
    assert!(e.to_string().contains("another handle"), "{e}");
    write_read(&d, &h, 6, 4096, 4096);
    h.close(ugds::Drain::NoWait).unwrap();
    drop(h);
    // Closed: the next handle on the same attachment gets queues anew.
    let h = d.open_handle(p, handle_opts()).unwrap();
    write_read(&d, &h, 7, 8192, 4096);
    assert_eq!(server.stats().sessions, 1);
}

#[test]
fn attached_queues_complete_by_interrupt_on_vectors_of_their_own() {
    let (server, emu) = serve("irq", ServeOptions::default());
    let d = Driver::open();
    let opts = handle_opts().completion(ugds::Completion::Interrupt);
    let a = d.open_handle(Arc::new(AttachPlatform::connect(server.path()).unwrap()), opts.clone()).unwrap();
    let b = d.open_handle(Arc::new(AttachPlatform::connect(server.path()).unwrap()), opts).unwrap();
    // Each session's synchronous queue has a vector, and not the other's.
    let va: Vec<_> = a.queues().iter().filter_map(|q| q.vector).collect();
    assert!(!va.is_empty(), "{:?}", a.queues());
    let before = emu.stats().interrupts;
    write_read(&d, &a, 1, 0, 65536);
    write_read(&d, &b, 2, 1 << 20, 65536);
    assert!(emu.stats().interrupts > before, "completions signalled their vectors");
    assert_eq!(a.interrupt_waits_capped(), 0);
    drop((a, b));
    wait_for("both sessions torn down", || server.stats().attached == 0);
    // Their vectors are free again: a new session gets them.
    let c = d
        .open_handle(
            Arc::new(AttachPlatform::connect(server.path()).unwrap()),
            handle_opts().completion(ugds::Completion::Interrupt),
        )
        .unwrap();
    write_read(&d, &c, 3, 0, 4096);
}

/// Batches, stream-ordered and vectored I/O in an attached process, and a
/// volume striped over two served controllers: the same calls as a process
/// that owns its controller.
#[test]
fn every_api_works_attached() {
    use ugds::{BatchIo, BatchOp, BatchStatus, HostStream, StreamIo, Volume, VolumeLayout};
    let (s1, _e1) = serve("api1", ServeOptions::default());
    let (s2, _e2) = serve("api2", ServeOptions::default());
    let d = Driver::open();
    let opts = handle_opts().batch_queue(true).batch_queues(1);
    let h = d.open_handle(Arc::new(AttachPlatform::connect(s1.path()).unwrap()), opts.clone()).unwrap();
    let mut b = Buf::new(&d, 32 * 4096);
    b.mem.copy_from_slice(&pattern(4, 0, 32 * 4096));
    // A batch of 32 writes, then reads.
    let batch = h.batch(32).unwrap();
    let ios = |op| -> Vec<BatchIo> {
        (0..32u64)
            .map(|i| BatchIo {
                op,
                buf: b.token,
                size: 4096,
                file_offset: i * 8192,
                buf_offset: i as usize * 4096,
                cookie: i,
            })
            .collect()
    };
    batch.submit(&ios(BatchOp::Write)).unwrap();
    let mut ev = Vec::new();
    assert_eq!(batch.get_status(32, 32, Some(Duration::from_secs(10)), &mut ev).unwrap(), 32);
    assert!(ev.iter().all(|e| e.status == BatchStatus::Complete));
    b.mem.fill(0);
    batch.submit(&ios(BatchOp::Read)).unwrap();
    ev.clear();
    assert_eq!(batch.get_status(32, 32, Some(Duration::from_secs(10)), &mut ev).unwrap(), 32);
    assert!(b.mem[..] == pattern(4, 0, 32 * 4096)[..], "batch round trip");
    drop(batch);
    // Stream-ordered: a write then a read back, in order on a host stream.
    let s = HostStream::new();
    let (w, wr) = StreamIo::new(65536, 1 << 20, 0);
    h.write_async(&b.token, w, &s).unwrap();
    let (r, rr) = StreamIo::new(65536, 1 << 20, 65536);
    h.read_async(&b.token, r, &s).unwrap();
    s.synchronize();
    assert_eq!((wr.bytes(), rr.bytes()), (65536, 65536));
    assert!(b.mem[65536..131072] == b.mem[..65536], "stream-ordered round trip");
    // Vectored: two segments as one range.
    let segs = [ugds::Segment::new(&b.token, 0, 4096), ugds::Segment::new(&b.token, 8192, 4096)];
    assert_eq!(h.readv(&segs, 1 << 20).unwrap(), 8192);
    assert!(b.mem[8192..12288] == b.mem[65536 + 4096..65536 + 8192]);
    // A volume striped over two served controllers.
    let h2 = d.open_handle(Arc::new(AttachPlatform::connect(s2.path()).unwrap()), opts).unwrap();
    let v = Volume::new(vec![h, h2], VolumeLayout::Striped { stripe: 65536 }).unwrap();
    let mut vb = Buf::new(&d, 1 << 20);
    vb.mem.copy_from_slice(&pattern(5, 4096, 1 << 20));
    assert_eq!(v.write(&vb.token, 1 << 20, 4096, 0).unwrap(), 1 << 20);
    vb.mem.fill(0);
    assert_eq!(v.read(&vb.token, 1 << 20, 4096, 0).unwrap(), 1 << 20);
    assert!(vb.mem[..] == pattern(5, 4096, 1 << 20)[..], "volume round trip");
    let (st1, st2) = (s1.stats(), s2.stats());
    assert_eq!((st1.bad_requests, st2.bad_requests), (0, 0));
}

/// A process that sends a registration and goes before the reply: the
/// owner maps, finds the socket closed, and takes the mapping down again.
#[test]
fn a_process_gone_mid_registration_leaves_no_mapping() {
    let (server, _emu) = serve("midmap", ServeOptions::default());
    let sock = Seqpacket::connect(server.path()).unwrap();
    let mut hello = Writer::new(op::HELLO);
    hello.u32(wire::VERSION);
    call(&sock, &hello, &[]).0.unwrap();
    let mem = SharedMemory::new(1 << 20).unwrap();
    let mut m = Writer::new(op::MAP);
    m.u64(0).u64(1 << 20);
    sock.send(&m.0, &[mem.as_fd()]).unwrap();
    drop(sock);
    wait_for("the session torn down", || {
        let s = server.stats();
        s.attached == 0 && s.mappings == 0 && s.sessions == 1
    });
}

/// A process asking for many queue pairs (one per CPU on a large host)
/// gets a quarter of the controller's by default: the next one attaches too.
#[test]
fn one_greedy_process_leaves_queue_pairs_for_the_others() {
    let (server, _emu) = serve("greedy", ServeOptions::default());
    assert_eq!((server.queues(), server.queues_per_process()), (16, 4));
    let d = Driver::open();
    let greedy = HandleOptions::default().sync_queues(16).async_queues(4).timeout(Duration::from_secs(5));
    let hs: Vec<Handle> = (0..4)
        .map(|_| d.open_handle(Arc::new(AttachPlatform::connect(server.path()).unwrap()), greedy.clone()).unwrap())
        .collect();
    assert!(hs.iter().all(|h| h.queues().len() == 4), "{:?}", hs[0].queues());
    for (i, h) in hs.iter().enumerate() {
        write_read(&d, h, i as u8, i as u64 * 65536, 4096);
    }
    // All sixteen held: a fifth is refused with the reason.
    let e = d.open_handle(Arc::new(AttachPlatform::connect(server.path()).unwrap()), greedy).unwrap_err();
    assert!(e.to_string().contains("no I/O queue pair left"), "{e}");
}
