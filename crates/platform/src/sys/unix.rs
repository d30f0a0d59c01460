//! Unix sequenced-packet sockets: whole messages, with descriptors passed
//! alongside (SCM_RIGHTS) and the peer's credentials (SO_PEERCRED).

use crate::{Error, Result};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// A connected or listening `SOCK_SEQPACKET` socket.
#[derive(Debug)]
pub struct Seqpacket(OwnedFd);

/// Who is at the other end of a connection (the kernel's word, taken at
/// connect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: i32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "{}: a socket path is 1 to {} bytes without NUL",
            path.display(),
            addr.sun_path.len() - 1
        )));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn socket() -> Result<OwnedFd> {
    // SAFETY: creates a descriptor.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::os("socket(AF_UNIX, SOCK_SEQPACKET)"));
    }
    // SAFETY: a descriptor we just made and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Seqpacket {
    /// Listens at `path` (which must not exist).
    pub fn listen(path: &Path) -> Result<Seqpacket> {
        let (addr, len) = sockaddr(path)?;
        let fd = socket()?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) } != 0 {
            return Err(Error::io(format!("bind {}", path.display()), std::io::Error::last_os_error()));
        }
        // SAFETY: a bound socket of ours.
        if unsafe { libc::listen(fd.as_raw_fd(), 64) } != 0 {
            return Err(Error::os("listen"));
        }
        Ok(Seqpacket(fd))
    }

    /// Connects to the socket at `path`.
    pub fn connect(path: &Path) -> Result<Seqpacket> {
        let (addr, len) = sockaddr(path)?;
        let fd = socket()?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) } != 0 {
            return Err(Error::io(format!("connect {}", path.display()), std::io::Error::last_os_error()));
        }
        Ok(Seqpacket(fd))
    }

    /// A connected pair (tests, and a process serving itself).
    pub fn pair() -> Result<(Seqpacket, Seqpacket)> {
        let mut fds = [0; 2];
        // SAFETY: writes two descriptors into `fds`.
        if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) }
            != 0
        {
            return Err(Error::os("socketpair"));
        }
        // SAFETY: both descriptors are ours.
        Ok(unsafe { (Seqpacket(OwnedFd::from_raw_fd(fds[0])), Seqpacket(OwnedFd::from_raw_fd(fds[1]))) })
    }

    /// Waits up to `timeout` for a connection; `None` when none came.
    pub fn accept(&self, timeout: Duration) -> Result<Option<Seqpacket>> {
        if !self.readable(timeout) {
            return Ok(None);
        }
        // SAFETY: accepts on our listening socket; no address is asked for.
        let fd = unsafe {
            libc::accept4(self.0.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC)
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR | libc::ECONNABORTED) => Ok(None),
                _ => Err(Error::io("accept", e)),
            };
        }
        // SAFETY: a descriptor the kernel just gave us.
        Ok(Some(Seqpacket(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Whether a message (or the peer's hang-up) is waiting, within `timeout`.
    pub fn readable(&self, timeout: Duration) -> bool {
        use rustix::event::{PollFd, PollFlags};
        let mut p = [PollFd::new(&self.0, PollFlags::IN)];
        super::poll(&mut p, timeout) && !p[0].revents().is_empty()
    }

    /// Whether the peer has closed its end (checked without waiting).
    pub fn hung_up(&self) -> bool {
        use rustix::event::{PollFd, PollFlags};
        let mut p = [PollFd::new(&self.0, PollFlags::RDHUP)];
        super::poll(&mut p, Duration::ZERO)
            && p[0].revents().intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR)
    }

    /// Sends one message with `fds` alongside.
    pub fn send(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        if fds.len() > MAX_FDS {
            return Err(Error::InvalidArgument(format!("at most {MAX_FDS} descriptors per message")));
        }
        let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
        let mut control = [0u64; 8];
        // SAFETY: msghdr is plain data; all zeros is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let data = std::mem::size_of_val(fds) as u32;
            // SAFETY: CMSG_SPACE computes a size.
            msg.msg_controllen = unsafe { libc::CMSG_SPACE(data) } as _;
            msg.msg_control = control.as_mut_ptr().cast();
            // SAFETY: the control buffer (64 bytes) holds one header and
            // MAX_FDS descriptors; CMSG_FIRSTHDR points into it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(data) as _;
                let dst = libc::CMSG_DATA(c).cast::<RawFd>();
                for (i, fd) in fds.iter().enumerate() {
                    dst.add(i).write_unaligned(fd.as_raw_fd());
                }
            }
        }
        loop {
            // SAFETY: `msg` points at live buffers for the call.
            let n = unsafe { libc::sendmsg(self.0.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(Error::io("sendmsg", e));
            }
        }
    }

    /// Receives one message into `buf`: its length (0 when the peer has
    /// hung up) and the descriptors that came with it. A message longer
    /// than `buf` is refused (its descriptors closed).
    pub fn recv(&self, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut control = [0u64; 8];
        // SAFETY: msghdr is plain data; all zeros is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = loop {
            // SAFETY: `msg` points at live buffers for the call.
            let n = unsafe { libc::recvmsg(self.0.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if n >= 0 {
                break n as usize;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(Error::io("recvmsg", e));
            }
        };
        let mut fds = Vec::new();
        // SAFETY: walks the control messages the kernel wrote into
        // `control`, within msg_controllen; each SCM_RIGHTS entry holds
        // descriptors now ours.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                    let src = libc::CMSG_DATA(c).cast::<RawFd>();
                    for i in 0..count {
                        fds.push(OwnedFd::from_raw_fd(src.add(i).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Err(Error::InvalidArgument(format!(
                "a message longer than {} bytes or with too many descriptors",
                buf.len()
            )));
        }
        Ok((n, fds))
    }

    /// The peer's credentials, as the kernel recorded them at connect.
    pub fn peer(&self) -> Result<PeerCred> {
        let mut c = libc::ucred { pid: 0, uid: 0, gid: 0 };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: SO_PEERCRED writes one ucred into `c`.
        let r = unsafe {
            libc::getsockopt(
                self.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut c as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(Error::os("getsockopt(SO_PEERCRED)"));
        }
        Ok(PeerCred { pid: c.pid, uid: c.uid, gid: c.gid })
    }

    /// Stops both directions: a thread waiting in `recv` or `accept` returns.
    pub fn shutdown(&self) {
        // SAFETY: shuts down our own socket.
        unsafe { libc::shutdown(self.0.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

impl AsFd for Seqpacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_keep_their_boundaries_and_carry_descriptors() {
        let (a, b) = Seqpacket::pair().unwrap();
        let e = super::super::EventFd::new().unwrap();
        a.send(b"one", &[e.as_fd()]).unwrap();
        a.send(b"second", &[]).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = b.recv(&mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"one"[..], 1));
        let (n, fds) = b.recv(&mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"second"[..], 0));
        // SAFETY: geteuid has no preconditions.
        assert_eq!(b.peer().unwrap().uid, unsafe { libc::geteuid() });
        drop(a);
        assert!(b.hung_up());
        assert_eq!(b.recv(&mut buf).unwrap().0, 0);
    }

    #[test]
    fn a_message_longer_than_the_buffer_is_refused() {
        let (a, b) = Seqpacket::pair().unwrap();
        a.send(&[7u8; 64], &[]).unwrap();
        assert!(b.recv(&mut [0u8; 16]).is_err());
    }

    #[test]
    fn a_path_too_long_is_refused() {
        let long = "/tmp/".to_string() + &"x".repeat(200);
        assert!(matches!(Seqpacket::connect(Path::new(&long)), Err(Error::InvalidArgument(_))));
    }
}
