//! GPU memory of processes attached to an emulated controller another
//! process owns (`ugds::serve`): the owner opens the process's allocation by
//! its CUDA IPC handle, and its emulated controller copies to and from it.
//! One test attaches from the owner's own process (which registers the
//! memory as it is), the others from child processes: this binary run again
//! on `child_process_io_on_its_cuda_memory`.
//!
//! These need a CUDA GPU. Where there is none each test prints SKIPPED and
//! passes; `UGDS_REQUIRE_GPU=1` turns a missing GPU into a failure.

mod common;
mod gpu_common;

use common::{pattern, wait_for, Buf};
use gpu_common::{cuda_device, skip_without_gpu};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use ugds::gpu::cuda::{Cuda, DeviceBuffer};
use ugds::gpu::StreamWait;
use ugds::platform::attach::AttachPlatform;
use ugds::serve::{ServeOptions, Server};
use ugds::{Driver, Handle, HandleOptions, StreamIo};
use ugds_emu::{EmuConfig, EmuPlatform, NamespaceConfig};

/// The socket a child attaches to; set only in a child.
const CHILD_SOCKET: &str = "UGDS_TEST_ATTACH_SOCKET";
/// What a child does: `verify` (round trips, then exit) or `loop` (I/O
/// until killed).
const CHILD_MODE: &str = "UGDS_TEST_ATTACH_MODE";
/// What a child writes, and where: the parent reads it back.
const CHILD_SEED: u8 = 9;
const CHILD_OFFSET: u64 = 8 << 20;
const CHILD_LEN: usize = 1 << 20;

/// CUDA (without the other suites' fixture: these tests make their own
/// streams and memory), or `None` (said) without a GPU.
fn cuda() -> Option<Arc<Cuda>> {
    cuda_device().map_err(skip_without_gpu).ok()
}

