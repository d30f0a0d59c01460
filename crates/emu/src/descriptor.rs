//! What serves an open file descriptor a C binding was handed (libugds's
//! `uGDSHandleRegister`, libcufile's `cuFileHandleRegister`): ugds_drv's
//! character device, an emulated controller over a regular file (with
//! `UGDS_EMULATE=1`), or the kernel path for any other regular file or
//! block device; with `UGDS_ATTACH=SOCKET`, whatever the descriptor, the
//! controller `ugds serve` serves at SOCKET (queue pairs of this process's
//! own).

use crate::{EmuConfig, EmuPlatform, NamespaceConfig};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use ugds_platform::Platform;

/// What serves a descriptor.
pub enum Served {
    /// A controller: through ugds_drv, or emulated.
    Controller(Arc<dyn Platform>),
    /// The kernel path (a regular file or a block device).
    Kernel,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Served::Controller(p) => write!(f, "Controller({})", p.describe()),
            Served::Kernel => f.write_str("Kernel"),
        }
    }
}

/// Why a descriptor cannot be served.
#[derive(Debug)]
pub enum Refused {
    /// Not an open descriptor.
    NotOpen,
    /// A character device that is not ugds_drv's, or neither a regular
    /// file nor a block device.
    FileType(String),
    /// `dup` failed.
    Dup(std::io::Error),
    /// The platform could not be made (its error).
    Platform(ugds_platform::Error),
    /// An emulated controller over a file smaller than one block.
    TooSmall,
}

/// What serves `fd` (borrowed for the call; a platform keeps a duplicate).
pub fn serve(fd: BorrowedFd<'_>) -> Result<Served, Refused> {
    use std::os::fd::AsRawFd;
    // SAFETY: fstat writes one struct; the descriptor is borrowed, open or not.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(Refused::NotOpen);
    }
    let name = || {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| format!("fd {}", fd.as_raw_fd()))
    };
    let dup = || -> Result<OwnedFd, Refused> { fd.try_clone_to_owned().map_err(Refused::Dup) };
    // Attached to a controller `ugds serve` owns: every descriptor stands
    // for its namespace (the descriptor only names the handle).
    if let Some(socket) = std::env::var_os("UGDS_ATTACH").filter(|s| !s.is_empty()) {
        return ugds_platform::attach::AttachPlatform::connect(std::path::Path::new(&socket))
            .map(|p| Served::Controller(Arc::new(p)))
            .map_err(Refused::Platform);
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFCHR => {
            let (maj, min) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
            let subsystem = std::fs::read_link(format!("/sys/dev/char/{maj}:{min}/subsystem")).ok();
            if subsystem.as_ref().and_then(|p| p.file_name()).is_none_or(|n| n != "ugds_drv") {
                return Err(Refused::FileType(format!("{} is a character device not of ugds_drv", name())));
            }
            ugds_platform::ugds_drv::UgdsDrvPlatform::from_fd(dup()?, &name())
                .map(|p| Served::Controller(Arc::new(p)))
                .map_err(Refused::Platform)
        }
        libc::S_IFREG if std::env::var("UGDS_EMULATE").is_ok_and(|v| v == "1") => {
            let block: u32 = std::env::var("UGDS_EMULATE_BLOCK_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
            let size = st.st_size as u64 / block as u64 * block as u64;
            if size == 0 {
                return Err(Refused::TooSmall);
            }
            // The caller's file itself, through a duplicate of its
            // descriptor: never reopened by name (the name may be gone).
            EmuPlatform::new(EmuConfig::default().namespaces(vec![NamespaceConfig::descriptor(dup()?, size, block)]))
                .map(|p| Served::Controller(Arc::new(p)))
                .map_err(Refused::Platform)
        }
        libc::S_IFREG | libc::S_IFBLK => Ok(Served::Kernel),
        _ => Err(Refused::FileType(format!("{} is neither /dev/ugds_drvN, a regular file nor a block device", name()))),
    }
}
