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
    /// An environment variable that decides how the descriptor is served
    /// has a value it does not take (which, and why).
    Setting(String),
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
        libc::S_IFREG if emulate(std::env::var("UGDS_EMULATE").ok().as_deref())? => {
            let block = emulated_block_size(std::env::var("UGDS_EMULATE_BLOCK_SIZE").ok().as_deref())?;
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

/// Whether `UGDS_EMULATE` (its value, if set) asks for the emulated
/// controller: `1` yes; unset, empty or `0` no.
fn emulate(value: Option<&str>) -> Result<bool, Refused> {
    match value {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(Refused::Setting(format!("UGDS_EMULATE={v:?}: 1 (the emulated controller) or 0"))),
    }
}

/// The emulated controller's block size from `UGDS_EMULATE_BLOCK_SIZE`
/// (its value, if set): 512 (the default) or 4096.
fn emulated_block_size(value: Option<&str>) -> Result<u32, Refused> {
    match value {
        None | Some("" | "512") => Ok(512),
        Some("4096") => Ok(4096),
        Some(v) => Err(Refused::Setting(format!("UGDS_EMULATE_BLOCK_SIZE={v:?}: 512 or 4096"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emulate_takes_1_and_0_only() {
        assert!(!emulate(None).unwrap());
        assert!(!emulate(Some("")).unwrap());
        assert!(!emulate(Some("0")).unwrap());
        assert!(emulate(Some("1")).unwrap());
        for v in ["yes", "true", "2", " 1"] {
            let Err(Refused::Setting(why)) = emulate(Some(v)) else { panic!("UGDS_EMULATE={v} taken") };
            assert!(why.contains("UGDS_EMULATE="), "{why}");
        }
    }

    #[test]
    fn block_size_is_512_or_4096() {
        assert_eq!(emulated_block_size(None).unwrap(), 512);
        assert_eq!(emulated_block_size(Some("512")).unwrap(), 512);
        assert_eq!(emulated_block_size(Some("4096")).unwrap(), 4096);
        // 0 used to divide by zero; the others became 512 without a word.
        for v in ["0", "4k", "1024", "-512", "8192"] {
            let Err(Refused::Setting(why)) = emulated_block_size(Some(v)) else { panic!("{v} taken") };
            assert!(why.contains("512 or 4096"), "{why}");
        }
    }
}
