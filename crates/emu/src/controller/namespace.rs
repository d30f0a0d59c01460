//! The namespaces: memory, a file by path, or a caller's descriptor.

use super::*;

pub(crate) struct Namespace {
    pub(super) block_size: u32,
    pub(super) blocks: u64,
    pub(super) store: Store,
}

pub(super) enum Store {
    Memory(Anonymous),
    File(File),
    /// Opened with O_DIRECT: transfers go through page-aligned memory only.
    DirectFile(File),
}

impl Namespace {
    pub(crate) fn open_all(cfg: &EmuConfig) -> Result<Vec<Namespace>> {
        cfg.namespaces
            .iter()
            .map(|n| {
                let bytes = n.blocks * n.block_size as u64;
                let store = match &n.backing {
                    crate::Backing::Memory => Store::Memory(Anonymous::new(bytes as usize)?),
                    crate::Backing::File(p) | crate::Backing::DirectFile(p) => {
                        let direct = matches!(n.backing, crate::Backing::DirectFile(_));
                        let f = OpenOptions::new()
                            .read(true)
                            .write(true)
                            .create(true)
                            .truncate(false)
                            .custom_flags(if direct { libc::O_DIRECT } else { 0 })
                            .open(p)
                            .map_err(|e| Error::io("open namespace backing file", e))?;
                        let len = f.metadata().map_err(|e| Error::io("stat backing file", e))?.len();
                        if len < bytes {
                            f.set_len(bytes).map_err(|e| Error::io("extend backing file", e))?;
                        }
                        if direct {
                            Store::DirectFile(f)
                        } else {
                            Store::File(f)
                        }
                    }
                    crate::Backing::Descriptor(fd) => {
                        let f = File::from(
                            fd.0.try_clone().map_err(|e| Error::io("duplicate the namespace's descriptor", e))?,
                        );
                        let len = f.metadata().map_err(|e| Error::io("stat backing file", e))?.len();
                        if len < bytes {
                            return Err(Error::InvalidArgument(format!(
                                "the file holds {len} bytes, fewer than the namespace's {bytes}"
                            )));
                        }
                        // SAFETY: F_GETFL on a descriptor we own.
                        let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
                        if flags >= 0 && flags & libc::O_DIRECT != 0 {
                            Store::DirectFile(f)
                        } else {
                            Store::File(f)
                        }
                    }
                };
                Ok(Namespace { block_size: n.block_size, blocks: n.blocks, store })
            })
            .collect()
    }

    /// Copies `len` bytes at byte `off` of the namespace to `dst`.
    ///
    /// # Safety
    /// `dst..dst+len` is host memory the controller may write.
    pub(super) unsafe fn read_into(&self, off: u64, dst: *mut u8, len: usize) -> std::io::Result<()> {
        match &self.store {
            // SAFETY: the namespace holds `blocks * block_size` bytes and the
            // caller checked the range; dst is valid per this fn's contract.
            Store::Memory(m) => unsafe {
                std::ptr::copy_nonoverlapping(m.as_ptr().add(off as usize), dst, len);
                Ok(())
            },
            // SAFETY: per this fn's contract.
            Store::File(f) | Store::DirectFile(f) => unsafe { sys::pread_raw(f.as_raw_fd(), dst, len, off) },
        }
    }

    /// Copies `len` bytes from `src` to byte `off` of the namespace.
    ///
    /// # Safety
    /// `src..src+len` is host memory the controller may read.
    pub(super) unsafe fn write_from(&self, off: u64, src: *const u8, len: usize) -> std::io::Result<()> {
        match &self.store {
            // SAFETY: as for `read_into`.
            Store::Memory(m) => unsafe {
                std::ptr::copy_nonoverlapping(src, m.as_ptr().add(off as usize), len);
                Ok(())
            },
            // SAFETY: per this fn's contract.
            Store::File(f) | Store::DirectFile(f) => unsafe { sys::pwrite_raw(f.as_raw_fd(), src, len, off) },
        }
    }

    pub(super) fn zero(&self, off: u64, len: u64) -> std::io::Result<()> {
        match &self.store {
            // SAFETY: the range was checked against the namespace size.
            Store::Memory(m) => unsafe {
                std::ptr::write_bytes(m.as_ptr().add(off as usize), 0, len as usize);
                Ok(())
            },
            Store::File(f) | Store::DirectFile(f) => {
                // Page-aligned zeros, as O_DIRECT needs.
                let zeros = Anonymous::new(1 << 16).map_err(std::io::Error::other)?;
                // SAFETY: a fresh, zeroed mapping of 64 KiB.
                let zeros = unsafe { std::slice::from_raw_parts(zeros.as_ptr(), 1 << 16) };
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(zeros.len() as u64) as usize;
                    std::os::unix::fs::FileExt::write_all_at(f, &zeros[..n], off + done)?;
                    done += n as u64;
                }
                Ok(())
            }
        }
    }

    pub(super) fn flush(&self) {
        if let Store::File(f) | Store::DirectFile(f) = &self.store {
            let _ = f.sync_data();
        }
    }

    pub(super) fn identify(&self) -> IdentifyNamespace {
        let lbaf = vec![LbaFormat { ms: 0, lbads: 9, rp: 0 }, LbaFormat { ms: 0, lbads: 12, rp: 0 }];
        IdentifyNamespace {
            nsze: self.blocks,
            ncap: self.blocks,
            nuse: self.blocks,
            nlbaf: 1,
            flbas: if self.block_size == 4096 { 1 } else { 0 },
            lbaf,
        }
    }
}
