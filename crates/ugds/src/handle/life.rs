//! A handle's life: open, wedged, closing, closed; what is in flight on
//! it; and what stuck commands hold (kept until the controller is reset).

use super::inflight::Inflight;
use super::{Drain, HandleState};
use crate::engine::hold::Hold;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use ugds_platform::Recover;
use ugds_platform::{Error, Result};

const OPEN: u8 = 0;
const WEDGED: u8 = 1;
const CLOSING: u8 = 2;
const CLOSED: u8 = 3;

/// See the module. The state and the in-flight count meet at a SeqCst
/// store-then-load handshake (see `inflight`).
#[derive(Default)]
pub(crate) struct Life {
    state: AtomicU8,
    pub inflight: Inflight,
    /// What commands stuck on the device hold.
    quarantine: Mutex<Vec<Hold>>,
}

/// How a close may go on, once [`Life::drain`] lets it.
pub(crate) enum Closing {
    /// Nothing in flight, and the state is CLOSING: tear down in order.
    Idle,
    /// Wedged, and the caller asked for a forced teardown.
    Force,
}

impl Life {
    /// Raises the calling thread's stripe if the handle is open; its
    /// stripe, for the matching `inflight.sub`.
    #[inline]
    pub fn enter(&self) -> Result<usize> {
        let stripe = self.inflight.add();
        match self.state.load(Ordering::SeqCst) {
            OPEN => Ok(stripe),
            s => {
                self.inflight.sub(stripe);
                Err(if s == WEDGED { Error::Wedged } else { Error::Closed })
            }
        }
    }

    /// Refuses everything from now on, keeping `guards`; whether this is
    /// the first wedge.
    pub fn wedge<G: Into<Hold>>(&self, guards: impl IntoIterator<Item = G>) -> bool {
        let first = self.state.swap(WEDGED, Ordering::SeqCst) != WEDGED;
        self.quarantine.lock().recover().extend(guards.into_iter().map(Into::into));
        first
    }

    #[inline]
    pub fn is_wedged(&self) -> bool {
        self.state.load(Ordering::SeqCst) == WEDGED
    }

    /// Where the handle stands (closing counts as open: a close may be
    /// refused and leave it so).
    pub fn handle_state(&self) -> HandleState {
        match self.state.load(Ordering::SeqCst) {
            OPEN | CLOSING => HandleState::Open,
            WEDGED => HandleState::Wedged,
            _ => HandleState::Closed,
        }
    }

    /// Whether it is open (neither wedged nor closing nor closed).
    pub fn is_open(&self) -> bool {
        self.state.load(Ordering::SeqCst) == OPEN
    }

    /// The controller did not confirm it stopped: keep everything.
    pub fn stuck(&self) {
        self.state.store(WEDGED, Ordering::SeqCst);
    }

    /// Torn down: the controller can no longer reach anything.
    pub fn closed(&self) {
        self.state.store(CLOSED, Ordering::SeqCst);
    }

    /// The stuck commands' holds may go (the controller was reset).
    pub fn release_quarantine(&self) {
        self.quarantine.lock().recover().clear();
    }

    /// Leaks the stuck commands' holds: the device may still reach them.
    pub fn leak_quarantine(&self) {
        std::mem::forget(std::mem::take(&mut *self.quarantine.lock().recover()));
    }

    /// Waits, as `drain` says, until nothing is in flight, and moves the
    /// state to CLOSING; a close refused (busy, wedged, closed) changes
    /// nothing.
    pub fn drain(&self, drain: Drain) -> Result<Closing> {
        match self.state.load(Ordering::SeqCst) {
            CLOSED | CLOSING => return Err(Error::Closed),
            WEDGED if drain == Drain::ForceAfterReset => return Ok(Closing::Force),
            WEDGED => return Err(Error::Wedged),
            _ => {}
        }
        let deadline = match drain {
            Drain::NoWait | Drain::ForceAfterReset => Some(Instant::now()),
            Drain::Timeout(d) => Some(Instant::now() + d),
            Drain::Forever => None,
        };
        loop {
            if self.state.compare_exchange(OPEN, CLOSING, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                // Wedged meanwhile by an I/O that timed out.
                return self.drain(drain);
            }
            let n = self.inflight.total();
            if n == 0 {
                return Ok(Closing::Idle);
            }
            // Reopen while waiting, so that a refused close changes nothing.
            self.state.store(OPEN, Ordering::SeqCst);
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Busy { what: "handle", inflight: n });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}
