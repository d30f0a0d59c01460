//! The messages between an attached process and the controller's owner:
//! one request, one reply, on a `SOCK_SEQPACKET` socket, little-endian,
//! every field read through a bounds check (a peer is input).
//!
//! | request (op) | fields | descriptor | reply after the status |
//! |---|---|---|---|
//! | `HELLO` | version | - | registers' length, offset and wake word, dstrd, part, parts, whether a device's BAR (else a sealed memfd), how GPU memory goes to the owner ([`gpu`]); the registers' file |
//! | `QUEUES` | how many | - | how many granted, the first queue id; interrupt vectors granted, the first vector |
//! | `VECTOR` | a vector (1..) of this process's | - | its eventfd |
//! | `MAP` | offset, length | the memfd | controller address of the range (contiguous) |
//! | `MAPDMABUF` | offset, length | the dma-buf | controller address of the range's first page (contiguous), the offset in it |
//! | `MAPIPC` | the runtime's handle (64 bytes), the device's UUID (16), offset in the allocation, length, the address in the process | - | controller address of the range's first page (contiguous), the offset in it |
//! | `UNMAP` | controller address | - | - |
//! | `ADMIN` | a 64-byte SQE | - | a 16-byte CQE, whether data follows, 4096 bytes of data |
//! | `DETACH` | - | - | - |
//!
//! A reply starts with a status: 0, or an error kind, an errno and a message.

use crate::{Error, Result};

/// Version of this protocol; an owner refuses any other.
pub const VERSION: u32 = 2;

/// Request codes.
pub mod op {
    /// Start of a session.
    pub const HELLO: u32 = 1;
    /// Reserve I/O queue pairs.
    pub const QUEUES: u32 = 2;
    /// Map a shared range for the controller.
    pub const MAP: u32 = 3;
    /// Remove a mapping.
    pub const UNMAP: u32 = 4;
    /// Run an admin command.
    pub const ADMIN: u32 = 5;
    /// Delete every queue of this process.
    pub const DETACH: u32 = 6;
    /// The eventfd of one of this process's interrupt vectors.
    pub const VECTOR: u32 = 7;
    /// Map a range of a dma-buf (GPU memory) for the controller.
    pub const MAPDMABUF: u32 = 8;
    /// Map a range of GPU memory named by the runtime's IPC handle.
    pub const MAPIPC: u32 = 9;
}

/// How an attached process's GPU memory reaches the owner's platform (the
/// last field of `HELLO`'s reply).
pub mod gpu {
    /// Not at all.
    pub const NONE: u32 = 0;
    /// As a dma-buf the platform imports (`MAPDMABUF`: ugds_drv).
    pub const DMABUF: u32 = 1;
    /// By the runtime's IPC handle, opened by the owner and copied to and
    /// from by its emulated controller (`MAPIPC`).
    pub const IPC: u32 = 2;
}

/// Largest message either side sends.
pub const MAX_MESSAGE: usize = 8192;

/// Error kinds on the wire.
mod kind {
    pub const INVALID: u32 = 1;
    pub const UNSUPPORTED: u32 = 2;
    pub const OS: u32 = 3;
    pub const OTHER: u32 = 4;
}

/// Builds a message.
#[derive(Debug, Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// A message that starts with `code` (a request's op, or a reply's 0).
    pub fn new(code: u32) -> Writer {
        let mut w = Writer(Vec::with_capacity(64));
        w.u32(code);
        w
    }

    /// Appends a 32-bit value.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a 64-bit value.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends bytes as they are.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }

    /// A reply carrying `e`.
    pub fn error(e: &Error) -> Writer {
        let (k, errno) = match e {
            Error::InvalidArgument(_) => (kind::INVALID, libc::EINVAL),
            Error::Unsupported(_) => (kind::UNSUPPORTED, libc::EOPNOTSUPP),
            Error::Os { errno, .. } => (kind::OS, *errno),
            _ => (kind::OTHER, e.errno()),
        };
        let msg = match e {
            Error::InvalidArgument(m) | Error::Unsupported(m) => m.clone(),
            other => other.to_string(),
        };
        let mut w = Writer::new(k);
        w.u32(errno as u32);
        let m = &msg.as_bytes()[..msg.len().min(1024)];
        w.u32(m.len() as u32).bytes(m);
        w
    }
}

/// Reads a message field by field; a field past the end is an error.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Reads `buf` from its start.
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, at: 0 }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "malformed message: {} bytes, field at {} wants {n}",
                self.buf.len(),
                self.at
            ))
        })?;
        let b = &self.buf[self.at..end];
        self.at = end;
        Ok(b)
    }

    /// The next 32-bit value.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("four bytes")))
    }

    /// The next 64-bit value.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("eight bytes")))
    }

    /// A reply's status: Ok, or the error it carries.
    pub fn status(&mut self) -> Result<()> {
        let k = self.u32()?;
        if k == 0 {
            return Ok(());
        }
        let errno = self.u32()? as i32;
        let n = self.u32()? as usize;
        let msg = String::from_utf8_lossy(self.bytes(n.min(self.buf.len()))?).into_owned();
        Err(match k {
            kind::INVALID => Error::InvalidArgument(msg),
            kind::UNSUPPORTED => Error::Unsupported(msg),
            kind::OS => Error::Os { op: format!("the controller's owner: {msg}").into(), errno },
            _ => Error::Platform(format!("the controller's owner: {msg}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_cross_with_their_kind_and_message() {
        for e in [
            Error::InvalidArgument("qid 9 is not yours".into()),
            Error::Unsupported("no".into()),
            Error::Os { op: "mmap".into(), errno: libc::EACCES },
        ] {
            let w = Writer::error(&e);
            let back = Reader::new(&w.0).status().unwrap_err();
            assert_eq!(back.kind(), e.kind(), "{e} came back as {back}");
        }
        let w = Writer::error(&Error::DeviceGone);
        assert!(Reader::new(&w.0).status().unwrap_err().to_string().contains("owner"));
    }

    #[test]
    fn short_and_lying_messages_are_refused() {
        assert!(Reader::new(&[1, 0]).u32().is_err());
        let mut r = Reader::new(&[1, 2, 3, 4, 5]);
        assert_eq!(r.u32().unwrap(), 0x0403_0201);
        assert!(r.u64().is_err());
        // An error whose message length runs past the end.
        let mut w = Writer::new(1);
        w.u32(22).u32(1 << 30).bytes(b"abc");
        assert!(Reader::new(&w.0).status().is_err());
        // Every prefix of a well-formed error reply fails cleanly.
        let full = Writer::error(&Error::InvalidArgument("x".into())).0;
        for n in 0..full.len() {
            let _ = Reader::new(&full[..n]).status();
        }
    }
}
