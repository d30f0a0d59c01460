//! What keeps a request's memory from being given back while the device may
//! use it. The engine holds one [`Hold`] per request in flight and never
//! knows what it holds; the API's buffer registry implements [`Inflight`].

use std::sync::Arc;

/// Something a request in flight keeps: an in-flight count, raised by
/// whoever made the [`Hold`] and lowered by its drop.
pub(crate) trait Inflight: Send + Sync {
    /// Lowers the count (the request is done with it).
    fn release(&self);
}

/// One request's claim on its memory; released on drop. A request the
/// device may still complete keeps its hold in the handle's quarantine
/// instead (it is then never dropped before a reset).
pub(crate) struct Hold(Arc<dyn Inflight>);

impl Hold {
    /// A claim whose count the caller has already raised.
    pub(crate) fn new(counted: Arc<dyn Inflight>) -> Hold {
        Hold(counted)
    }

    /// Several claims as one (a vectored request's, one per buffer piece),
    /// all released together.
    pub(crate) fn many(mut holds: Vec<Hold>) -> Hold {
        if holds.len() == 1 {
            return holds.pop().expect("one");
        }
        Hold(Arc::new(Many(std::sync::Mutex::new(holds))))
    }
}

/// The claims of [`Hold::many`].
struct Many(std::sync::Mutex<Vec<Hold>>);

impl Inflight for Many {
    fn release(&self) {
        // Each dropped claim releases its own count.
        drop(std::mem::take(&mut *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)));
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.release();
    }
}