fn serve(name: &str) -> Server {
    let path = std::env::temp_dir().join(format!("ugds-gpu-attach-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let cfg = EmuConfig::default().namespaces(vec![NamespaceConfig::memory(32 << 20, 512)]).max_io_queues(16);
    Server::start(Arc::new(EmuPlatform::new(cfg).unwrap()), &path, ServeOptions::default()).unwrap()
}

fn attach(d: &Driver, path: &Path) -> Handle {
    let opts = HandleOptions::default().sync_queues(1).async_queues(1).queue_depth(32).timeout(Duration::from_secs(10));
    d.open_handle(Arc::new(AttachPlatform::connect(path).unwrap()), opts).unwrap()
}

fn download(b: &DeviceBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    b.download(off, &mut v).unwrap();
    v
}

/// Writes a pattern from GPU memory, reads it back into another part of
/// it (synchronously, then ordered on a CUDA stream), and checks both.
fn gpu_round_trips(cuda: &Arc<Cuda>, d: &Driver, h: &Handle, seed: u8, off: u64) {
    let gpu = cuda.alloc(4 << 20).unwrap();
    // SAFETY: `gpu` outlives the registration (deregistered below).
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    for &(len, at) in &[(4096usize, 0usize), (CHILD_LEN, 512), (CHILD_LEN + 8192, 4096)] {
        gpu.upload(at, &pattern(seed, off, len)).unwrap();
        assert_eq!(h.write(&t, len, off, at).unwrap(), len);
        assert_eq!(h.read(&t, len, off, 2 << 20).unwrap(), len);
        assert!(download(&gpu, 2 << 20, len) == pattern(seed, off, len), "{len} bytes from GPU memory at {at}");
    }
    let raw = cuda.create_stream().unwrap();
    // SAFETY: `raw` outlives `s`.
    let s = unsafe { cuda.stream(raw.raw(), StreamWait::DeviceSide) }.unwrap();
    let (io, res) = StreamIo::new(65536, off, 3 << 20);
    h.read_async(&t, io, &s).unwrap();
    raw.synchronize().unwrap();
    assert_eq!(res.bytes(), 65536, "{:?}", res.take_error());
    assert!(download(&gpu, 3 << 20, 65536) == pattern(seed, off, 65536), "stream-ordered read");
    drop(s);
    d.deregister(&t).unwrap();
}

#[test]
fn cuda_memory_of_a_session_in_the_owners_own_process() {
    let Some(cuda) = cuda() else { return };
    let server = serve("own");
    let d = Driver::open();
    let h = attach(&d, server.path());
    gpu_round_trips(&cuda, &d, &h, 3, 1 << 20);
    drop(h);
    wait_for("the session's end", || server.stats().attached == 0);
    let st = server.stats();
    assert_eq!((st.mappings, st.leaked, st.bad_requests), (0, 0, 0), "{st:?}");
}

/// Runs this binary's child test against `socket`.
fn child(socket: &Path, mode: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["child_process_io_on_its_cuda_memory", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_SOCKET, socket)
        .env(CHILD_MODE, mode)
        .env("UGDS_REQUIRE_GPU", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn cuda_memory_of_another_process_goes_both_ways() {
    let Some(_cuda) = cuda() else { return };
    let server = serve("child");
    let out = child(server.path(), "verify").wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the attached process failed: {text}");
    assert!(text.contains("attached GPU round trips done"), "the child ran nothing: {text}");
    wait_for("the child's session to end", || server.stats().attached == 0);
    let st = server.stats();
    assert_eq!((st.mappings, st.leaked, st.bad_requests), (0, 0, 0), "{st:?}");
    // What the child wrote from its GPU memory is on the namespace.
    let d = Driver::open();
    let h = attach(&d, server.path());
    let b = Buf::new(&d, CHILD_LEN);
    assert_eq!(h.read(&b.token, CHILD_LEN, CHILD_OFFSET, 0).unwrap(), CHILD_LEN);
    assert!(b.mem[..] == pattern(CHILD_SEED, CHILD_OFFSET, CHILD_LEN)[..], "the child's data on the namespace");
}

#[test]
fn a_process_killed_mid_io_on_cuda_memory_leaves_nothing_mapped() {
    let Some(cuda) = cuda() else { return };
    let server = serve("killed");
    let mut c = child(server.path(), "loop");
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    let started = lines.by_ref().map_while(Result::ok).any(|l| l.contains("looping"));
    assert!(started, "the child never started its I/O");
    assert!(server.stats().mappings > 0, "the child's GPU memory is mapped while it runs");
    c.kill().unwrap();
    c.wait().unwrap();
    wait_for("the killed process's session to end", || server.stats().attached == 0);
    let st = server.stats();
    assert_eq!((st.mappings, st.leaked, st.bad_requests), (0, 0, 0), "{st:?}");
    // The controller serves the next process as before.
    let d = Driver::open();
    let h = attach(&d, server.path());
    gpu_round_trips(&cuda, &d, &h, 4, 4 << 20);
}

#[test]
#[ignore = "the child process of the tests above: they run it with its socket"]
fn child_process_io_on_its_cuda_memory() {
    let Some(socket) = std::env::var_os(CHILD_SOCKET).map(PathBuf::from) else {
        panic!("run by cuda_memory_of_another_process_goes_both_ways, which sets {CHILD_SOCKET}");
    };
    let cuda = cuda().expect("UGDS_REQUIRE_GPU is set by the parent");
    let d = Driver::open();
    let h = attach(&d, &socket);
    if std::env::var(CHILD_MODE).as_deref() == Ok("loop") {
        let gpu = cuda.alloc(1 << 20).unwrap();
        // SAFETY: `gpu` outlives the registration: the process is killed
        // while both stand.
        let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
        println!("looping");
        let give_up = Instant::now() + Duration::from_secs(60);
        while Instant::now() < give_up {
            h.read(&t, 1 << 20, 0, 0).unwrap();
            h.write(&t, 1 << 20, 1 << 20, 0).unwrap();
        }
        panic!("not killed within 60 s");
    }
    gpu_round_trips(&cuda, &d, &h, CHILD_SEED + 1, 2 << 20);
    let gpu = cuda.alloc(CHILD_LEN).unwrap();
    gpu.upload(0, &pattern(CHILD_SEED, CHILD_OFFSET, CHILD_LEN)).unwrap();
    // SAFETY: `gpu` outlives the registration.
    let t = unsafe { d.register_cuda(gpu.ptr(), gpu.len()) }.unwrap();
    assert_eq!(h.write(&t, CHILD_LEN, CHILD_OFFSET, 0).unwrap(), CHILD_LEN);
    d.deregister(&t).unwrap();
    println!("attached GPU round trips done");
}
