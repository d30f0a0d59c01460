//! What a [`Driver`](crate::Driver) and every handle it opened share: the
//! buffer registry and the list of open handles. It lives with the handle,
//! below the driver, because a closing handle leaves the list and unmaps
//! its buffers itself.

use super::HandleInner;
use crate::registry::Registry;
use std::sync::{Mutex, Weak};

#[derive(Default)]
pub(crate) struct DriverInner {
    pub registry: Registry,
    /// Open handles. Lock order: this, then the registry.
    pub handles: Mutex<Vec<(u64, Weak<HandleInner>)>>,
}
