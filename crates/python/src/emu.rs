//! `EmuTcpTarget`: an emulated NVMe/TCP target to try `Driver.open_tcp` on.

use super::*;

/// An emulated NVMe/TCP target on 127.0.0.1 (a memory namespace of `size`
/// bytes in blocks of `block_size`), for trying `Driver.open_tcp` without
/// one: `addr` and `nqn` name it. Stops listening when collected.
#[pyclass(module = "ugds")]
pub(crate) struct EmuTcpTarget {
    pub(crate) inner: ugds_emu::tcp::EmuTcpTarget,
}

#[pymethods]
impl EmuTcpTarget {
    #[new]
    #[pyo3(signature = (size=64<<20, block_size=4096))]
    fn new(size: u64, block_size: u32) -> PyResult<Self> {
        if block_size == 0 || !block_size.is_power_of_two() || size % block_size as u64 != 0 || size == 0 {
            return Err(err(ugds::Error::InvalidArgument(format!(
                "size {size} in blocks of {block_size}: a power-of-two block size that divides the size"
            ))));
        }
        let cfg = ugds_emu::tcp::EmuTcpConfig { blocks: size / block_size as u64, block_size, ..Default::default() };
        let inner = ugds_emu::tcp::EmuTcpTarget::start(cfg).map_err(|e| err(ugds::Error::io("listen", e)))?;
        Ok(EmuTcpTarget { inner })
    }

    /// "127.0.0.1:port".
    #[getter]
    fn addr(&self) -> String {
        self.inner.addr().to_string()
    }

    /// The subsystem's NQN.
    #[getter]
    fn nqn(&self) -> String {
        self.inner.nqn().to_string()
    }
}
